"""Tests of smoothsk.sampling.InputSpecificSampler (ISS, papers/003): the map psi, Prop. 1, and certification."""

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk import ABSTAIN
from smoothsk.sampling import InputSpecificSampler

from sampling_support import BinomialEngine, ScriptedEngine


def _iss_radius(k, p, sigma, alpha):
    """Radius certified by k samples at frequency p (ISS Def. 1), 0 where it abstains; scipy only."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = stats.beta.ppf(alpha, p * k, k - p * k + 1)
        radius = sigma * stats.norm.ppf(bound)
    return np.where((k > 0) & (bound > 0.5), radius, 0.0)


def _iss_exact_psi(p, n_max, decline, decline_type, sigma, alpha):
    """psi(p) by a direct scan over every k = 1..n_max (ISS Eq. 5, Def. 1-2)."""
    full = float(_iss_radius(n_max, p, sigma, alpha))
    required = full - decline if decline_type == "absolute" else (1 - decline) * full
    if required <= 0:
        return 0
    k = np.arange(1, n_max + 1)
    return int(k[np.argmax(_iss_radius(k, p, sigma, alpha) >= required)])


class _IssLinearModel(torch.nn.Module):
    """Logits (-z, z) with z = w.x + b: its smoothed classifier is itself at every sigma.

    P(f(x + e) = 1) = Phi(z / (sigma |w|)), so the true certified radius of the
    smoothed classifier is |z| / |w| whatever sigma is.
    """

    def __init__(self, w, b):
        super().__init__()
        self.w, self.b = w, b

    def forward(self, x):
        z = x.flatten(1) @ self.w + self.b
        return torch.stack([-z, z], dim=1)


class TestInputSpecificSamplerMap:
    """psi_ISS: exact values, shape (ISS Fig. 6), and upper bound between grid points."""

    @pytest.mark.parametrize("decline_type, decline", [("absolute", 0.05), ("relative", 0.05)])
    @pytest.mark.parametrize("n_max, ps", [(3000, [0.55, 0.6, 0.8, 0.95, 0.99, 1.0]), (100_000, [0.9, 1.0])])
    def test_equals_direct_scan_at_grid_points(self, decline_type, decline, n_max, ps):
        # At grid points (multiples of 1e-4) and a grid sigma (0.25 = 2 ** -2) psi_ISS is psi.
        sampler = InputSpecificSampler(n_max=n_max, decline=decline, decline_type=decline_type)
        expected = [_iss_exact_psi(p, n_max, decline, decline_type, 0.25, 0.001) for p in ps]
        assert sampler.sample_size(ps, 0.25).tolist() == expected
        assert max(expected) > 0

    def test_known_values(self):
        # psi(1.0) at n_max = 100,000, U_AD = 0.05 is about 0.45 n_max at sigma 0.25, 0.67 at 0.5.
        sampler = InputSpecificSampler(n_max=100_000, decline=0.05)
        assert sampler.sample_size(1.0, 0.25) == _iss_exact_psi(1.0, 100_000, 0.05, "absolute", 0.25, 0.001)
        assert 0.44 < sampler.sample_size(1.0, 0.25) / 100_000 < 0.46
        assert 0.66 < sampler.sample_size(1.0, 0.5) / 100_000 < 0.68

    @pytest.mark.parametrize("decline_type, decline", [("absolute", 0.1), ("relative", 0.2)])
    def test_close_upper_bound_of_psi_off_grid_and_off_sigma_grid(self, decline_type, decline):
        # Eq. 6 gives psi_ISS >= psi between grid points; sigma = 0.3 lies between sigma grid
        # points and must be rounded conservatively.
        n_max, sigma = 2000, 0.3
        sampler = InputSpecificSampler(n_max=n_max, decline=decline, decline_type=decline_type)
        ps = np.concatenate([np.random.default_rng(0).uniform(0.5, 1.0, 150), 1.0 - np.arange(1, 20) * 1e-5])
        exact = np.array([_iss_exact_psi(p, n_max, decline, decline_type, sigma, 0.001) for p in ps])
        got = sampler.sample_size(ps, sigma)
        assert np.all((got >= exact) & (got <= n_max))
        assert np.mean(got <= 1.05 * exact + 1) > 0.8  # and close to psi for most points

    @pytest.mark.parametrize("decline_type, decline", [("absolute", 0.05), ("relative", 0.05)])
    def test_sample_size_admissible_everywhere(self, decline_type, decline):
        # At every p, k = psi_ISS(p) must satisfy the decline bound of Def. 1-2 at p (the
        # radius grows with k, so this is psi_ISS(p) >= psi(p)). Includes dense points in the
        # cell where psi jumps up from 0: for RD psi tends to n_max just above the threshold,
        # above both neighbouring grid values, so Eq. 6 alone would be too small there.
        n_max, sigma, alpha = 100_000, 0.3, 0.001
        sampler = InputSpecificSampler(n_max=n_max, decline=decline, decline_type=decline_type)
        first = np.flatnonzero(sampler.sample_size(np.arange(10_001) / 10_000, sigma))[0]
        ps = np.concatenate([np.random.default_rng(1).uniform(0.5, 1.0, 400),
                             (first - 1 + np.arange(1, 200) / 200) / 10_000, 1.0 - np.arange(1, 50) * 2e-6])
        k = sampler.sample_size(ps, sigma)
        full, reached = _iss_radius(n_max, ps, sigma, alpha), _iss_radius(k, ps, sigma, alpha)
        allowed = decline if decline_type == "absolute" else decline * full
        assert np.all(full - reached <= allowed + 1e-12)

    @pytest.mark.parametrize("decline_type", ["absolute", "relative"])
    def test_zero_at_or_below_one_half(self, decline_type):
        sampler = InputSpecificSampler(n_max=10_000, decline=0.05, decline_type=decline_type)
        p = np.linspace(0, 0.5, 101)
        for sigma in (0.12, 0.5, 1.0):
            assert not sampler.sample_size(p, sigma).any()

    @pytest.mark.parametrize("decline_type, declines", [("absolute", [0.01, 0.05, 0.1]),
                                                        ("relative", [0.01, 0.05, 0.1])])
    def test_monotone_in_decline_and_n_max(self, decline_type, declines):
        # ISS Fig. 6: the sample size decreases with the decline bound and increases with n_max.
        p = np.concatenate([np.arange(5001, 10_001, 25) / 10_000, np.linspace(0.5, 1, 397)])
        sizes = np.array([InputSpecificSampler(n_max=10_000, decline=u, decline_type=decline_type)
                          .sample_size(p, 0.5) for u in declines])
        assert np.all(np.diff(sizes, axis=0) <= 0)
        assert np.any(np.diff(sizes, axis=0) < 0)
        sizes = np.array([InputSpecificSampler(n_max=n, decline=0.05, decline_type=decline_type)
                          .sample_size(p, 0.5) for n in (1000, 10_000, 100_000)])
        assert np.all(np.diff(sizes, axis=0) >= 0)
        assert np.any(np.diff(sizes, axis=0) > 0)

    def test_shape_absolute_monotone_relative_u_shaped(self):
        # ISS Fig. 6: AD's map increases with p; RD's first decreases, then increases.
        p = np.arange(5001, 10_001) / 10_000
        absolute = InputSpecificSampler(n_max=100_000, decline=0.05).sample_size(p, 0.25)
        assert np.all(np.diff(absolute) >= 0)
        relative = InputSpecificSampler(n_max=100_000, decline=0.05, decline_type="relative").sample_size(p, 0.25)
        positive = relative[relative > 0]
        bottom = np.argmin(positive)
        assert 0 < bottom < len(positive) - 1
        assert np.all(np.diff(positive[:bottom + 1]) <= 0)
        assert np.all(np.diff(positive[bottom:]) >= 0)

    def test_absolute_decline_scales_with_sigma_relative_does_not(self):
        p = np.linspace(0.5, 1, 51)
        small = InputSpecificSampler(n_max=10_000, decline=0.1).sample_size(p, 0.5)
        large = InputSpecificSampler(n_max=10_000, decline=0.2).sample_size(p, 1.0)
        np.testing.assert_array_equal(small, large)
        assert np.any(small != InputSpecificSampler(n_max=10_000, decline=0.1).sample_size(p, 1.0))
        relative = InputSpecificSampler(n_max=10_000, decline=0.1, decline_type="relative")
        np.testing.assert_array_equal(relative.sample_size(p, 0.3), relative.sample_size(p, 1.7))

    def test_vectorised_over_p_with_broadcast_sigma(self):
        sampler = InputSpecificSampler(n_max=10_000, decline=0.05)
        p = np.array([[0.6, 0.9], [0.99, 1.0]])
        sigma = np.array([0.25, 0.5])
        got = sampler.sample_size(p, sigma)
        assert got.shape == (2, 2) and got.dtype == np.int64
        assert got[1, 1] == sampler.sample_size(1.0, 0.5)
        assert got[1, 0] == sampler.sample_size(0.99, 0.25)


class TestInputSpecificSamplerCertify:
    """Alg. 2: fresh estimation samples, Prop. 1, soundness, parameters."""

    def test_final_bound_uses_only_fresh_samples(self):
        rng = np.random.default_rng(1)
        p_top = rng.uniform(0.5, 1.0, 200)
        engine = BinomialEngine(p_top)
        sampler = InputSpecificSampler(n_max=5000, decline=0.1, n0_fraction=0.02)
        result = sampler.certify(engine, np.zeros((200, 1)), np.full(200, 0.5), 0.001, stage=(3,))
        (pilot_stage, pilot_n, pilot), (estimation_stage, k_hat, estimation) = engine.calls
        assert (pilot_stage, estimation_stage) == ((3, 0), (3, 1))
        assert np.all(pilot_n == 100)
        assert k_hat.min() < k_hat.max() <= 5000  # one packed call with per-input sizes
        np.testing.assert_array_equal(result.n_samples, 100 + k_hat)
        candidate = pilot.argmax(axis=1)
        expected = np.where(k_hat > 0, stats.beta.ppf(0.001, estimation[np.arange(200), candidate],
                                                      k_hat - estimation[np.arange(200), candidate] + 1), 0)
        np.testing.assert_allclose(result.p_lower, np.nan_to_num(expected), rtol=1e-12, atol=1e-300)
        assert np.all((result.prediction == -1) == (result.p_lower <= 0.5))

    def test_confident_inputs_spend_pilot_plus_psi_at_one(self):
        # pA = 1: the pilot interval is [(alpha/2)^(1/k0), 1] and the AD map peaks at p = 1.
        engine = BinomialEngine(np.ones(5))
        sampler = InputSpecificSampler(n_max=20_000, decline=0.05, n0_fraction=0.01)
        result = sampler.certify(engine, np.zeros((5, 1)), np.full(5, 0.25), 0.001)
        assert np.all(result.n_samples == 200 + sampler.sample_size(1.0, 0.25))
        assert np.all(result.prediction == 0)

    @pytest.mark.parametrize("decline_type, decline", [("absolute", 0.05), ("relative", 0.05)])
    def test_decline_bounded_with_confidence_1_minus_alpha(self, decline_type, decline):
        # Prop. 1: if pA lies in the pilot interval (probability >= 1 - alpha), the decline
        # of the expected radius at k_hat vs n_max is at most U. Each input fails with
        # probability <= alpha; the count of failures is bounded at error probability 1e-6.
        rng = np.random.default_rng(2)
        n_inputs, n_max, alpha = 3000, 10_000, 0.01
        p_top = np.concatenate([rng.uniform(0.5, 1.0, 1500), 1 - rng.beta(0.5, 30, 1400), np.ones(100)])
        sigma = rng.choice([0.25, 0.5, 1.0], n_inputs)
        engine = BinomialEngine(p_top, seed=3)
        sampler = InputSpecificSampler(n_max=n_max, decline=decline, decline_type=decline_type)
        result = sampler.certify(engine, np.zeros((n_inputs, 1)), sigma, alpha)
        k_hat = result.n_samples - 100
        full = _iss_radius(n_max, p_top, sigma, alpha)
        reached = _iss_radius(k_hat, p_top, sigma, alpha)
        if decline_type == "absolute":
            too_much = full - reached > decline + 1e-9
        else:
            too_much = (full > 0) & ((full - reached) > decline * full + 1e-9)
        assert too_much.sum() <= stats.binom.isf(1e-6, n_inputs, alpha)
        assert np.mean(k_hat) < 0.6 * n_max  # and it does save samples

    @pytest.mark.parametrize("decline_type", ["absolute", "relative"])
    def test_sound_on_linear_model(self, decline_type):
        # The certified radius exceeds the true radius |z| / |w| (or the class is wrong) with
        # probability <= alpha per input; bound the count at error probability 1e-6.
        from smoothsk.engine import MonteCarloEngine

        generator = torch.Generator().manual_seed(0)
        n_inputs, alpha = 300, 0.05
        w = torch.randn(4, generator=generator)
        b = torch.tensor(0.1)
        X = torch.randn(n_inputs, 4, generator=generator)
        sigma = np.random.default_rng(4).choice([0.25, 0.5, 1.0], n_inputs)
        z = (X @ w + b).numpy().astype(np.float64)
        true_class, true_radius = (z > 0).astype(int), np.abs(z) / float(w.norm())
        engine = MonteCarloEngine(_IssLinearModel(w, b), 2, batch_size=4096, root_seed=5)
        sampler = InputSpecificSampler(n_max=2000, decline=0.1, decline_type=decline_type, n0_fraction=0.05)
        result = sampler.certify(engine, X, sigma, alpha)
        certified = result.prediction != -1
        radius = sigma * stats.norm.ppf(np.clip(result.p_lower, 0.5, 1))
        wrong = certified & ((result.prediction != true_class) | (radius > true_radius))
        assert wrong.sum() <= stats.binom.isf(1e-6, n_inputs, alpha)
        assert certified.mean() > 0.5
        assert np.all(result.n_samples <= 100 + 2000)

    @pytest.mark.parametrize("params, message", [
        ({"decline_type": "both"}, "'decline_type' parameter"), ({"decline": 0.0}, "'decline' parameter"),
        ({"decline": -0.1}, "'decline' parameter"), ({"n_max": 0}, "'n_max' parameter"),
        ({"n0_fraction": 0.0}, "'n0_fraction' parameter"), ({"n0_fraction": 1.5}, "'n0_fraction' parameter"),
        ({"decline_type": "relative", "decline": 1.0}, "relative decline must be below 1"),
    ])
    def test_invalid_parameters(self, params, message):
        sampler = InputSpecificSampler(**params)
        with pytest.raises(ValueError, match=message):
            sampler.sample_size(0.9, 0.5)
        engine = BinomialEngine(np.ones(2))
        with pytest.raises(ValueError, match=message):
            sampler.certify(engine, np.zeros((2, 1)), np.ones(2), 0.001)
        assert engine.calls == []

    @pytest.mark.parametrize("p, sigma, alpha, message", [
        (1.2, 0.5, 0.001, "p must be probabilities"), (-0.1, 0.5, 0.001, "p must be probabilities"),
        (0.9, 0.0, 0.001, "sigma must be finite and positive"),
        (0.9, np.inf, 0.001, "sigma must be finite and positive"), (0.9, 0.5, 0.0, "alpha must be in"),
        (0.9, 0.5, 1.0, "alpha must be in")])
    def test_invalid_sample_size_arguments(self, p, sigma, alpha, message):
        with pytest.raises(ValueError, match=message):
            InputSpecificSampler(n_max=1000).sample_size(p, sigma, alpha)

    def test_through_the_estimator(self):
        from smoothsk import SampleWiseSmoothedClassifier
        from smoothsk.datasets import load_digits_images
        from smoothsk.models import DigitsCNN

        X, y = load_digits_images()
        clf = SampleWiseSmoothedClassifier(
            DigitsCNN, max_epochs=2, lr=0.1, random_state=0,
            sampler=InputSpecificSampler(n_max=2000, decline=0.1, n0_fraction=0.05))
        clf.fit(X[:300], y[:300])
        prediction, radius, details = clf.certify(X[300:320], return_details=True)
        assert np.all((details.n_samples >= 100) & (details.n_samples <= 2100))
        assert len(np.unique(details.n_samples)) > 1
        np.testing.assert_array_equal(radius > 0, prediction != -1)
        # No radius exceeds what 2000 estimation samples, all of the candidate class, certify.
        assert np.all(radius <= 0.25 * stats.norm.ppf(0.001 ** (1 / 2000)))

    def test_prediction_sample_size_is_n_max(self):
        sampler = InputSpecificSampler(n_max=5000, decline=0.1, decline_type="relative", n0_fraction=0.02)
        assert sampler.prediction_sample_size == 5000

    def test_hopeless_inputs_get_no_estimation_samples_and_abstain(self):
        # Pilot votes spread over 10 classes: the candidate's interval from 10 of 100 lies below 1/2,
        # where no sample size certifies, so psi = 0 and the input abstains on the pilot alone (Alg. 2).
        pilot = np.tile(np.full(10, 10), (3, 1))
        engine = ScriptedEngine(pilot, np.zeros((3, 10)))
        sampler = InputSpecificSampler(n_max=5000, decline=0.05, n0_fraction=0.02)
        result = sampler.certify(engine, torch.zeros(3, 1), np.full(3, 0.5), 0.001)
        np.testing.assert_array_equal(engine.calls[1]["n_samples"], 0)
        np.testing.assert_array_equal(result.n_samples, 100)
        np.testing.assert_array_equal(result.prediction, ABSTAIN)
