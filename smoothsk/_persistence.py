"""Saving a fitted estimator to one safetensors file, and loading it without running code.

What the file holds
-------------------
A `safetensors <https://huggingface.co/docs/safetensors>`_ file stores named
arrays and a string-to-string header; reading one runs no code (unlike pickle,
which joblib uses). A saved estimator is one such file:

- tensors, written from the CPU bit for bit: the module's ``state_dict``
  (``module_.<key>``), ``train_sigmas_`` and ``train_keys_``, the arrays of the region store
  (``regions_.<name>``, see :meth:`~smoothsk.regions.RegionStore.to_arrays`)
  and the fitted state of a certified sigma function (``sigma_search_.<name>``,
  see below);
- header entry ``smoothsk``: a JSON document (keys sorted, no spaces) with
  the format version (:data:`FORMAT_VERSION`), the library version, the
  estimator class, its parameters (``get_params(deep=False)``), ``classes_``
  (values and numpy dtype), ``input_shape_``, the region store's scalar
  attributes (a file without ``autocast``, the precision its regions were
  certified in, was saved before stores recorded it: its regions are
  refused until ``reset_regions()``), skorch's ``history``, the fitted
  certified sigma function's class and parameters (``sigma_search_``, or
  null), and a manifest of every tensor's dtype and shape;
- header entry ``smoothsk_sha256``: the hex SHA-256 of the JSON document's
  UTF-8 bytes followed by the raw bytes of each tensor (as stored) in sorted
  name order.

One file, not a directory with weights and a JSON file beside them: it is
copied, moved and written (through a temporary file and a rename, so a crash
never leaves half a model) as one unit, and one digest covers the tensors and
the JSON together. Region centres go in as tensors, not JSON lists: they are
(n_regions, n_features) float32, exact and compact that way, and checked by
the digest like the weights.

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

Format versions
---------------
Version 2 (:data:`FORMAT_VERSION`) added ``sigma_search_``: the fitted
certified sigma function
(:class:`~smoothsk.sigma.BaseCertifiedSigma`) that certificates of ``G``
need, e.g. the trained selector module of
:class:`~smoothsk.sigma.CertifiedSigmaSelector` or the training inputs of
:class:`~smoothsk.sigma.SemiElasticSigma`'s nearest-neighbour rule. A class
saves it when it provides ``fitted_arrays()`` (its state as named tensors)
and ``restore_fitted(estimator, arrays, source)`` (which checks them and
rebuilds what derives from them: a module from the saved parameters, a
neighbour index); saving refuses any other fitted sigma function rather
than write a file whose loaded estimator could not certify. Version 1 is
version 2 without ``sigma_search_``; both are read (:data:`READ_VERSIONS`),
any other version is refused.

Parameters in JSON
------------------
A parameter value is saved as itself when it is None, a bool, a number, a
string or a list; a tuple as ``{"tuple": [...]}``, a dict with string keys as
``{"dict": {...}}``, a class as ``{"type": "dotted.Name"}``, and a
scikit-learn-style component (an object with ``get_params``) as
``{"class": "dotted.Name", "params": {...}}`` (recursively). Anything else (a
function, a ``RandomState``, an array) is refused when saving, naming the
parameter. A module *instance* (``module=MyNet(...)``) is recorded by its
class only, and must be passed again to :func:`load_estimator`.

Classes are never imported from a name in the file. A name is looked up in an
allow-list: smoothsk's public classes, the losses of ``torch.nn``, the
optimizers of ``torch.optim``, ``torch.utils.data.DataLoader`` and skorch's
``Dataset``, plus classes the caller passes explicitly. Components are then
rebuilt by calling their class with the saved parameters, which only stores
them (scikit-learn's ``__init__`` contract).

Not saved
---------
- The optimizer's state (momentum buffers, Adam moments): a saved model is for
  inference; ``partial_fit`` after loading continues from the saved weights
  with a fresh optimizer.
- ``callbacks``: skorch callbacks are objects that hold functions (``print``
  as a sink, scoring callables), which a format without code cannot carry. The
  loaded estimator has ``callbacks=None``; set them again with ``set_params``
  before training further. Saving warns when callbacks are set.
- The fitted copy of the training schedule (``training_``) and its stage:
  every ``fit``/``partial_fit`` sets them again (the stage from the history).

The digest detects accidental corruption and naive edits. It is not a
signature: there is no secret key, so whoever edits a file can recompute it.
Loading is safe against code execution whatever the file holds; whether its
weights and parameters deserve trust is the user's call.
"""

