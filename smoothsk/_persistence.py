"""Saving a fitted estimator to one safetensors file, and loading it without running code.

The file's container (one safetensors file, its JSON document and its
digest or HMAC, authenticated before it is parsed) is
:mod:`smoothsk._model_file`; this module decides what the document holds
and rebuilds the estimator from it.

What loading guarantees, whoever wrote the file
-----------------------------------------------
- **No code runs.** Nothing is unpickled and nothing is imported by name.
  The file sets only the parameters listed under "Parameters a file may
  set" (below), each only with the kind of value it takes. Classes come from
  an allow-list (smoothsk's public classes and ``torch.optim``'s optimizers,
  plus those the caller passes), and components are rebuilt by calling
  their class with the saved parameters, which only stores them
  (scikit-learn's ``__init__`` contract): only classes with ``get_params``
  are called so, never a module (built only as ``module`` or a selector,
  under the budget below) or an optimizer. This follows the line skops
  draws with its trusted types, with fewer types: only what a saved
  estimator needs.
- **No allocation the file's size does not justify.** Tensors are read
  within the file (safetensors checks every offset). The module (and a
  certified sigma function's selector) is built first on torch's ``meta``
  device under an allocation budget derived from the file's tensors of it
  (:mod:`smoothsk._module_state`: its size plus 64 MiB, both for what the
  build registers and for all the tensors it creates, a probe input through
  lazy layers and its activations included, and bounded counts of tensors
  and submodules, enforced at each registration and allocation), its
  ``state_dict`` compared with them, and only then built for real. The JSON
  nests at most :data:`~smoothsk._model_file.MAX_NESTING` deep; ``classes_`` takes at most
  :data:`MAX_CLASSES_BYTES`; ``input_shape_`` has at most
  :data:`MAX_INPUT_FEATURES` features; ``certify_batch_size`` batches at most
  :data:`MAX_BATCH_BYTES` of noisy inputs; sample sizes are at most
  :data:`~smoothsk._constraints.MAX_SAMPLE_SIZE` (every component is
  validated at load).
- **One clear error.** Anything else is refused with one ValueError naming
  the file and the parameter or entry.
- **What a digest means**: see :mod:`smoothsk._model_file`.

Parameters a file may set
-------------------------
Those of :func:`_is_file_parameter`, each with one kind of value:

- smoothsk's own (``alpha``, ``certify_batch_size``, ``device``, ``lr``,
  ...): None, a bool, a number or a string;
- ``module`` and ``optimizer``: a class;
- ``training``, ``sigma_search``, ``sampler``, ``allocator``: None or a
  component;
- ``optimizer__*``: None, bools, numbers, strings, and lists or tuples of
  them;
- ``module__*``: those, and module classes (``{"type": name}``, alone or in
  a list or tuple), so that a module may take the classes of its parts, as
  :class:`~smoothsk.experts.NoiseLevelExperts` takes its experts'. Such a
  class comes from the allow-list and is only passed to the module's
  constructor, which runs in the budgeted build above; a component
  (``{"class": ..., "params": ...}``) or a class that is not a module is
  refused there: a ``module__*`` value builds nothing itself.

``compile``, ``torch_load_kwargs``, ``callbacks``, ``criterion``, the
iterators, ``dataset``, ``train_split``, ``predict_nonlinearity`` and
``use_caching`` can reach code (torch.compile's C++ build takes its flags
from ``compile__options``) and are refused by name; saving leaves them out,
with a warning where they are not at their defaults.

What loading gives is what was saved
------------------------------------
A module's ``state_dict`` is not all it computes with: a non-persistent
buffer, an attribute changed after construction or a hook added to it
changes its outputs too, and the file cannot hold them. So saving first
builds the estimator from the document and tensors it is about to write, by
the code loading runs, and refuses (writing nothing) when that estimator's
module or fitted sigma function holds other data than the saved one (see
:func:`_held_state`: tensors, other attributes, hooks), naming what
differs; it refuses likewise parameters the estimator class cannot be
built with (an attribute set on an estimator is a parameter for skorch).
The comparison runs in the saving process, with the code and library
versions of that moment: the file holds no code, so loading with edited
module code, or a module instance passed to ``load`` (which saving can
only compare with a copy of itself), is the loader's responsibility.

Certified sigma functions
-------------------------
``sigma_search_`` is the fitted certified sigma function
(:class:`~smoothsk.sigma.BaseCertifiedSigma`) that certificates of ``G``
need, e.g. the trained selector module of
:class:`~smoothsk.sigma.CertifiedSigmaSelector` or the training inputs of
:class:`~smoothsk.sigma.SemiElasticSigma`'s nearest-neighbour rule. A class
saves it when it provides ``fitted_arrays()`` (its state as named tensors)
and ``restore_fitted(estimator, arrays, source)`` (which checks them and
rebuilds what derives from them: a module from the saved parameters, a
neighbour index); saving refuses any other fitted sigma function rather
than write a file whose loaded estimator could not certify. One format
version is read, :data:`~smoothsk._model_file.FORMAT_VERSION`; smoothsk has released no other.

Parameters in JSON
------------------
A parameter value is saved as itself when it is None, a bool, a number, a
string or a list; a tuple as ``{"tuple": [...]}``, a dict with string keys as
``{"dict": {...}}`` (inside components only), a class as
``{"type": "dotted.Name"}``, and a scikit-learn-style component (an object
with ``get_params``) as ``{"class": "dotted.Name", "params": {...}}``
(recursively). Anything else (a function, a ``RandomState``, an array) is
refused when saving, naming the parameter.

A module *instance* that gives its ``constructor_params()`` (a dict: the
parameters its class rebuilds it from, such as the levels and the experts'
classes of :class:`~smoothsk.experts.NoiseLevelExperts`) is recorded as its
class with those as ``module__*`` parameters (the estimator's own
``module__*`` parameters must then be empty), and loads without a module
argument; saving refuses one that its class does not rebuild from them (see
"What loading gives is what was saved"). Any other module instance
(``module=MyNet(...)``) is recorded by its class only, and must be passed
again to :func:`load_estimator`.

Not saved
---------
- The optimizer's state (momentum buffers, Adam moments): a saved model is for
  inference; ``partial_fit`` after loading continues from the saved weights
  with a fresh optimizer.
- The parameters a file may not set (above): ``callbacks`` hold functions,
  the others can name code. The loaded estimator has their defaults; set them
  again with ``set_params`` before training further.
- The fitted copy of the training schedule (``training_``) and its stage:
  every ``fit``/``partial_fit`` sets them again (the stage from the history).
"""

