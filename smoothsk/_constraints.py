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
"""

from numbers import Integral

from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    InvalidParameterError,
    StrOptions,
    validate_parameter_constraints,
)

__all__ = ["MAX_SAMPLE_SIZE", "SAMPLE_SIZE", "HasMethods", "Interval", "InvalidParameterError", "StrOptions",
           "validate_parameter_constraints"]

#: The most Monte Carlo samples per input any sample-size parameter takes (``n``, ``n0``, ``n_max``, ...):
#: 10,000 times Cohen et al.'s 100,000, so no real run meets it, while a value from a file (``n=10**18``)
#: is refused when the file is loaded instead of asking for years of sampling.
MAX_SAMPLE_SIZE = 10**9
#: The constraint of every sample-size parameter: an int in [1, MAX_SAMPLE_SIZE].
SAMPLE_SIZE = Interval(Integral, 1, MAX_SAMPLE_SIZE, closed="both")
