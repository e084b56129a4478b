"""Confidence sequences for a Bernoulli mean: lower bounds valid at every sample size at once.

Voráček (NeurIPS 2024), "Treatment of statistical estimation problems in
randomized smoothing for adversarial robustness", lets a sampler look at the
counts as they arrive by bounding the candidate's probability with a
confidence sequence. Two are implemented, both one-sided (all of alpha goes to
the lower bound) and both computed from counts:

- :class:`UnionBound`: Clopper-Pearson bounds at the looks of a schedule fixed
  in advance, each at its own share of alpha (Voráček's union-bound sequence);
- :class:`BettingBound`: a mixture of constant-bet capital processes
  (Waudby-Smith and Ramdas 2023, "Estimating means of bounded random variables
  by betting", JRSS-B: their capital process, here a diversified-Kelly mixture
  of constant bets), inverted with Ville's inequality.

Why each is valid at any stopping time is in ``docs/sequential.md``.
"""

from abc import ABC, abstractmethod

import numpy as np

from ..statistics import clopper_pearson_interval, clopper_pearson_lower

# Constant bets of the betting mixture: lambda in (0, 1] on a geometric grid of this ratio (a fixed
# ratio loses a fixed fraction of the Kelly bet's log-capital at any sample size; see _bet_grid).
_BET_RATIO = 1.5
# Bisection steps when inverting the betting test (the interval [0, p_hat] halves each step: 2 ** -50).
_BISECTION_STEPS = 50


def look_sizes(first, growth, n_max):
    """Cumulative estimation sample sizes at the looks of the geometric schedule.

    Parameters
    ----------
    first : int
        Size of the first look.
    growth : float
        Ratio of consecutive sizes (> 1); each look adds at least one sample.
    n_max : int
        Last look.

    Returns
    -------
    sizes : ndarray of int64, shape (n_looks,)
        Strictly increasing, ending at ``n_max``.

    Examples
    --------
    >>> look_sizes(1000, 2.0, 10_000).tolist()
    [1000, 2000, 4000, 8000, 10000]
    """
    sizes = [min(int(first), int(n_max))]
    while sizes[-1] < n_max:
        sizes.append(min(int(n_max), max(sizes[-1] + 1, int(np.ceil(sizes[-1] * growth)))))
    return np.asarray(sizes, dtype=np.int64)


def _bet_grid(n_max):
    """Constant bets ``lambda`` of the betting mixture, geometric from ~1/sqrt(n_max) up to 1.

    Near a decision at sample size N the Kelly bet ``(p - m) / (m (1 - m))``
    is of order ``z / sqrt(N m (1 - m))`` (``z`` the normal quantile of
    alpha), so a fixed ratio between neighbouring bets loses a fixed fraction
    of the optimal log-capital whatever N is; the smallest useful bet is about
    ``1 / sqrt(n_max)``.

    Returns
    -------
    lambdas : ndarray of float, shape (n_bets,)
        Increasing, ending at 1.
    """
    n_bets = int(np.ceil(0.5 * np.log(max(n_max, 2)) / np.log(_BET_RATIO))) + 1
    return _BET_RATIO ** -np.arange(n_bets)[::-1].astype(np.float64)


def betting_lower(successes, trials, alpha, log_weights, lambdas):
    """Lower end of the one-sided betting confidence sequence for a Bernoulli mean (vectorised).

    For a candidate mean ``m`` the capital of a constant bet ``lambda`` on
    ``X - m`` after ``trials`` outcomes with ``successes`` ones is
    ``(1 + lambda (1 - m)) ** successes * (1 - lambda m) ** (trials - successes)``
    (WSR 2023's capital process ``K_t(m) = prod_i (1 + lambda_i (X_i - m))`` with
    ``lambda_i = lambda``, a predictable bet). The mixture ``K(m)`` is the
    weighted mean of these capitals (WSR's diversified Kelly). Its bets are
    non-negative, so it only grows when the data say the mean exceeds ``m``
    (one-sided), and every component, hence ``K``, decreases in ``m``
    (``d/dm log K_lambda = -lambda successes / (1 + lambda (1 - m)) -
    lambda failures / (1 - lambda m) <= 0``). The bound is
    ``inf {m : K(m) < 1 / alpha}``, found by bisection on ``[0, successes / trials]``
    (at ``m = successes / trials`` every capital is at most 1 by Jensen's
    inequality, so that end is never rejected).

    Parameters
    ----------
    successes, trials : ndarray of float, shape (n_inputs,)
        Counts (``successes`` may be fractional for a hypothetical frequency).
    alpha : float
        Failure probability of the whole sequence.
    log_weights : ndarray of float, shape (n_inputs, n_bets)
        Log weights of the bets; their exponentials sum to at most 1 per row.
    lambdas : ndarray of float, shape (n_bets,)
        Constant bets in (0, 1].

    Returns
    -------
    lower : ndarray of float, shape (n_inputs,)
        0 where ``trials == 0``.
    """
    successes = np.asarray(successes, dtype=np.float64)
    trials = np.asarray(trials, dtype=np.float64)
    failures = trials - successes
    threshold = np.log(1.0 / alpha)
    low = np.zeros(len(trials))  # rejected (or 0)
    high = np.where(trials > 0, successes / np.maximum(trials, 1.0), 0.0)  # never rejected
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (low + high)
        # log K(m) >= log(1 / alpha): the mean m is rejected.
        log_capital = (log_weights + successes[:, None] * np.log1p(lambdas * (1.0 - middle[:, None]))
                       + failures[:, None] * np.log1p(-lambdas * middle[:, None]))
        # log K(m) as numpy's log-add-exp reduction: scipy's logsumexp costs ~0.5 ms of array-API overhead a call.
        reject = np.logaddexp.reduce(log_capital, axis=1) >= threshold
        low = np.where(reject, middle, low)
        high = np.where(reject, high, middle)
    # low is rejected (or 0) and K decreases, so inf {m : not rejected} >= low: low is conservative.
    return np.where(trials > 0, low, 0.0)


