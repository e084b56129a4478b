"""Test doubles and checks shared by the region tests (``tests/test_regions_*.py``)."""

import numpy as np
from scipy.spatial.distance import cdist
from scipy.stats import norm

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk.regions import MemoryAllocator, NoRegions, OnlineBallAllocator, TransductiveLPAllocator
from smoothsk.sampling import FixedSampler
from smoothsk.sampling._base import SamplingResult
from smoothsk.sigma._base import BaseSigmaSearch, SigmaSearchResult

from conftest import LinearLogits

#: The orders of :class:`~smoothsk.regions.OnlineBallAllocator`.
ORDERS = ("given", "ascending", "descending")
#: One instance of every allocator (every order of the online one).
ALLOCATORS = [NoRegions(), OnlineBallAllocator("given"), OnlineBallAllocator("ascending"),
              OnlineBallAllocator("descending"), TransductiveLPAllocator(), MemoryAllocator()]


class Oracle:
    """Test double of the estimator's ``certify_fn``: certificates from known radii.

    ``p_lower = Phi(radius / sigma)`` so that the certified radius is exactly
    ``radius(offset + rows, sigma)``; negative radii abstain. The class is
    ``label[offset + rows]`` or ``label(offset + rows, sigma)``. Records every call.
    """

    def __init__(self, radius, label, offset=0):
        self.radius = radius if callable(radius) else (lambda rows, sigma: radius[rows])
        labels = None if callable(label) else np.asarray(label)
        self.label = label if callable(label) else (lambda rows, sigma: labels[rows])
        self.offset = offset
        self.calls = []

    def __call__(self, rows, sigma, stage, alpha_share=1.0):
        rows = np.asarray(rows)
        self.calls.append({"rows": rows.copy(), "sigma": np.array(sigma), "stage": stage,
                           "share": alpha_share})
        rows = rows + self.offset
        p_lower = norm.cdf(self.radius(rows, np.asarray(sigma)) / np.asarray(sigma))
        prediction = np.where(p_lower < 0.5, ABSTAIN, self.label(rows, np.asarray(sigma)))
        return SamplingResult(prediction, p_lower, np.full(len(rows), 100, dtype=np.int64))


def crowded_cloud(rng, n, dim, n_clusters, spread):
    """Points in ``n_clusters`` tight clusters (pairwise distance about ``spread``) in ``dim`` dims."""
    centres = rng.standard_normal((n_clusters, dim)) * 3 * spread / np.sqrt(dim) * 4
    noise = rng.standard_normal((n, dim)) * spread / np.sqrt(2 * dim)
    return (centres[rng.integers(0, n_clusters, n)] + noise).astype(np.float32)


def pairwise(points):
    """Exact pairwise distances (float64) of the rows of ``points``."""
    return cdist(np.asarray(points, dtype=np.float64), np.asarray(points, dtype=np.float64))


def assert_disjoint(store, mask=None):
    """No two stored regions meet: ||c_k - c_l|| >= r_k + r_l (for pairs in ``mask``)."""
    distance = pairwise(store.centres)
    np.fill_diagonal(distance, np.inf)
    meet = distance < store.radii[:, None] + store.radii[None, :]
    if mask is not None:
        meet &= mask
    assert not meet.any(), f"{meet.sum() // 2} pairs of regions meet"


def assert_inside_regions(store, X, certificates):
    """Each certified ball lies in the region ``details.region`` names."""
    region = certificates.region
    distance = np.linalg.norm(X.astype(np.float64) - store.centres[region].astype(np.float64), axis=1)
    assert np.all(region >= 0)
    assert np.all(distance + certificates.radius <= store.radii[region] + 1e-9)
    # an input lies in its region: strictly inside, or its centre
    assert np.all((distance < store.radii[region]) | (distance == 0))


class FirstCoordinateSigma(BaseSigmaSearch):
    """Test double of a sigma search: ``low`` where x[..., 0] < 0, else ``high``."""

    def __init__(self, low=0.3, high=0.6):
        self.low = low
        self.high = high

    def _search(self, engine, X, y):
        first = X.flatten(1)[:, 0].numpy()
        return SigmaSearchResult(np.where(first < 0, self.low, self.high), np.ones(len(X), dtype=np.int64))


def linear_estimator(allocator, dim, alpha, n=2000):
    """A fitted estimator around :class:`LinearLogits` with a random unit ``w`` (``w[0] = 0``), bias 0.1.

    Its smoothed classifier is ``sign(z)``, ``z = w . x + 0.1``, at every
    sigma (true radius ``|z|``); :class:`FirstCoordinateSigma` gives sigma 0.4
    where ``x[0] < 0``, else 0.8, independently of ``z``.

    Returns
    -------
    clf : SampleWiseSmoothedClassifier
    w : ndarray of float, shape (dim,)
    """
    rng = np.random.default_rng(9)
    w = rng.standard_normal(dim)
    w[0] = 0  # the first coordinate picks sigma (FirstCoordinateSigma) independently of z
    w /= np.linalg.norm(w)
    clf = SampleWiseSmoothedClassifier(
        LinearLogits(w, 0.1), max_epochs=0, sigma_search=FirstCoordinateSigma(0.4, 0.8),
        sampler=FixedSampler(n=n, n0=50), allocator=allocator, alpha=alpha, certify_batch_size=4000,
        random_state=0)
    X = rng.standard_normal((4, dim)).astype(np.float32)
    return clf.fit(X, np.array([0, 1, 0, 1])), w
