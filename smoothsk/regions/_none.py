"""No regions: every input is certified with its own noise level (Insta-RS)."""

import numpy as np

from ._base import BaseAllocator, certificates_from_sampling


class NoRegions(BaseAllocator):
    """Certify each input independently at the sigma its search chose.

    Guarantee
    ---------
    For input ``x`` with chosen noise level ``sigma(x)``, with probability at
    least ``1 - alpha`` the *fixed-sigma* smoothed classifier
    ``g(., sigma(x))`` predicts the returned class everywhere in the L2 ball
    of the returned radius around ``x``. This is Insta-RS's asymmetric
    guarantee: it does not say that the sample-wise classifier
    ``x' -> g(x', sigma(x'))`` is constant on that ball, because a point
    ``x'`` in the ball may be given a different sigma. Use a region
    allocator when that stronger guarantee is needed.

    Examples
    --------
    >>> NoRegions()
    NoRegions()
    """

    def _allocate(self, regions, X, sigma, certify_fn):
        sampling = certify_fn(np.arange(len(X)), sigma, (1,))
        return certificates_from_sampling(sampling, sigma)
