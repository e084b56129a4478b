"""Confidence bounds, radii and PREDICT's test against exact reference values."""

import numpy as np
import pytest
from scipy import stats

from smoothsk.statistics import (
    binomial_abstains,
    certified_radius,
    clopper_pearson_interval,
    clopper_pearson_lower,
)


class TestClopperPearsonLower:
    @pytest.mark.parametrize("n_success, n_total, expected", [
        # Values of the reference code's statsmodels proportion_confint(method="beta").
        (99000, 100000, 0.9889893403774748),
        (100, 100, 0.933254300796991),
        (50000, 100000, 0.49510904290369595),
    ])
    def test_reference_values_bit_for_bit(self, n_success, n_total, expected):
        assert clopper_pearson_lower(n_success, n_total, 0.001) == expected

    def test_equals_beta_ppf(self):
        rng = np.random.default_rng(0)
        n_total = rng.integers(1, 5000, size=200)
        n_success = rng.integers(1, n_total + 1)
        for alpha in (0.001, 0.05):
            expected = stats.beta.ppf(alpha, n_success, n_total - n_success + 1)
            np.testing.assert_array_equal(clopper_pearson_lower(n_success, n_total, alpha), expected)

    def test_all_successes_is_alpha_root(self):
        # beta.ppf(alpha, n, 1) = alpha ** (1 / n).
        n = np.array([1, 10, 100, 1000])
        np.testing.assert_allclose(clopper_pearson_lower(n, n, 0.01), 0.01 ** (1 / n), rtol=1e-12)

    def test_no_success_or_no_sample_is_zero(self):
        np.testing.assert_array_equal(clopper_pearson_lower([0, 0], [100, 0], 0.001), [0.0, 0.0])

    def test_vectorised_shape(self):
        assert clopper_pearson_lower(np.full(7, 5), np.full(7, 10), 0.05).shape == (7,)

    def test_coverage(self):
        # P(lower > p) <= alpha for each trial; over 2000 independent trials the
        # count of failures exceeds the binomial (1 - 1e-6) quantile with
        # probability below 1e-6.
        rng = np.random.default_rng(1)
        p, n, alpha, trials = 0.8, 50, 0.05, 2000
        failures = int((clopper_pearson_lower(rng.binomial(n, p, size=trials), n, alpha) > p).sum())
        assert failures <= stats.binom.ppf(1 - 1e-6, trials, alpha)


class TestClopperPearsonInterval:
    def test_equals_beta_ppf_at_both_ends(self):
        lower, upper = clopper_pearson_interval([30, 70], [100, 100], 0.02)
        np.testing.assert_array_equal(lower, stats.beta.ppf(0.01, [30, 70], [71, 31]))
        np.testing.assert_array_equal(upper, stats.beta.ppf(0.99, [31, 71], [70, 30]))

    def test_ends_at_zero_and_one(self):
        lower, upper = clopper_pearson_interval([0, 10], [10, 10], 0.05)
        assert lower[0] == 0.0 and upper[1] == 1.0
        assert 0 < upper[0] < 1 and 0 < lower[1] < 1

    def test_contains_the_estimate_and_narrows_with_n(self):
        n = np.array([10, 100, 1000, 10000])
        lower, upper = clopper_pearson_interval(n // 4, n, 0.01)
        assert np.all(lower < 0.25) and np.all(upper > 0.25)
        assert np.all(np.diff(upper - lower) < 0)

    def test_symmetric_under_swapping_success_and_failure(self):
        lower, upper = clopper_pearson_interval([13], [40], 0.05)
        lower_swapped, upper_swapped = clopper_pearson_interval([27], [40], 0.05)
        np.testing.assert_allclose([lower[0], upper[0]], [1 - upper_swapped[0], 1 - lower_swapped[0]], rtol=1e-12)

    def test_each_end_is_the_one_sided_bound_at_half_alpha(self):
        lower, _ = clopper_pearson_interval([900], [1000], 0.002)
        assert lower[0] == clopper_pearson_lower(900, 1000, 0.001)

    def test_two_sided_coverage(self):
        # Each trial misses p with probability <= alpha; bound as in TestClopperPearsonLower.
        rng = np.random.default_rng(2)
        p, n, alpha, trials = 0.3, 40, 0.05, 2000
        lower, upper = clopper_pearson_interval(rng.binomial(n, p, size=trials), np.full(trials, n), alpha)
        misses = int(((lower > p) | (upper < p)).sum())
        assert misses <= stats.binom.ppf(1 - 1e-6, trials, alpha)


class TestCertifiedRadius:
    def test_reference_value(self):
        radius = certified_radius(0.5, clopper_pearson_lower(99000, 100000, 0.001))
        assert radius == pytest.approx(1.1449999776, abs=1e-10)

    def test_sigma_times_phi_inverse(self):
        p = np.array([0.6, 0.9, 0.999])
        sigma = np.array([0.25, 0.5, 1.0])
        np.testing.assert_allclose(certified_radius(sigma, p), sigma * stats.norm.ppf(p), rtol=1e-15)

    def test_zero_at_or_below_one_half(self):
        np.testing.assert_array_equal(certified_radius([1.0, 1.0, 1.0], [0.0, 0.3, 0.5]), [0.0, 0.0, 0.0])

    def test_half_abstains_reference(self):
        # 50000/100000 at alpha 0.001 bounds below 1/2: Cohen's CERTIFY abstains.
        p_lower = clopper_pearson_lower(50000, 100000, 0.001)
        assert p_lower < 0.5 and certified_radius(0.5, p_lower) == 0.0


class TestBinomialAbstains:
    def test_reference_decisions(self):
        assert binomial_abstains([600, 550], [400, 450], 0.001).tolist() == [False, True]

    def test_matches_scipy_binomtest(self):
        rng = np.random.default_rng(3)
        total = rng.integers(1, 400, size=400)
        top = rng.integers(0, total + 1)
        second = total - top
        expected_p = np.array([stats.binomtest(int(k), int(n), 0.5).pvalue for k, n in zip(top, total)])
        for alpha in (0.001, 0.01, 0.05, 0.3):
            np.testing.assert_array_equal(binomial_abstains(top, second, alpha), expected_p > alpha)

    def test_no_samples_abstains(self):
        assert binomial_abstains([0], [0], 0.5).tolist() == [True]

    def test_symmetric_in_its_two_counts(self):
        np.testing.assert_array_equal(binomial_abstains([30, 70], [70, 30], 0.01),
                                      binomial_abstains([70, 30], [30, 70], 0.01))

    def test_level_under_the_null(self):
        # Under a tie the test predicts with probability <= alpha; 3000 trials,
        # failure probability of this check below 1e-6.
        rng = np.random.default_rng(4)
        trials, alpha = 3000, 0.05
        top = rng.binomial(200, 0.5, size=trials)
        predicted = int((~binomial_abstains(top, 200 - top, alpha)).sum())
        assert predicted <= stats.binom.ppf(1 - 1e-6, trials, alpha)