import copy
import hashlib
import json
import warnings
from functools import cache
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from skorch.dataset import Dataset as SkorchDataset
from skorch.exceptions import DeviceWarning
from skorch.history import History
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm
from torch.utils.data import DataLoader
from torch.utils.hooks import RemovableHandle

from . import models, regions, sampling, sigma, training
from ._atomic import atomic_file, unwritable_reason
from ._digest import value_digest
from .regions import RegionStore
from .regions._store import UNRECORDED

__all__ = ["FORMAT_VERSION", "READ_VERSIONS", "load_estimator", "save_estimator"]

#: Version of the file layout that saving writes.
FORMAT_VERSION = 2
#: Versions loading reads (see "Format versions"); it refuses any other.
READ_VERSIONS = (1, 2)
#: Header entries holding the JSON document and its digest.
DOCUMENT_KEY = "smoothsk"
DIGEST_KEY = "smoothsk_sha256"

_MODULE_PREFIX = "module_."
_REGIONS_PREFIX = "regions_."
_SIGMA_FUNCTION_PREFIX = "sigma_search_."
_TRAIN_SIGMAS = "train_sigmas_"
_TRAIN_KEYS = "train_keys_"
_ABSENT = object()  # an attribute one of two compared objects lacks
_ALLOWED = ("smoothsk's public classes, torch.nn losses, torch.optim optimizers, "
            "torch.utils.data.DataLoader and skorch.dataset.Dataset")


# ------------------------------------------------------------------ class names

@cache
def _builtin_classes():
    """The allow-list: dotted public name -> class, for classes any file may name."""
    named = {}
    for module in (sigma, sampling, regions, training, models):
        for attr in module.__all__:
            if isinstance(getattr(module, attr), type):
                named[f"{module.__name__}.{attr}"] = getattr(module, attr)
    for module, base in ((torch.nn, torch.nn.modules.loss._Loss), (torch.optim, torch.optim.Optimizer)):
        for attr in dir(module):
            obj = getattr(module, attr)
            if isinstance(obj, type) and issubclass(obj, base):
                named[f"{module.__name__}.{attr}"] = obj
    named["torch.utils.data.DataLoader"] = DataLoader
    named["skorch.dataset.Dataset"] = SkorchDataset
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

def _refuse(where, value, what):
    raise ValueError(f"Cannot save parameter {where}={value!r}: a saved model holds only {what}; "
                     f"{type(value).__name__} is none of these.")


def _plain(value, where):
    """``value`` as JSON data (None, bool, numbers, strings, lists, dicts with string keys)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _plain(item, f"{where}[{key!r}]") for key, item in value.items()}
    return _refuse(where, value, "JSON data (None, bool, numbers, strings, lists, dicts with string keys)")


def _encode(value, where, named):
    """JSON form of the parameter value ``value`` (see the module docstring); ``where`` names it.

    Every class it writes goes into the dict ``named`` (dotted name -> class).
    """
    if value is None or isinstance(value, (bool, str, np.bool_, Integral, Real)):
        return _plain(value, where)
    if isinstance(value, list):
        return [_encode(item, f"{where}[{i}]", named) for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, f"{where}[{i}]", named) for i, item in enumerate(value)]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"dict": {key: _encode(item, f"{where}[{key!r}]", named) for key, item in value.items()}}
    if isinstance(value, type):
        named[class_name(value, where)] = value
        return {"type": class_name(value, where)}
    if hasattr(value, "get_params") and not isinstance(value, torch.nn.Module):
        named[class_name(type(value), where)] = type(value)
        return {"class": class_name(type(value), where),
                "params": {key: _encode(item, f"{where}.{key}", named)
                           for key, item in value.get_params(deep=False).items()}}
    return _refuse(where, value, "None, bool, numbers, strings, lists, tuples, dicts with string keys, "
                                 "classes and scikit-learn-style components (objects with get_params)")


def _decode(value, where, classes, source):
    """The parameter value that :func:`_encode` wrote as ``value``; classes only from ``classes``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(item, f"{where}[{i}]", classes, source) for i, item in enumerate(value)]
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"tuple"} and isinstance(value["tuple"], list):
            return tuple(_decode(item, f"{where}[{i}]", classes, source) for i, item in enumerate(value["tuple"]))
        if keys == {"dict"} and isinstance(value["dict"], dict):
            return {key: _decode(item, f"{where}[{key!r}]", classes, source) for key, item in value["dict"].items()}
        if keys == {"type"}:
            return _lookup(value["type"], where, classes, source)
        if keys == {"class", "params"} and isinstance(value["params"], dict):
            cls = _lookup(value["class"], where, classes, source)
            params = {key: _decode(item, f"{where}.{key}", classes, source) for key, item in value["params"].items()}
            try:
                return cls(**params)
            except TypeError as exc:
                raise ValueError(f"{source}: cannot rebuild {where} as {value['class']}(...): {exc}") from exc
    raise ValueError(f"{source}: parameter {where} has a malformed saved value {value!r}.")


