"""Tests of ``smoothsk.regions.MemoryAllocator`` (DDRS Alg. 3)."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from scipy.stats import binom, norm

from smoothsk import ABSTAIN
from smoothsk.regions import MemoryAllocator, RegionStore

from regions_support import Oracle, assert_disjoint, crowded_cloud


class TestMemoryAllocator:
    def test_three_cases_of_figure_2(self):
        dim = 128
        e = np.eye(dim, dtype=np.float32)[0]
        store = RegionStore.empty(dim)
        store.append([np.zeros(dim)], [1.0], [0.5], [0], [0.99])
        X = np.stack([1.5 * e, 0.5 * e, -1.5 * e, 3.0 * e, -0.6 * e])
        # same class overlapping; other class inside; other class overlapping; abstain far away;
        # abstaining inside, then class 0 at the region's sigma
        base = np.array([1.0, 0.8, 1.0, -1.0, -1.0])
        oracle = Oracle(lambda rows, sigma: np.where((rows == 4) & (sigma == 0.5), 0.3, base[rows]), [0, 1, 1, 1, 0])
        cert = MemoryAllocator().allocate(store, X, np.full(5, 0.25), oracle)
        # taking region 0's class needs the input's own certificate at its sigma 0.5 (second pass):
        # input 1 is class 1 there and abstains, input 4 is class 0 and keeps min(0.3, room 0.4)
        assert [(call["stage"], call["rows"].tolist(), call["share"]) for call in oracle.calls] == [
            ((1, 1), [0, 1, 2, 3, 4], 0.5), ((2, 1), [1, 4], 0.5)]
        np.testing.assert_array_equal(oracle.calls[1]["sigma"], [0.5, 0.5])
        assert cert.prediction.tolist() == [0, ABSTAIN, 1, ABSTAIN, 0]
        np.testing.assert_allclose(cert.radius, [1.0, 0.0, 0.5, 0.0, 0.3], rtol=1e-6)
        np.testing.assert_array_equal(cert.sigma, [0.25, 0.5, 0.25, 0.25, 0.5])
        np.testing.assert_allclose(cert.p_lower[[1, 4]], [0.0, norm.cdf(0.3 / 0.5)])
        assert cert.region[1] == 0  # it lies in region 0, whose class G answers there; nothing is remembered
        assert len(store) == 5 and store.predictions.tolist() == [0, 0, 1, ABSTAIN, 0]
        # a later ball of another class never swallows the remembered abstention
        later = MemoryAllocator().allocate(store, np.stack([2.5 * e]), np.array([0.25]),
                                           Oracle(np.array([2.0]), [0]))
        np.testing.assert_allclose(later.radius, [0.5], rtol=1e-6)

    def test_invariant_high_dimension_over_calls(self):
        rng = np.random.default_rng(7)
        X = crowded_cloud(rng, 300, 3072, 20, 1.0)
        label = rng.integers(0, 3, 300)
        radius = rng.uniform(-0.2, 1.5, 300)
        sigma = rng.choice([0.5, 1.0], 300)

        def label_at(rows, sigma):  # the class depends on sigma: some re-certified inputs agree
            return (label[rows] + (sigma > 0.75)) % 3

        store = RegionStore.empty(3072)
        allocator = MemoryAllocator()
        certs = [allocator.allocate(store, X[rows], sigma[rows], Oracle(radius, label_at, rows[0]))
                 for rows in np.split(np.arange(300), 3)]
        other = store.predictions[:, None] != store.predictions[None, :]
        assert_disjoint(store, mask=other)
        cert = certs[0]
        own = np.where(radius[:100] < 0, ABSTAIN, label_at(np.arange(100), sigma[:100]))
        kept = cert.prediction == own
        adopted = ~kept & (cert.prediction != ABSTAIN)
        assert adopted.any() and kept.any() and (~kept & ~adopted).any()  # all three outcomes occur
        assert np.all(cert.radius[kept] <= radius[:100][kept].clip(0) + 1e-12)
        # an adopted ball is the input's own certificate at the region's sigma, inside a region of its class
        assert np.all(cert.radius[adopted] <= radius[:100][adopted] + 1e-12)
        np.testing.assert_array_equal(cert.prediction[adopted], label_at(np.flatnonzero(adopted), cert.sigma[adopted]))
        distance = cdist(X[:100][adopted].astype(np.float64), store.centres.astype(np.float64))
        fits = (distance + cert.radius[adopted][:, None] <= store.radii[None, :] + 1e-9)
        fits &= store.predictions[None, :] == cert.prediction[adopted][:, None]
        fits &= store.sigmas[None, :] == cert.sigma[adopted][:, None]
        assert fits.any(axis=1).all()

    def test_remembered_inputs_are_answered_without_sampling(self):
        rng = np.random.default_rng(8)
        X = crowded_cloud(rng, 50, 64, 5, 1.0)
        X[30] = X[4]
        oracle = Oracle(rng.uniform(0, 1, 50), rng.integers(0, 2, 50))
        store = RegionStore.empty(64)
        first = MemoryAllocator().allocate(store, X[:40], np.ones(40), oracle)
        assert first.n_samples[30] == 0 and first.region[30] == first.region[4]
        # remembered: inputs that are their region's centre (an adopter that abstains adds no region)
        remembered = np.all(store.centres[first.region] == X[:40], axis=1)
        assert remembered.sum() >= 30
        n_calls = len(oracle.calls)
        again = MemoryAllocator().allocate(store, X[:40], np.full(40, 0.3), oracle)
        assert not np.isin(np.concatenate([call["rows"] for call in oracle.calls[n_calls:]] + [[]]),
                           np.flatnonzero(remembered)).any()
        assert np.all(again.n_samples[remembered] == 0)
        for field in ("prediction", "radius", "sigma", "p_lower", "region"):
            np.testing.assert_array_equal(getattr(again, field)[remembered], getattr(first, field)[remembered])


def test_memory_alpha_is_split_between_own_and_adopted_certificates():
    """An input's own samples decide whether it keeps its certificate or takes a region's: alpha / 2 each."""
    rng = np.random.default_rng(12)
    X = crowded_cloud(rng, 40, 16, 3, 1.0)
    oracle = Oracle(rng.uniform(-0.1, 1.5, 40), rng.integers(0, 2, 40))
    store = RegionStore.empty(16)
    certificates = MemoryAllocator().allocate(store, X, np.ones(40), oracle)
    assert [(call["stage"], call["share"]) for call in oracle.calls] == [((1, 1), 0.5), ((2, 1), 0.5)]
    reported = certificates.prediction != ABSTAIN
    np.testing.assert_array_equal(certificates.p_lower[reported], store.p_lowers[certificates.region[reported]])


def test_memory_predict_answers_as_the_memory_classifier(make_linear_classifier):
    """predict: the class of the remembered region an input lies in, else the smoothed prediction."""
    clf = make_linear_classifier([1.0, 0.0], sigma=0.25, n=200, n0=20, allocator=MemoryAllocator())
    # a remembered class-1 ball reaching into class 0 of the linear model, an abstention, nothing
    clf.regions_.append([[0.5, 0.0], [-2.0, 1.0]], [1.0, 0.0], [0.25, 0.25], [1, ABSTAIN], [0.9, 0.4])
    X = np.array([[-0.3, 0.0], [-2.0, 1.0], [-2.0, 3.0], [2.0, 3.0]], dtype=np.float32)
    assert clf.predict(X).tolist() == [1, ABSTAIN, 0, 1]
    # the same inputs without memory: the smoothed classifier alone
    assert clf.reset_regions().predict(X).tolist() == [0, 0, 0, 1]


def test_memory_adopted_statement_fails_more_than_alpha_with_overlapping_regions(make_linear_classifier):
    """The reported statement ``g(x', details.sigma) = c on B(x, r)`` holds with probability >= 1 - alpha.

    The linear model's smoothed classifier is itself at every sigma. Per group:
    ten distinct near-duplicate class-1 inputs at distance 0.5 from the boundary
    (each opens its own region, overlapping ones of one class), then a query just
    across the boundary (true class 0, Monte Carlo class mostly ABSTAIN). The query
    takes class 1 whenever one of the ten regions' certificates failed badly enough
    to cover it; its statement "g = 1 at x" is then false. Groups lie 20 apart
    (no region reaches another group), rows draw independent noise: failures are
    independent Bernoulli trials. Measured on main: ~0.47 of queries fail, alpha = 0.2.
    """
    n_groups, n_near, alpha = 500, 10, 0.2
    clf = make_linear_classifier([1.0, 0.0], sigma=0.5, n=100, n0=10, alpha=alpha, allocator=MemoryAllocator(),
                                 certify_batch_size=5000)
    along = 20.0 * np.arange(n_groups)
    centres = np.stack([np.full((n_groups, n_near), 0.5), along[:, None] + 1e-3 * np.arange(n_near)], axis=-1)
    queries = np.stack([np.full(n_groups, -1e-3), along], axis=-1)
    X = np.concatenate([centres.reshape(-1, 2), queries]).astype(np.float32)
    prediction, _ = clf.certify(X)
    failures = int(np.sum(prediction[n_groups * n_near:] == 1))  # x[0] < 0: class 0, no class-1 claim holds
    assert failures <= binom.ppf(1 - 1e-6, n_groups, alpha)


def test_memory_statements_made_at_a_larger_alpha_are_not_reported_at_a_smaller_one(make_linear_classifier):
    """Each certificate of a call holds with probability >= 1 - alpha, alpha as set for that call.

    Regions are made at alpha = 0.4 (each certificate at 0.2) near the linear model's
    boundary, then alpha is lowered to 0.001 and a query just across the boundary from
    each region is certified: it takes the region's class exactly when that region's
    certificate failed far enough to cover it. Groups lie 20 apart and draw
    independent noise. Measured on main: ~0.1 of the queries fail at alpha = 0.001.
    """
    n_groups, alpha = 500, 0.001
    clf = make_linear_classifier([1.0, 0.0], sigma=0.5, n=100, n0=10, alpha=0.4, allocator=MemoryAllocator(),
                                 certify_batch_size=5000)
    along = 20.0 * np.arange(n_groups)
    clf.certify(np.stack([np.full(n_groups, 0.5), along], axis=-1).astype(np.float32))
    with pytest.warns(UserWarning, match="regions in regions_ were certified at the old alpha"):
        clf.set_params(alpha=alpha)
    prediction, _ = clf.certify(np.stack([np.full(n_groups, -1e-3), along], axis=-1).astype(np.float32))
    failures = int(np.sum(prediction == 1))  # x[0] < 0: class 0, no class-1 claim holds
    assert failures <= binom.ppf(1 - 1e-6, n_groups, alpha)