import contextlib
import copy
import inspect
import warnings
from functools import cache
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import torch
from skorch import NeuralNet
from skorch.exceptions import DeviceWarning
from skorch.history import History
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm
from torch.utils.hooks import RemovableHandle

from . import experts, models, regions, sampling, sigma, training
from ._atomic import unwritable_reason
from ._codec import encode
from ._codec import plain as _plain
from ._codec import refuse as _refuse
from ._digest import value_digest
from ._messages import one_line, quoted
from ._model_file import FORMAT_VERSION, check_key, read_model_file, write_model_file
from ._module_state import allocation_budget, check_buildable, load_module_state, tensor_spec
from ._validation import smoothing_components
from ._version import __version__
from .regions import RegionStore
from .statistics import check_noise_levels

__all__ = ["MAX_CLASSES_BYTES", "MAX_INPUT_FEATURES", "MAX_BATCH_BYTES", "MAX_N_JOBS", "load_estimator",
           "save_estimator"]

#: Limits on what a file may ask loading to allocate, beyond its own tensors (see "Sizes").
MAX_INPUT_FEATURES = 2**26
MAX_BATCH_BYTES = 2**30
MAX_N_JOBS = 256
#: The devices a model file may name (a device is also checked to exist, or a saved CUDA one falls back to the CPU).
_FILE_DEVICES = ("cpu", "cuda", "mps")
#: ``classes_``'s array: its labels times its dtype's width (a string dtype is as wide as its longest label).
MAX_CLASSES_BYTES = 64 * 2**20
#: Longest parameter name of a component a file may give (a Python identifier).
_MAX_NAME_LENGTH = 100

#: The parameters a file may set, by the kind of value each takes (see "Parameters a file may set").
_PLAIN_PARAMETERS = frozenset({"alpha", "batch_size", "certify_autocast", "certify_batch_size", "certify_memory_format",
                               "device", "lr", "max_epochs", "n_jobs", "random_state", "verbose", "warm_start"})
_CLASS_PARAMETERS = frozenset({"module", "optimizer"})
_COMPONENT_PARAMETERS = frozenset({"allocator", "sampler", "sigma_search", "training"})
_PLAIN_PREFIXES = ("module__", "optimizer__")
_MODULE_OPTION_PREFIX = "module__"  # whose values may name module classes too
#: skorch's options of the parameters a file may not set (saving leaves them out, with a warning).
_TRAINING_SETTING_PREFIXES = ("callbacks__", "compile__", "criterion__", "dataset__", "iterator_train__",
                              "iterator_valid__")

_MODULE_PREFIX = "module_."
_REGIONS_PREFIX = "regions_."
_SIGMA_FUNCTION_PREFIX = "sigma_search_."
_TRAIN_SIGMAS = "train_sigmas_"
_TRAIN_KEYS = "train_keys_"
_ABSENT = object()  # an attribute one of two compared objects lacks
_MALFORMED = object()  # a saved value that is not of its parameter's kind
_ALLOWED = "smoothsk's public classes and torch.optim optimizers"


# ------------------------------------------------------------------ class names

@cache
def _builtin_classes():
    """The allow-list: dotted public name -> class, for classes any file may name."""
    named = {}
    for module in (sigma, sampling, regions, training, models, experts):
        for attr in module.__all__:
            if isinstance(getattr(module, attr), type):
                named[f"{module.__name__}.{attr}"] = getattr(module, attr)
    for attr in dir(torch.optim):
        obj = getattr(torch.optim, attr)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer):
            named[f"torch.optim.{attr}"] = obj
    return named


@cache
def _builtin_names():
    """Class -> its public name in the allow-list (the first one listed)."""
    return {cls: name for name, cls in reversed(_builtin_classes().items())}


def class_name(cls, where="class"):
    """The dotted name a file records for ``cls``: its public allow-list name, else ``module.qualname``."""
    if cls in _builtin_names():
        return _builtin_names()[cls]
    if "<locals>" in cls.__qualname__:
        raise ValueError(f"Cannot save {where}: class {cls.__qualname__} is defined inside a function, so no "
                         "name identifies it; define it at module level.")
    return f"{cls.__module__}.{cls.__qualname__}"