def _lookup(name, where, classes, source):
    """The allowed class called ``name``; refused (nothing imported) when it is not on the allow-list."""
    if isinstance(name, str) and name in classes:
        return classes[name]
    raise ValueError(
        f"{source}: parameter {where} names the class {name!r}, which is not on the allow-list of classes "
        f"a saved model may name ({_ALLOWED}); nothing was imported. If you trust the file and the class, "
        "pass it explicitly: load(path, allowed_classes=[TheClass]) (or module=TheClass for the module).")


# --------------------------------------------------------------------- tensors

def _digest(document, tensors):
    """Hex SHA-256 of the JSON document's bytes, then each tensor's bytes in sorted name order."""
    digest = hashlib.sha256(document.encode("utf-8"))
    for name in sorted(tensors):
        if tensors[name].numel():  # an empty tensor has no bytes (and no byte view)
            digest.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _tensor_spec(tensor):
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}


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
    return _encode(sigma_function, "sigma_search_", named)


# ------------------------------------------------------------------------ save

def save_estimator(estimator, path):
    """Write fitted ``estimator`` to ``path`` as one safetensors file (see the module docstring).

    Every value is checked before anything is written, so a refused save
    leaves no file behind; the file appears by an atomic rename.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        A fitted estimator.
    path : str or path-like
        File to write (overwritten if it exists).

    Raises
    ------
    ValueError
        If ``path`` is a directory or its folder does not exist or is not
        writable; if a parameter (or a component's parameter, or a history entry) is
        not one the format holds, if the estimator class takes no such
        parameter, or if the module (or the fitted sigma function) holds
        state the file cannot hold; the message names it.
    """
    from . import __version__

    estimator.check_is_fitted()
    path = Path(path)
    reason = unwritable_reason(path)
    if reason:
        raise ValueError(f"Cannot save {path}: {reason}.")
    named = {}
    sigma_function = _encode_sigma_function(estimator, named)
    params = estimator.get_params(deep=False)
    if params.pop("callbacks", None) is not None:
        warnings.warn("callbacks are not saved (skorch callbacks hold functions, which a file without code "
                      "cannot carry); set them again on the loaded estimator before training it further.",
                      UserWarning, stacklevel=3)
    module = params.pop("module")
    encoded = {"module": ({"instance": class_name(type(module), "module")} if isinstance(module, torch.nn.Module)
                          else _encode(module, "module", named))}
    encoded.update((name, _encode(value, name, named)) for name, value in params.items())
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
        "tensors": {name: _tensor_spec(tensor) for name, tensor in tensors.items()},
    }
    _check_rebuilt(estimator, document, tensors, f"Cannot save {path}", module, named)
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    content = safetensors_bytes(tensors, metadata={DOCUMENT_KEY: text, DIGEST_KEY: _digest(text, tensors)})
    with atomic_file(path) as file:
        file.write(content)


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

