"""Cohen et al.'s CERTIFY: the same sample sizes for every input (IAS)."""

from numbers import Integral

import numpy as np
from sklearn.utils._param_validation import Interval

from ..certificates import ABSTAIN
from ..statistics import clopper_pearson_lower
from ._base import BaseSampler, SamplingResult


class FixedSampler(BaseSampler):
    """``n0`` samples select the top class, ``n`` fresh samples bound it.

    This is CERTIFY of Cohen et al. (2019), input-agnostic sampling (IAS) in
    the words of the ISS paper: the selection counts are discarded, and the
    one-sided Clopper-Pearson bound uses only the ``n`` estimation samples.

    Parameters
    ----------
    n : int, default=100_000
        Estimation samples per input (Cohen et al.'s N).
    n0 : int, default=100
        Selection samples per input (Cohen et al.'s N0).

    Examples
    --------
    >>> FixedSampler(n=1000).prediction_sample_size
    1000
    """

    _parameter_constraints = {
        "n": [Interval(Integral, 1, None, closed="left")],
        "n0": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(self, n=100_000, n0=100):
        self.n = n
        self.n0 = n0

    @property
    def prediction_sample_size(self):
        return int(self.n)

    def _certify(self, engine, X, sigma, alpha, stage):
        rows = np.arange(len(X))
        selection = engine.class_counts(X, sigma, self.n0, (*stage, 0))
        candidate = selection.argmax(axis=1)
        estimation = engine.class_counts(X, sigma, self.n, (*stage, 1))
        p_lower = clopper_pearson_lower(estimation[rows, candidate], self.n, alpha)
        prediction = np.where(p_lower < 0.5, ABSTAIN, candidate)
        return SamplingResult(prediction, p_lower, np.full(len(X), self.n0 + self.n, dtype=np.int64))
