"""Tests of ``smoothsk.regions.TransductiveLPAllocator`` (PFAT App. C, Eq. 10)."""

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from smoothsk.regions import OnlineBallAllocator, RegionStore, TransductiveLPAllocator
from smoothsk.regions._layout import MARGIN
from smoothsk.regions._lp import max_radii_lp

from regions_support import ORDERS, Oracle, assert_disjoint, assert_inside_regions, crowded_cloud, pairwise


def brute_force_lp(distance, upper):
    """Optimum of max sum r, r_i + r_j <= d_ij (overlapping pairs), 0 <= r <= upper, by vertex enumeration."""
    n = len(upper)
    rows, rhs = [], []
    for i, j in itertools.combinations(range(n), 2):
        if distance[i, j] < upper[i] + upper[j]:
            row = np.zeros(n)
            row[[i, j]] = 1
            rows.append(row)
            rhs.append(distance[i, j])
    for i in range(n):
        rows.extend([np.eye(n)[i], -np.eye(n)[i]])
        rhs.extend([upper[i], 0.0])
    A, b = np.array(rows), np.array(rhs)
    best = -np.inf
    for subset in itertools.combinations(range(len(A)), n):
        M = A[list(subset)]
        if abs(np.linalg.det(M)) < 1e-12:
            continue
        r = np.linalg.solve(M, b[list(subset)])
        if np.all(A @ r <= b + 1e-9):
            best = max(best, r.sum())
    return best