def _allowed_classes(extra):
    """The allow-list extended by the classes the caller passed explicitly."""
    classes = dict(_builtin_classes())
    for cls in extra:
        if not isinstance(cls, type):
            raise TypeError(f"allowed_classes must hold classes; got {cls!r}.")
        classes[class_name(cls)] = cls
    return classes


# ------------------------------------------------------------------- encoding

def _decode(value, where, classes, source):
    """The parameter value that :func:`~smoothsk._codec.encode` wrote as ``value``; classes only from ``classes``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(item, f"{where}[{i}]", classes, source) for i, item in enumerate(value)]
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"tuple"} and isinstance(value["tuple"], list):
            return tuple(_decode(item, f"{where}[{i}]", classes, source) for i, item in enumerate(value["tuple"]))
        if keys == {"dict"} and isinstance(value["dict"], dict):
            return {key: _decode(item, f"{where}[{quoted(key)}]", classes, source)
                    for key, item in value["dict"].items()}
        if keys == {"type"}:
            return _lookup(value["type"], where, classes, source)
        if keys == {"class", "params"} and isinstance(value["params"], dict):
            cls = _lookup(value["class"], where, classes, source)
            if not hasattr(cls, "get_params") or issubclass(cls, torch.nn.Module):
                # What encode writes so: a module is a class ({"type": ...}), never built from the file's values.
                raise ValueError(f"{source}: parameter {where} names {value['class']} as a component, which it is "
                                 "not (a scikit-learn-style object with get_params, not a module): nothing was built.")
            names = [key for key in value["params"] if not (key.isidentifier() and len(key) <= _MAX_NAME_LENGTH)]
            if names:
                raise ValueError(f"{source}: parameter {where} gives {value['class']} a parameter "
                                 f"{quoted(names[0])}, which is no parameter name.")
            params = {key: _decode(item, f"{where}.{key}", classes, source) for key, item in value["params"].items()}
            try:
                return cls(**params)
            except TypeError as exc:
                raise ValueError(f"{source}: cannot rebuild {where} as {value['class']}(...): {one_line(exc)}") \
                    from exc
    raise ValueError(f"{source}: parameter {where} has a malformed saved value {quoted(value)}.")


def _lookup(name, where, classes, source):
    """The allowed class called ``name``; refused (nothing imported) when it is not on the allow-list."""
    if isinstance(name, str) and name in classes:
        return classes[name]
    raise ValueError(
        f"{source}: parameter {where} names the class {quoted(name)}, which is not on the allow-list of classes "
        f"a saved model may name ({_ALLOWED}); nothing was imported. If you trust the file and the class, "
        "pass it explicitly: load(path, allowed_classes=[TheClass]) (or module=TheClass for the module).")


# --------------------------------------------------------------------- tensors

def _fitted_tensors(estimator):
    """Every fitted array of ``estimator`` as CPU tensors with their file names."""
    tensors = {}
    for key, value in estimator.module_.state_dict().items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"Cannot save module_: its state_dict entry {key!r} is a {type(value).__name__}, "
                             "not a tensor.")
        # A fresh CPU copy: tied weights must not share memory in a safetensors file.
        tensors[_MODULE_PREFIX + key] = value.detach().to("cpu", copy=True).contiguous()
    if hasattr(estimator, "train_sigmas_"):
        tensors[_TRAIN_SIGMAS] = torch.from_numpy(np.array(estimator.train_sigmas_))
    if hasattr(estimator, "train_keys_"):
        tensors[_TRAIN_KEYS] = torch.from_numpy(np.array(estimator.train_keys_, dtype=np.uint64))
    arrays, _ = estimator.regions_.to_arrays()
    for name, array in arrays.items():
        tensors[_REGIONS_PREFIX + name] = torch.from_numpy(np.array(array))
    sigma_function = getattr(estimator, "sigma_search_", None)
    if sigma_function is not None:
        tensors.update((_SIGMA_FUNCTION_PREFIX + name, tensor)
                       for name, tensor in sigma_function.fitted_arrays().items())
    return tensors


def _encode_sigma_function(estimator, named):
    """JSON form of the fitted certified sigma function (class and parameters), or None; classes into ``named``."""
    sigma_function = getattr(estimator, "sigma_search_", None)
    if sigma_function is None:
        return None
    if not (callable(getattr(sigma_function, "fitted_arrays", None))
            and callable(getattr(sigma_function, "restore_fitted", None))):
        # Refuse rather than write a file whose loaded estimator could not certify.
        raise ValueError(
            f"Cannot save sigma_search_ (the fitted {type(sigma_function).__name__}): the file format holds the "
            "fitted state of a certified sigma function only when its class provides fitted_arrays() and "
            "restore_fitted(estimator, arrays, source). Use joblib.dump (joblib.load runs code: load only "
            "files you trust), or refit after loading.")
    return encode(sigma_function, "sigma_search_", named, class_name)


# ------------------------------------------------------------------------ save

def _is_file_parameter(name):
    """Whether a model file may set the parameter ``name`` (see "Parameters a file may set")."""
    return name in _PLAIN_PARAMETERS | _CLASS_PARAMETERS | _COMPONENT_PARAMETERS or name.startswith(_PLAIN_PREFIXES)


@cache
def _defaults(cls):
    """Default value of each constructor parameter of the estimator class ``cls`` and of skorch's NeuralNet."""
    defaults = {}
    for klass in (NeuralNet, cls):
        defaults.update((name, parameter.default) for name, parameter in inspect.signature(klass).parameters.items()
                        if parameter.default is not inspect.Parameter.empty)
    return defaults