def _read(path):
    """The JSON document and tensors of a smoothsk file, checked against its manifest and digest."""
    if path.is_dir():
        raise ValueError(f"{path}: it is a directory, not a smoothsk model file.")
    try:
        with safe_open(path, framework="pt", device="cpu") as file:
            metadata = file.metadata() or {}
            tensors = {name: file.get_tensor(name) for name in file.keys()}
    except SafetensorError as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc}).") from exc
    if DOCUMENT_KEY not in metadata or DIGEST_KEY not in metadata:
        raise ValueError(f"{path}: not a smoothsk model file (its safetensors header has no "
                         f"{DOCUMENT_KEY!r} and {DIGEST_KEY!r} entries).")
    try:
        document = json.loads(metadata[DOCUMENT_KEY])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: its {DOCUMENT_KEY!r} header entry is not valid JSON ({exc}).") from exc
    if not isinstance(document, dict):
        raise ValueError(f"{path}: its {DOCUMENT_KEY!r} header entry is not a JSON object.")
    version = document.get("format_version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise ValueError(f"{path}: format version {version!r} is not one this smoothsk reads "
                         f"({', '.join(map(str, READ_VERSIONS))}); the file says smoothsk "
                         f"{document.get('library_version')!r} wrote it.")
    if version == 1 and "sigma_search_" in document:
        raise ValueError(f"{path}: format version 1 has no sigma_search_ entry, but the document holds one.")
    manifest = document.get("tensors")
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: the document has no tensor manifest.")
    missing, extra = sorted(set(manifest) - set(tensors)), sorted(set(tensors) - set(manifest))
    if missing:
        raise ValueError(f"{path}: tensors {missing} are missing from the file.")
    if extra:
        raise ValueError(f"{path}: the file holds tensors {extra} that its manifest does not list.")
    for name, spec in manifest.items():
        if spec != _tensor_spec(tensors[name]):
            raise ValueError(f"{path}: tensor {name!r} has {_tensor_spec(tensors[name])} but the manifest "
                             f"says {spec}: the tensor was reshaped or replaced.")
    if _digest(metadata[DOCUMENT_KEY], tensors) != metadata[DIGEST_KEY]:
        raise ValueError(f"{path}: the content does not match its SHA-256 digest: the file was edited or "
                         "corrupted after it was saved.")
    return document, tensors


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
    if dtype is None or dtype.kind not in "biufUO" or len(values) < 2 or not plain:
        raise ValueError(f"{source}: classes_ is malformed: expected at least 2 labels (numbers or strings) "
                         f"of a bool, int, float, string or object dtype; got {spec!r}.")
    classes = np.empty(len(values), dtype=dtype)
    classes[:] = values
    if classes.tolist() != values:
        raise ValueError(f"{source}: classes_ values {values!r} do not fit their dtype {spec['dtype']!r}.")
    return classes


def _decode_shape(shape, source):
    if not (isinstance(shape, list) and shape and all(type(size) is int and size > 0 for size in shape)):
        raise ValueError(f"{source}: input_shape_ must be a non-empty list of positive ints; got {shape!r}.")
    return tuple(shape)


def _prefixed(tensors, prefix):
    """The tensors whose names start with ``prefix``, by the rest of their names."""
    return {name[len(prefix):]: tensor for name, tensor in tensors.items() if name.startswith(prefix)}


def load_module_state(module, saved, source, what="module_"):
    """Copy ``saved`` into ``module``'s state after checking names, shapes and dtypes.

    Parameters
    ----------
    module : torch.nn.Module
        Built from the saved parameters.
    saved : dict of str to torch.Tensor
        The file's tensors of this module, by state-dict key.
    source : str
        The file, named in errors.
    what : str, default="module_"
        The module's role, named in errors.

    Raises
    ------
    ValueError
        If a key is missing or extra, or a tensor's dtype or shape differs.
    """
    expected = module.state_dict()
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing:
        raise ValueError(f"{source}: {what} tensors {missing} are missing from the file (the "
                         f"{type(module).__name__} built from the saved parameters has them).")
    if extra:
        raise ValueError(f"{source}: the file has {what} tensors {extra} that the {type(module).__name__} "
                         "built from the saved parameters does not have.")
    for key, tensor in expected.items():
        if _tensor_spec(saved[key]) != _tensor_spec(tensor):
            raise ValueError(f"{source}: {what} tensor {key!r} has {_tensor_spec(saved[key])} in the file, "
                             f"but the {type(module).__name__} built from the saved parameters has "
                             f"{_tensor_spec(tensor)}.")
    module.load_state_dict(saved, strict=True)


def _decode_regions(attributes, tensors, n_features, source):
    """The region store, its arrays checked against an empty store's names, dtypes and row shapes."""
    template_arrays, template_attributes = RegionStore.empty(n_features).to_arrays()
    saved = {name: tensor.numpy() for name, tensor in _prefixed(tensors, _REGIONS_PREFIX).items()}
    if set(saved) != set(template_arrays):
        raise ValueError(f"{source}: the region arrays are {sorted(saved)}; expected {sorted(template_arrays)}.")
    for name, template in template_arrays.items():
        if saved[name].dtype != template.dtype or saved[name].shape[1:] != template.shape[1:]:
            raise ValueError(f"{source}: region array {name!r} has dtype {saved[name].dtype} and shape "
                             f"{saved[name].shape}; expected dtype {template.dtype} and shape "
                             f"{('n_regions',) + template.shape[1:]}.")
    if len({len(array) for array in saved.values()}) > 1:
        raise ValueError(f"{source}: the region arrays have different numbers of rows "
                         f"{ {name: len(array) for name, array in saved.items()} }.")
    if isinstance(attributes, dict) and "autocast" not in attributes:
        attributes = {**attributes, "autocast": UNRECORDED}  # saved before stores recorded their precision
    if not (isinstance(attributes, dict) and set(attributes) == set(template_attributes) and all(
            template is None or type(attributes[name]) is type(template)
            for name, template in template_attributes.items())):
        raise ValueError(f"{source}: the region attributes {attributes!r} do not match "
                         f"{ {name: type(value).__name__ for name, value in template_attributes.items()} }.")
    return RegionStore.from_arrays(saved, attributes)


