"""Digests of objects by value: equal states give equal digests, whatever the objects' identities.

Pickling a tensor goes through its storage and gives other bytes for two equal
tensors, and a module's weights (its ``state_dict``) are not all of what it
computes: a plain attribute, a buffer left out of the ``state_dict`` or the
order of a ``Sequential``'s children change its outputs too. Checkpoints,
region stores and certified sigma functions identify modules and parameters
by :func:`value_digest` and :func:`module_fingerprint` instead.
"""

import functools
import types
import weakref
from collections import OrderedDict

import joblib
import numpy as np
import torch
from sklearn.neighbors import BallTree, KDTree

#: Values whose pickle is their value: kept as they are, for the one final hash (hashing each alone is slow).
_PLAIN = (bool, int, float, complex, str, bytes, type(None))
#: Objects pickled by reference (qualified name): hashed as they are, never walked.
_BY_REFERENCE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
                 functools.partial)


def _leaf_digest(value):
    """:func:`joblib.hash` of ``value``; by its type and ``repr`` where it cannot be pickled (a lambda, say)."""
    try:
        return joblib.hash(value)
    except Exception:  # noqa: BLE001 - pickling can fail with any error type
        return joblib.hash((type(value).__module__, type(value).__qualname__, repr(value)))


def _cell_contents(cell):
    """The value a closure captured in ``cell``; ``("empty cell",)`` for a variable not yet assigned."""
    try:
        return cell.cell_contents
    except ValueError:
        return ("empty cell",)


def _tensor_form(tensor):
    """A tensor as its layout, dtype, shape and bytes (a sparse tensor densified).

    A lazy module's parameter or buffer before its first forward has neither
    shape nor values: it is its kind and dtype.
    """
    if isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin):
        return ("uninitialized", type(tensor).__qualname__, str(tensor.dtype))
    layout = str(tensor.layout)
    tensor = tensor.detach().cpu()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    # An empty tensor may keep any stride through contiguous() (0 in a forged file), which view refuses.
    values = tensor.contiguous().reshape(-1) if tensor.numel() else tensor.new_empty(0)
    return ("tensor", layout, str(tensor.dtype), tuple(tensor.shape), values.view(torch.uint8).numpy())


