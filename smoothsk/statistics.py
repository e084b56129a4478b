"""Confidence bounds, certified radii and the abstention rules of randomized smoothing.

Everything here is vectorised over inputs. The formulas are those of Cohen,
Rosenfeld and Kolter (2019), "Certified Adversarial Robustness via Randomized
Smoothing": the one-sided Clopper-Pearson bound of CERTIFY, the radius
``sigma / 2 * (PhiInv(p_A) - PhiInv(p_B))`` of their Theorem 1 (with
``p_B = 1 - p_A``: ``sigma * PhiInv(p_A)``), CERTIFY's abstention when
``p_A``'s lower bound is not above 1/2, and the two-sided binomial test of
PREDICT. The soft radii that sigma searches and MACER maximise are the same
Theorem 1 radius evaluated at the probabilities of the soft smoothed classifier
(:func:`gaussian_radius`, :func:`soft_margin`).
"""

import numpy as np
import torch
from scipy import special, stats

__all__ = [
    "clopper_pearson_lower",
    "clopper_pearson_interval",
    "abstains",
    "gaussian_radius",
    "certified_radius",
    "top_class_radius",
    "soft_margin",
    "binomial_abstains",
    "top_two_test",
    "votes_reaching",
    "quantile_class",
    "quantile_test",
]


def first_offender(values, bad):
    """The first entry of ``values`` where ``bad`` holds, and its position, for an error message.

    Parameters
    ----------
    values, bad : ndarray, one shape
        Checked values, and where they fail the check.

    Returns
    -------
    str
        ``"<value> at index <i>"`` (the value alone for a scalar).
    """
    values, bad = np.broadcast_arrays(np.asarray(values), np.asarray(bad))
    if values.ndim == 0:
        return repr(values.item())
    index = tuple(int(k) for k in np.argwhere(bad)[0])
    return f"{values[index].item()!r} at index {index[0] if len(index) == 1 else index}"


def _checked_counts(n_success, n_total, alpha):
    """The counts as float arrays; refused unless ``0 <= n_success <= n_total`` and alpha is in [0, 1]."""
    n_success = np.asarray(n_success, dtype=np.float64)
    n_total = np.asarray(n_total, dtype=np.float64)
    bad = ~((n_success >= 0) & (n_success <= n_total))
    if bad.any():
        raise ValueError(f"n_success must lie in [0, n_total] for every input; got n_success="
                         f"{first_offender(n_success, bad)}, with n_total={first_offender(n_total, bad)}.")
    check_probability(alpha, "alpha")
    return n_success, n_total


def check_probability(values, name):
    """Refuse a probability (scalar or per input: a failure probability, a bound) outside [0, 1], naming it."""
    values = np.asarray(values, dtype=np.float64)
    bad = ~((values >= 0) & (values <= 1))
    if bad.any():
        raise ValueError(f"{name} must be a probability in [0, 1]; got {first_offender(values, bad)}.")


def check_noise_levels(sigma, name="sigma"):
    """Refuse noise levels (scalar or per input) that are not finite and positive, naming them ``name``."""
    sigma = np.asarray(sigma, dtype=np.float64)
    bad = ~(np.isfinite(sigma) & (sigma > 0))
    if bad.any():
        raise ValueError(f"{name} must be finite and positive; got {first_offender(sigma, bad)}.")


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
    n_success, n_total = _checked_counts(n_success, n_total, alpha)
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
    n_success, n_total = _checked_counts(n_success, n_total, alpha)
    n_fail = n_total - n_success
    with np.errstate(invalid="ignore"):
        lower = stats.beta.ppf(alpha / 2, n_success, n_fail + 1)
        upper = stats.beta.ppf(1 - alpha / 2, n_success + 1, n_fail)
    lower = np.where(n_success > 0, lower, 0.0)
    upper = np.where(n_fail > 0, upper, 1.0)
    return lower, upper


