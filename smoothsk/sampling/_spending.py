"""Alpha spending: where each input's confidence sequence looks and what share of alpha each look holds.

One strategy per value of ``SequentialSampler``'s ``alpha_spending``, chosen
through :data:`SPENDING`. Each turns the selection counts into a
:class:`Schedule` before any estimation sample is drawn, so the looks and
their levels are fixed given the selection and the union argument holds
(``docs/sequential.md`` has the argument and how the strategies and their
constants were chosen and measured).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..statistics import certified_radius, clopper_pearson_interval, clopper_pearson_lower
from ._confidence_sequences import look_sizes

# Share of alpha (union) or of the betting mixture's weight on the never-failing look of an input whose
# selection samples were all of the candidate: the sampler's design value (docs/sequential.md, never-failing).
_NEVER_FAILING_SHARE = 0.75
# "predicted": the predicted frequency is the selection's one-sided (1 - _PREDICTION_ALPHA) Clopper-Pearson
# upper bound (tuned on benchmarks/bench_sequential.py).
_PREDICTION_ALPHA = 0.3
# "predicted": looks in the ladder from the predicted size (tuned on benchmarks/bench_sequential.py).
_LADDER_LOOKS = 4
# "predicted": ratio of consecutive ladder sizes (tuned on benchmarks/bench_sequential.py).
_LADDER_RATIO = 1.2
# "predicted": ratio of consecutive ladder shares, 8 : 4 : 2 : 1 (tuned on benchmarks/bench_sequential.py).
_LADDER_DECAY = 0.5
# "predicted": rule (b) on the two-sided 90 % Clopper-Pearson interval (bench_sequential.py: a 50 % one
# overshot the decline in expectation, 0.0513 +- 0.0006 at pA 0.57, sigma 0.5, U 0.05).
_PREDICTED_INTERVAL_ALPHA = 0.1
# "prior": mid-quantiles of the selection's Jeffreys posterior that each predict a stopping size
# (tuned on benchmarks/bench_sequential.py, which measures the MAD).
_PRIOR_QUANTILES = 20
# "prior": level of the first pass's stopping sizes, as a share of alpha (a guess the second pass replaces;
# tuned on benchmarks/bench_sequential.py).
_PRIOR_LEVEL = 0.25
# "prior": ratio of the size grid the predicted sizes are rounded up to (tuned on benchmarks/bench_sequential.py).
_PRIOR_RATIO = 1.2
# "prior": share of the alpha not on the never-failing look left on the geometric looks, for inputs the
# posterior misjudges (tuned on benchmarks/bench_sequential.py).
_PRIOR_FLOOR = 0.1
# "prior": passes recomputing the stopping sizes at the levels their looks got (tuned on bench_sequential.py).
_PRIOR_PASSES = 2
# "prior" and "plan": rule (b) on the two-sided 50 % Clopper-Pearson interval (bench_sequential.py: the 90 %
# interval near the abstain threshold cost 14 % samples at pA 0.55, sigma 0.5, for 0.0008 of decline).
_PRIOR_INTERVAL_ALPHA = 0.5
# "plan": posterior quantiles whose planned sizes must ask a radius and lie within _PLAN_SPREAD
# (tuned on benchmarks/bench_sequential.py, which measures the MAD).
_PLAN_SPREAD_QUANTILES = (0.1, 0.9)
# "plan": largest ratio of those planned sizes for a planned input (tuned on benchmarks/bench_sequential.py).
_PLAN_SPREAD = 3.0
# "plan": mid-quantiles of the posterior the planned decline is averaged over (bench_sequential.py: the
# median's size alone reached the decline, 0.0501 +- 0.0004 at pA 0.98).
_PLAN_POSTERIOR_POINTS = 8
# "plan": share of the decline kept in reserve (bench_sequential.py --seed-offset: at 0.03 the expected
# decline reached 0.0502 +- 0.0004 at pA 0.98, sigma 0.25; at 0.05 at most 0.0497 +- 0.0004).
_PLAN_MARGIN = 0.05
# "plan": mid-quantiles of the binomial count over which the expected radius is averaged (set with the other
# "plan" constants on benchmarks/bench_sequential.py).
_EXPECTATION_POINTS = 16


@dataclass(frozen=True)
class Schedule:
    """The looks of each input's confidence sequence and their levels, fixed given the selection.

    Attributes
    ----------
    looks : ndarray of int64, shape (n_inputs, n_columns)
        Sorted cumulative estimation sizes per input; a repeated size draws
        no new samples. An input stops at its last column at the latest.
    look_alpha : ndarray of float, shape (n_inputs, n_columns)
        Level of each look's Clopper-Pearson bound (the union bound); each
        row sums to ``alpha``.
    never_failing_share : ndarray of float, shape (n_inputs,)
        :data:`_NEVER_FAILING_SHARE` where the selection never failed, else 0:
        the share of alpha (union: included in ``look_alpha``) or of the
        betting mixture's weight (on ``lambda = 1``) that backs the
        never-failing look.
    """

    looks: np.ndarray
    look_alpha: np.ndarray
    never_failing_share: np.ndarray


class Spending(ABC):
    """Turns each input's selection count into its :class:`Schedule`.

    Parameters
    ----------
    rule : StoppingRule
        The sampler's stopping rules (where an input will stop).
    n0 : int
        Selection samples per input.
    geometric : ndarray of int64, shape (n_geometric,)
        The geometric looks (:func:`look_sizes`), ending at ``n_max``.
    sequence : type
        The confidence sequence's class (``UnionBound`` or ``BettingBound``),
        which says how many ones in a row reach a bound.

    Attributes
    ----------
    union_only : bool
        Places shares of alpha on looks, which only the union bound has.
    decline_only : bool
        Needs rule (b) (``radius=None``).
    decline_interval_alpha : float or None
        Rule (b) is checked on the two-sided ``1 - decline_interval_alpha``
        Clopper-Pearson interval of the current counts (a stopping rule needs
        no anytime validity); None: on the anytime interval.
    """

    union_only = True
    decline_only = False
    decline_interval_alpha = None

    def __init__(self, rule, n0, geometric, sequence):
        self.rule = rule
        self.n0 = n0
        self.geometric = geometric
        self.sequence = sequence

    def schedule(self, selected, sigma, alpha):
        """The schedule of each input, a function of its selection count and sigma alone.

        Parameters
        ----------
        selected : ndarray of int, shape (n_inputs,)
            Selection samples of the candidate, out of ``n0``.
        sigma : ndarray of float, shape (n_inputs,)
            Noise level per input.
        alpha : float
            Failure probability of each certificate.

        Returns
        -------
        Schedule
        """
        never_failed = selected == self.n0
        looks, look_alpha = self._looks(selected, never_failed, sigma, alpha)
        return Schedule(looks, look_alpha, np.where(never_failed, _NEVER_FAILING_SHARE, 0.0))

    @abstractmethod
    def _looks(self, selected, never_failed, sigma, alpha):
        """``looks`` and ``look_alpha`` of :class:`Schedule`; ``never_failed`` is ``selected == n0``."""

    def _never_failing_size(self, sigma, alpha):
        """Smallest size at which ``N`` ones of ``N`` stop an input, its look holding :data:`_NEVER_FAILING_SHARE`.

        Parameters
        ----------
        sigma : ndarray of float, shape (n_inputs,)
        alpha : float

        Returns
        -------
        size : ndarray of int64, shape (n_inputs,)
            In ``1 .. n_max``.
        """
        target = self.rule.target_radius(np.ones(len(sigma)), sigma, alpha)
        needed = stats.norm.cdf(np.maximum(target, 0.0) / sigma)  # the bound on p that gives target
        size = np.where(target > 0, self.sequence.ones_needed(needed, _NEVER_FAILING_SHARE, alpha), 1.0)
        return np.clip(size, 1, int(self.rule.n_max)).astype(np.int64)


class EqualSpending(Spending):
    """``"equal"``: alpha split equally over the geometric looks, plus the never-failing look.

    A never-failing selection puts :data:`_NEVER_FAILING_SHARE` of alpha on
    one extra look where an input that keeps never failing stops; the
    geometric looks share the rest. With the betting sequence the looks are
    the same and the share goes to the bet ``lambda = 1``.
    """

    union_only = False

    def _looks(self, selected, never_failed, sigma, alpha):
        n_inputs, n_max, geometric = len(sigma), int(self.rule.n_max), self.geometric
        extra = np.where(never_failed, self._never_failing_size(sigma, alpha), n_max)
        looks = np.sort(np.column_stack([np.broadcast_to(geometric, (n_inputs, len(geometric))), extra]), axis=1)
        share = np.where(never_failed, _NEVER_FAILING_SHARE, 0.0)
        # The extra look gets share * alpha: the first occurrence of its size, or, without extra look
        # (share 0, size n_max), the last column, after the look at n_max where the input stops, so
        # that look keeps its (1 - share) * alpha / R.
        extra_column = np.where(never_failed, np.argmax(looks == extra[:, None], axis=1), looks.shape[1] - 1)
        look_alpha = np.repeat(((1.0 - share) * alpha / len(geometric))[:, None], looks.shape[1], axis=1)
        look_alpha[np.arange(n_inputs), extra_column] = np.where(never_failed, share * alpha, 0.0)
        return looks, look_alpha


class PredictedSpending(Spending):
    """``"predicted"``: most of alpha on a short ladder of looks from the size the selection predicts.

    Every input keeps the geometric looks, sharing ``(1 - 0.75) alpha``
    equally. A never-failing selection puts the other ``0.75 alpha`` on its
    never-failing look; any other input spreads it over :data:`_LADDER_LOOKS`
    looks ``N*, 1.2 N*, 1.44 N*, ...`` in shares ``8 : 4 : 2 : 1``, where
    ``N*`` is the size at which a count at the selection's predicted
    frequency stops at the ladder's first share. ``looks`` and ``look_alpha``
    have shape (n_inputs, n_geometric + :data:`_LADDER_LOOKS`): ladder looks
    clipped to ``n_max``, and the unused ladder looks of never-failing inputs
    (level 0), sort after the geometric look at ``n_max``.
    """

    decline_interval_alpha = _PREDICTED_INTERVAL_ALPHA

    def _looks(self, selected, never_failed, sigma, alpha):
        n_inputs, n_max, geometric = len(sigma), int(self.rule.n_max), self.geometric
        ladder_share = _NEVER_FAILING_SHARE * _LADDER_DECAY ** np.arange(_LADDER_LOOKS)
        ladder_share *= _NEVER_FAILING_SHARE / ladder_share.sum()
        anchor = self._predicted_size(selected, sigma, ladder_share[0] * alpha)
        ladder = np.minimum(np.ceil(anchor[:, None] * _LADDER_RATIO ** np.arange(_LADDER_LOOKS)), n_max)
        ladder_alpha = np.broadcast_to(ladder_share * alpha, ladder.shape).copy()
        # Never-failing selections: one look at the never-failing size with the whole 0.75 alpha.
        ladder[never_failed] = n_max
        ladder[never_failed, 0] = self._never_failing_size(sigma[never_failed], alpha)
        ladder_alpha[never_failed] = 0.0
        ladder_alpha[never_failed, 0] = _NEVER_FAILING_SHARE * alpha
        looks = np.concatenate([np.broadcast_to(geometric, (n_inputs, len(geometric))),
                                ladder.astype(np.int64)], axis=1)
        geometric_alpha = np.full((n_inputs, len(geometric)), (1.0 - _NEVER_FAILING_SHARE) * alpha / len(geometric))
        look_alpha = np.concatenate([geometric_alpha, ladder_alpha], axis=1)
        # Stable: the geometric look at n_max comes before every ladder look clipped to n_max.
        order = np.argsort(looks, axis=1, kind="stable")
        return np.take_along_axis(looks, order, axis=1), np.take_along_axis(look_alpha, order, axis=1)

    def _predicted_size(self, selected, sigma, level):
        """Size at which a count at the selection's predicted frequency stops, its bound at ``level``.

        Parameters
        ----------
        selected, sigma
            As in :meth:`Spending.schedule`.
        level : float
            Level of the Clopper-Pearson bound at that size (also that of the reference radius).

        Returns
        -------
        size : ndarray of int64, shape (n_inputs,)
            In ``1 .. n_max``, as :meth:`StoppingRule.fixed_size`.
        """
        predicted = clopper_pearson_interval(selected, self.n0, 2 * _PREDICTION_ALPHA)[1]
        return self.rule.fixed_size(predicted, sigma, level, level)


class PriorSpending(Spending):
    """``"prior"``: alpha in proportion to the selection's posterior probability of stopping at each look.

    Each of the :data:`_PRIOR_QUANTILES` mid-quantiles ``p_j`` of the
    Jeffreys posterior of the selection count predicts the size ``N*(p_j)``
    where a count at ``p_j`` stops at the level of its look
    (:data:`_PRIOR_PASSES` passes, the first at ``_PRIOR_LEVEL * alpha``),
    rounded up to the grid of sizes growing by :data:`_PRIOR_RATIO`. Of the
    alpha not on the never-failing look, a share :data:`_PRIOR_FLOOR` goes
    equally to the geometric looks and the rest in equal parts to the
    ``N*(p_j)``; quantiles where rule (b) asks no radius get no look (their
    shares go to the geometric looks). Looks of equal size are merged: the
    first column of each run holds the run's level, the others 0.
    ``looks`` and ``look_alpha`` have shape
    (n_inputs, n_geometric + :data:`_PRIOR_QUANTILES` + 1) and end at ``n_max``.
    """

    decline_interval_alpha = _PRIOR_INTERVAL_ALPHA

    def _looks(self, selected, never_failed, sigma, alpha):
        n_inputs, n_max, geometric = len(sigma), int(self.rule.n_max), self.geometric
        quantiles = (np.arange(_PRIOR_QUANTILES) + 0.5) / _PRIOR_QUANTILES
        grid = look_sizes(1, _PRIOR_RATIO, n_max)
        all_in = np.where(never_failed, _NEVER_FAILING_SHARE, 0.0)
        never_failing = np.where(never_failed, self._never_failing_size(sigma, alpha), n_max)
        # Inputs with the same selection count and sigma share their predicted looks: compute each once.
        keys, inverse = np.unique(np.column_stack([selected, sigma, never_failed]), axis=0, return_inverse=True)
        inverse = inverse.ravel()
        key_selected, key_sigma = keys[:, 0], np.repeat(keys[:, 1], _PRIOR_QUANTILES)
        p = self.posterior_quantiles(key_selected, quantiles).ravel()
        prior_alpha = (1.0 - _PRIOR_FLOOR) * (1.0 - _NEVER_FAILING_SHARE * keys[:, 2]) * alpha
        level = np.full(p.shape, _PRIOR_LEVEL * alpha)
        for _ in range(_PRIOR_PASSES):
            # Each quantile's stopping size at the level its look gets (first pass: a guess),
            # snapped up to the grid; a look's level is the sum over the quantiles landing on it.
            needed = np.empty(p.shape, dtype=np.int64)
            for value in np.unique(level):  # few values: multiples of the quantiles' share
                at = level == value
                needed[at] = self.rule.fixed_size(p[at], key_sigma[at], value, alpha)
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

    def posterior_quantiles(self, selected, quantiles):
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
        n0 = self.n0
        return stats.beta.ppf(quantiles[None, :], selected[:, None] + 0.5, n0 - selected[:, None] + 0.5)


class PlanSpending(PriorSpending):
    """``"plan"`` (rule (b) only): one look holding all of alpha where the selection pins the stopping size.

    An input whose selection count is below ``n0`` and whose posterior
    quantiles :data:`_PLAN_SPREAD_QUANTILES` have planned sizes (see
    :meth:`_planned_size`) low ``> 1`` and high ``<= _PLAN_SPREAD * low``
    gets a single look holding all of alpha, at the size planned for its
    whole posterior, repeated in every column (alpha in the first, 0 in the
    others): Cohen et al.'s CERTIFY with its size chosen from the selection.
    Every other input gets the ``"prior"`` schedule, whose shape this one has.
    """

    decline_only = True

    def _looks(self, selected, never_failed, sigma, alpha):
        keys, inverse = np.unique(np.column_stack([selected, sigma]), axis=0, return_inverse=True)
        inverse = inverse.ravel()
        key_selected, key_sigma = keys[:, 0], keys[:, 1]
        ends = self.posterior_quantiles(key_selected, np.asarray(_PLAN_SPREAD_QUANTILES))
        low, high = (self._planned_size(ends[:, [j]], key_sigma, alpha) for j in (0, 1))
        pinned = (key_selected < self.n0) & (low > 1) & (high <= _PLAN_SPREAD * low)
        posterior = self.posterior_quantiles(key_selected[pinned],
                                             (np.arange(_PLAN_POSTERIOR_POINTS) + 0.5) / _PLAN_POSTERIOR_POINTS)
        size = np.zeros(len(keys), dtype=np.int64)
        size[pinned] = self._planned_size(posterior, key_sigma[pinned], alpha)
        planned = pinned[inverse]
        n_columns = len(self.geometric) + _PRIOR_QUANTILES + 1  # the prior schedule's width
        looks = np.repeat(size[inverse, None], n_columns, axis=1)
        look_alpha = np.zeros((len(selected), n_columns))
        look_alpha[planned, 0] = alpha
        if not planned.all():  # the prior's schedule only where it is used
            looks[~planned], look_alpha[~planned] = super()._looks(
                selected[~planned], never_failed[~planned], sigma[~planned], alpha)
        return looks, look_alpha

    def _planned_size(self, p, sigma, alpha):
        """Smallest size whose decline, averaged over frequencies ``p`` and the count, meets rule (b) (bisection).

        The decline at a frequency is the reference radius at ``n_max`` less
        the expected Clopper-Pearson radius at level ``alpha`` of a count
        ``K ~ Binomial(N, p)`` (at :data:`_EXPECTATION_POINTS` mid-quantiles
        of ``K``); its mean over a row of ``p`` must be within ``(1 -
        _PLAN_MARGIN) decline`` (absolute, or relative to the mean reference).
        The expected radius grows with ``N``.

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
        n_max = int(self.rule.n_max)
        sigma_points = np.broadcast_to(sigma[:, None], p.shape)
        required = self.rule.required_radius(self.rule.reference_radius(p, sigma_points, alpha), margin=_PLAN_MARGIN)
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


# SequentialSampler's alpha_spending parameter: its values and the strategies they name.
SPENDING = {"equal": EqualSpending, "predicted": PredictedSpending, "prior": PriorSpending, "plan": PlanSpending}
