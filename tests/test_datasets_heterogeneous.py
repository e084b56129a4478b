"""Tests of the synthetic heterogeneous-margin data set (smoothsk.datasets.make_heterogeneous_margins)."""

import numpy as np
import pytest

from smoothsk.datasets import make_heterogeneous_margins


class TestMakeHeterogeneousMargins:
    def test_shapes_balance_and_determinism(self):
        X, y = make_heterogeneous_margins(n_samples=250, n_features=64, random_state=3)
        assert X.shape == (250, 64) and X.dtype == np.float32 and y.dtype == np.int64
        assert np.bincount(y).min() >= 250 // 12 and np.bincount(y).max() <= 250 // 12 + 1
        X2, y2 = make_heterogeneous_margins(n_samples=250, n_features=64, random_state=3)
        np.testing.assert_array_equal(X, X2)
        np.testing.assert_array_equal(y, y2)
        assert not np.array_equal(X, make_heterogeneous_margins(n_samples=250, n_features=64, random_state=4)[0])

    def test_group_geometry(self):
        spacings, counts, distance, spread = (0.5, 3.0), (3, 2), 5.0, 0.1
        X, y = make_heterogeneous_margins(n_samples=5000, n_features=32, spacings=spacings,
                                          classes_per_group=counts, group_distance=distance, spread=spread)
        means = np.stack([X[y == k].mean(axis=0) for k in range(5)]).astype(np.float64)
        gaps = np.linalg.norm(means[:, None] - means[None], axis=2)
        # Sample means are off by about spread * sqrt(n_features / 1000) = 0.018 per class.
        np.testing.assert_allclose(gaps[[0, 0, 1], [1, 2, 2]], 0.5, atol=0.06)
        np.testing.assert_allclose(gaps[3, 4], 3.0, atol=0.06)
        between = np.sqrt(2 * distance**2 + (spacings[0] ** 2 + spacings[1] ** 2) / 2)
        np.testing.assert_allclose(gaps[:3, 3:], between, atol=0.06)
        within = X[y == 0] - means[0]
        assert abs(within.std() - spread) < 0.01

    @pytest.mark.parametrize("kwargs", [
        {"spacings": (1.0, 2.0), "classes_per_group": (3,)},
        {"classes_per_group": (6, 0, 2)},
        {"n_features": 10},
    ])
    def test_invalid_arguments(self, kwargs):
        with pytest.raises(ValueError):
            make_heterogeneous_margins(**kwargs)