def abstains(p_lower):
    """CERTIFY's abstention rule: no certificate unless ``p_lower > 1/2`` (Cohen et al., Alg. 1).

    The one rule of the library: samplers return ``ABSTAIN`` and radii are 0
    exactly where it holds.

    Parameters
    ----------
    p_lower : array-like of float, shape (n_inputs,)
        Lower confidence bound on the candidate class's probability.

    Returns
    -------
    abstain : ndarray of bool, shape (n_inputs,)
        True where ``p_lower <= 1/2``: Theorem 1 then certifies nothing (and,
        at exactly 1/2, not even the class).

    Examples
    --------
    >>> abstains([0.3, 0.5, 0.51]).tolist()
    [True, True, False]
    """
    return np.asarray(p_lower, dtype=np.float64) <= 0.5


def gaussian_radius(sigma, p):
    """Theorem 1's radius ``sigma * PhiInv(p)`` of Cohen et al., with no abstention.

    ``sigma / 2 * (PhiInv(p) - PhiInv(1 - p))``: the radius when the runner-up
    has probability at most ``1 - p``. Negative below ``p = 1/2``, where it
    ranks candidates (Insta-RS's approximate radius, Sec. 3.1) but certifies
    nothing; :func:`certified_radius` is the certificate.

    Parameters
    ----------
    sigma : float or ndarray of float, shape (n_inputs,)
        Noise level.
    p : ndarray of float, shape (n_inputs,)
        Probability of the class, in [0, 1].

    Returns
    -------
    radius : ndarray of float, shape (n_inputs,)
        ``-inf`` at ``p = 0`` and ``inf`` at ``p = 1``.

    Examples
    --------
    >>> gaussian_radius(2.0, np.array([0.5, 0.8413447460685429])).round(6).tolist()
    [0.0, 2.0]
    """
    return sigma * special.ndtri(p)


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
        The radius; 0 where ``p_lower <= 1/2`` (the certificate abstains, :func:`abstains`).

    Examples
    --------
    >>> float(certified_radius(0.5, clopper_pearson_lower(99000, 100000, 0.001)))
    1.1449999776...
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    p_lower = np.asarray(p_lower, dtype=np.float64)
    if not np.all(sigma > 0):
        raise ValueError(f"sigma must be positive; got {first_offender(sigma, ~(sigma > 0))}.")
    check_probability(p_lower, "p_lower")
    return np.where(abstains(p_lower), 0.0, gaussian_radius(sigma, p_lower))


def top_class_radius(counts, n_samples, sigma, alpha, y=None):
    """CERTIFY's radius for the top class of the counts, optionally 0 unless it is the label.

    The radius estimate that grid and sign searches score a noise level by
    (PFAT Eq. 2; with labels PFAT Eq. 5, ``R * 1[top class == y]``). The
    class and its bound come from the same samples, so this ranks noise levels
    and certifies nothing: the certificate that follows draws fresh samples.

    Parameters
    ----------
    counts : ndarray of int, shape (n_inputs, n_classes)
        Votes of ``n_samples`` noisy copies per input.
    n_samples : int or ndarray of int, shape (n_inputs,)
        Copies per input (each row of ``counts`` sums to it).
    sigma : float or ndarray of float, shape (n_inputs,)
        Noise level of the copies.
    alpha : float
        Failure probability of the one-sided Clopper-Pearson bound.
    y : ndarray of int, shape (n_inputs,), optional
        Class indices; None scores the top class whatever it is.

    Returns
    -------
    radius : ndarray of float, shape (n_inputs,)
        :func:`certified_radius` of the top class's bound; with labels 0 where
        the top class is not ``y``.

    Examples
    --------
    >>> counts = np.array([[2, 98], [98, 2]])
    >>> top_class_radius(counts, 100, 1.0, 0.001, y=np.array([1, 1])).round(4).tolist()
    [1.2413, 0.0]
    """
    top = counts.argmax(axis=1)
    radius = certified_radius(sigma, clopper_pearson_lower(counts[np.arange(len(counts)), top], n_samples, alpha))
    return radius if y is None else np.where(top == y, radius, 0.0)