def _value_form(value, ancestors=frozenset()):
    """A form of ``value`` that is equal for equal states: what :func:`value_digest` hashes.

    A tensor becomes its layout, dtype, shape and bytes. Lists and tuples map
    their items in order. A dict maps its items; the order counts for an
    ``OrderedDict`` and for a module's children (``_modules``: a
    ``Sequential`` runs them in that order), while a plain dict is compared
    as a mapping. Subclasses of these containers also keep their own
    attributes (a ``defaultdict`` its factory). An object that pickles by
    its state (a module, a scikit-learn-style component, a callback) becomes
    its class and the form of that state (``__getstate__()``, else
    ``__dict__``; a module's :func:`module_state`), so all of a module's
    state counts, not only its ``state_dict``: plain attributes,
    non-persistent buffers, hooks (in the order they run). A
    KD- or ball tree (a fitted neighbour index) becomes its arrays, without
    its query counters, which every query advances; a weak reference its
    referent (None once dead); a function its qualified name, bytecode,
    defaults and captured values (not the globals it reads); a
    ``functools.partial`` its function and arguments; a bound method its
    function and object.
    Anything else (numbers, strings, arrays, classes, built-in functions) is
    a leaf, hashed by :func:`_leaf_digest`.
    """
    if type(value) in _PLAIN:
        return value
    if isinstance(value, torch.Tensor):
        return _tensor_form(value)
    if type(value) is np.ndarray and value.dtype != object:
        return ("array", value)
    if id(value) in ancestors:
        return ("cycle", type(value).__module__, type(value).__qualname__)
    inner = ancestors | {id(value)}
    cls = type(value)
    if isinstance(value, (list, tuple, dict)):
        # A subclass's own attributes (a defaultdict's factory, a list subclass's fields) count too.
        extra = None if cls in (list, tuple, dict, OrderedDict) else [
            _value_form(vars(value), inner) if hasattr(value, "__dict__") else None,
            _leaf_digest(getattr(value, "default_factory", None))]
        if not isinstance(value, dict):
            return ("sequence", cls.__module__, cls.__qualname__, [_value_form(item, inner) for item in value], extra)
        if all(isinstance(key, (str, bytes, int, float, type(None))) for key in value):
            items = [(key, _value_form(item, inner)) for key, item in value.items()]
            if not isinstance(value, OrderedDict):
                items = dict(items)  # a mapping: joblib.hash sorts its keys
        else:  # keys by value too (an optimizer's state is keyed by its parameters), a mapping in their digests' order
            items = [(_value_form(key, inner), _value_form(item, inner)) for key, item in value.items()]
            if not isinstance(value, OrderedDict):
                items.sort(key=lambda pair: joblib.hash(pair[0]))
        return ("mapping", cls.__module__, cls.__qualname__, items, extra)
    if isinstance(value, types.MethodType):  # its function and the object it is bound to (often an ancestor)
        return ("method", _value_form(value.__func__, inner), _value_form(value.__self__, inner))
    if isinstance(value, types.FunctionType):
        # By what it computes, not its identity (a lambda made in ``__init__``
        # is a new function in every instance): its code (two lambdas share a
        # name), defaults and captured values. Globals it reads are not part.
        cells = [_cell_contents(cell) for cell in value.__closure__ or ()]
        return ("function", value.__module__, value.__qualname__, _value_form(value.__code__, inner),
                _value_form(value.__defaults__, inner), _value_form(value.__kwdefaults__, inner),
                _value_form(cells, inner))
    if isinstance(value, types.CodeType):  # its bytecode and constants (nested functions' code among them)
        return ("code", value.co_code, value.co_names, _value_form(value.co_consts, inner))
    if isinstance(value, functools.partial):
        return ("partial", _value_form(value.func, inner), _value_form(value.args, inner),
                _value_form(value.keywords, inner))
    if isinstance(value, weakref.ref):  # a new reference in every copy: its referent is the state
        return ("weakref", _value_form(value(), inner))
    if isinstance(value, (KDTree, BallTree)):  # a neighbour index: its arrays, not its query counters
        return ("tree", cls.__module__, cls.__qualname__, [_leaf_digest(array) for array in value.get_arrays()])
    if (hasattr(value, "__dict__") and not isinstance(value, _BY_REFERENCE)
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__):
        if isinstance(value, torch.nn.Module):
            state = module_state(value)
        else:
            getstate = getattr(value, "__getstate__", None)
            state = getstate() if getstate is not None else vars(value)
        return ("object", cls.__module__, cls.__qualname__, _value_form(state, inner))
    return ("leaf", _leaf_digest(value))


def module_state(module):
    """A module's own state as digests see it (its children are modules in it, not walked here).

    Its attributes (``__dict__``, not ``__getstate__``, which a parametrized
    module makes raise) without the train/eval flag (certification runs every
    module in eval mode); ``_modules`` as an ordered mapping (the children's
    order is the forward's); each hook dict keyed by the hook's rank among
    the module's hooks, not its handle id: ids come from a global counter,
    so two modules built alike hold equal hooks under other ids, while ranks
    keep the order hooks run in and which entries of two dicts (a hook and
    its ``with_kwargs`` flag) match.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    dict
    """
    state = {key: item for key, item in vars(module).items() if key != "training"}
    state["_modules"] = OrderedDict(state.get("_modules", {}))
    hooks = {key: item for key, item in state.items() if "hooks" in key and isinstance(item, dict)}
    rank = {hook_id: i for i, hook_id in enumerate(sorted({hook_id for item in hooks.values() for hook_id in item}))}
    state.update((key, OrderedDict((rank[hook_id], hook) for hook_id, hook in item.items()))
                 for key, item in hooks.items())
    return state


def value_digest(value):
    """Digest of ``value`` by value (see :func:`_value_form`).

    Parameters
    ----------
    value : object

    Returns
    -------
    str
        Hex digest, equal for equal states.

    Examples
    --------
    >>> import torch
    >>> a, b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    >>> _ = b.load_state_dict(a.state_dict())
    >>> value_digest(a) == value_digest(b)
    True
    >>> b.scale = 2.0  # a plain attribute its forward could read
    >>> value_digest(a) == value_digest(b)
    False
    """
    return joblib.hash(_value_form(value))


def module_fingerprint(module):
    """Digest of everything a module computes with, in eval mode: weights, other state, children in order.

    Region stores, checkpoints and certified sigma functions identify a
    model by it: unlike the weights' fingerprint
    (:func:`smoothsk.regions._store.weights_fingerprint`, the ``state_dict``
    alone), it also changes with a plain attribute, a non-persistent buffer,
    a hook or the order of the children.

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    str
        Hex digest.
    """
    return value_digest(module)
