"""Confidence bounds, radii, abstention and PREDICT's test against closed forms and exact reference values."""

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk.statistics import (
    abstains,
    binomial_abstains,
    certified_radius,
    clopper_pearson_interval,
    clopper_pearson_lower,
    gaussian_radius,
    quantile_test,
    soft_margin,
    top_class_radius,
    top_two_test,
)

#: Phi(1): the probability at which Theorem 1's radius is exactly sigma.
PHI_OF_ONE = 0.8413447460685429
#: Relative precision of a binomial tail evaluated at a Beta quantile computed in float64.
TAIL_RTOL = 1e-9


class TestClopperPearsonLower:
    @pytest.mark.parametrize("n_success, n_total, expected", [
        # Values of the reference code's statsmodels proportion_confint(method="beta").
        (99000, 100000, 0.9889893403774748),
        (100, 100, 0.933254300796991),
        (50000, 100000, 0.49510904290369595),
    ])
    def test_reference_values_bit_for_bit(self, n_success, n_total, expected):
        assert clopper_pearson_lower(n_success, n_total, 0.001) == expected

    def test_is_where_the_upper_binomial_tail_equals_alpha(self):
        # The exact bound is the p at which P(Binomial(n, p) >= k) = alpha (Clopper and Pearson 1934).
        rng = np.random.default_rng(0)
        n_total = rng.integers(1, 5000, size=200)
        n_success = rng.integers(1, n_total + 1)
        for alpha in (0.001, 0.05):
            lower = clopper_pearson_lower(n_success, n_total, alpha)
            np.testing.assert_allclose(stats.binom.sf(n_success - 1, n_total, lower), alpha, rtol=TAIL_RTOL)

    def test_one_success_closed_form(self):
        # P(X >= 1) = 1 - (1 - p) ** n = alpha, so p = 1 - (1 - alpha) ** (1 / n) (expm1: no cancellation).
        n = np.array([1, 10, 100, 1000])
        np.testing.assert_allclose(clopper_pearson_lower(1, n, 0.01), -np.expm1(np.log1p(-0.01) / n), rtol=1e-12)

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
    def test_each_end_leaves_half_alpha_in_its_binomial_tail(self):
        k, n = np.array([30, 70, 1]), np.array([100, 100, 7])
        lower, upper = clopper_pearson_interval(k, n, 0.02)
        np.testing.assert_allclose(stats.binom.sf(k - 1, n, lower), 0.01, rtol=TAIL_RTOL)
        np.testing.assert_allclose(stats.binom.cdf(k, n, upper), 0.01, rtol=TAIL_RTOL)

    def test_no_success_upper_closed_form(self):
        # P(X <= 0) = (1 - p) ** n = alpha / 2.
        n = np.array([1, 10, 1000])
        _, upper = clopper_pearson_interval(np.zeros(3), n, 0.05)
        np.testing.assert_allclose(upper, -np.expm1(np.log(0.025) / n), rtol=1e-12)

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

    def test_is_the_distance_at_which_the_normal_cdf_reaches_p(self):
        # Theorem 1: the radius r solves Phi(r / sigma) = p_lower; Phi(1) gives r = sigma.
        p = np.array([0.6, 0.9, 0.999, PHI_OF_ONE])
        sigma = np.array([0.25, 0.5, 1.0, 0.37])
        radius = certified_radius(sigma, p)
        np.testing.assert_allclose(stats.norm.cdf(radius / sigma), p, rtol=1e-12)
        assert radius[3] == pytest.approx(0.37, rel=1e-12)

    def test_grows_with_p_lower_and_linearly_with_sigma(self):
        p = np.linspace(0.51, 0.999, 50)
        assert np.all(np.diff(certified_radius(1.0, p)) > 0)
        np.testing.assert_allclose(certified_radius(3.0, p), 3 * certified_radius(1.0, p), rtol=1e-15)

    def test_zero_at_or_below_one_half(self):
        np.testing.assert_array_equal(certified_radius([1.0, 1.0, 1.0], [0.0, 0.3, 0.5]), [0.0, 0.0, 0.0])

    def test_half_abstains_reference(self):
        # 50000/100000 at alpha 0.001 bounds below 1/2: Cohen's CERTIFY abstains.
        p_lower = clopper_pearson_lower(50000, 100000, 0.001)
        assert p_lower < 0.5 and certified_radius(0.5, p_lower) == 0.0


class TestAbstains:
    def test_cohen_certify_rule(self):
        # CERTIFY returns a class only if its lower bound exceeds 1/2.
        assert abstains([0.0, 0.3, 0.5, np.nextafter(0.5, 1.0), 0.9, 1.0]).tolist() == [
            True, True, True, False, False, False]

    def test_radius_is_zero_exactly_where_it_abstains(self):
        p_lower = np.concatenate([np.random.default_rng(5).uniform(0, 1, 1000), [0.5]])
        np.testing.assert_array_equal(certified_radius(1.0, p_lower) == 0, abstains(p_lower))