def soft_margin(probabilities, clip, y=None):
    """The gap ``PhiInv(p_A) - PhiInv(p_B)`` of the soft smoothed classifier, differentiable.

    ``sigma / 2`` times it is Theorem 1's radius at the soft classifier's
    probabilities: DDRS's objective (Alfarra et al. 2022, Eq. 1 and 3) and
    MACER's ``xi`` (Zhai et al. 2020, Eq. 9-10). ``p_A`` is the top
    probability, or with labels the label's, and ``p_B`` the largest other
    one; both are clipped to ``clip`` before ``PhiInv`` so the gap stays finite
    (DDRS App. A clips to [0.02, 0.98], MACER to ``[eps, 1 - eps]``).

    Parameters
    ----------
    probabilities : torch.Tensor, shape (n_inputs, n_classes)
        Mean softmax over noisy copies.
    clip : tuple of (float, float)
        Range the two probabilities are clipped to.
    y : torch.Tensor of int64, shape (n_inputs,), optional
        Class indices; None takes the top class.

    Returns
    -------
    gap : torch.Tensor, shape (n_inputs,)
        ``PhiInv(p_A) - PhiInv(p_B)``, >= 0 without labels.
    first : torch.Tensor of int64, shape (n_inputs,)
        Class of ``p_A``: the top class, or ``y``.

    Examples
    --------
    >>> gap, first = soft_margin(torch.tensor([[0.1, 0.2, 0.7]]), (0.02, 0.98))
    >>> round(float(gap), 4), first.tolist()
    (1.366, [2])
    """
    if y is None:
        top_two = probabilities.topk(2, dim=1)
        p_a, p_b, first = top_two.values[:, 0], top_two.values[:, 1], top_two.indices[:, 0]
    else:
        p_a = probabilities.gather(1, y[:, None])[:, 0]
        p_b = probabilities.scatter(1, y[:, None], -1.0).max(dim=1).values
        first = y
    return torch.special.ndtri(p_a.clamp(*clip)) - torch.special.ndtri(p_b.clamp(*clip)), first


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
    check_probability(alpha, "alpha")
    n_trials = count_top + count_second
    # Under p = 1/2 the binomial law is symmetric, so the two-sided p-value of
    # scipy.stats.binomtest is exactly min(1, 2 * cdf(min(k, n - k))).
    p_value = np.minimum(1.0, 2.0 * stats.binom.cdf(np.minimum(count_top, count_second), n_trials, 0.5))
    return np.where(n_trials > 0, p_value, 1.0) > alpha


def top_two_test(counts, alpha):
    """Cohen et al.'s PREDICT on vote counts: the top class, and where it is not significantly ahead.

    Parameters
    ----------
    counts : array-like of int, shape (n_inputs, n_classes)
        Votes of each input's noisy samples, ``n_classes >= 2``.
    alpha : float
        Probability of returning a class other than the smoothed classifier's.

    Returns
    -------
    top : ndarray of int, shape (n_inputs,)
        The most frequent class of each input (the first among ties).
    abstain : ndarray of bool, shape (n_inputs,)
        :func:`binomial_abstains` of the counts of the most and second most
        frequent classes.

    Examples
    --------
    >>> top, abstain = top_two_test([[10, 600, 390], [450, 0, 550]], 0.001)
    >>> top.tolist(), abstain.tolist()
    ([1, 2], [False, True])
    """
    counts = np.asarray(counts)
    order = np.argsort(-counts, axis=1, kind="stable")
    rows = np.arange(len(counts))
    return order[:, 0], binomial_abstains(counts[rows, order[:, 0]], counts[rows, order[:, 1]], alpha)


def votes_reaching(counts):
    """Votes on each of ordered classes or a later one.

    Parameters
    ----------
    counts : array-like of int, shape (n_inputs, n_classes)
        Votes per class, the classes in their order (e.g. increasing noise levels).

    Returns
    -------
    ndarray of int, shape (n_inputs, n_classes)
        Column ``k`` is ``counts[:, k:].sum(axis=1)``; column 0 is every vote.

    Examples
    --------
    >>> votes_reaching([[5, 3, 2]]).tolist()
    [[10, 5, 2]]
    """
    counts = np.asarray(counts, dtype=np.int64)
    return counts[:, ::-1].cumsum(axis=1)[:, ::-1]