def _recorded_params(estimator):
    """The estimator's parameters as a file records them: a module that gives its ``constructor_params()`` as its class.

    Such a module instance becomes its class, and each of its constructor
    parameters a ``module__<name>`` parameter (see "Parameters in JSON").
    """
    params = estimator.get_params(deep=False)
    module = params["module"]
    if not (isinstance(module, torch.nn.Module) and callable(getattr(module, "constructor_params", None))):
        return params
    own = sorted(name for name in params if name.startswith(_MODULE_OPTION_PREFIX))
    if own:
        raise ValueError(f"Cannot save {', '.join(own)}: the module is a {type(module).__name__} instance, saved as "
                         "its class and its constructor_params(), which these parameters would override; remove "
                         "them (the instance holds its own).")
    return {**params, "module": type(module),
            **{_MODULE_OPTION_PREFIX + name: value for name, value in module.constructor_params().items()}}


def _encode_params(estimator, params, named):
    """JSON form of the parameters ``params`` a file may set; warns about the others not at their defaults."""
    defaults = _defaults(type(estimator))
    for name in params:
        if not (_is_file_parameter(name) or name in defaults or name.startswith(_TRAINING_SETTING_PREFIXES)):
            raise ValueError(f"Cannot save parameter {name}: {type(estimator).__name__} takes no such parameter "
                             "(skorch counts any attribute set on an estimator, estimator.name = value, among its "
                             "parameters: delete such an attribute before saving).")
    left_out = [name for name, value in params.items() if not _is_file_parameter(name)
                and (name not in defaults or value_digest(value) != value_digest(defaults[name]))]
    if left_out:
        warnings.warn(f"{', '.join(sorted(left_out))} not saved: a model file sets only the parameters that "
                      "cannot name code (callbacks, compile, criterion, iterators, datasets and torch_load_kwargs "
                      "can); the loaded estimator has their defaults: set them again before training it further.",
                      UserWarning, stacklevel=4)
    encoded = {}
    for name, value in params.items():
        if not _is_file_parameter(name):
            continue
        if name == "module" and isinstance(value, torch.nn.Module):
            encoded[name] = {"instance": class_name(type(value), "module")}
        elif name.startswith(_MODULE_OPTION_PREFIX):
            encoded[name] = _encode_plain(value, name, named)
        elif name in _PLAIN_PARAMETERS or name.startswith(_PLAIN_PREFIXES):
            encoded[name] = _encode_plain(value, name)
        else:
            encoded[name] = encode(value, name, named, class_name)
    return encoded


def _encode_plain(value, where, named=None):
    """JSON form of a plain value: None, bool, a number, a string, or a list or tuple of them.

    With ``named`` (a ``module__*`` value), a module class too, alone or in
    the list or tuple: ``{"type": name}``, the class recorded in ``named``.
    """
    classes = "module classes, " if named is not None else ""
    what = f"None, bools, numbers, strings, {classes}and lists or tuples of them"
    if isinstance(value, (list, tuple)):
        items = [_encode_plain(item, f"{where}[{i}]", named) for i, item in enumerate(value)]
        if any(isinstance(item, list) or isinstance(item, dict) and set(item) != {"type"} for item in items):
            _refuse(where, value, what)
        return items if isinstance(value, list) else {"tuple": items}
    if value is None or isinstance(value, (bool, str, np.bool_, Integral, Real)):
        return _plain(value, where)
    if named is not None and isinstance(value, type) and issubclass(value, torch.nn.Module):
        return encode(value, where, named, class_name)
    return _refuse(where, value, what)


def save_estimator(estimator, path, key=None):
    """Write fitted ``estimator`` to ``path`` as one safetensors file (see the module docstring).

    Every value is checked before anything is written, so a refused save
    leaves no file behind; the file appears by an atomic rename.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        A fitted estimator.
    path : str or path-like
        File to write (overwritten if it exists, keeping its permissions).
    key : bytes, optional
        Authenticates the file with HMAC-SHA256 under this key (at least
        :data:`MIN_KEY_BYTES` bytes): it then loads only with the same key.

    Raises
    ------
    ValueError
        If ``path`` is a directory or its folder does not exist or is not
        writable; if a parameter (or a component's parameter, or a history entry) is
        not one the format holds, if the estimator class takes no such
        parameter, or if the module (or the fitted sigma function) holds
        state the file cannot hold; the message names it.
    TypeError
        If ``key`` is not None or bytes of at least :data:`MIN_KEY_BYTES`.
    """
    key = check_key(key)
    estimator.check_is_fitted()
    path = Path(path)
    reason = unwritable_reason(path)
    if reason:
        raise ValueError(f"Cannot save {path}: {reason}.")
    named = {}
    sigma_function = _encode_sigma_function(estimator, named)
    params = _recorded_params(estimator)
    encoded = _encode_params(estimator, params, named)
    tensors = _fitted_tensors(estimator)
    _, region_attributes = estimator.regions_.to_arrays()
    document = {
        "format_version": FORMAT_VERSION,
        "library_version": __version__,
        "estimator": class_name(type(estimator), "the estimator"),
        "params": encoded,
        "classes_": {"dtype": estimator.classes_.dtype.str, "values": _plain(estimator.classes_.tolist(), "classes_")},
        "input_shape_": [int(size) for size in estimator.input_shape_],
        "regions_": _plain(region_attributes, "regions_"),
        "history": _plain(list(estimator.history), "history"),
        "sigma_search_": sigma_function,
        "tensors": {name: tensor_spec(tensor) for name, tensor in tensors.items()},
    }
    _check_rebuilt(estimator, document, tensors, f"Cannot save {path}", params["module"], named)
    write_model_file(path, document, tensors, key)