class TestGaussianRadius:
    def test_known_values(self):
        # Phi(1) -> sigma, 1/2 -> 0, 0.975 -> 1.959963984540054 sigma (the two-sided 95 % normal quantile).
        radius = gaussian_radius(0.5, np.array([PHI_OF_ONE, 0.5, 0.975]))
        np.testing.assert_allclose(radius, [0.5, 0.0, 0.5 * 1.959963984540054], rtol=1e-12, atol=1e-300)

    def test_antisymmetric_about_one_half_negative_below(self):
        p = np.random.default_rng(6).uniform(0.01, 0.49, 100)
        below = gaussian_radius(0.8, p)
        assert np.all(below < 0)
        np.testing.assert_allclose(below, -gaussian_radius(0.8, 1 - p), rtol=1e-12)

    def test_is_the_certified_radius_wherever_that_certifies(self):
        p = np.linspace(0.5001, 0.9999, 200)
        np.testing.assert_array_equal(gaussian_radius(0.25, p), certified_radius(0.25, p))


class TestTopClassRadius:
    def test_unanimous_votes_closed_form(self):
        # n of n votes: the Clopper-Pearson bound is alpha ** (1 / n), the radius sigma * PhiInv of it.
        n = np.array([10, 100, 1000])
        counts = np.column_stack([np.zeros(3, dtype=np.int64), n, np.zeros(3, dtype=np.int64)])
        radius = top_class_radius(counts, n, 0.5, 0.001)
        np.testing.assert_allclose(radius, 0.5 * stats.norm.ppf(0.001 ** (1 / n)), rtol=1e-12)

    def test_labels_zero_the_radius_where_the_top_class_is_not_the_label(self):
        counts = np.array([[2, 98], [98, 2]])
        unlabelled = top_class_radius(counts, 100, 1.0, 0.001)
        labelled = top_class_radius(counts, 100, 1.0, 0.001, y=np.array([1, 1]))
        assert unlabelled[0] == unlabelled[1] > 0
        assert labelled[0] == unlabelled[0] and labelled[1] == 0.0

    def test_grows_with_the_top_count_and_is_zero_for_a_tie(self):
        top = np.arange(50, 101)
        radius = top_class_radius(np.column_stack([top, 100 - top]), 100, 1.0, 0.01)
        assert radius[0] == 0.0 and np.all(np.diff(radius[radius > 0]) > 0)


class TestSoftMargin:
    def test_two_classes_closed_form_and_theorem_one(self):
        # p = (1 - Phi(z), Phi(z)): PhiInv(p_A) - PhiInv(p_B) = 2 z, and sigma / 2 times it is
        # Theorem 1's radius sigma * PhiInv(p_A) of the two-class case.
        z = torch.tensor([0.3, 1.0, 1.7], dtype=torch.float64)
        p_a = torch.special.ndtr(z)
        gap, first = soft_margin(torch.stack([1 - p_a, p_a], dim=1), (1e-12, 1 - 1e-12))
        torch.testing.assert_close(gap, 2 * z, rtol=1e-12, atol=0)
        assert first.tolist() == [1, 1, 1]
        np.testing.assert_allclose(0.4 / 2 * gap.numpy(), gaussian_radius(0.4, p_a.numpy()), rtol=1e-12)

    def test_a_label_that_is_not_the_top_class_has_a_negative_gap(self):
        probabilities = torch.tensor([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]], dtype=torch.float64)
        gap, first = soft_margin(probabilities, (0.02, 0.98), y=torch.tensor([1, 0]))
        expected = [stats.norm.ppf(0.2) - stats.norm.ppf(0.7), stats.norm.ppf(0.6) - stats.norm.ppf(0.3)]
        np.testing.assert_allclose(gap.numpy(), expected, rtol=1e-12)
        assert first.tolist() == [1, 0]

    def test_clipping_keeps_a_saturated_gap_finite(self):
        # DDRS's [0.02, 0.98]: a one-hot average gives 2 PhiInv(0.98) = 2 * 2.0537489106318225.
        gap, _ = soft_margin(torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64), (0.02, 0.98))
        assert float(gap) == pytest.approx(2 * 2.0537489106318225, rel=1e-12)

    def test_gradient_is_the_derivative_of_the_normal_quantile(self):
        # d PhiInv(p) / dp = 1 / phi(PhiInv(p)); at p = Phi(1): sqrt(2 pi) e^(1/2).
        probabilities = torch.tensor([[PHI_OF_ONE, 1 - PHI_OF_ONE]], dtype=torch.float64, requires_grad=True)
        gap, _ = soft_margin(probabilities, (0.02, 0.98))
        (gradient,) = torch.autograd.grad(gap.sum(), probabilities)
        slope = np.sqrt(2 * np.pi) * np.exp(0.5)
        np.testing.assert_allclose(gradient.numpy(), [[slope, -slope]], rtol=1e-9)


