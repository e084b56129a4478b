"""Tests of ``smoothsk.regions.OnlineBallAllocator`` (PFAT Alg. 2, App. C.2 orders)."""

import itertools

import numpy as np
import pytest
from scipy.stats import binom, norm

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.regions import OnlineBallAllocator, RegionStore
from smoothsk.sampling import FixedSampler

from conftest import LinearLogits
from regions_support import ORDERS, FirstCoordinateSigma, Oracle, assert_disjoint, assert_inside_regions, crowded_cloud


class TestOnlineBallAllocator:
    def test_eq6_member_of_stored_region(self):
        """Inside a stored ball: certified at its sigma, radius min(R, distance to boundary)."""
        X = np.zeros((2, 64), dtype=np.float32)
        X[:, 0] = [0.5, 5.0]  # inside the stored ball around 0, and far outside it
        store = RegionStore.empty(64)
        store.append(np.zeros((1, 64)), [2.0], [0.5], [1], [0.9])
        oracle = Oracle(lambda rows, sigma: np.where(sigma == 0.5, 3.0, 0.2), [0, 1])
        cert = OnlineBallAllocator().allocate(store, X, np.array([0.25, 0.25]), oracle)
        first = oracle.calls[0]
        assert first["stage"] == (1, 1) and len(oracle.calls) == 1
        np.testing.assert_array_equal(first["sigma"], [0.5, 0.25])  # region sigma, searched sigma
        assert cert.region.tolist() == [0, 1] and len(store) == 2
        np.testing.assert_allclose(cert.radius, [1.5, 0.2], rtol=1e-6)  # min(3, 2 - 0.5); own ball
        np.testing.assert_array_equal(cert.sigma, [0.5, 0.25])
        assert cert.prediction.tolist() == [0, 1]

    def test_joined_input_gets_own_certificate_in_one_batched_pass(self):
        """Inputs inside a ball opened in the call are re-certified together at its sigma."""
        dim = 64
        rng = np.random.default_rng(1)
        centre = rng.standard_normal(dim).astype(np.float32)
        offsets = rng.standard_normal((4, dim))
        offsets *= 0.5 / np.linalg.norm(offsets, axis=1, keepdims=True)
        X = np.concatenate([centre[None], centre + offsets.astype(np.float32)])
        sigma = np.array([1.0, 0.25, 0.5, 1.0, 0.25])
        # the owner is very sure at sigma 1; the others are not
        def radius(rows, s):
            return np.where(rows == 0, 2.0, np.where(s == 1.0, 0.7, 1.5))
        oracle = Oracle(radius, np.zeros(5, dtype=int))
        cert = OnlineBallAllocator().allocate(RegionStore.empty(dim), X, sigma, oracle)
        assert [call["stage"] for call in oracle.calls] == [(1, 1), (2, 1)]
        second = oracle.calls[1]
        np.testing.assert_array_equal(second["rows"], [1, 2, 4])  # row 3 had sigma 1 already
        np.testing.assert_array_equal(second["sigma"], [1.0, 1.0, 1.0])
        assert cert.region.tolist() == [0] * 5
        dist = np.linalg.norm(X[1:] - X[0], axis=1)
        # min(own radius at sigma 1, distance to the ball's boundary) - never the owner's 2 - dist
        np.testing.assert_allclose(cert.radius, [2.0] + list(np.minimum(0.7, 2 - dist)), rtol=1e-6)
        np.testing.assert_array_equal(cert.sigma, [1.0] * 5)
        np.testing.assert_array_equal(cert.n_samples, [100, 200, 200, 100, 200])

    @pytest.mark.parametrize("order", ORDERS)
    def test_invariants_high_dimension(self, order):
        rng = np.random.default_rng(2)
        dim, n = 3072, 300
        X = crowded_cloud(rng, n, dim, 25, 1.0)
        X[7] = X[3]
        sigma = rng.choice([0.25, 0.5, 1.0], n)
        base = rng.uniform(-0.1, 1.2, n)
        label = rng.integers(0, 3, n)
        def true_radius(rows, s):
            return base[rows] * (0.5 + s)
        store = RegionStore.empty(dim)
        allocator = OnlineBallAllocator(order)
        oracles = [Oracle(true_radius, label, offset) for offset in (0, 200)]
        cert = allocator.allocate(store, X[:200], sigma[:200], oracles[0])
        assert len(store) < 200  # some inputs joined a ball
        cert2 = allocator.allocate(store, X[200:], sigma[200:], oracles[1])
        assert_disjoint(store)
        assert_inside_regions(store, X[:200], cert)
        assert_inside_regions(store, X[200:], cert2)
        for c, rows in ((cert, np.arange(200)), (cert2, np.arange(200, n))):
            # never above the Monte Carlo radius at the sigma it was certified at
            assert np.all(c.radius <= true_radius(rows, c.sigma).clip(0) + 1e-9)
            np.testing.assert_array_equal(c.sigma, store.sigmas[c.region])
        for call, oracle in enumerate(oracles, start=1):
            # fresh stages per call, at most one certify_fn call per (stage, share)
            assert {stage[1] for stage in (c["stage"] for c in oracle.calls)} == {call}
            keys = [(c["stage"], c["share"]) for c in oracle.calls]
            assert len(keys) == len(set(keys))
        assert cert.region[7] == cert.region[3]

    @pytest.mark.parametrize("order", ORDERS)
    def test_alpha_split_only_for_degree_orders(self, order):
        rng = np.random.default_rng(3)
        X = crowded_cloud(rng, 60, 32, 4, 1.0)
        oracle = Oracle(rng.uniform(0.2, 1.5, 60), np.zeros(60, dtype=int))
        store = RegionStore.empty(32)
        store.append(X[:1], [0.1], [0.5], [0], [0.9])  # X[0] is a member: known before sampling
        X[5] = X[4]  # an exact duplicate: its owner's samples choose its pass too
        OnlineBallAllocator(order).allocate(store, X, rng.choice([0.5, 1.0], 60), oracle)
        for call in oracle.calls:
            expected = 1.0 if order == "given" or 0 in call["rows"] else 0.5
            assert call["share"] == expected
        assert any(5 in call["rows"] and call["share"] == (1.0 if order == "given" else 0.5)
                   for call in oracle.calls)

    def test_degree_orders_app_c2(self):
        """A hub overlapping six leaves: ascending keeps the leaves whole (PFAT App. C.2)."""
        dim, k = 16, 6
        X = np.zeros((k + 1, dim), dtype=np.float32)
        X[1:, :k] = 1.2 * np.eye(k)  # leaves 1.2 from the hub, 1.2 * sqrt(2) from each other
        radius = np.array([1.0] + [0.8] * k)  # hub overlaps every leaf; leaves do not overlap
        results = {}
        for order in ORDERS:
            store = RegionStore.empty(dim)
            cert = OnlineBallAllocator(order).allocate(store, X, np.ones(k + 1), Oracle(radius, np.zeros(k + 1, int)))
            assert len(store) == k + 1
            results[order] = cert.radius
        np.testing.assert_allclose(results["ascending"], [0.4] + [0.8] * k, rtol=1e-6)
        np.testing.assert_allclose(results["descending"], [1.0] + [0.2] * k, rtol=1e-6)
        np.testing.assert_allclose(results["given"], results["descending"])  # hub listed first
        assert results["ascending"].sum() > results["descending"].sum()