def _decode_params(document, classes, module, source):
    """Constructor parameters of the saved estimator; ``module`` (if given) replaces the saved one."""
    saved = document.get("params")
    if not isinstance(saved, dict):
        raise ValueError(f"{source}: the document has no parameters.")
    params = {}
    for name, value in saved.items():
        if name != "module":
            params[name] = _decode(value, name, classes, source)
        elif module is not None:
            params[name] = module
        elif isinstance(value, dict) and set(value) == {"instance"}:
            raise ValueError(f"{source}: the module was saved as an instance of {value['instance']!r}, which "
                             "a file cannot rebuild; pass one (or its class): load(path, module=...).")
        else:
            params[name] = _decode(value, name, classes, source)
    device = params.get("device")
    if isinstance(device, str) and device.startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"{source} was saved with device={device!r}, but CUDA is not available: loading it "
                      "with device='cpu'.", DeviceWarning, stacklevel=4)
        params["device"] = "cpu"
    return params


def load_estimator(cls, path, module=None, allowed_classes=()):
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
        when the module was saved as an instance, or its class is not on the
        allow-list). An instance receives the saved weights.
    allowed_classes : sequence of type, default=()
        Further classes the file may name (your own components or modules).

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
        not match its digest, a class not on the allow-list, malformed values,
        parameters the estimator class does not take.
    """
    if module is not None and not (isinstance(module, torch.nn.Module) or
                                   (isinstance(module, type) and issubclass(module, torch.nn.Module))):
        raise TypeError(f"module must be a torch.nn.Module class or instance, or None; got {module!r}.")
    source = str(path)
    document, tensors = _read(Path(path))
    return _rebuild(cls, document, tensors, source, module, _allowed_classes(list(allowed_classes)))


def _rebuild(cls, document, tensors, source, module, classes):
    """The estimator that a checked document and its tensors describe: what loading returns.

    Saving builds it too (:func:`_check_rebuilt`), so that a file is written
    only when what loading it will give is the estimator saved. ``source``
    starts every error message; ``classes`` maps the names the document may
    use to classes.
    """
    if document.get("estimator") != class_name(cls, "the estimator"):
        raise ValueError(f"{source}: the file holds a {document.get('estimator')!r}, not a {class_name(cls)!r}.")
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
    try:
        estimator = cls(**params)
        estimator.classes_, estimator.input_shape_ = classes_, input_shape
        estimator.n_features_in_ = int(np.prod(input_shape))
        estimator.initialize()  # skorch refuses parameters its class does not take here, with a ValueError
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: cannot rebuild the estimator from the saved parameters: {exc} (skorch "
                         "counts any attribute set on an estimator, estimator.name = value, among its "
                         "parameters: delete such an attribute before saving.)") from exc
    load_module_state(estimator.module_, _prefixed(tensors, _MODULE_PREFIX), source)
    if _TRAIN_SIGMAS in tensors:
        train_sigmas = tensors[_TRAIN_SIGMAS].numpy()
        if train_sigmas.ndim != 1 or train_sigmas.dtype.kind != "f":
            raise ValueError(f"{source}: train_sigmas_ must be a 1-d float array; got dtype "
                             f"{train_sigmas.dtype} and shape {train_sigmas.shape}.")
        estimator.train_sigmas_ = train_sigmas
    if _TRAIN_KEYS in tensors:  # whose sigmas train_sigmas_ are, for a later partial_fit
        estimator.train_keys_ = tensors[_TRAIN_KEYS].numpy()
    estimator.regions_ = _decode_regions(document.get("regions_"), tensors, estimator.n_features_in_, source)
    estimator.history = History(history)
    _decode_sigma_function(estimator, document.get("sigma_search_"), _prefixed(tensors, _SIGMA_FUNCTION_PREFIX),
                           classes, source)
    return estimator


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
    estimator.sigma_search_ = sigma_function.restore_fitted(estimator, arrays, source)
