"""GradientSigmaSearch: DDRS's gradient ascent of the soft radius over sigma (smoothsk.sigma._gradient)."""

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk.sigma import GradientSigmaSearch, SigmaSearchResult

from conftest import linear_engine


def soft_objective(engine, X, sigma, n=4000, stage=(5,)):
    """Mean of DDRS's clamped soft radius, estimated with fresh noise (independent of the search)."""
    p = np.sort(engine.mean_softmax(X, sigma, np.full(len(X), n), stage), axis=1)
    p = np.clip(p, 0.02, 0.98)
    return float(np.mean(sigma / 2 * (stats.norm.ppf(p[:, -1]) - stats.norm.ppf(p[:, -2]))))


class TestGradientSigmaSearch:
    def test_increases_the_soft_radius_on_average(self, linear_data):
        X = torch.from_numpy(linear_data[0][:100])
        engine = linear_engine()
        result = GradientSigmaSearch(sigma_init=0.25, steps=30, lr=0.05, n=2).search(engine, X)
        start = soft_objective(engine, X, np.full(len(X), 0.25))
        # The Monte Carlo error of each mean is below 0.01 here; the gain is far larger.
        assert soft_objective(engine, X, result.sigma) > start + 0.1
        assert (result.steps == 30).all()

    def test_reproducible_batch_independent_and_bounded(self, linear_data):
        X = torch.from_numpy(linear_data[0][:30])
        search = GradientSigmaSearch(steps=10, lr=0.2, n=3, sigma_min=0.1, sigma_max=0.6)
        whole = search.search(linear_engine(batch_size=1000), X)
        batched = search.search(linear_engine(batch_size=7), X)
        np.testing.assert_allclose(whole.sigma, batched.sigma, rtol=1e-6)
        rows = np.arange(5, 20)
        subset = search.search(linear_engine().restricted(rows), X[rows])
        np.testing.assert_allclose(subset.sigma, whole.sigma[rows], rtol=1e-6)
        assert (whole.sigma >= 0.1).all() and (whole.sigma <= 0.6).all()
        assert whole.sigma.max() == pytest.approx(0.6)  # confident inputs push up to the bound
        other_seed = search.search(linear_engine(root_seed=1), X)
        assert not np.allclose(other_seed.sigma, whole.sigma)

    def test_labels_steer_sigma(self, linear_data):
        X, y, distance = linear_data
        X_t = torch.from_numpy(X[:60])
        search = GradientSigmaSearch(steps=10, lr=0.2, n=2, sigma_max=2.0)
        far = distance[:60] > 1.5
        right = search.search(linear_engine(), X_t, y[:60])
        wrong = search.search(linear_engine(), X_t, 1 - y[:60])
        # For the label, far inputs are confident (sigma grows); against it, sigma shrinks.
        assert (right.sigma[far] > 0.25).all() and (wrong.sigma[far] < 0.25).all()

    def test_ascent_starts_from_each_inputs_own_sigma(self, linear_data):
        X_t = torch.from_numpy(linear_data[0][:60])
        start = np.random.default_rng(0).uniform(0.5, 1.8, 60)  # all >= 0.25 away from sigma_init = 0.25
        still = GradientSigmaSearch(steps=0, sigma_min=0.6, sigma_max=1.5).ascend(linear_engine(), X_t, start)
        assert isinstance(still, SigmaSearchResult)
        # no step: the clipped start, to float32 precision (sigma is held in the inputs' dtype)
        np.testing.assert_allclose(still.sigma, np.clip(start, 0.6, 1.5), rtol=1e-7)
        # Two steps of lr = 1e-3 move sigma by at most 2e-3 * |gradient|: within 0.05 of its start for
        # gradients up to 25 (this model's stay near PhiInv(0.98) = 2.05, the clamped gap's half).
        warm = GradientSigmaSearch(steps=2, lr=1e-3, n=2, sigma_max=2.0).ascend(linear_engine(), X_t, start)
        np.testing.assert_allclose(warm.sigma, start, atol=0.05)

    @pytest.mark.parametrize("params, match", [
        ({"lr": 0.0}, "lr"),
        ({"steps": -1}, "steps"),
        ({"n": 0}, "'n'"),
        ({"sigma_init": 0.0}, "sigma_init"),
        ({"sigma_min": 0.5, "sigma_max": 0.2}, "sigma_max"),
    ])
    def test_invalid_parameters(self, params, match):
        with pytest.raises(ValueError, match=match):
            GradientSigmaSearch(**params).search(linear_engine(), torch.zeros((2, 4)))