def quantile_class(counts, threshold):
    """The largest of ordered classes that at least a fraction ``threshold`` of the votes reach.

    Class ``k`` is reached by the votes on ``k`` or a later class; the
    result is the largest ``k`` with :func:`votes_reaching` ``>= threshold *
    n``, the ``(1 - threshold)``-quantile of the votes (the median for 1/2).

    Parameters
    ----------
    counts : array-like of int, shape (n_inputs, n_classes)
        Votes per class, the classes in their order; each row sums to ``n > 0``.
    threshold : float
        In (0, 1).

    Returns
    -------
    ndarray of int, shape (n_inputs,)

    Examples
    --------
    >>> [quantile_class([[60, 30, 10]], threshold).item() for threshold in (0.5, 0.3, 0.1)]
    [0, 1, 2]
    """
    reaching = votes_reaching(counts)
    # Columns never increase, so the classes reached are 0 .. k: count them.
    return np.count_nonzero(reaching >= threshold * reaching[:, :1], axis=1) - 1


def quantile_test(counts, threshold, alpha):
    """The :func:`quantile_class` of vote counts, and where it is not significant (a PREDICT for ordered classes).

    The smoothed class is ``k* = max{k : S_k >= threshold}``, ``S_k`` the
    probability that a vote reaches class ``k``. With ``k`` the votes'
    class, the test keeps it where both one-sided binomial tests reject at
    ``alpha / 2``: ``S_k < threshold`` (``P(Bin(n, threshold) >= reaching_k)``;
    not for ``k = 0``, where ``S_0 = 1``) and ``S_{k+1} >= threshold``
    (``P(Bin(n, threshold) <= reaching_{k+1})``; not for the last class).

    **Proof** that a kept class is ``k*`` except with probability at most
    ``alpha``. ``S_k`` never increases with ``k``, nor do the counts
    reaching it. If ``k > k*``, then ``S_{k*+1} < threshold`` and
    ``reaching_{k*+1} >= reaching_k``, so keeping ``k`` means the first test
    rejected at the fixed class ``k* + 1``, where its null holds: probability
    at most ``alpha / 2``. If ``k < k*``, then ``S_{k*} >= threshold`` and
    ``reaching_{k*} <= reaching_{k+1}``, so the second test rejected at the
    fixed class ``k*``: at most ``alpha / 2``.

    Parameters
    ----------
    counts : array-like of int, shape (n_inputs, n_classes)
        Votes per class, the classes in their order; each row sums to ``n > 0``.
    threshold : float
        In (0, 1).
    alpha : float
        Probability of keeping a class other than ``k*``.

    Returns
    -------
    chosen : ndarray of int, shape (n_inputs,)
        :func:`quantile_class` of each row.
    abstain : ndarray of bool, shape (n_inputs,)
        Where either test does not reject.

    Examples
    --------
    >>> chosen, abstain = quantile_test([[100, 500, 400], [900, 50, 50]], 0.3, 0.001)
    >>> chosen.tolist(), abstain.tolist()
    ([2, 0], [False, False])
    >>> quantile_test([[100, 600, 300]], 0.3, 0.001)[1].tolist()
    [True]
    """
    check_probability(alpha, "alpha")
    reaching = votes_reaching(counts)
    n_inputs, n_classes = reaching.shape
    chosen = quantile_class(counts, threshold)
    total = reaching[:, 0]
    rows = np.arange(n_inputs)
    # Past either end the test has nothing to reject: a p-value of 0.
    above = np.where(chosen > 0, stats.binom.sf(reaching[rows, chosen] - 1, total, threshold), 0.0)
    following = np.minimum(chosen + 1, n_classes - 1)
    below = np.where(chosen < n_classes - 1, stats.binom.cdf(reaching[rows, following], total, threshold), 0.0)
    return chosen, np.maximum(above, below) > alpha / 2
