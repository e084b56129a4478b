"""Parameter values as JSON data: the form a saved model file holds them in.

:mod:`smoothsk._persistence` writes parameters so (its docstring describes
the format) and names classes by its allow-list; the per-sample training
keys (:mod:`smoothsk.training._per_sample`) hash a schedule's parameters in
this form, so that they survive a save and load. It imports no smoothsk
module: both build on it.
"""

from numbers import Integral, Real

import numpy as np
import torch


def refuse(where, value, what):
    """Raise the ValueError of a parameter ``where=value`` that a file cannot hold; ``what`` says what it can."""
    raise ValueError(f"Cannot save parameter {where}={value!r}: a saved model holds only {what}; "
                     f"{type(value).__name__} is none of these.")


def plain(value, where):
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
        return [plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: plain(item, f"{where}[{key!r}]") for key, item in value.items()}
    return refuse(where, value, "JSON data (None, bool, numbers, strings, lists, dicts with string keys)")


def encode(value, where, named, class_name):
    """JSON form of the parameter value ``value`` (the format of :mod:`smoothsk._persistence`).

    Parameters
    ----------
    value : object
        None, a bool, a number, a string, a list, a tuple, a dict with
        string keys, a class or a scikit-learn-style component (an object
        with ``get_params``, not a module), nested.
    where : str
        Names the parameter in errors.
    named : dict
        Receives every class written (its name -> the class).
    class_name : callable
        ``class_name(cls, where)``: the name recorded for the class ``cls``.

    Returns
    -------
    JSON data

    Raises
    ------
    ValueError
        If ``value`` holds anything else (a function, a ``RandomState``, an array).
    """
    if value is None or isinstance(value, (bool, str, np.bool_, Integral, Real)):
        return plain(value, where)
    if isinstance(value, list):
        return [encode(item, f"{where}[{i}]", named, class_name) for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return {"tuple": [encode(item, f"{where}[{i}]", named, class_name) for i, item in enumerate(value)]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"dict": {key: encode(item, f"{where}[{key!r}]", named, class_name) for key, item in value.items()}}
    if isinstance(value, type):
        named[class_name(value, where)] = value
        return {"type": class_name(value, where)}
    if hasattr(value, "get_params") and not isinstance(value, torch.nn.Module):
        named[class_name(type(value), where)] = type(value)
        return {"class": class_name(type(value), where),
                "params": {key: encode(item, f"{where}.{key}", named, class_name)
                           for key, item in value.get_params(deep=False).items()}}
    return refuse(where, value, "None, bool, numbers, strings, lists, tuples, dicts with string keys, "
                                "classes and scikit-learn-style components (objects with get_params)")