class TestTransductiveLPAllocator:
    @pytest.mark.parametrize("seed", range(4))
    def test_optimal_vs_vertex_enumeration(self, seed):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((5, 3072)) / np.sqrt(3072)  # pairwise distances near 1.41
        upper = rng.uniform(0.6, 1.3, 5)
        distance = pairwise(X)
        i, j = np.triu_indices(5, 1)
        keep = distance[i, j] < upper[i] + upper[j]
        radius = max_radii_lp(i[keep], j[keep], distance[i, j][keep], upper)
        assert keep.sum() >= 3
        np.testing.assert_allclose(radius.sum(), brute_force_lp(distance, upper), rtol=1e-6)

    @pytest.mark.parametrize("scale", [1e-7, 1e-5, 1e5])
    def test_optimal_at_any_scale(self, scale):
        # The program is homogeneous: scaled distances and bounds give scaled radii. HiGHS's absolute tolerances
        # used to stop it far from the optimum at small scales (41% short at 1e-6, 100% at 1e-7).
        rng = np.random.default_rng(0)
        X = rng.standard_normal((5, 3072)) / np.sqrt(3072)
        upper = rng.uniform(0.6, 1.3, 5)
        distance = pairwise(X)
        i, j = np.triu_indices(5, 1)
        keep = distance[i, j] < upper[i] + upper[j]
        radius = max_radii_lp(i[keep], j[keep], distance[i, j][keep] * scale, upper * scale)
        np.testing.assert_allclose(radius.sum() / scale, brute_force_lp(distance, upper), rtol=1e-6)

    def test_close_pairs_among_far_ones_keep_their_optimum(self):
        # Independent pairs, each node bounded by its pair's distance: the optimum gives each pair its whole
        # distance (less the margin). One unit for all edges (their median) left the close pairs nothing.
        distance = np.r_[np.full(3, 1e-6), np.full(20, 2000.0)] * (1 + np.arange(23) % 3 * 0.1)
        i = np.arange(0, 46, 2)
        radius = max_radii_lp(i, i + 1, distance, np.repeat(distance, 2))
        np.testing.assert_allclose(radius[i] + radius[i + 1], distance * (1 - MARGIN), rtol=1e-6)

    def test_a_small_cluster_keeps_its_optimum_next_to_a_large_unrelated_pair(self):
        # A triangle of bounds 1e-7 at distances 1.5e-7 (optimum 0.75e-7 each) and, unconnected, a pair of
        # bound 1: one objective scale for both gave the triangle [0, 0, 1e-7].
        i, j = np.array([2, 2, 3, 0]), np.array([3, 4, 4, 1])
        distance = np.array([1.5e-7, 1.5e-7, 1.5e-7, 1.5])
        radius = max_radii_lp(i, j, distance, np.array([1.0, 1.0, 1e-7, 1e-7, 1e-7]))
        np.testing.assert_allclose(radius[2:], 0.75e-7 * (1 - MARGIN), rtol=1e-6)

    @pytest.mark.parametrize("distance, upper", [(1e-20, 0.5), (1.0, 1e30)], ids=["near-duplicates", "huge-bounds"])
    def test_extreme_ratios_of_bound_to_distance_are_solved(self, distance, upper):
        # HiGHS refuses matrix entries above 1e15: bound / distance must not reach the matrix.
        radius = max_radii_lp(np.array([0]), np.array([1]), np.array([distance]), np.full(2, upper))
        assert radius.sum() == pytest.approx(distance * (1 - MARGIN), rel=1e-6)

    def test_optimal_vs_dense_interior_point(self):
        """Constraints only on overlap-graph edges give the optimum of all pairs (another HiGHS method)."""
        rng = np.random.default_rng(4)
        X = crowded_cloud(rng, 60, 3072, 8, 1.0)
        upper = rng.uniform(0.1, 0.9, 60)
        store = RegionStore.empty(3072)
        cert = TransductiveLPAllocator().allocate(store, X, np.ones(60), Oracle(upper, np.zeros(60, int)))
        distance = pairwise(X)
        i, j = np.triu_indices(60, 1)
        A = np.zeros((len(i), 60))
        A[np.arange(len(i)), i] = A[np.arange(len(i)), j] = 1
        dense = linprog(-np.ones(60), A_ub=A, b_ub=distance[i, j], bounds=np.column_stack([np.zeros(60), upper]),
                        method="highs-ipm")
        assert cert.radius.sum() < upper.sum() - 1  # capping matters here
        np.testing.assert_allclose(cert.radius.sum(), -dense.fun, rtol=1e-6)
        assert_disjoint(store)

    @pytest.mark.parametrize("order", ORDERS)
    def test_objective_at_least_online(self, order):
        """Partial overlaps only (no centre inside another ball): online balls are LP-feasible."""
        rng = np.random.default_rng(5)
        X = crowded_cloud(rng, 200, 3072, 20, 1.0)
        distance = pairwise(X)
        np.fill_diagonal(distance, np.inf)
        upper = distance.min(axis=1) * rng.uniform(0.4, 1.0, 200)
        oracle = Oracle(upper, np.zeros(200, int))
        lp_store, online_store = RegionStore.empty(3072), RegionStore.empty(3072)
        lp = TransductiveLPAllocator().allocate(lp_store, X, np.ones(200), oracle)
        online = OnlineBallAllocator(order).allocate(online_store, X, np.ones(200), oracle)
        assert len(online_store) == 200  # nobody joined a ball
        assert online.radius.sum() < upper.sum() - 1  # overlaps forced capping
        assert lp.radius.sum() >= online.radius.sum() - 1e-6
        assert np.all(lp.radius <= upper + 1e-12)
        assert_disjoint(lp_store)

    def test_invariants_with_stored_regions(self):
        rng = np.random.default_rng(6)
        X = crowded_cloud(rng, 240, 3072, 20, 1.0)
        X[100] = X[10]
        radius = rng.uniform(-0.1, 1.5, 240)
        label = rng.integers(0, 2, 240)
        store = RegionStore.empty(3072)
        allocator = TransductiveLPAllocator()
        first = allocator.allocate(store, X[:120], np.ones(120), Oracle(radius, label))
        n_first = len(store)
        second = allocator.allocate(store, X[120:], np.full(120, 0.5), Oracle(radius, label, 120))
        assert_disjoint(store)
        assert_inside_regions(store, X[:120], first)
        assert_inside_regions(store, X[120:], second)
        assert np.all(first.radius <= radius[:120].clip(0) + 1e-12)
        assert np.all(second.radius <= radius[120:].clip(0) + 1e-12)
        assert first.region[100] == first.region[10]  # duplicates share a region
        members = second.region < n_first  # lie in regions of the first call
        assert members.any() and np.all(second.sigma[members] == 1.0)

    def test_nested_inputs_each_keep_own_ball(self):
        """Eq. 10 gives each input its own ball: a centre deep inside another ball caps both."""
        X = np.zeros((2, 8), dtype=np.float32)
        X[1, 0] = 1.0
        store = RegionStore.empty(8)
        sigma = np.full(2, 4.0)
        cert = TransductiveLPAllocator().allocate(store, X, sigma, Oracle(np.array([10.0, 0.1]), [0, 0]))
        np.testing.assert_allclose(cert.radius.sum(), 1.0, rtol=1e-6)
        online = OnlineBallAllocator().allocate(RegionStore.empty(8), X, sigma,
                                                Oracle(np.array([10.0, 0.1]), [0, 0]))
        np.testing.assert_allclose(online.radius, [10.0, 0.1], rtol=1e-6)  # the second joins the first
