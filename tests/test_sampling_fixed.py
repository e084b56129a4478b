"""Tests of smoothsk.sampling.FixedSampler (Cohen et al.'s CERTIFY)."""

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk import ABSTAIN
from smoothsk._constraints import InvalidParameterError
from smoothsk.sampling import FixedSampler, SamplingResult
from smoothsk.statistics import certified_radius, clopper_pearson_lower

from sampling_support import ScriptedEngine


class TestFixedSampler:
    def test_selection_then_fresh_estimation_samples(self):
        # Selection says class 2 for input 0 and class 0 for input 1; the
        # estimation counts (which would say otherwise) only bound those classes.
        selection = [[1, 2, 7], [6, 3, 1]]
        estimation = [[900, 0, 100], [10, 990, 0]]
        engine = ScriptedEngine(selection, estimation)
        result = FixedSampler(n=1000, n0=10).certify(engine, torch.zeros(2, 3), np.array([0.5, 1.0]), 0.001)
        assert [call["stage"] for call in engine.calls] == [(1, 0), (1, 1)]
        assert [np.broadcast_to(call["n_samples"], 2).tolist() for call in engine.calls] == [[10, 10], [1000, 1000]]
        np.testing.assert_array_equal(engine.calls[1]["sigma"], [0.5, 1.0])
        np.testing.assert_array_equal(result.p_lower, clopper_pearson_lower([100, 10], 1000, 0.001))
        np.testing.assert_array_equal(result.prediction, [ABSTAIN, ABSTAIN])
        np.testing.assert_array_equal(result.n_samples, [1010, 1010])

    def test_predicts_the_selected_class_when_its_bound_exceeds_one_half(self):
        engine = ScriptedEngine([[0, 9, 1], [5, 0, 5]], [[3, 990, 7], [499, 2, 499]])
        result = FixedSampler(n=1000, n0=10).certify(engine, torch.zeros(2, 3), np.ones(2), 0.001)
        assert isinstance(result, SamplingResult)
        np.testing.assert_array_equal(result.prediction, [1, ABSTAIN])  # a tie selects the first class
        assert result.p_lower[0] == clopper_pearson_lower(990, 1000, 0.001)
        assert result.p_lower[1] == clopper_pearson_lower(499, 1000, 0.001)

    def test_stage_prefix_is_passed_on(self):
        engine = ScriptedEngine([[1, 0]], [[5, 0]])
        FixedSampler(n=5, n0=1).certify(engine, torch.zeros(1, 1), np.ones(1), 0.1, stage=(4,))
        assert [call["stage"] for call in engine.calls] == [(4, 0), (4, 1)]

    def test_on_the_real_engine_bounds_hold(self, make_linear_classifier):
        # Through the estimator: a linear model with P(class 1) = Phi(1) at
        # sigma 1. Each input's p_lower exceeds it with probability <= alpha;
        # the count of such inputs is checked against the binomial (1 - 1e-6) quantile.
        p, alpha = stats.norm.cdf(1.0), 0.01
        clf = make_linear_classifier((1.0,), 1.0, sigma=1.0, n=2000, n0=50, alpha=alpha)
        details = clf.certify(np.zeros((200, 1), dtype=np.float32), return_details=True)[2]
        np.testing.assert_array_equal(details.prediction, 1)
        assert (details.p_lower > p).sum() <= stats.binom.ppf(1 - 1e-6, 200, alpha)
        # Tight: p_lower < 0.77 would need a frequency 6 standard deviations below p.
        assert np.all(details.p_lower > 0.77)

    def test_prediction_sample_size(self):
        assert FixedSampler(n=321, n0=5).prediction_sample_size == 321

    @pytest.mark.parametrize("params", [{"n": 0}, {"n": -1}, {"n": 2.5}, {"n0": 0}, {"n0": "many"}])
    def test_invalid_parameters(self, params):
        with pytest.raises(InvalidParameterError, match=f"'{next(iter(params))}' parameter of FixedSampler"):
            FixedSampler(**params).certify(ScriptedEngine(), torch.zeros(1, 1), np.ones(1), 0.1)

    def test_defaults_spend_cohen_et_al_sample_sizes(self):
        # Cohen et al.'s experiments: N0 = 100 selection and N = 100,000 estimation samples.
        engine = ScriptedEngine([[100, 0]], [[99_000, 1000]])
        result = FixedSampler().certify(engine, torch.zeros(1, 1), np.ones(1), 0.001)
        assert [np.broadcast_to(call["n_samples"], 1).tolist() for call in engine.calls] == [[100], [100_000]]
        np.testing.assert_array_equal(result.n_samples, [100_100])
        # The bound uses the 100,000 estimation samples only (statsmodels' proportion_confint value).
        assert result.p_lower[0] == 0.9889893403774748

    def test_abstains_exactly_where_the_certified_radius_is_zero(self):
        # One abstention rule: a prediction is returned exactly where Theorem 1 certifies a radius > 0.
        rng = np.random.default_rng(7)
        n_inputs, n = 400, 200
        top = rng.integers(80, 140, n_inputs)  # bounds on both sides of 1/2 at alpha 0.05
        engine = ScriptedEngine(np.tile([[5, 0]], (n_inputs, 1)), np.column_stack([top, n - top]))
        result = FixedSampler(n=n, n0=5).certify(engine, torch.zeros(n_inputs, 1), np.ones(n_inputs), 0.05)
        radius = certified_radius(np.ones(n_inputs), result.p_lower)
        assert 0 < (result.prediction == ABSTAIN).sum() < n_inputs
        np.testing.assert_array_equal(result.prediction == ABSTAIN, radius == 0)
