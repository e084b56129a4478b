"""Sequential, anytime-valid certification: sample each input in rounds and stop it once it is decided.

Voráček (NeurIPS 2024), "Treatment of statistical estimation problems in
randomized smoothing for adversarial robustness": confidence sequences, valid
at every sample size at once, let a sampler look at the counts as they arrive.
Two confidence sequences for the candidate's probability are implemented, both
one-sided (all of alpha goes to the lower bound) and both computed from counts:

- ``"betting"``: a mixture of constant-bet capital processes (Waudby-Smith and
  Ramdas 2023, "Estimating means of bounded random variables by betting",
  JRSS-B: their capital process, here a diversified-Kelly mixture of constant
  bets), inverted with Ville's inequality;
- ``"union"``: Clopper-Pearson bounds at the looks of a fixed schedule with
  alpha split over the looks (Voráček's union-bound confidence sequence),
  equally or, with ``alpha_spending="predicted"``, mostly on the looks near
  the size the selection samples predict, or, with ``"prior"``, in
  proportion to the selection's posterior probability of stopping at each look,
  or, with ``"plan"``, all of alpha on one look planned from the selection
  wherever the selection pins the stopping size down.
"""

from numbers import Real

import numpy as np
from scipy import stats
from scipy.special import logsumexp
from .._constraints import SAMPLE_SIZE, Interval, StrOptions

from .._stages import ESTIMATION, SELECTION
from ..statistics import (
    certified_radius,
    clopper_pearson_interval,
    clopper_pearson_lower,
)
from ._base import BaseSampler, SamplingResult
from ._input_specific import _min_sample_size, _radius_per_sigma, check_relative_decline

