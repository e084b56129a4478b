"""Parameter constraints: scikit-learn's constraint language, imported in one place.

Every smoothsk component declares ``_parameter_constraints`` in scikit-learn's
constraint language (``Interval``, ``StrOptions``, ``HasMethods``) and checks
them with its validator, so that a bad parameter gets scikit-learn's usual
``InvalidParameterError`` naming the parameter and what was expected. That
language lives in the private module ``sklearn.utils._param_validation``, which
scikit-learn may change in any release. smoothsk imports it here only, and
``pyproject.toml`` bounds scikit-learn to the minor releases the suite was run
with: a release that moves it fails at install or at this import, never
silently inside a component.

:func:`validate_parameter_constraints` is scikit-learn's, with one rule
added for every component and the estimator alike: a bool is not a number,
alone or inside an array of numbers.
"""

from numbers import Integral

import numpy as np
import torch
from sklearn.utils._param_validation import (
    HasMethods,
    Hidden,
    Interval,
    InvalidParameterError,
    Options,
    StrOptions,
    make_constraint,
)
from sklearn.utils._param_validation import validate_parameter_constraints as _validate_with_sklearn

from ._messages import quoted

__all__ = ["MAX_SAMPLE_SIZE", "SAMPLE_SIZE", "HasMethods", "Hidden", "Interval", "InvalidParameterError", "Options",
           "StrOptions", "holds_bool", "validate_parameter_constraints"]

#: The most Monte Carlo samples per input any sample-size parameter takes (``n``, ``n0``, ``n_max``, ...):
#: 10,000 times Cohen et al.'s 100,000, so no real run meets it, while a value from a file (``n=10**18``)
#: is refused when the file is loaded instead of asking for years of sampling.
MAX_SAMPLE_SIZE = 10**9
#: The constraint of every sample-size parameter: an int in [1, MAX_SAMPLE_SIZE].
SAMPLE_SIZE = Interval(Integral, 1, MAX_SAMPLE_SIZE, closed="both")
#: How deep :func:`holds_bool` looks into nested containers (numpy's most dimensions).
_MAX_DEPTH = 64


def holds_bool(value):
    """Whether ``value`` is a bool or a list, tuple or array holding one (numpy's and torch's bools included).

    Containers are looked into at most :data:`_MAX_DEPTH` deep (numpy's most
    dimensions), and each once, so a self-referential list ends.

    Parameters
    ----------
    value : object

    Returns
    -------
    bool
    """
    pending, seen = [(value, 0)], set()
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (bool, np.bool_)) or (isinstance(item, torch.Tensor) and item.dtype == torch.bool):
            return True
        if depth < _MAX_DEPTH and id(item) not in seen and (
                isinstance(item, (list, tuple)) or (isinstance(item, np.ndarray) and item.dtype.kind in "bO")):
            seen.add(id(item))
            pending.extend((inner, depth + 1) for inner in (item.flat if isinstance(item, np.ndarray) else item))
    return False


def validate_parameter_constraints(parameter_constraints, params, caller_name):
    """scikit-learn's ``validate_parameter_constraints``, with a bool refused wherever no constraint is "boolean".

    ``bool`` is a subclass of ``int`` in Python, so scikit-learn's
    ``Interval(Integral, ...)`` and ``Interval(Real, ...)`` take ``True``
    as 1: ``n=True`` in code, or a JSON ``true`` in a model file, would run
    as one sample, and ``sigma=True`` as sigma 1.0. Likewise numpy reads
    ``[True, 0.5]`` as ``[1.0, 0.5]``, so an ``"array-like"`` parameter
    holding a bool is refused too. Only the ``"boolean"`` constraint admits
    a bool: declare a parameter that takes one (or an array of them) with it.

    Parameters
    ----------
    parameter_constraints : dict of str to list
        Each parameter's constraints, in scikit-learn's language.
    params : dict of str to object
        The values to check.
    caller_name : str
        Named in the message.

    Raises
    ------
    InvalidParameterError
        scikit-learn's message: "The 'name' parameter of caller must be
        ... Got value instead."
    """
    for name, value in params.items():
        constraints = parameter_constraints.get(name, "no_validation")
        if constraints == "no_validation" or "boolean" in constraints:
            continue
        inside_an_array = not isinstance(value, bool) and "array-like" in constraints
        if not (holds_bool(value) if inside_an_array else isinstance(value, bool)):
            continue
        # As scikit-learn words it: its hidden constraints (a deprecated value, say) left out.
        expected = [str(constraint) for constraint in map(make_constraint, constraints) if not constraint.hidden]
        expected = expected[0] if len(expected) == 1 else f"{', '.join(expected[:-1])} or {expected[-1]}"
        if inside_an_array:
            expected = expected.replace("an array-like", "an array-like of numbers (a bool is not one)")
        raise InvalidParameterError(f"The {name!r} parameter of {caller_name} must be {expected}. "
                                    f"Got {quoted(value)} instead.")
    _validate_with_sklearn(parameter_constraints, params, caller_name=caller_name)