def betting_upper(successes, trials, alpha, lambdas):
    """Upper end of a one-sided betting confidence sequence (uniform constant bets on the failures).

    The mirror of :func:`betting_lower`: a lower bound on the failure rate
    ``1 - p`` from the failures, at level ``alpha``.

    Parameters
    ----------
    successes, trials : ndarray of float, shape (n_inputs,)
        Counts.
    alpha : float
        Failure probability of the whole sequence.
    lambdas : ndarray of float, shape (n_bets,)
        Constant bets in (0, 1], equally weighted.

    Returns
    -------
    upper : ndarray of float, shape (n_inputs,)
        1 where ``trials == 0``.
    """
    trials = np.asarray(trials, dtype=np.float64)
    log_weights = np.full((len(trials), len(lambdas)), -np.log(len(lambdas)))
    failures = trials - np.asarray(successes, dtype=np.float64)
    return 1.0 - betting_lower(failures, trials, alpha, log_weights, lambdas)


class ConfidenceSequence(ABC):
    """Anytime bounds on each input's candidate probability at the looks of its schedule.

    Built once per call by ``from_schedule`` from the spending strategy's
    ``Schedule`` (fixed given the selection samples); ``rows`` index inputs of
    that schedule and ``look`` its columns.
    """

    @classmethod
    @abstractmethod
    def from_schedule(cls, schedule, n_max, alpha):
        """The sequence of each input of ``schedule``.

        Parameters
        ----------
        schedule : Schedule
            Per input: the looks, their levels and the never-failing share (``_spending``).
        n_max : int
            Largest number of estimation samples.
        alpha : float
            Failure probability of each sequence.

        Returns
        -------
        ConfidenceSequence
        """

    @abstractmethod
    def lower(self, rows, look, successes, trials):
        """Lower end of the sequence at ``look``.

        Parameters
        ----------
        rows : ndarray of int, shape (n_rows,)
            Inputs.
        look : int
            Column of the schedule.
        successes, trials : ndarray of float, shape (n_rows,)
            Estimation samples of the candidate, and all estimation samples, drawn so far.

        Returns
        -------
        lower : ndarray of float, shape (n_rows,)
        """

    @abstractmethod
    def upper(self, rows, look, successes, trials):
        """Upper end at ``look`` (it only decides when to stop): as :meth:`lower`, shape (n_rows,)."""

    @classmethod
    def ones_needed(cls, needed, weight, alpha):
        """Ones in a row after which the bound reaches ``needed``, from a look or bet holding ``weight``.

        Union: the look's level is ``weight * alpha``. Betting: the bet
        ``lambda = 1`` with weight ``weight`` rejects ``m`` once its capital
        ``weight (2 - m) ** N`` reaches ``1 / alpha``.

        Parameters
        ----------
        needed : ndarray of float, shape (n_inputs,)
            Lower bound to reach, in (0, 1).
        weight : float
            Share of alpha (union) or of the mixture's weight (betting).
        alpha : float
            Failure probability of the sequence.

        Returns
        -------
        size : ndarray of float, shape (n_inputs,)
            Whole numbers, not clipped.
        """
        with np.errstate(divide="ignore"):
            return np.ceil(np.log(1.0 / (weight * alpha)) / cls._log_growth_per_one(needed))

    @staticmethod
    @abstractmethod
    def _log_growth_per_one(needed):
        """How much one more one moves the bound towards ``needed``, in nats (ndarray, shape of ``needed``)."""

    def lower_at(self, rows, look, p, trials):
        """The lower bound this look would give from counts at frequencies ``p`` (rule (b) asks).

        Parameters
        ----------
        rows, look, trials
            As in :meth:`lower`.
        p : ndarray of float, shape (n_rows, n_points)
            Frequencies of the candidate, per row.

        Returns
        -------
        lower : ndarray of float, shape (n_rows, n_points)
        """
        n_points = p.shape[1]
        successes = (p * trials[:, None]).ravel()
        return self.lower(np.repeat(rows, n_points), look, successes, np.repeat(trials, n_points)).reshape(p.shape)


