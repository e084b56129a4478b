"""One noise level for every input (Cohen et al. 2019)."""

from numbers import Real

import numpy as np

from .._constraints import Interval
from ._base import BaseSigmaSearch, SigmaSearchResult


class FixedSigma(BaseSigmaSearch):
    """The same sigma for every input: classic randomized smoothing.

    Parameters
    ----------
    sigma : float, default=0.25
        Noise standard deviation, > 0, in the model's input space.

    Examples
    --------
    >>> FixedSigma(0.5)
    FixedSigma(sigma=0.5)
    """

    _parameter_constraints = {"sigma": [Interval(Real, 0, None, closed="neither")]}

    def __init__(self, sigma=0.25):
        self.sigma = sigma

    def noise_levels(self):
        """The one level ``sigma``."""
        return np.array([float(self.sigma)])

    def _search(self, engine, X, y):
        n_inputs = len(X)
        return SigmaSearchResult(np.full(n_inputs, float(self.sigma)), np.zeros(n_inputs, dtype=np.int64))
