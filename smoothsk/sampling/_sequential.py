"""Sequential, anytime-valid certification: sample each input in rounds and stop it once it is decided.

Voráček (NeurIPS 2024), "Treatment of statistical estimation problems in
randomized smoothing for adversarial robustness": confidence sequences
(:mod:`._confidence_sequences`), valid at every sample size at once, let the
sampler look at the counts as they arrive and stop each input by its own
rules (:mod:`._stopping`); the looks and their shares of alpha come from the
selection samples (:mod:`._spending`). ``docs/sequential.md`` has the
validity argument, the strategies and the measurements behind their constants.
"""

from functools import partial
from numbers import Real

import numpy as np

from .._constraints import SAMPLE_SIZE, Interval, StrOptions
from .._stages import ESTIMATION, SELECTION
from ..statistics import clopper_pearson_interval
from ._base import BaseSampler, SamplingResult
from ._confidence_sequences import CONFIDENCE_SEQUENCES, look_sizes
from ._input_specific import check_relative_decline
from ._spending import SPENDING
from ._stopping import StoppingRule

# n0=None: selection samples as a share of n_max in decline mode, at least _MIN_N0 (benchmarks/bench_sequential.py:
# on the linear model at sigma 1.0, n0=100 let wrong candidates push the expected decline at pA 0.55 to 0.057 with
# "plan"; 1.5 % kept it within decline at n_max 10,000 to 100,000, and 2 % cost samples at sigma 0.5).
_N0_SHARE = 0.015
# n0=None: the fewest selection samples, and those of radius mode (where more only cost: decisions come early).
_MIN_N0 = 100


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
        ``alpha_spending="predicted"``: a 90 % interval; ``"prior"`` and
        ``"plan"``: 50 %); this includes inputs that even ``n_max`` could not
        certify by more than ``decline``;
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
    n0 : int or None, default=None
        Selection samples per input (Cohen et al.'s N0). None: 1.5 % of
        ``n_max`` (at least 100) in decline mode, 100 with ``radius``. Rule
        (b) bounds the decline of the selected candidate's radius; a wrong
        candidate, more frequent at a small ``n0``, costs its whole radius:
        near the abstain threshold at sigma 1.0 (pA 0.55), ``n0=100`` took
        the expected decline to 0.057 for a ``decline`` of 0.05, 1.5 % of
        ``n_max`` kept it within (``docs/sequential.md``).
    alpha_spending : {"auto", "equal", "predicted", "prior", "plan"}, default="auto"
        How the union bound shares alpha over the looks. ``"auto"``:
        ``"plan"`` in decline mode, ``"prior"`` with ``radius``, ``"equal"``
        with the betting sequence (the fewest samples on
        ``benchmarks/bench_sequential.py``: with ``n0=None``, 0.90x ISS's
        samples at sigma 0.5 and 0.72x at 1.0 on a linear model at
        ``n_max=20_000``, where the equal split spent 1.02x and 1.16x).
        ``"equal"``: equally over the geometric looks (plus the
        never-failing look).
        ``"predicted"`` (union only): the selection samples also predict the
        size where the input will stop, and most of alpha goes to a short
        ladder of looks from there; rule (b) is then checked on a narrower
        interval. Fewer samples for inputs with ``pA < 1`` on
        ``benchmarks/bench_sequential.py``. ``"prior"`` (union
        only): alpha in proportion to the selection's posterior probability
        of stopping at each look, with a narrower interval for rule (b)
        still; fewer samples than ``"predicted"`` on that benchmark.
        ``"plan"`` (union, decline mode only): where the selection predicts
        the stopping size within a factor 3, a single look holding all of
        alpha at a size planned for the selection's posterior, else
        ``"prior"``; the fewest samples for inputs with ``pA < 1`` on that
        benchmark. ``docs/sequential.md`` describes each strategy and how its
        constants were tuned.

    Notes
    -----
    **Validity.** Given an input's selection counts (stage ``(*stage, 0)``,
    independent of every estimation stage), its candidate, looks and shares
    of alpha (union) or bet weights (betting) are fixed, and its estimation
    outcomes are i.i.d. Bernoulli(p). The union bound's looks are fixed sizes
    whose levels sum to ``alpha``; the betting mixture's capital at ``p`` is a
    non-negative martingale (Ville's inequality). Either way the event "some
    look's bound exceeds p" has probability at most ``alpha`` and does not
    depend on when sampling stops, so the bound reported at the stopping time
    of rules (a)-(c) holds with probability at least ``1 - alpha``. The upper
    bounds and the intervals of rule (b) only decide when to stop: a wrong one
    stops an input early (a smaller, still sound radius), never a wrong
    certificate. Every ``alpha_spending`` strategy is a function of the
    selection counts alone, so each keeps this argument. The full argument,
    the strategies and the benchmark measurements behind their constants are
    in ``docs/sequential.md``.

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
        "confidence_sequence": [StrOptions(set(CONFIDENCE_SEQUENCES))],
        "first": [SAMPLE_SIZE],
        "growth": [Interval(Real, 1, None, closed="neither")],
        "n0": [SAMPLE_SIZE, None],
        "alpha_spending": [StrOptions(set(SPENDING) | {"auto"})],
    }

    def __init__(self, n_max=100_000, decline=0.05, decline_type="absolute", radius=None,
                 confidence_sequence="union", first=500, growth=1.5, n0=None, alpha_spending="auto"):
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
        spending = SPENDING[self._alpha_spending()]
        if spending.union_only and self.confidence_sequence != "union":
            raise ValueError(f"alpha_spending={self.alpha_spending!r} places shares of alpha on looks, so it needs "
                             f"confidence_sequence='union'; got {self.confidence_sequence!r}.")
        if spending.decline_only and self.radius is not None:
            raise ValueError(f"alpha_spending={self.alpha_spending!r} plans each look for the expected radius "
                             f"decline, so it needs radius=None; got radius={self.radius!r}.")

    def _alpha_spending(self):
        """The strategy ``alpha_spending`` names: ``"auto"`` resolved by the confidence sequence and the mode."""
        if self.alpha_spending != "auto":
            return self.alpha_spending
        if self.confidence_sequence != "union":
            return "equal"
        return "plan" if self.radius is None else "prior"

    def _n0(self):
        """The selection samples per input: ``n0``, or its default for the mode (see the class docstring)."""
        if self.n0 is not None:
            return int(self.n0)
        if self.radius is not None:
            return _MIN_N0
        return max(_MIN_N0, round(_N0_SHARE * int(self.n_max)))

    @property
    def prediction_sample_size(self):
        """int: ``n_max``: ``predict``'s test has no radius to aim at, so it gets the largest size."""
        return int(self.n_max)

    def _spending(self, rule):
        """The ``alpha_spending`` strategy of this sampler's parameters (a subclass may return its own).

        Parameters
        ----------
        rule : StoppingRule

        Returns
        -------
        Spending
        """
        geometric = look_sizes(self.first, self.growth, rule.n_max)
        sequence = CONFIDENCE_SEQUENCES[self.confidence_sequence]
        return SPENDING[self._alpha_spending()](rule, self._n0(), geometric, sequence)

    def _certify(self, engine, X, sigma, alpha, stage):
        n_inputs = len(X)
        rows = np.arange(n_inputs)
        sigma = np.array(np.broadcast_to(sigma, (n_inputs,)), dtype=np.float64)
        n0, n_max = self._n0(), int(self.n_max)
        rule = StoppingRule(n_max, self.decline, self.decline_type, self.radius)

        # Selection: n0 samples choose the candidate; its count fixes the looks and their levels.
        selection = engine.class_counts(X, sigma, n0, (*stage, SELECTION))
        candidate = selection.argmax(axis=1)
        selected = selection[rows, candidate]
        spending = self._spending(rule)
        schedule = spending.schedule(selected, sigma, alpha)
        looks = schedule.looks
        sequence = spending.sequence.from_schedule(schedule, n_max, alpha)

        # Hopeless inputs stop on the selection samples alone (rules (a)/(b) at zero estimation samples).
        selection_low, selection_high = clopper_pearson_interval(selected, n0, alpha)
        p_lower = np.zeros(n_inputs)
        p_upper = np.ones(n_inputs)
        active = ~rule.decided(selection_low, selection_high, np.zeros_like, sigma, alpha, p_lower)
        successes = np.zeros(n_inputs, dtype=np.int64)
        trials = np.zeros(n_inputs, dtype=np.int64)

        # Estimation in rounds: every undecided input to its next look, on a fresh stage per round.
        for look in range(looks.shape[1]):
            target = np.where(active, looks[:, look], trials)
            if not active.any():
                break
            if np.any(target > trials):
                counts = engine.class_counts(X, sigma, target - trials, (*stage, ESTIMATION, look))
                successes += counts[rows, candidate]
                trials = target
            idx = np.flatnonzero(active)
            k, n = successes[idx].astype(np.float64), trials[idx].astype(np.float64)
            # Running max / min: the bounds hold at every look simultaneously.
            p_lower[idx] = np.maximum(p_lower[idx], sequence.lower(idx, look, k, n))
            p_upper[idx] = np.minimum(p_upper[idx], sequence.upper(idx, look, k, n))
            low, high = np.minimum(p_lower[idx], p_upper[idx]), p_upper[idx]
            if spending.decline_interval_alpha is not None and rule.radius is None:
                low, high = clopper_pearson_interval(k, n, spending.decline_interval_alpha)
            certify_at = partial(sequence.lower_at, idx, look, trials=n)
            stop = rule.decided(low, high, certify_at, sigma[idx], alpha, p_lower[idx])
            stop |= trials[idx] >= looks[idx, -1]  # the last look: n_max, or the one look "plan" gave the input
            active[idx[stop]] = False

        return SamplingResult.from_bound(candidate, p_lower, n0 + trials)
