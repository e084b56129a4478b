"""Tests of ``smoothsk.regions._geometry``: exact pairs of meeting balls in high dimension."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from smoothsk.regions._geometry import PointSet, Projection, ball_pairs

from regions_support import crowded_cloud


class TestBallPairs:
    @pytest.mark.parametrize("dim", [5, 3072])
    def test_matches_brute_force(self, dim):
        rng = np.random.default_rng(0)
        a = crowded_cloud(rng, 120, dim, 6, 1.0)
        b = crowded_cloud(rng, 90, dim, 6, 1.0)
        b[:5] = a[:5]  # identical points
        ra = rng.uniform(0, 0.6, len(a)) * (rng.random(len(a)) < 0.8)
        rb = rng.uniform(0, 0.6, len(b)) * (rng.random(len(b)) < 0.8)
        projection = Projection.fit(a, b)
        pa, pb = PointSet.project(a, projection), PointSet.project(b, projection)
        distance = cdist(a.astype(np.float64), b.astype(np.float64))
        for strict in (True, False):
            ia, ib, d = ball_pairs(pa, ra, pb, rb, strict=strict)
            reach = ra[:, None] + rb[None, :]
            expected = np.argwhere(distance < reach if strict else distance <= reach)
            assert 0 < len(expected) < distance.size / 4  # the case is neither empty nor trivial
            np.testing.assert_array_equal(np.column_stack([ia, ib]), expected)
            np.testing.assert_allclose(d, distance[ia, ib], rtol=1e-12)
        # zero radii, closed balls: exactly the identical points
        ia, ib, _ = ball_pairs(pa, np.zeros(len(a)), pb, np.zeros(len(b)), strict=False)
        assert {(int(i), int(j)) for i, j in zip(ia, ib, strict=True)} >= {(k, k) for k in range(5)}
        assert np.all(distance[ia, ib] == 0)