class UnionBound(ConfidenceSequence):
    """Voráček's union-bound sequence: a Clopper-Pearson bound at each fixed look, at that look's level.

    The bound at look ``k`` (fixed size ``N_k``, level ``alpha_k``) exceeds
    the probability with probability at most ``alpha_k``; the levels of a row
    sum to ``alpha``, so all the looks' bounds hold at once with probability
    at least ``1 - alpha``. The upper bound (which only decides when to stop)
    splits its own ``alpha`` equally over the columns.

    Parameters
    ----------
    look_alpha : ndarray of float, shape (n_inputs, n_looks)
        Level of each look's lower bound; each row sums to ``alpha``.
    alpha : float
        Failure probability of each sequence.
    """

    def __init__(self, look_alpha, alpha):
        self.look_alpha = look_alpha
        self.upper_alpha = alpha / look_alpha.shape[1]

    @classmethod
    def from_schedule(cls, schedule, n_max, alpha):
        """The union bound with the schedule's levels (``n_max`` unused: the looks say everything)."""
        return cls(schedule.look_alpha, alpha)

    @staticmethod
    def _log_growth_per_one(needed):
        """The Clopper-Pearson bound from ``N`` ones of ``N`` at level ``w`` is ``w ** (1 / N)``."""
        return -np.log(needed)

    def lower(self, rows, look, successes, trials):
        """The Clopper-Pearson bound at the look's level."""
        return clopper_pearson_lower(successes, trials, self.look_alpha[rows, look])

    def upper(self, rows, look, successes, trials):
        """The Clopper-Pearson upper bound at level ``alpha / n_looks``."""
        return clopper_pearson_interval(successes, trials, 2 * self.upper_alpha)[1]


class BettingBound(ConfidenceSequence):
    """A mixture of constant bets (WSR 2023) inverted with Ville's inequality: valid at every size.

    At the true mean ``p`` each constant bet's capital ``prod_i (1 + lambda
    (X_i - p))`` is a non-negative martingale starting at 1, so is their
    weighted mean, and Ville's inequality bounds the probability that it ever
    reaches ``1 / alpha`` by ``alpha``. The upper bound mirrors it on the
    failures with equal weights.

    Parameters
    ----------
    log_weights : ndarray of float, shape (n_inputs, n_bets)
        Log weights of the bets per input; their exponentials sum to 1 per row.
    lambdas : ndarray of float, shape (n_bets,)
        Constant bets in (0, 1].
    alpha : float
        Failure probability of each sequence.
    """

    def __init__(self, log_weights, lambdas, alpha):
        self.log_weights = log_weights
        self.lambdas = lambdas
        self.alpha = alpha

    @classmethod
    def from_schedule(cls, schedule, n_max, alpha):
        """Equal weights on the bets of :func:`_bet_grid`, plus the never-failing share on ``lambda = 1``.

        ``lambda = 1`` (the last bet) is the bet a count of all ones wins
        fastest: within ``N (1 - m) ** 2`` nats of the best bet then.
        """
        lambdas = _bet_grid(n_max)
        share = schedule.never_failing_share
        weights = np.repeat(((1.0 - share) / len(lambdas))[:, None], len(lambdas), axis=1)
        weights[:, -1] += share
        return cls(np.log(weights), lambdas, alpha)

    @staticmethod
    def _log_growth_per_one(needed):
        """The capital of the bet ``lambda = 1`` at ``m`` grows by ``2 - m`` with each one."""
        return np.log(2.0 - needed)

    def lower(self, rows, look, successes, trials):
        """:func:`betting_lower` with the rows' weights (the same at every look)."""
        return betting_lower(successes, trials, self.alpha, self.log_weights[rows], self.lambdas)

    def upper(self, rows, look, successes, trials):
        """:func:`betting_upper` (the same at every look)."""
        return betting_upper(successes, trials, self.alpha, self.lambdas)


# SequentialSampler's confidence_sequence parameter: its values and the sequences they name.
CONFIDENCE_SEQUENCES = {"union": UnionBound, "betting": BettingBound}
