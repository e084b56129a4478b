"""GridSigmaSearch: PFAT's grid of noise levels (smoothsk.sigma._grid)."""

import functools

import numpy as np
import pytest
import torch

from smoothsk.metrics import average_certified_radius
from smoothsk.sigma import FixedSigma, GridSigmaSearch

from conftest import SEARCH_WEIGHT, linear_engine


class TestGridSigmaSearch:
    def test_grid_follows_pfat_definition(self):
        # PFAT Eq. 5/7: multiples of the interval inside [sigma_min, sigma_max].
        np.testing.assert_allclose(GridSigmaSearch().grid_sigmas(), np.arange(3, 21) * 0.05)
        np.testing.assert_allclose(GridSigmaSearch(0.1, 0.3, 0.1).grid_sigmas(), [0.1, 0.2, 0.3])

    def test_grid_points_are_the_decimal_multiples(self):
        # No floating-point residue (3 * 0.05 is 0.15000000000000002): the grid holds the decimals themselves.
        np.testing.assert_array_equal(GridSigmaSearch().grid_sigmas(), np.arange(3, 21) * 5 / 100)
        np.testing.assert_array_equal(GridSigmaSearch(0.1, 0.3, 0.1).grid_sigmas(), [0.1, 0.2, 0.3])
        np.testing.assert_array_equal(GridSigmaSearch(0.12, 0.5, 0.05).grid_sigmas(), np.arange(3, 11) * 5 / 100)
        # Fine steps too (16 decimals of 1e-4 left residue: 0.4688000000000001).
        np.testing.assert_array_equal(GridSigmaSearch(0.4, 0.5, 1e-4).grid_sigmas(), np.arange(4000, 5001) / 10_000)

    @pytest.mark.parametrize("sigma_min, sigma_max, step, multiples", [
        (1e-13, 5e-13, 1e-13, [1, 2, 3, 4, 5]),
        (1e-12, 1.6e-12, 1.5e-12, [1]),
        (3e-7, 9e-7, 3e-7, [1, 2, 3]),
        (1e-10, 2.0, 1.0, [1, 2]),  # 0 is within the tolerance of sigma_min, but not a noise level
        (0.15000000001, 0.3, 0.05, [3, 4, 5, 6]),  # an end a hair off a multiple
    ])
    def test_every_grid_point_is_a_positive_multiple_in_range(self, sigma_min, sigma_max, step, multiples):
        grid = GridSigmaSearch(sigma_min, sigma_max, step).validate().grid_sigmas()
        assert np.all(grid > 0) and np.all(grid >= sigma_min) and np.all(grid <= sigma_max)
        np.testing.assert_allclose(grid, np.array(multiples) * step, rtol=1e-9)

    def test_per_input_sigmas_beat_every_fixed_sigma_of_the_grid(self, linear_data, make_linear_classifier):
        X, y, _ = linear_data
        classifier = functools.partial(make_linear_classifier, SEARCH_WEIGHT, n=500, n0=50, alpha=0.001)
        search = GridSigmaSearch()
        prediction, radius, details = classifier(sigma_search=search).certify(X, return_details=True)
        grid_acr = average_certified_radius(y, prediction, radius)
        fixed_acr = [average_certified_radius(y, *classifier(sigma_search=FixedSigma(sigma)).certify(X))
                     for sigma in search.grid_sigmas()]
        assert len(np.unique(details.sigma)) >= 5
        # Far inputs want the largest sigma (the estimate saturates), near ones a small one.
        far = linear_data[2] > 2.5
        near = linear_data[2] < 0.3
        assert details.sigma[far].mean() > details.sigma[near].mean() + 0.3
        assert grid_acr >= max(fixed_acr)
        assert (details.search_steps == len(search.grid_sigmas())).all()

    def test_labels_keep_only_correct_radii(self, linear_data):
        X, y, distance = linear_data
        engine, X_t = linear_engine(), torch.from_numpy(X)
        search = GridSigmaSearch(n=200)
        plain = search.search(engine, X_t)
        # With the true labels the smoothed prediction is right wherever it is confident: same choice.
        confident = distance > 1.0
        labelled = search.search(engine, X_t, y)
        np.testing.assert_array_equal(labelled.sigma[confident], plain.sigma[confident])
        # With wrong labels every radius x correct is 0: ties go to the smallest sigma (Eq. 5).
        wrong = search.search(engine, X_t, torch.as_tensor(1 - y))
        np.testing.assert_allclose(wrong.sigma[confident], search.grid_sigmas()[0])

    def test_search_is_reproducible_and_keyed_by_global_row(self, linear_data):
        X = torch.from_numpy(linear_data[0][:40])
        search = GridSigmaSearch(n=100)
        first = search.search(linear_engine(), X)
        np.testing.assert_array_equal(search.search(linear_engine(), X).sigma, first.sigma)
        assert not np.array_equal(search.search(linear_engine(root_seed=1), X).sigma, first.sigma)
        # n divides the engine's batch size, so no input's samples straddle a batch and a
        # subset of rows sees exactly the noise those rows see in the whole set.
        rows = np.arange(10, 30)
        subset = search.search(linear_engine().restricted(rows), X[rows])
        np.testing.assert_array_equal(subset.sigma, first.sigma[rows])

    @pytest.mark.parametrize("params, match", [
        ({"sigma_min": 0.5, "sigma_max": 0.2}, "sigma_max"),
        ({"step": 0.0}, "step"),
        ({"n": 0}, "'n'"),
        ({"sigma_min": 0.12, "sigma_max": 0.13}, "grid is empty"),
        ({"alpha": 1.5}, "alpha"),
        # The grid is refused by its count, before it is built: no OverflowError, no 0.8 GB array.
        ({"sigma_min": 0.1, "sigma_max": 1.0, "step": 1e-8}, "90000001 noise levels, more than the 10000"),
        ({"sigma_max": 1e308, "step": 5e-324}, "more than the 10000"),
        ({"sigma_max": 1.0, "step": 2.0**64}, "grid is empty"),
    ])
    def test_invalid_parameters(self, params, match):
        with pytest.raises(ValueError, match=match):
            GridSigmaSearch(**params).search(linear_engine(), torch.zeros((2, 4)))