#: torch's own bookkeeping attributes of every module (hook tables keyed by global handle ids, flags).
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))
#: Forward pre-hooks that recompute the module attribute they name (``hook.name``) at every call.
_DERIVING_HOOKS = (SpectralNorm, WeightNorm)


def _held_state(value):
    """What a module (or sigma function) computes with, by name, to compare it with its rebuilt copy.

    For a module, per submodule (dotted names): its class, its parameters and
    buffers (non-persistent ones too), its other attributes and its hooks in
    the order they run (compared by :func:`~smoothsk._digest.value_digest`:
    functions by their code and captured values, objects by their state),
    torch's bookkeeping (hook tables' ids, hook handles, the weight a legacy
    ``spectral_norm``/``weight_norm`` hook recomputes at every call) left
    out. Two modules built by the same code in one process hold equal
    states when they compute alike; a module caching what its last call saw
    (an attribute set in ``forward``) is refused although it loads alike. For a sigma
    function, its attributes, those of its modules replaced by their held
    state (``selector_module_.shift``, ...).

    Parameters
    ----------
    value : torch.nn.Module or BaseSigmaSearch

    Returns
    -------
    dict
        Name -> value; two states are compared entry by entry with
        :func:`~smoothsk._digest.value_digest`.
    """
    if not isinstance(value, torch.nn.Module):
        state = {}
        for key, item in vars(value).items():
            if isinstance(item, torch.nn.Module):
                state.update((f"{key}.{name}", part) for name, part in _held_state(item).items())
            else:
                state[key] = item
        return state
    state = {}
    for name, module in value.named_modules(remove_duplicate=False):
        prefix = f"{name}." if name else ""
        state[f"{prefix}<class>"] = f"{type(module).__module__}.{type(module).__qualname__}"
        # torch's legacy spectral_norm / weight_norm: a pre-hook recomputes the attribute it names at every call.
        derived = {hook.name for hook in module._forward_pre_hooks.values() if isinstance(hook, _DERIVING_HOOKS)}
        for key, item in vars(module).items():
            if key in ("_parameters", "_buffers"):
                state.update((prefix + tensor_name, tensor) for tensor_name, tensor in item.items())
            elif key.endswith("hooks") and isinstance(item, dict):
                if item:  # without the handle ids, which come from a global counter
                    state[prefix + key] = list(item.values())
            elif key not in _MODULE_INTERNALS and key not in derived and not isinstance(item, RemovableHandle):
                state[prefix + key] = item
    return state


def _check_rebuilt(estimator, document, tensors, source, module, named):
    """Refuse to save a file whose loaded estimator would not be ``estimator``.

    Builds the estimator from ``document`` and ``tensors`` as
    :func:`load_estimator` will (``module``, the ``module`` parameter, is
    passed again as a copy when it is an instance; ``named`` holds the
    classes the document names) and compares the :func:`_held_state` of its
    module and fitted sigma function with ``estimator``'s.
    """
    random_state = np.random.get_state()  # building draws initial weights from it when random_state is None
    try:
        rebuilt = _rebuild(type(estimator), document, tensors, source,
                           copy.deepcopy(module) if isinstance(module, torch.nn.Module) else None,
                           _allowed_classes(named.values()))
    finally:
        np.random.set_state(random_state)
    for what in ("module_", "sigma_search_"):
        if getattr(estimator, what, None) is None:
            continue
        live, loaded = _held_state(getattr(estimator, what)), _held_state(getattr(rebuilt, what))
        parts = [key for key in dict.fromkeys([*live, *loaded])
                 if value_digest(live.get(key, _ABSENT)) != value_digest(loaded.get(key, _ABSENT))]
        if parts:
            raise ValueError(
                f"{source}: {what} holds state that the file cannot hold, so the loaded estimator would be "
                f"another classifier: {', '.join(parts)} differs in the {what} rebuilt from the saved parameters "
                "and tensors. In a module, that is state outside its state_dict (a non-persistent buffer, an "
                "attribute changed after construction, a hook added to it): register it as a parameter or a "
                "persistent buffer, or set it from a constructor argument (module__<name>=...).")


# ------------------------------------------------------------------------ load