def test_duplicate_certificate_chosen_by_own_samples_fails_at_most_alpha():
    """Union bound: a duplicate whose reported pass is chosen by its own samples fails with probability <= alpha.

    Each of 3,000 isolated trials holds an owner D, its exact duplicate D'
    (same values, hence the same noise), an input A at a higher sigma and a
    sure input C. With ``order="descending"``, D's first-pass radius decides
    whether D reaches C (degree 2: D opens its ball, D' reports its first
    pass at sigma_D) or not (A goes first, D joins A's ball, D' is
    re-certified at sigma_A). The linear model gives the true probability
    of class 1 at each sigma, ``Phi(z_D / sigma)``, placed just below a
    Clopper-Pearson threshold at both sigmas. D's certificate fails when its
    class is wrong or its ``p_lower`` exceeds that probability (its radius
    then exceeds the true one). Before the fix D' got the full alpha in both
    passes and failed in 35% of trials; a sound allocator stays within the
    binomial bound at error probability 1e-6.
    """
    alpha, n, low = 0.2, 30, 0.5
    z_d = low * norm.ppf(0.947)  # CP lower bound of 30/30 at alpha = 0.2 is 0.9478
    high = z_d / norm.ppf(0.903)  # ... of 29/30 is 0.9035
    z_c, radius_c = 4 * low, low * norm.ppf(0.1 ** (1 / n))  # C: sure, its ball at alpha / 2
    dc = radius_c + 0.65  # D reaches C only when 30 of its 30 samples are class 1
    d = np.array([-0.005, z_d, 0.0])
    c = np.array([-0.005, z_c, np.sqrt(dc ** 2 - (z_c - z_d) ** 2)])
    a = d + 0.4 * (c - d)
    a[0] = 0.005  # the first coordinate gives A the high sigma
    n_trials, dim = 3000, 7
    offsets = 10.0 * np.array(list(itertools.product(range(8), repeat=4)))[:n_trials]  # trials never meet
    X = np.zeros((n_trials, 4, dim))
    X[:, :, :3] = [d, d, a, c]
    X[:, :, 3:] = offsets[:, None]
    X = X.reshape(-1, dim).astype(np.float32)
    w = np.zeros(dim)
    w[1] = 1
    clf = SampleWiseSmoothedClassifier(
        LinearLogits(w, 0.0), max_epochs=0, sigma_search=FirstCoordinateSigma(low, high),
        sampler=FixedSampler(n=n, n0=10), allocator=OnlineBallAllocator("descending"), alpha=alpha,
        certify_batch_size=20000, random_state=0).fit(X[:2], np.array([0, 1]))
    _, _, details = clf.certify(X, return_details=True)
    duplicate = np.arange(n_trials) * 4 + 1
    prediction, sigma = details.prediction[duplicate], details.sigma[duplicate]
    first_pass = sigma == low
    assert 0.1 < first_pass.mean() < 0.4  # both passes are reported, chosen by D's own samples
    failed = (prediction == 0) | ((prediction == 1) & (details.p_lower[duplicate] > norm.cdf(z_d / sigma)))
    assert failed.sum() <= binom.isf(1e-6, n_trials, alpha)
