"""Confidence bounds, certified radii and the abstention test of randomized smoothing.

Everything here is vectorised over inputs and built on :mod:`scipy.stats`.
The formulas are those of Cohen, Rosenfeld and Kolter (2019), "Certified
Adversarial Robustness via Randomized Smoothing": the one-sided
Clopper-Pearson bound of CERTIFY, the radius ``sigma * PhiInv(pA_lower)`` of
their Theorem 1, and the two-sided binomial test of PREDICT.
"""

import numpy as np
from scipy import stats

__all__ = [
    "clopper_pearson_lower",
    "clopper_pearson_interval",
    "certified_radius",
    "binomial_abstains",
]


def clopper_pearson_lower(n_success, n_total, alpha):
    """One-sided ``(1 - alpha)`` Clopper-Pearson lower bound on a binomial proportion.

    Parameters
    ----------
    n_success : array-like of int, shape (n_inputs,)
        Number of noisy samples classified as the candidate class.
    n_total : array-like of int, shape (n_inputs,)
        Number of noisy samples drawn for each input.
    alpha : float
        Failure probability of the bound, in (0, 1).

    Returns
    -------
    lower : ndarray of float, shape (n_inputs,)
        ``beta.ppf(alpha, n_success, n_total - n_success + 1)``; 0 where
        ``n_success == 0`` (including inputs with no samples).

    Examples
    --------
    >>> float(clopper_pearson_lower(99000, 100000, 0.001))
    0.9889893403774748
    """
    n_success = np.asarray(n_success, dtype=np.float64)
    n_total = np.asarray(n_total, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lower = stats.beta.ppf(alpha, n_success, n_total - n_success + 1)
    return np.where(n_success > 0, lower, 0.0)


def clopper_pearson_interval(n_success, n_total, alpha):
    """Two-sided ``(1 - alpha)`` Clopper-Pearson interval on a binomial proportion.

    Parameters
    ----------
    n_success, n_total : array-like of int, shape (n_inputs,)
        Successes and trials per input.
    alpha : float
        Total failure probability, split evenly between the two ends.

    Returns
    -------
    lower, upper : ndarray of float, shape (n_inputs,)
        Bounds in [0, 1]; ``lower`` is 0 where ``n_success == 0`` and
        ``upper`` is 1 where ``n_success == n_total``.
    """
    n_success = np.asarray(n_success, dtype=np.float64)
    n_total = np.asarray(n_total, dtype=np.float64)
    n_fail = n_total - n_success
    with np.errstate(invalid="ignore"):
        lower = stats.beta.ppf(alpha / 2, n_success, n_fail + 1)
        upper = stats.beta.ppf(1 - alpha / 2, n_success + 1, n_fail)
    lower = np.where(n_success > 0, lower, 0.0)
    upper = np.where(n_fail > 0, upper, 1.0)
    return lower, upper


def certified_radius(sigma, p_lower):
    """Certified L2 radius ``sigma * PhiInv(p_lower)`` (Cohen et al., Theorem 1).

    Parameters
    ----------
    sigma : array-like of float, shape (n_inputs,)
        Noise level each input was certified at.
    p_lower : array-like of float, shape (n_inputs,)
        Lower confidence bound on the top-class probability.

    Returns
    -------
    radius : ndarray of float, shape (n_inputs,)
        The radius; 0 where ``p_lower <= 1/2`` (the certificate abstains).

    Examples
    --------
    >>> float(certified_radius(0.5, clopper_pearson_lower(99000, 100000, 0.001)))
    1.1449999776...
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    p_lower = np.asarray(p_lower, dtype=np.float64)
    radius = sigma * stats.norm.ppf(p_lower)
    return np.where(p_lower > 0.5, radius, 0.0)


def binomial_abstains(count_top, count_second, alpha):
    """Cohen et al.'s PREDICT test: whether the top class is not significantly ahead.

    Parameters
    ----------
    count_top, count_second : array-like of int, shape (n_inputs,)
        Counts of the most and second most frequent classes among the noisy samples.
    alpha : float
        Probability of returning a class other than the smoothed classifier's.

    Returns
    -------
    abstain : ndarray of bool, shape (n_inputs,)
        True where the two-sided binomial test of ``(count_top, count_top +
        count_second, 1/2)`` has a p-value above ``alpha``.

    Examples
    --------
    >>> binomial_abstains([600, 550], [400, 450], 0.001).tolist()
    [False, True]
    """
    count_top = np.asarray(count_top, dtype=np.int64)
    count_second = np.asarray(count_second, dtype=np.int64)
    n_trials = count_top + count_second
    # Under p = 1/2 the binomial law is symmetric, so the two-sided p-value of
    # scipy.stats.binomtest is exactly min(1, 2 * cdf(min(k, n - k))).
    p_value = np.minimum(1.0, 2.0 * stats.binom.cdf(np.minimum(count_top, count_second), n_trials, 0.5))
    return np.where(n_trials > 0, p_value, 1.0) > alpha