def _decode_classes(spec, source):
    """``classes_`` with its saved dtype."""
    if not (isinstance(spec, dict) and isinstance(spec.get("values"), list) and isinstance(spec.get("dtype"), str)):
        raise ValueError(f"{source}: classes_ is malformed: expected {{'dtype': str, 'values': list}}.")
    try:
        dtype = np.dtype(spec["dtype"])
    except (TypeError, ValueError):
        dtype = None
    values = spec["values"]
    plain = all(isinstance(v, (bool, int, float, str)) for v in values)
    if dtype is not None and len(values) * dtype.itemsize > MAX_CLASSES_BYTES:
        raise ValueError(f"{source}: classes_ of {len(values)} labels of dtype {quoted(spec['dtype'])} would "
                         f"take {len(values) * dtype.itemsize / 2**20:.3g} MiB, over the {MAX_CLASSES_BYTES // 2**20} "
                         "MiB a model file may ask for.")
    if dtype is None or dtype.kind not in "biufUO" or len(values) < 2 or not plain:
        raise ValueError(f"{source}: classes_ is malformed: expected at least 2 labels (numbers or strings) "
                         f"of a bool, int, float, string or object dtype; got {quoted(spec)}.")
    classes = np.empty(len(values), dtype=dtype)
    with np.errstate(all="ignore"):
        try:
            classes[:] = values
        except (OverflowError, ValueError, TypeError):  # an int out of its dtype's range, a string in a number dtype
            classes = None
    if classes is None or classes.tolist() != values:
        raise ValueError(f"{source}: classes_ values {quoted(values)} do not fit their dtype "
                         f"{quoted(spec['dtype'])}.")
    try:  # fit keeps np.unique(y); labels of types that do not compare (0 and "a") do not sort
        fitted = np.array_equal(np.unique(classes), classes)
    except TypeError:
        fitted = False
    if not fitted:
        raise ValueError(f"{source}: classes_ {quoted(values)} are not distinct and sorted, as fit leaves "
                         "them.")
    return classes


def _decode_shape(shape, source):
    if not (isinstance(shape, list) and shape and all(type(size) is int and size > 0 for size in shape)):
        raise ValueError(f"{source}: input_shape_ must be a non-empty list of positive ints; got "
                         f"{quoted(shape)}.")
    if np.prod(shape, dtype=object) > MAX_INPUT_FEATURES:
        raise ValueError(f"{source}: input_shape_ {quoted(shape)} has more than {MAX_INPUT_FEATURES} features, "
                         "the most a model file may declare.")
    return tuple(shape)


def _prefixed(tensors, prefix):
    """The tensors whose names start with ``prefix``, by the rest of their names."""
    return {name[len(prefix):]: tensor for name, tensor in tensors.items() if name.startswith(prefix)}


def _array(tensors, name, source):
    """The file's tensor ``name`` as a numpy array; refused where numpy has no such dtype (bfloat16, float8)."""
    try:
        return tensors[name].numpy()
    except TypeError:
        raise ValueError(f"{source}: tensor {name!r} has dtype {tensors[name].dtype}, which no fitted array outside "
                         "a module has.") from None


def _decode_regions(attributes, tensors, n_features, n_classes, source):
    """The region store, checked by :meth:`~smoothsk.regions.RegionStore.from_arrays` (names, shapes, values)."""
    saved = {name: _array(tensors, _REGIONS_PREFIX + name, source) for name in _prefixed(tensors, _REGIONS_PREFIX)}
    with _naming(source):
        return RegionStore.from_arrays(saved, attributes, n_features, n_classes)


@contextlib.contextmanager
def _naming(source):
    """A check's ValueError inside, raised again with ``source`` (the file) before its message."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _decode_params(document, classes, module, source):
    """Constructor parameters of the saved estimator; ``module`` (if given) replaces the saved one.

    Only the parameters a file may set are taken, each only with the kind of
    value it takes (see "Parameters a file may set"); any other is refused,
    naming it, before anything is built.
    """
    saved = document.get("params")
    if not isinstance(saved, dict):
        raise ValueError(f"{source}: the document has no parameters.")
    params = {}
    for name, value in saved.items():
        if not _is_file_parameter(name):
            raise ValueError(f"{source}: parameter {quoted(name)} is not one a model file may set (only "
                             "smoothsk's "
                             "parameters, the module, the optimizer and module__*/optimizer__* values; "
                             "callbacks, compile, criterion, iterators, datasets and torch_load_kwargs can name "
                             "code): set it in Python after loading if you need it.")
        if name == "module" and module is not None:
            params[name] = module
        elif name == "module" and isinstance(value, dict) and set(value) == {"instance"}:
            raise ValueError(f"{source}: the module was saved as an instance of {quoted(value['instance'])}, "
                             "which "
                             "a file cannot rebuild; pass one (or its class): load(path, module=...).")
        elif name in _CLASS_PARAMETERS:
            if not (isinstance(value, dict) and set(value) == {"type"}):
                raise ValueError(f"{source}: parameter {name!r} must be a class ({{'type': name}}); "
                                 f"got {quoted(value)}.")
            params[name] = _lookup(value["type"], name, classes, source)
        elif name in _COMPONENT_PARAMETERS:
            if not (value is None or isinstance(value, dict) and set(value) == {"class", "params"}):
                raise ValueError(f"{source}: parameter {name!r} must be None or a component "
                                 f"({{'class': name, 'params': {{...}}}}); got {quoted(value)}.")
            params[name] = _decode(value, name, classes, source)
        else:
            module_classes = classes if name.startswith(_MODULE_OPTION_PREFIX) else None
            params[name] = _decode_plain(value, name, name in _PLAIN_PARAMETERS, source, module_classes)
    device = params.get("device")
    if isinstance(device, str) and device.startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"{source} was saved with device={device!r}, but CUDA is not available: loading it "
                      "with device='cpu'.", DeviceWarning, stacklevel=4)
        params["device"] = "cpu"
    return params


def _decode_plain(value, name, scalar, source, module_classes=None):
    """The plain value ``value`` of parameter ``name``: a scalar, or (unless ``scalar``) a list or tuple of them.

    With ``module_classes`` (a ``module__*`` parameter), a scalar may also be
    a module class, ``{"type": name}``, looked up there only; nothing is
    built from the file's values (see "Parameters a file may set").
    """
    items = value.get("tuple") if isinstance(value, dict) and set(value) == {"tuple"} else value
    if not scalar and isinstance(items, list):
        decoded = [_decode_scalar(item, f"{name}[{i}]", module_classes, source) for i, item in enumerate(items)]
        if all(item is not _MALFORMED for item in decoded):
            return decoded if items is value else tuple(decoded)
    else:
        decoded = _decode_scalar(value, name, module_classes, source)
        if decoded is not _MALFORMED:
            return decoded
    if scalar:
        kinds = "None, a bool, a number or a string"
    else:
        kinds = ("None, a bool, a number, a string, " + ("a module class ({'type': name}), " if module_classes else "")
                 + "or a list or tuple of them")
    raise ValueError(f"{source}: parameter {name!r} must be {kinds}; got {quoted(value)}.")


def _decode_scalar(value, where, module_classes, source):
    """A plain scalar, or (with ``module_classes``) a module class named ``{"type": name}``; else ``_MALFORMED``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if module_classes is None or not (isinstance(value, dict) and set(value) == {"type"}):
        return _MALFORMED
    cls = _lookup(value["type"], where, module_classes, source)
    if not issubclass(cls, torch.nn.Module):
        raise ValueError(f"{source}: parameter {where} names {value['type']}, which is not a module class: a "
                         "module__ parameter names only module classes (nothing else is passed to a module).")
    return cls