class TestBinomialAbstains:
    def test_reference_decisions(self):
        assert binomial_abstains([600, 550], [400, 450], 0.001).tolist() == [False, True]

    def test_matches_scipy_binomtest(self):
        rng = np.random.default_rng(3)
        total = rng.integers(1, 400, size=400)
        top = rng.integers(0, total + 1)
        second = total - top
        expected_p = np.array([stats.binomtest(int(k), int(n), 0.5).pvalue for k, n in zip(top, total, strict=True)])
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


class TestTopTwoTest:
    def test_matches_the_top_class_and_scipy_binomtest_of_the_two_largest_counts(self):
        rng = np.random.default_rng(5)
        counts = rng.multinomial(200, rng.dirichlet(np.full(4, 0.5), size=300))
        largest = np.sort(counts, axis=1)[:, ::-1]
        expected_p = np.array([stats.binomtest(int(first), int(first + second), 0.5).pvalue
                               for first, second in largest[:, :2]])
        for alpha in (0.001, 0.05):
            top, abstain = top_two_test(counts, alpha)
            np.testing.assert_array_equal(top, counts.argmax(axis=1))
            np.testing.assert_array_equal(abstain, expected_p > alpha)

    def test_a_tie_for_the_top_takes_the_first_class_and_abstains(self):
        top, abstain = top_two_test([[0, 70, 70], [70, 0, 70]], 0.5)
        assert top.tolist() == [1, 0] and abstain.tolist() == [True, True]


class TestQuantileTest:
    @pytest.mark.parametrize(("probabilities", "smoothed"), [
        ((0.5, 0.21, 0.29), 1),  # S_2 = 0.29, just below the threshold 0.3
        ((0.69, 0.0, 0.31), 2),  # S_2 = 0.31, just above
        ((0.71, 0.2, 0.09), 0),  # S_1 = 0.29, just below
    ])
    def test_it_keeps_a_class_other_than_the_smoothed_one_with_probability_at_most_alpha(self, probabilities,
                                                                                           smoothed):
        # Rows of n = 1,000 votes, threshold 0.3, alpha 0.1. The votes' own class is wrong in about a quarter
        # of the rows, so a test that keeps too much fails the check.
        alpha, rows = 0.1, 4000
        counts = np.random.default_rng(6).multinomial(1000, probabilities, size=rows)
        chosen, abstain = quantile_test(counts, 0.3, alpha)
        assert np.mean(chosen != smoothed) > 2 * alpha
        assert np.mean(~abstain) > 0.05
        wrong = np.sum(~abstain & (chosen != smoothed))
        assert wrong <= stats.binom.ppf(1 - 1e-6, rows, alpha)

    def test_far_from_the_threshold_it_keeps_the_class(self):
        chosen, abstain = quantile_test([[900, 60, 40], [100, 800, 100], [100, 300, 600]], 0.3, 0.001)
        assert chosen.tolist() == [0, 1, 2] and not abstain.any()


class TestInvalidArguments:
    @pytest.mark.parametrize("call, message", [
        pytest.param(lambda: clopper_pearson_lower(11, 10, 0.05), r"n_success must lie in \[0, n_total\]",
                     id="lower-more-successes-than-trials"),
        pytest.param(lambda: clopper_pearson_lower(-1, 10, 0.05), r"n_success must lie in \[0, n_total\]",
                     id="lower-negative"),
        pytest.param(lambda: clopper_pearson_lower(5, 10, 1.5), r"alpha must be a probability in \[0, 1\]",
                     id="lower-alpha"),
        pytest.param(lambda: clopper_pearson_interval([5, 12], [10, 10], 0.05), r"n_success must lie in",
                     id="interval"),
        pytest.param(lambda: certified_radius(-0.5, 0.9), "sigma must be positive", id="radius-sigma"),
        pytest.param(lambda: certified_radius(0.5, 1.2), r"p_lower must be a probability in \[0, 1\]",
                     id="radius-p"),
        pytest.param(lambda: binomial_abstains([600], [400], 2.0), r"alpha must be a probability in \[0, 1\]",
                     id="predict-alpha"),
    ])
    def test_is_refused_naming_it(self, call, message):
        # Each used to return NaN, a negative radius, or a test that never abstains.
        with pytest.raises(ValueError, match=message):
            call()

    def test_the_message_names_the_first_bad_entry_not_the_whole_array(self):
        n_success = np.full(100_000, 5)
        n_success[777] = 11
        with pytest.raises(ValueError, match=r"got n_success=11\.0 at index 777, with n_total=10\.0 at index 777\.$"):
            clopper_pearson_lower(n_success, 10, 0.05)
