"""Cohen et al.'s CERTIFY: the same sample sizes for every input (IAS)."""


import numpy as np

from .._constraints import SAMPLE_SIZE
from ._base import BaseTwoStageSampler


class FixedSampler(BaseTwoStageSampler):
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
        "n": [SAMPLE_SIZE],
        "n0": [SAMPLE_SIZE],
    }

    def __init__(self, n=100_000, n0=100):
        self.n = n
        self.n0 = n0

    @property
    def prediction_sample_size(self):
        return int(self.n)

    def _selection_size(self):
        return int(self.n0)

    def _estimation_sizes(self, candidate_count, n_selection, sigma, alpha):
        return np.full(len(candidate_count), self.n, dtype=np.int64)