def load_estimator(cls, path, module=None, allowed_classes=(), key=None):
    """Rebuild an estimator that :func:`save_estimator` wrote, without running code from the file.

    Tensors are read onto the CPU and copied into a module built on the
    estimator's ``device`` (a model saved from a GPU loads on a CPU-only
    machine, with a warning, with ``device='cpu'``).

    Parameters
    ----------
    cls : type
        The estimator class; the file must have been saved from it.
    path : str or path-like
    module : torch.nn.Module class or instance, optional
        The module to use instead of the saved ``module`` parameter (required
        when the module was saved as an instance without
        ``constructor_params()``, or its class is not on the allow-list). An
        instance receives the saved weights.
    allowed_classes : sequence of type, default=()
        Further classes the file may name (your own components or modules).
    key : bytes, optional
        The key the file was saved with: the file loads only if its
        HMAC-SHA256 under this key matches. A file saved with a key needs it.

    Returns
    -------
    estimator : cls
        Fitted: parameters, ``classes_`` (with its dtype), ``input_shape_``,
        ``module_`` weights, ``train_sigmas_``, ``regions_``, ``history``
        and the fitted certified sigma function ``sigma_search_`` as saved.

    Raises
    ------
    ValueError
        Naming the file and the problem: not a smoothsk file, an unknown
        format version, missing, extra or reshaped tensors, content that does
        not match its digest (or HMAC), a class not on the allow-list, a parameter
        a file may not set, malformed values, parameters the estimator class
        does not take, or sizes larger than the file justifies.
    TypeError
        If ``module`` or ``key`` has the wrong type.
    """
    key = check_key(key)
    if module is not None and not (isinstance(module, torch.nn.Module) or
                                   (isinstance(module, type) and issubclass(module, torch.nn.Module))):
        raise TypeError(f"module must be a torch.nn.Module class or instance, or None; got {module!r}.")
    source = str(path)
    document, tensors = read_model_file(Path(path), key)
    return _rebuild(cls, document, tensors, source, module, _allowed_classes(list(allowed_classes)))


