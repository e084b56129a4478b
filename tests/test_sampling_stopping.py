"""Tests of smoothsk.sampling._stopping.StoppingRule: rules (a) and (b) of the sequential sampler."""

import numpy as np
import pytest
from scipy import stats

from smoothsk.sampling._stopping import StoppingRule
from smoothsk.statistics import certified_radius, clopper_pearson_lower

ALPHA = 0.001


def _radius(size, p, sigma, level):
    """Clopper-Pearson radius from ``size`` samples at frequency ``p`` (ISS Def. 1)."""
    size = np.asarray(size, dtype=np.float64)
    return certified_radius(sigma, clopper_pearson_lower(p * size, size, level))


class TestRequiredRadius:
    def test_absolute_and_relative_decline_with_a_margin(self):
        reference = np.array([0.2, 1.0])
        np.testing.assert_allclose(StoppingRule(1000, 0.05, "absolute").required_radius(reference), [0.15, 0.95])
        np.testing.assert_allclose(StoppingRule(1000, 0.1, "relative").required_radius(reference, margin=0.5),
                                   [0.19, 0.95])


class TestFixedSize:
    @pytest.mark.parametrize("radius", [None, 0.3])
    def test_the_smallest_size_whose_bound_stops_the_input(self, radius):
        rule = StoppingRule(100_000, 0.05, "absolute", radius)
        p, sigma = np.array([0.8, 0.95, 0.999]), np.array([0.5, 0.25, 0.5])
        level = 0.4 * ALPHA
        size = rule.fixed_size(p, sigma, level, ALPHA)
        target = rule.target_radius(p, sigma, ALPHA)
        assert np.all(_radius(size, p, sigma, level) >= target)
        assert np.all(_radius(size - 1, p, sigma, level) < target)

    def test_size_one_where_rule_b_asks_no_radius(self):
        # pA = 0.5: not even n_max certifies anything, so no size is needed.
        rule = StoppingRule(10_000, 0.05, "absolute")
        np.testing.assert_array_equal(rule.fixed_size(np.array([0.5]), np.array([0.25]), ALPHA, ALPHA), [1])


class TestDecided:
    def test_rule_a_stops_the_robust_and_the_hopeless_only(self):
        rule = StoppingRule(100_000, 0.05, "absolute", radius=0.5)
        sigma = np.full(3, 0.5)
        robust_bound = stats.norm.cdf(1.1)  # radius 0.55 reported now
        low, high = np.array([0.8, 0.55, 0.6]), np.array([0.9, 0.62, 0.99])
        current = np.array([robust_bound, 0.55, 0.6])
        stop = rule.decided(low, high, np.zeros_like, sigma, ALPHA, current)
        # The second: even at its upper bound 0.62, n_max certifies 0.5 * PhiInv(0.62) < 0.5.
        np.testing.assert_array_equal(stop, [True, True, False])

    def test_rule_b_stops_once_more_samples_cannot_raise_the_radius_by_the_decline(self):
        rule = StoppingRule(10_000, 0.05, "absolute")
        low, high, sigma = np.full(2, 0.9), np.full(2, 0.92), np.full(2, 0.5)

        def certify_at(p):
            # The first input would report the bound of n_max samples (no decline), the second nothing.
            return np.where(np.arange(2)[:, None] == 0, clopper_pearson_lower(p * 10_000, 10_000, ALPHA), 0.0)

        stop = rule.decided(low, high, certify_at, sigma, ALPHA, np.zeros(2))
        np.testing.assert_array_equal(stop, [True, False])