# Share of alpha (union) or of the betting mixture's weight given to "the candidate never fails"
# for inputs whose selection samples were all of the candidate (see SequentialSampler, Notes).
_ALL_IN_SHARE = 0.75
# Constant bets of the betting mixture: lambda in (0, 1] on a geometric grid (ratio ~1.5).
_BET_RATIO = 1.5
# Bisection steps when inverting the betting test (interval [0, p_hat] halves each step).
_BISECTION_STEPS = 50
# Points of the confidence interval on which the decline rule (b) is checked.
_DECLINE_GRID = 9
# alpha_spending="predicted" (tuned on benchmarks/bench_sequential.py; see SequentialSampler, Notes):
# the selection's predicted frequency is its one-sided (1 - _PREDICTION_ALPHA) Clopper-Pearson upper bound;
_PREDICTION_ALPHA = 0.3
# the ladder of looks from the predicted size: _LADDER_LOOKS looks, sizes growing by _LADDER_RATIO,
# shares of alpha shrinking by _LADDER_DECAY;
_LADDER_LOOKS = 4
_LADDER_RATIO = 1.2
_LADDER_DECAY = 0.5
# alpha_spending="prior" (see SequentialSampler, Notes): _PRIOR_QUANTILES quantiles of the Jeffreys
# posterior of the selection count give the predicted stopping sizes (first pass at level _PRIOR_LEVEL * alpha),
# snapped up to a grid of sizes growing by _PRIOR_RATIO; _PRIOR_FLOOR of the alpha not on the never-failing
# look stays on the geometric looks (equal split) in case the prediction is wrong; _PRIOR_PASSES recomputations
# of the sizes at the levels their looks got; rule (b) is checked on the two-sided (1 - _PRIOR_INTERVAL_ALPHA)
# Clopper-Pearson interval (tuned on benchmarks/bench_sequential.py, which measures the MAD).
_PRIOR_QUANTILES = 20
_PRIOR_LEVEL = 0.25
_PRIOR_RATIO = 1.2
_PRIOR_FLOOR = 0.1
_PRIOR_PASSES = 2
_PRIOR_INTERVAL_ALPHA = 0.5
# alpha_spending="plan" (see SequentialSampler, Notes): a selection is planned when the planned sizes at the
# Jeffreys posterior's _PLAN_SPREAD_QUANTILES (low, high) frequencies ask a radius (low > 1) and differ by at
# most a factor _PLAN_SPREAD; its size makes the decline, averaged over _PLAN_POSTERIOR_POINTS mid-quantiles
# of the posterior and the count's binomial law (_EXPECTATION_POINTS mid-quantiles), at most
# (1 - _PLAN_MARGIN) * decline (tuned on benchmarks/bench_sequential.py, which measures the MAD).
_PLAN_SPREAD_QUANTILES = (0.1, 0.9)
_PLAN_SPREAD = 3.0
_PLAN_POSTERIOR_POINTS = 8
_PLAN_MARGIN = 0.05
_EXPECTATION_POINTS = 16
# rule (b) is checked on the two-sided (1 - _DECLINE_INTERVAL_ALPHA) Clopper-Pearson interval of the
# current counts (it only decides when to stop, so it needs no anytime validity).
_DECLINE_INTERVAL_ALPHA = 0.1


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
        reject = logsumexp(log_capital, axis=1) >= threshold
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
    alpha : float
    lambdas : ndarray of float, shape (n_bets,)

    Returns
    -------
    upper : ndarray of float, shape (n_inputs,)
        1 where ``trials == 0``.
    """
    trials = np.asarray(trials, dtype=np.float64)
    log_weights = np.full((len(trials), len(lambdas)), -np.log(len(lambdas)))
    failures = trials - np.asarray(successes, dtype=np.float64)
    return 1.0 - betting_lower(failures, trials, alpha, log_weights, lambdas)


class SequentialSampler(BaseSampler):
    """Anytime-valid sequential certification: rounds of fresh samples until each input is decided.

    ``n0`` selection samples (engine stage ``(*stage, 0)``) choose each
    input's candidate class, as in Cohen et al.'s CERTIFY. Estimation then
    runs in rounds: round ``r`` brings every undecided input to its next look
    (cumulative sizes ``first, first * growth, ...`` up to ``n_max``), all
    inputs packed into one engine call with per-input counts on the fresh
    stage ``(*stage, 1, r)``. After each round a confidence sequence gives a
    lower bound on the candidate's probability valid at every look at once,
    and an input stops when

    (a) ``radius`` is given and the bound shows it robust at ``radius``
        (``sigma * PhiInv(lower) >= radius``), or an upper bound shows that
        even ``n_max`` samples could not (the Clopper-Pearson radius at
        ``n_max`` and that upper bound is below ``radius``);
    (b) ``radius`` is None and more samples cannot raise the radius by more
        than ``decline``: at the current size, the radius this sampler
        certifies from a count at frequency ``p`` is at most ``decline``
        (absolute, radius units) or a fraction ``decline`` (relative) below the
        Clopper-Pearson radius at ``n_max`` (ISS's reference, Def. 1-2), for
        every ``p`` in the current confidence interval (with
        ``alpha_spending="predicted"``: a 90 % interval; ``"prior"``: 50 %);
        this includes inputs
        that even ``n_max`` could not certify by more than ``decline``;
    (c) it reached ``n_max`` estimation samples.

    Rule (a) or (b) is also checked on the selection samples alone (their
    two-sided Clopper-Pearson interval), so hopeless inputs stop after ``n0``.
    The certificate is about ``g(., sigma)``, the smoothed classifier at each
    input's own sigma: with probability at least ``1 - alpha`` its top class
    is the prediction and the reported ``p_lower`` is below its probability.

    Parameters
    ----------
    n_max : int, default=100_000
        Largest number of estimation samples per input; the decline is
        measured against the Clopper-Pearson radius at this size.
    decline : float, default=0.05
        Allowed radius decline of rule (b): radius units for ``"absolute"``,
        a fraction in (0, 1) for ``"relative"``. Unused when ``radius`` is set.
    decline_type : {"absolute", "relative"}, default="absolute"
    radius : float or None, default=None
        Decide "robust at ``radius``" (rule (a)) instead of bounding the decline.
    confidence_sequence : {"union", "betting"}, default="union"
        Clopper-Pearson bounds with alpha split over the looks, or a mixture
        of constant bets inverted with Ville's inequality. The union bound
        needs fewer samples on our benchmarks (``benchmarks/bench_sequential.py``):
        the looks are few and fixed, and Clopper-Pearson is exact at each,
        while the betting bound pays a Chernoff-type slack and, for inputs
        with ``pA`` just below 1, the weight it puts on the bet ``lambda = 1``.
    first : int, default=500
        Estimation samples of the first look.
    growth : float, default=1.5
        Ratio of consecutive look sizes, > 1.
    n0 : int, default=100
        Selection samples per input (Cohen et al.'s N0). Rule (b) bounds the
        decline of the selected candidate's radius; a wrong candidate, more
        frequent at a small ``n0``, costs its whole radius. At ``n0=20``
        (sigma 0.5, ``decline=0.05``, ``n_max=100_000``) the expected
        decline reached 0.057 at ``pA = 0.6`` with ``"predicted"``,
        ``"prior"`` and ``"plan"`` spending (0.052 with ``"equal"``); at
        the default it stays within ``decline``.
    alpha_spending : {"equal", "predicted", "prior", "plan"}, default="equal"
        How the union bound shares alpha over the looks. ``"equal"``: equally
        over the geometric looks (plus the never-failing look, Notes).
        ``"predicted"`` (union only): the selection samples also predict the
        size where the input will stop, and most of alpha goes to a short
        ladder of looks from there; rule (b) is then checked on a narrower
        interval. Fewer samples for inputs with ``pA < 1`` on
        ``benchmarks/bench_sequential.py``; see Notes. ``"prior"`` (union
        only): alpha in proportion to the selection's posterior probability
        of stopping at each look, with a narrower interval for rule (b)
        still; fewer samples than ``"predicted"`` on that benchmark (Notes).
        ``"plan"`` (union, decline mode only): where the selection predicts
        the stopping size within a factor 3, a single look holding all of
        alpha at a size planned for the selection's posterior, else
        ``"prior"``; the fewest samples for inputs with ``pA < 1`` on that
        benchmark (Notes).

    Notes
    -----
    **Anytime validity.** Fix an input and condition on its selection counts
    (stage ``(*stage, 0)``, independent of every estimation stage). The
    candidate, the schedule of looks ``N_1 < ... < N_R`` and the shares of
    alpha (union) or bet weights (betting) are then fixed, and the candidate's
    estimation outcomes ``X_1, X_2, ...`` (fresh stages, each round's copies
    i.i.d.) are i.i.d. Bernoulli(p). Union: the Clopper-Pearson bound at the
    fixed size ``N_k`` and level ``alpha_k`` exceeds p with probability at most
    ``alpha_k``, so the event "some look's bound exceeds p" has probability at
    most ``sum_k alpha_k = alpha``. Betting: at ``m = p`` each constant bet's
    capital ``prod_i (1 + lambda (X_i - p))`` is a non-negative martingale
    with initial value 1 (``E[X_i] = p``, ``0 < lambda <= 1 <= 1 / p``), so is
    their weighted mean ``K_t(p)``, and Ville's inequality gives
    ``P(exists t: K_t(p) >= 1 / alpha) <= alpha`` (Ville's inequality, as in WSR 2023).
    Outside that event p is never rejected, so every bound is at most p. In
    both cases the failure event does not depend on when sampling stops: the
    bound (the largest of the bounds of all looks so far) is valid at any
    stopping time, in particular at one chosen by rules (a)-(c) from the same
    counts. Each certificate therefore holds with probability at least
    ``1 - alpha`` and alpha is not split between looks and stopping.
    The upper bounds of rules (a) and (b) only decide when to stop: a wrong
    upper bound can stop an input early, giving a smaller (still sound)
    radius or an abstention, never a wrong certificate, so they get their own
    level ``alpha`` (anytime-valid as well: union over the looks, or the
    mirrored betting sequence); the decline bound of (b) holds when they do.

    **Inputs that never fail.** For a well-trained model most inputs have
    ``pA = 1``, where a fixed-size Clopper-Pearson bound is ``alpha ** (1/N)``
    and any split of alpha costs samples in proportion to ``log(1/alpha_k)``.
    When all ``n0`` selection samples were of the candidate, a share
    ``0.75`` of alpha (union) or of the mixture weight (betting, on the bet
    ``lambda = 1``, within ``N (1 - m) ** 2`` nats of the best bet when every
    outcome is a one) goes to one extra look at the size where an input that
    never fails meets its stopping rule; that size is computed before any
    estimation sample is drawn, so the schedule stays fixed given the
    selection. The other looks share the rest (union: equally; betting:
    equal weights on constant bets on a geometric grid in (0, 1]).

    **Predicted spending** (``alpha_spending="predicted"``). Before any
    estimation sample, each input's selection count predicts its frequency
    (the one-sided 70 % Clopper-Pearson upper bound of the ``n0`` selection
    samples) and the size ``N*`` at which a count at that frequency meets its
    stopping rule. ``0.75 alpha`` goes to the looks ``N*, 1.2 N*, 1.44 N*,
    1.73 N*`` in shares ``8 : 4 : 2 : 1`` (or, for a never-failing selection,
    to the never-failing look above), ``0.25 alpha`` equally to the geometric
    looks. The looks and their levels are functions of the selection counts
    alone and sum to ``alpha``, so the union argument above holds unchanged
    (the schedule is fixed given the selection; the estimation counts are
    independent of it). Rule (b) is checked on the two-sided 90 %
    Clopper-Pearson interval of the current counts instead of the anytime
    interval: it is a stopping rule, which may use any function of the
    counts without touching validity. It brings the expected decline
    (ISS's MAD, Def. 2) up to ``decline``, where the wide anytime interval
    keeps it below (a 50 % interval overshot: 0.0513 +- 0.0006 at pA = 0.57,
    sigma 0.5, U = 0.05); ``benchmarks/bench_sequential.py`` measures it.

    **Prior spending** (``alpha_spending="prior"``). The selection count
    ``s`` of ``n0`` gives the candidate's probability the Jeffreys posterior
    ``Beta(s + 1/2, n0 - s + 1/2)``; its 20 mid-quantiles ``p_j`` each predict
    a stopping size ``N*(p_j)`` (where a count at ``p_j`` meets the stopping
    rule, at the level that size's look gets, found in two passes), rounded up
    to a grid of sizes growing by 1.2. Each ``N*(p_j)`` becomes a look holding
    ``0.9 / 20`` of the alpha left after the never-failing look (the whole
    alpha, or ``0.25 alpha`` for a never-failing selection, which keeps its
    look at ``0.75 alpha`` as above), looks of equal size merged; the other
    ``0.1``, and the shares of quantiles at which rule (b) asks no radius
    (the input would abstain), are split equally over the geometric looks,
    for inputs the posterior misjudges. So alpha goes where the posterior expects the input
    to stop (spending in proportion to the probability of stopping at a
    look is what minimises the expected ``log(1 / alpha_k)`` paid there),
    and the looks follow the posterior's spread instead of a fixed ladder.
    **Validity** is the union argument above: the looks and their levels
    are functions of the selection counts (stage ``(*stage, 0)``) alone,
    fixed before any estimation sample, and each row's levels sum to
    ``alpha``; where sampling stops is a stopping rule on the counts and
    may skip looks, which only leaves some of their alpha unused. Rule (b)
    is checked on the two-sided 50 % Clopper-Pearson interval (a stopping
    rule only, like the 90 % one above); ``benchmarks/bench_sequential.py``
    measures the MAD this gives.

    **Planned spending** (``alpha_spending="plan"``). Rule (b) is about the
    expected decline (ISS's MAD, Def. 2, is a maximum over ``pA`` of an
    expectation), and for an input whose selection already tells where it
    will stop, spreading alpha over looks costs more than waiting for the
    data saves. The selection count ``s`` of ``n0`` gives the Jeffreys
    posterior; a size is *planned* for a set of frequencies when the decline
    (the reference radius less the expected Clopper-Pearson radius at the
    full alpha, over the binomial law of the count), averaged over the set,
    is at most ``0.95 decline``. Where ``s < n0``, the size planned for the
    posterior's 10 % quantile asks for a radius and the one planned for its
    90 % quantile is at most 3 times larger, the input gets one look holding
    all of alpha, at the size planned for 8 mid-quantiles of the posterior
    (so a wider posterior buys more samples), and stops there: Cohen et
    al.'s CERTIFY with its size chosen from the selection samples. Every
    other input (never-failing selections, posteriors reaching frequencies
    that ask no radius, or spread too wide) gets the ``"prior"`` schedule.
    **Validity** is the union argument with a single look, or the prior's:
    the choice between them, the size and the levels are functions of the
    selection counts alone, and each row's levels sum to ``alpha``.
    ``benchmarks/bench_sequential.py`` measures the MAD (it tuned the
    constants: check it on your own distribution of ``pA``).

    **Why this split of alpha.** Voráček's reference code spends
    ``alpha_k = 5 alpha / ((k + 4) (k + 5))`` over unboundedly many looks
    (sizes growing by 1.1). Our schedule is finite and fixed (it ends at
    ``n_max``, ``R`` looks), so an equal split loses only ``log R`` nats at
    every look, while a series such as ``6 alpha / (pi^2 k^2)`` would put
    alpha on looks that never happen and starve the late looks where inputs
    with pA near 1 decide.

    **Cost.** Rounds are ``O(log(n_max / first) / log(growth))`` engine calls,
    each packing all undecided inputs into full batches; the bounds are
    vectorised over inputs (betting: a bisection over ~20 bets).

    References
    ----------
    V. Voráček, "Treatment of statistical estimation problems in randomized
    smoothing for adversarial robustness", NeurIPS 2024.
    I. Waudby-Smith and A. Ramdas, "Estimating means of bounded random
    variables by betting", JRSS-B 2023.

    Examples
    --------
    >>> sampler = SequentialSampler(n_max=10_000, first=500, growth=2.0)
    >>> sampler.prediction_sample_size
    10000
    """

    _parameter_constraints = {
        "n_max": [SAMPLE_SIZE],
        "decline": [Interval(Real, 0, None, closed="neither")],
        "decline_type": [StrOptions({"absolute", "relative"})],
        "radius": [Interval(Real, 0, None, closed="neither"), None],
        "confidence_sequence": [StrOptions({"betting", "union"})],
        "first": [SAMPLE_SIZE],
        "growth": [Interval(Real, 1, None, closed="neither")],
        "n0": [SAMPLE_SIZE],
        "alpha_spending": [StrOptions({"equal", "predicted", "prior", "plan"})],
    }

    def __init__(self, n_max=100_000, decline=0.05, decline_type="absolute", radius=None,
                 confidence_sequence="union", first=500, growth=1.5, n0=100, alpha_spending="equal"):
        self.n_max = n_max
        self.decline = decline
        self.decline_type = decline_type
        self.radius = radius
        self.confidence_sequence = confidence_sequence
        self.first = first
        self.growth = growth
        self.n0 = n0
        self.alpha_spending = alpha_spending

    def _check_consistency(self):
        check_relative_decline(self.decline, self.decline_type)
        if self.alpha_spending != "equal" and self.confidence_sequence != "union":
            raise ValueError(f"alpha_spending={self.alpha_spending!r} places shares of alpha on looks, so it needs "
                             f"confidence_sequence='union'; got {self.confidence_sequence!r}.")
        if self.alpha_spending == "plan" and self.radius is not None:
            raise ValueError(f"alpha_spending='plan' plans each look for the expected radius decline, so it needs "
                             f"radius=None; got radius={self.radius!r}.")

    @property
    def prediction_sample_size(self):
        """int: ``n_max``: ``predict``'s test has no radius to aim at, so it gets the largest size."""
        return int(self.n_max)

    # ------------------------------------------------------------------------------------------
    # The reference radius and the stopping rules
    # ------------------------------------------------------------------------------------------

    def _reference_radius(self, p, sigma, alpha):
        """Clopper-Pearson radius at ``n_max`` samples and frequency ``p`` (ISS Def. 1), shape of ``p``."""
        p = np.clip(p, 0.0, 1.0)
        return sigma * _radius_per_sigma(np.full(p.shape, int(self.n_max)), p, alpha)

    def _required_radius(self, reference, margin=0.0):
        """Smallest radius within the allowed decline of ``reference`` (rule (b)), less a share ``margin`` of it."""
        decline = (1.0 - margin) * self.decline
        if self.decline_type == "absolute":
            return reference - decline
        return (1.0 - decline) * reference

    def _never_failing_size(self, sigma, share, alpha):
        """Smallest size at which ``N`` ones of ``N`` meet the stopping rule with a share of alpha or weight.

        Union: the Clopper-Pearson bound from ``N`` ones at level ``share *
        alpha`` is ``(share alpha) ** (1 / N)``. Betting: the bet ``lambda = 1``
        with weight ``share`` alone rejects ``m`` once ``share (2 - m) ** N >=
        1 / alpha``. The returned size is where that bound reaches the bound
        the stopping rule needs at ``p = 1``.

        Parameters
        ----------
        sigma : ndarray of float, shape (n_inputs,)
        share : float
        alpha : float

        Returns
        -------
        size : ndarray of int64, shape (n_inputs,)
            In ``1 .. n_max``.
        """
        if self.radius is not None:
            target = np.full(len(sigma), float(self.radius))
        else:
            target = self._required_radius(self._reference_radius(np.ones(len(sigma)), sigma, alpha))
        needed = stats.norm.cdf(np.maximum(target, 0.0) / sigma)  # the bound on p that gives target
        growth_per_one = np.log(2.0 - needed) if self.confidence_sequence == "betting" else -np.log(needed)
        with np.errstate(divide="ignore"):
            size = np.ceil(np.log(1.0 / (share * alpha)) / growth_per_one)
        size = np.where(target > 0, size, 1.0)
        return np.clip(size, 1, int(self.n_max)).astype(np.int64)

    def _predicted_schedule(self, selected, never_failed, sigma, alpha, geometric):
        """Looks and their shares of alpha for ``alpha_spending="predicted"`` (union), fixed given the selection.

        Every input keeps the geometric looks, sharing ``(1 - 0.75) alpha``
        equally. An input whose selection samples were all of the candidate
        puts the other ``0.75 alpha`` on one look where a never-failing
        input stops (as with ``"equal"``); any other input spreads it over a
        ladder of ``_LADDER_LOOKS`` looks ``N*, 1.2 N*, 1.44 N*, ...`` with
        halving shares (``8 : 4 : 2 : 1``), where ``N*`` is the size at which a
        count at the selection's predicted frequency (the one-sided
        ``1 - _PREDICTION_ALPHA`` Clopper-Pearson upper bound of the selection
        samples) meets the stopping rule at the ladder's first share.

        Parameters
        ----------
        selected : ndarray of int, shape (n_inputs,)
            Selection samples of the candidate, out of ``n0``.
        never_failed : ndarray of bool, shape (n_inputs,)
            ``selected == n0``.
        sigma : ndarray of float, shape (n_inputs,)
        alpha : float
        geometric : ndarray of int64, shape (n_geometric,)
            The geometric looks, ending at ``n_max``.

        Returns
        -------
        looks : ndarray of int64, shape (n_inputs, n_geometric + _LADDER_LOOKS)
            Sorted cumulative sizes per input; repeated sizes draw no new samples.
        look_alpha : ndarray of float, shape (n_inputs, n_geometric + _LADDER_LOOKS)
            Level of each look's Clopper-Pearson bound; each row sums to ``alpha``.
            Ladder looks clipped to ``n_max``, and the unused ladder looks of
            never-failing inputs, sort after the geometric look at ``n_max``,
            where the input stops, and get level 0 for never-failing inputs.
        """
        n_inputs, n_max = len(sigma), int(self.n_max)
        ladder_share = _ALL_IN_SHARE * _LADDER_DECAY ** np.arange(_LADDER_LOOKS)
        ladder_share *= _ALL_IN_SHARE / ladder_share.sum()
        anchor = self._predicted_size(selected, sigma, ladder_share[0] * alpha)
        ladder = np.minimum(np.ceil(anchor[:, None] * _LADDER_RATIO ** np.arange(_LADDER_LOOKS)), n_max)
        ladder_alpha = np.broadcast_to(ladder_share * alpha, ladder.shape).copy()
        # Never-failing selections: one look at the never-failing size with the whole 0.75 alpha.
        ladder[never_failed] = n_max
        ladder[never_failed, 0] = self._never_failing_size(sigma[never_failed], _ALL_IN_SHARE, alpha)
        ladder_alpha[never_failed] = 0.0
        ladder_alpha[never_failed, 0] = _ALL_IN_SHARE * alpha
        looks = np.concatenate([np.broadcast_to(geometric, (n_inputs, len(geometric))),
                                ladder.astype(np.int64)], axis=1)
        geometric_alpha = np.full((n_inputs, len(geometric)), (1.0 - _ALL_IN_SHARE) * alpha / len(geometric))
        look_alpha = np.concatenate([geometric_alpha, ladder_alpha], axis=1)
        # Stable: the geometric look at n_max comes before every ladder look clipped to n_max.
        order = np.argsort(looks, axis=1, kind="stable")
        return np.take_along_axis(looks, order, axis=1), np.take_along_axis(look_alpha, order, axis=1)

    def _predicted_size(self, selected, sigma, level):
        """Size at which a count at the selection's predicted frequency meets the stopping rule.

        Parameters
        ----------
        selected : ndarray of int, shape (n_inputs,)
            Selection samples of the candidate, out of ``n0``.
        sigma : ndarray of float, shape (n_inputs,)
        level : float
            Level of the Clopper-Pearson bound at that size (also that of the reference radius).

        Returns
        -------
        size : ndarray of int64, shape (n_inputs,)
            In ``1 .. n_max``: the smallest size whose bound, from a count at the
            predicted frequency, certifies ``radius`` (radius mode) or the
            radius rule (b) requires there; ``n_max`` where no size does.
        """
        predicted = clopper_pearson_interval(selected, int(self.n0), 2 * _PREDICTION_ALPHA)[1]
        return self._stopping_size(predicted, sigma, level, level)

    def _stopping_size(self, p, sigma, level, reference_alpha):
        """Smallest size whose Clopper-Pearson bound at ``level``, from a count at frequency ``p``, stops an input.

        Parameters
        ----------
        p : ndarray of float, shape (n_points,)
            Frequencies of the candidate.
        sigma : ndarray of float, shape (n_points,)
        level : float
            Level of the bound.
        reference_alpha : float
            Level of the reference radius at ``n_max`` (rule (b)).

        Returns
        -------
        size : ndarray of int64, shape (n_points,)
            In ``1 .. n_max``: where the bound certifies ``radius`` (radius mode)
            or the radius rule (b) requires; 1 where rule (b) requires no
            radius, ``n_max`` where no size suffices.
        """
        if self.radius is not None:
            target = np.full(len(sigma), float(self.radius))
        else:
            target = self._required_radius(self._reference_radius(p, sigma, reference_alpha))
        size = np.ones(len(sigma), dtype=np.int64)
        positive = target > 0
        size[positive] = _min_sample_size(p[positive], target[positive] / sigma[positive], int(self.n_max), level)
        return size

    def _prior_schedule(self, selected, never_failed, sigma, alpha, geometric):
        """Looks and their levels for ``alpha_spending="prior"`` (union), fixed given the selection.

        The candidate's probability gets the Jeffreys posterior
        ``Beta(selected + 1/2, n0 - selected + 1/2)`` of the selection count;
        each of its ``_PRIOR_QUANTILES`` mid-quantiles ``p_j`` predicts the
        size ``N*(p_j)`` where a count at ``p_j`` meets the stopping rule at
        the level of its look (``_PRIOR_PASSES`` passes, the first at
        ``_PRIOR_LEVEL * alpha``), snapped up to the grid of sizes growing by
        ``_PRIOR_RATIO``. Of the alpha not on the never-failing look (as with
        ``"equal"``, ``0.75 alpha`` for a never-failing selection), a share
        ``_PRIOR_FLOOR`` goes equally to the geometric looks and the rest in
        equal parts to the ``N*(p_j)``: alpha in proportion to the posterior
        probability of stopping at each look. Quantiles where rule (b) asks
        no radius (the input abstains) get no look; their shares go to the
        geometric looks. Looks of equal size are merged, their levels added.

        Parameters
        ----------
        selected, never_failed, sigma, alpha, geometric
            As in :meth:`_predicted_schedule`.

        Returns
        -------
        looks : ndarray of int64, shape (n_inputs, n_geometric + _PRIOR_QUANTILES + 1)
            Sorted cumulative sizes per input, ending at ``n_max``; repeated sizes draw no new samples.
        look_alpha : ndarray of float, shape (n_inputs, n_geometric + _PRIOR_QUANTILES + 1)
            Level of each look's Clopper-Pearson bound; each row sums to ``alpha``.
            A repeated size holds the merged level at its first column and 0 at the others.
        """
        n_inputs, n_max = len(sigma), int(self.n_max)
        quantiles = (np.arange(_PRIOR_QUANTILES) + 0.5) / _PRIOR_QUANTILES
        grid = look_sizes(1, _PRIOR_RATIO, n_max)
        all_in = np.where(never_failed, _ALL_IN_SHARE, 0.0)
        never_failing = np.where(never_failed, self._never_failing_size(sigma, _ALL_IN_SHARE, alpha), n_max)
        # Inputs with the same selection count and sigma share their predicted looks: compute each once.
        keys, inverse = np.unique(np.column_stack([selected, sigma, never_failed]), axis=0, return_inverse=True)
        inverse = inverse.ravel()
        key_selected, key_sigma = keys[:, 0], np.repeat(keys[:, 1], _PRIOR_QUANTILES)
        p = self._posterior_quantiles(key_selected, quantiles).ravel()
        prior_alpha = (1.0 - _PRIOR_FLOOR) * (1.0 - _ALL_IN_SHARE * keys[:, 2]) * alpha
        level = np.full(p.shape, _PRIOR_LEVEL * alpha)
        for _ in range(_PRIOR_PASSES):
            # Each quantile's stopping size at the level its look gets (first pass: a guess),
            # snapped up to the grid; a look's level is the sum over the quantiles landing on it.
            needed = np.empty(p.shape, dtype=np.int64)
            for value in np.unique(level):  # few values: multiples of the quantiles' share
                at = level == value
                needed[at] = self._stopping_size(p[at], key_sigma[at], value, alpha)
            needed = needed.reshape(len(keys), _PRIOR_QUANTILES)
            # Size 1: rule (b) asks no radius at p_j (the input abstains there), so no look; its share
            # goes to the geometric looks (to the other quantiles it would stop inputs near that
            # threshold too early: measured MAD 0.0505 +- 0.0004 at pA 0.57, sigma 0.5).
            useful = needed > 1
            quantile_alpha = np.where(useful, prior_alpha[:, None] / _PRIOR_QUANTILES, 0.0)
            predicted = np.where(useful, grid[np.searchsorted(grid, needed)], n_max)
            same = predicted[:, :, None] == predicted[:, None, :]
            level = np.maximum(np.sum(same * quantile_alpha[:, None, :], axis=2), 1e-300).ravel()
        unplaced = (prior_alpha - quantile_alpha.sum(axis=1))[inverse]
        geometric_alpha = (_PRIOR_FLOOR * (1.0 - all_in) * alpha + unplaced) / len(geometric)
        looks = np.column_stack([np.broadcast_to(geometric, (n_inputs, len(geometric))), predicted[inverse],
                                 never_failing])
        look_alpha = np.column_stack([np.repeat(geometric_alpha[:, None], len(geometric), axis=1),
                                      quantile_alpha[inverse], all_in * alpha])
        order = np.argsort(looks, axis=1, kind="stable")
        looks, look_alpha = np.take_along_axis(looks, order, axis=1), np.take_along_axis(look_alpha, order, axis=1)
        # Merge equal sizes: the first column of each run of equal sizes gets the run's total level.
        run_start = np.concatenate([np.ones((n_inputs, 1), dtype=bool), np.diff(looks, axis=1) > 0], axis=1)
        run_id = np.cumsum(run_start, axis=1) - 1
        merged = np.zeros_like(look_alpha)
        np.add.at(merged, (np.repeat(np.arange(n_inputs), looks.shape[1]), run_id.ravel()), look_alpha.ravel())
        return looks, np.where(run_start, np.take_along_axis(merged, run_id, axis=1), 0.0)

    def _plan_schedule(self, selected, never_failed, sigma, alpha, geometric):
        """Looks and their levels for ``alpha_spending="plan"`` (union, decline mode), fixed given the selection.

        An input whose selection count is below ``n0`` and whose posterior
        quantiles ``_PLAN_SPREAD_QUANTILES`` have planned sizes (see
        :meth:`_planned_size`) low ``> 1`` and high ``<= _PLAN_SPREAD * low``
        gets a single look holding all of alpha, at the size planned for its
        whole posterior; every other input the ``"prior"`` schedule.

        Parameters
        ----------
        selected, never_failed, sigma, alpha, geometric
            As in :meth:`_predicted_schedule`.

        Returns
        -------
        looks : ndarray of int64, shape (n_inputs, n_geometric + _PRIOR_QUANTILES + 1)
            Sorted cumulative sizes per input, ending at ``n_max``, or, for a
            planned input, its one size repeated in every column.
        look_alpha : ndarray of float, shape (n_inputs, n_geometric + _PRIOR_QUANTILES + 1)
            Level of each look's Clopper-Pearson bound; each row sums to ``alpha``
            (a planned input: ``alpha`` in the first column, 0 in the others).
        """
        keys, inverse = np.unique(np.column_stack([selected, sigma]), axis=0, return_inverse=True)
        inverse = inverse.ravel()
        key_selected, key_sigma = keys[:, 0], keys[:, 1]
        ends = self._posterior_quantiles(key_selected, np.asarray(_PLAN_SPREAD_QUANTILES))
        low, high = (self._planned_size(ends[:, [j]], key_sigma, alpha) for j in (0, 1))
        pinned = (key_selected < int(self.n0)) & (low > 1) & (high <= _PLAN_SPREAD * low)
        posterior = self._posterior_quantiles(key_selected[pinned],
                                              (np.arange(_PLAN_POSTERIOR_POINTS) + 0.5) / _PLAN_POSTERIOR_POINTS)
        size = np.zeros(len(keys), dtype=np.int64)
        size[pinned] = self._planned_size(posterior, key_sigma[pinned], alpha)
        planned = pinned[inverse]
        n_columns = len(geometric) + _PRIOR_QUANTILES + 1  # the prior schedule's width
        looks = np.repeat(size[inverse, None], n_columns, axis=1)
        look_alpha = np.zeros((len(selected), n_columns))
        look_alpha[planned, 0] = alpha
        if not planned.all():  # the prior's schedule only where it is used
            looks[~planned], look_alpha[~planned] = self._prior_schedule(
                selected[~planned], never_failed[~planned], sigma[~planned], alpha, geometric)
        return looks, look_alpha

    def _planned_size(self, p, sigma, alpha):
        """Smallest size whose decline, averaged over frequencies ``p`` and the count, meets rule (b) (bisection).

        The decline at a frequency is the reference radius at ``n_max`` less
        the expected Clopper-Pearson radius at level ``alpha`` of a count
        ``K ~ Binomial(N, p)`` (at ``_EXPECTATION_POINTS`` mid-quantiles of
        ``K``); its mean over a row of ``p`` must be within ``(1 - _PLAN_MARGIN)
        decline`` (absolute, or relative to the mean reference). The expected
        radius grows with ``N``.

        Parameters
        ----------
        p : ndarray of float, shape (n_rows, n_points)
            Frequencies of the candidate (a row: points of one posterior).
        sigma : ndarray of float, shape (n_rows,)
        alpha : float
            Level of the bound and of the reference radius at ``n_max``.

        Returns
        -------
        size : ndarray of int64, shape (n_rows,)
            In ``1 .. n_max``: 1 where rule (b) asks no radius on average, ``n_max``
            where no smaller size suffices.
        """
        n_max = int(self.n_max)
        sigma_points = np.broadcast_to(sigma[:, None], p.shape)
        required = self._required_radius(self._reference_radius(p, sigma_points, alpha), margin=_PLAN_MARGIN)
        target = required.mean(axis=1) / sigma  # in units of sigma
        mid_quantiles = (np.arange(_EXPECTATION_POINTS) + 0.5) / _EXPECTATION_POINTS
        low = np.zeros(len(p), dtype=np.int64)  # 0, or a size whose mean expected radius misses the target
        high = np.full(len(p), n_max, dtype=np.int64)  # n_max, or a size that reaches it
        active = np.flatnonzero((target > 0) & (high - low > 1))
        while len(active):
            middle = (low[active] + high[active]) // 2
            counts = stats.binom.ppf(mid_quantiles, middle[:, None, None], p[active, :, None])
            trials = np.broadcast_to(middle[:, None, None], counts.shape).astype(np.float64)
            expected = certified_radius(1.0, clopper_pearson_lower(counts, trials, alpha)).mean(axis=(1, 2))
            reached = expected >= target[active]
            high[active[reached]] = middle[reached]
            low[active[~reached]] = middle[~reached]
            active = active[high[active] - low[active] > 1]
        return np.where(target > 0, high, 1)

    def _posterior_quantiles(self, selected, quantiles):
        """Quantiles of the Jeffreys posterior ``Beta(selected + 1/2, n0 - selected + 1/2)`` of the candidate.

        Parameters
        ----------
        selected : ndarray of float, shape (n_keys,)
            Selection samples of the candidate, out of ``n0``.
        quantiles : ndarray of float, shape (n_quantiles,)

        Returns
        -------
        p : ndarray of float, shape (n_keys, n_quantiles)
        """
        n0 = int(self.n0)
        return stats.beta.ppf(quantiles[None, :], selected[:, None] + 0.5, n0 - selected[:, None] + 0.5)

    def _decline_interval(self, successes, trials):
        """Interval on which rule (b) is checked with ``alpha_spending`` "predicted" or "prior" (see Notes).

        The two-sided Clopper-Pearson interval at level ``1 - _DECLINE_INTERVAL_ALPHA``
        ("predicted") or ``1 - _PRIOR_INTERVAL_ALPHA`` ("prior", and the inputs "plan" leaves to it).

        Parameters
        ----------
        successes, trials : ndarray of float, shape (n_rows,)

        Returns
        -------
        low, high : ndarray of float, shape (n_rows,)
        """
        interval_alpha = (_PRIOR_INTERVAL_ALPHA if self.alpha_spending in ("prior", "plan")
                          else _DECLINE_INTERVAL_ALPHA)
        return clopper_pearson_interval(successes, trials, interval_alpha)

    def _decided(self, low, high, certify_at, sigma, alpha, current_lower):
        """Rules (a) and (b) for inputs whose probability lies in ``[low, high]``.

        Parameters
        ----------
        low, high : ndarray of float, shape (n_rows,)
            Confidence interval on the candidate's probability.
        certify_at : callable
            ``certify_at(p)`` maps frequencies, shape (n_rows, n_points), to the
            lower bound this sampler would report now from a count at that
            frequency (0 before any estimation sample).
        sigma : ndarray of float, shape (n_rows,)
        alpha : float
        current_lower : ndarray of float, shape (n_rows,)
            The bound reported now.

        Returns
        -------
        stop : ndarray of bool, shape (n_rows,)
        """
        if self.radius is not None:
            robust = certified_radius(sigma, current_lower) >= self.radius
            hopeless = self._reference_radius(high, sigma, alpha) < self.radius
            return robust | hopeless
        grid = low[:, None] + (high - low)[:, None] * np.linspace(0.0, 1.0, _DECLINE_GRID)
        sigma_grid = np.broadcast_to(sigma[:, None], grid.shape)
        required = self._required_radius(self._reference_radius(grid, sigma_grid, alpha))
        reached = certified_radius(sigma_grid, certify_at(grid))
        return np.all(reached >= required - 1e-12, axis=1)

    # ------------------------------------------------------------------------------------------
    # Certification
    # ------------------------------------------------------------------------------------------

    def _certify(self, engine, X, sigma, alpha, stage):
        n_inputs = len(X)
        rows = np.arange(n_inputs)
        sigma = np.array(np.broadcast_to(sigma, (n_inputs,)), dtype=np.float64)
        n0, n_max = int(self.n0), int(self.n_max)
        betting = self.confidence_sequence == "betting"

        selection = engine.class_counts(X, sigma, n0, (*stage, SELECTION))
        candidate = selection.argmax(axis=1)
        never_failed = selection[rows, candidate] == n0
        geometric = look_sizes(self.first, self.growth, n_max)
        if self.alpha_spending == "predicted":  # union only (_check_consistency)
            looks, look_alpha = self._predicted_schedule(selection[rows, candidate], never_failed, sigma, alpha,
                                                         geometric)
        elif self.alpha_spending == "prior":  # union only (_check_consistency)
            looks, look_alpha = self._prior_schedule(selection[rows, candidate], never_failed, sigma, alpha,
                                                     geometric)
        elif self.alpha_spending == "plan":  # union and decline mode only (_check_consistency)
            looks, look_alpha = self._plan_schedule(selection[rows, candidate], never_failed, sigma, alpha,
                                                    geometric)
        else:
            # The schedule: geometric looks, plus for never-failing selections one look where an
            # input that keeps never failing stops, holding a share of alpha (see Notes).
            extra = np.where(never_failed, self._never_failing_size(sigma, _ALL_IN_SHARE, alpha), n_max)
            looks = np.sort(np.column_stack([np.broadcast_to(geometric, (n_inputs, len(geometric))), extra]),
                            axis=1)
            share = np.where(never_failed, _ALL_IN_SHARE, 0.0)
            if betting:
                # Equal weights on the constant bets, plus the share on lambda = 1 (the last bet).
                lambdas = _bet_grid(n_max)
                weights = np.repeat(((1.0 - share) / len(lambdas))[:, None], len(lambdas), axis=1)
                weights[:, -1] += share
                log_weights = np.log(weights)
            else:
                # alpha_k per look: the extra look gets share * alpha: the first occurrence of its size,
                # or, without extra look (share 0, size n_max), the last column, after the look at
                # n_max where the input stops, so that look keeps its (1 - share) * alpha / R.
                extra_column = np.where(never_failed, np.argmax(looks == extra[:, None], axis=1),
                                        looks.shape[1] - 1)
                look_alpha = np.repeat(((1.0 - share) * alpha / len(geometric))[:, None], looks.shape[1], axis=1)
                look_alpha[rows, extra_column] = np.where(never_failed, share * alpha, 0.0)
        if not betting:
            upper_alpha = alpha / looks.shape[1]

        # Hopeless inputs stop on the selection samples alone (rules (a)/(b) at zero estimation samples).
        sel_low, sel_high = clopper_pearson_interval(selection[rows, candidate], n0, alpha)
        p_lower = np.zeros(n_inputs)
        p_upper = np.ones(n_inputs)
        active = ~self._decided(sel_low, sel_high, np.zeros_like, sigma, alpha, p_lower)
        successes = np.zeros(n_inputs, dtype=np.int64)
        trials = np.zeros(n_inputs, dtype=np.int64)

        for round_index in range(looks.shape[1]):
            target = np.where(active, looks[:, round_index], trials)
            if not active.any():
                break
            if np.any(target > trials):
                counts = engine.class_counts(X, sigma, target - trials, (*stage, ESTIMATION, round_index))
                successes += counts[rows, candidate]
                trials = target
            idx = np.flatnonzero(active)
            k, n = successes[idx].astype(np.float64), trials[idx].astype(np.float64)
            if betting:
                lower_now = betting_lower(k, n, alpha, log_weights[idx], lambdas)
                upper_now = betting_upper(k, n, alpha, lambdas)

                def certify_at(p, idx=idx, n=n):
                    flat_rows = np.repeat(idx, p.shape[1])
                    flat_n = np.repeat(n, p.shape[1])
                    return betting_lower(p.ravel() * flat_n, flat_n, alpha, log_weights[flat_rows],
                                         lambdas).reshape(p.shape)
            else:
                level = look_alpha[idx, round_index]
                lower_now = clopper_pearson_lower(k, n, level)
                upper_now = clopper_pearson_interval(k, n, 2 * upper_alpha)[1]

                def certify_at(p, n=n, level=level):
                    return clopper_pearson_lower(p * n[:, None], n[:, None], level[:, None])
            # Running max / min: the bounds hold at every look simultaneously.
            p_lower[idx] = np.maximum(p_lower[idx], lower_now)
            p_upper[idx] = np.minimum(p_upper[idx], upper_now)
            low, high = np.minimum(p_lower[idx], p_upper[idx]), p_upper[idx]
            if self.alpha_spending != "equal" and self.radius is None:
                low, high = self._decline_interval(k, n)
            stop = self._decided(low, high, certify_at, sigma[idx], alpha, p_lower[idx])
            stop |= trials[idx] >= looks[idx, -1]  # the last look: n_max, or the one look "plan" gave the input
            active[idx[stop]] = False

        return SamplingResult.from_bound(candidate, p_lower, n0 + trials)