def _rebuild(cls, document, tensors, source, module, classes):
    """The estimator that a checked document and its tensors describe: what loading returns.

    Saving builds it too (:func:`_check_rebuilt`), so that a file is written
    only when what loading it will give is the estimator saved. ``source``
    starts every error message; ``classes`` maps the names the document may
    use to classes.
    """
    if document.get("estimator") != class_name(cls, "the estimator"):
        raise ValueError(f"{source}: the file holds a {quoted(document.get('estimator'))}, not a "
                         f"{class_name(cls)!r}.")
    unknown = sorted(name for name in tensors
                     if not name.startswith((_MODULE_PREFIX, _REGIONS_PREFIX, _SIGMA_FUNCTION_PREFIX))
                     and name not in (_TRAIN_SIGMAS, _TRAIN_KEYS))
    if unknown:
        raise ValueError(f"{source}: the file holds tensors {unknown} that no fitted attribute uses.")
    params = _decode_params(document, classes, module, source)
    history = document.get("history")
    if not (isinstance(history, list) and all(isinstance(row, dict) for row in history)):
        raise ValueError(f"{source}: history must be a list of epoch records (JSON objects).")
    classes_ = _decode_classes(document.get("classes_"), source)
    input_shape = _decode_shape(document.get("input_shape_"), source)
    estimator = _built(lambda: cls(**params), source)
    estimator.classes_, estimator.input_shape_ = classes_, input_shape
    estimator.n_features_in_ = int(np.prod(input_shape))
    _check_sizes(estimator, source)
    saved_module = _prefixed(tensors, _MODULE_PREFIX)
    # The module's size is checked on the meta device against the file's tensors before it is built for real.
    _built(lambda: check_buildable(estimator._new_module, saved_module, source, "module_"), source)
    with allocation_budget(saved_module, source, "module_"):
        _built(estimator.initialize, source)  # skorch refuses parameters its class does not take here
    load_module_state(estimator.module_, saved_module, source)
    if _TRAIN_SIGMAS in tensors:
        train_sigmas = _array(tensors, _TRAIN_SIGMAS, source)
        if train_sigmas.ndim != 1 or train_sigmas.dtype.kind != "f":
            raise ValueError(f"{source}: train_sigmas_ must be a 1-d float array; got dtype "
                             f"{train_sigmas.dtype} and shape {train_sigmas.shape}.")
        with _naming(source):
            check_noise_levels(train_sigmas, "train_sigmas_")  # noise levels, as training wrote them
        estimator.train_sigmas_ = train_sigmas
    if _TRAIN_KEYS in tensors:  # whose sigmas train_sigmas_ are, for a later partial_fit
        train_keys, train_sigmas = _array(tensors, _TRAIN_KEYS, source), getattr(estimator, "train_sigmas_", None)
        if train_keys.dtype != np.uint64 or train_sigmas is None or train_keys.shape != train_sigmas.shape:
            raise ValueError(f"{source}: train_keys_ must be a uint64 array of train_sigmas_'s shape; got dtype "
                             f"{train_keys.dtype} and shape {train_keys.shape}.")
        estimator.train_keys_ = train_keys
    estimator.regions_ = _decode_regions(document.get("regions_"), tensors, estimator.n_features_in_,
                                         len(classes_), source)
    estimator.history = History(history)
    _decode_sigma_function(estimator, document.get("sigma_search_"), _prefixed(tensors, _SIGMA_FUNCTION_PREFIX),
                           classes, source)
    return estimator


#: What building or validating from a file's parameters raises besides ValueError: the parameters' fault,
#: never this process's (an OverflowError or MemoryError of a parameter no check foresaw).
_BUILD_ERRORS = (TypeError, RuntimeError, AttributeError, LookupError, ArithmeticError, MemoryError)


def _built(build, source):
    """``build()``, its errors (the saved parameters' fault) as one ValueError naming ``source``."""
    try:
        return build()
    except ValueError as exc:
        if str(exc).startswith(source) and "\n" not in str(exc):
            raise
        error = exc
    except _BUILD_ERRORS as exc:
        error = exc
    raise ValueError(f"{source}: cannot rebuild the estimator from the saved parameters: "
                     f"{type(error).__name__}: {one_line(error)}") from error


def _check_sizes(estimator, source):
    """Refuse saved components and settings that are invalid or would allocate more than a model file may ask."""
    for name in sorted(_COMPONENT_PARAMETERS):
        if getattr(estimator, name) is not None:
            _validate(getattr(estimator, name), name, source)
    _built(lambda: smoothing_components(estimator), source)
    batch_bytes = estimator.certify_batch_size * estimator.n_features_in_ * 4
    if batch_bytes > MAX_BATCH_BYTES:
        raise ValueError(f"{source}: certify_batch_size={estimator.certify_batch_size} makes batches of "
                         f"{batch_bytes / 2**30:.3g} GiB of noisy inputs, over the {MAX_BATCH_BYTES // 2**30} GiB a "
                         "model file may ask for; save a smaller one and set yours after loading "
                         "(set_params(certify_batch_size=...)).")
    if not (isinstance(estimator.device, str) and estimator.device.split(":")[0] in _FILE_DEVICES):
        raise ValueError(f"{source}: device {estimator.device!r} is not one a model file may name "
                         f"({', '.join(_FILE_DEVICES)}, with an index for cuda).")
    if estimator.n_jobs is not None and not 1 <= abs(estimator.n_jobs) <= MAX_N_JOBS:
        raise ValueError(f"{source}: n_jobs={estimator.n_jobs} asks for more workers than the {MAX_N_JOBS} a model "
                         "file may (set yours after loading: set_params(n_jobs=...)).")


def _validate(component, name, source):
    """``component.validate()``, its refusal one ValueError naming ``source`` and ``name``."""
    try:
        component.validate()
    except (ValueError, *_BUILD_ERRORS) as exc:
        raise ValueError(f"{source}: parameter {name!r} is invalid: {one_line(exc)}") from None


def _decode_sigma_function(estimator, saved, arrays, classes, source):
    """Set ``estimator.sigma_search_`` from its saved class, parameters and arrays (when the file has one)."""
    if saved is None:
        if arrays:
            raise ValueError(f"{source}: the file holds sigma_search_ tensors {sorted(arrays)} but no "
                             "sigma_search_ entry.")
        return
    sigma_function = _decode(saved, "sigma_search_", classes, source)
    if not callable(getattr(sigma_function, "restore_fitted", None)):
        raise ValueError(f"{source}: sigma_search_ is a {type(sigma_function).__name__}, which is not a certified "
                         "sigma function whose fitted state a file holds.")
    _validate(sigma_function, "sigma_search_", source)  # as the sigma_search parameter is (_check_sizes)
    estimator.sigma_search_ = _built(lambda: sigma_function.restore_fitted(estimator, arrays, source), source)
