"""Multiple-start Fast Gradient Sign Search over noise levels (Insta-RS, Chen et al. 2021)."""

from numbers import Integral, Real

import numpy as np
import torch

from .._constraints import SAMPLE_SIZE, Interval, StrOptions
from .._messages import quoted
from .._stages import SEARCH_STAGE
from ..statistics import gaussian_radius, top_class_radius
from ._base import BaseSigmaSearch, SigmaSearchResult

#: Probabilities enter PhiInv clipped to [_P_CLIP, 1 - _P_CLIP] so that a
#: saturated softmax (mean exactly 1.0 in float64) keeps a finite radius.
_P_CLIP = 1e-6


def approximate_radius(probabilities, sigma, y=None):
    """Insta-RS's approximate certified radius of the soft smoothed classifier.

    ``sigma * PhiInv(max_c g_soft^c)`` (Sec. 3.1, ``CR_insta``), or with labels
    ``sigma * PhiInv(g_soft^y)`` (the training-time ``CR`` of Sec. 3.1, with
    ``max_{c != y}`` replaced by ``1 - g_soft^y`` as in the paper). It is
    negative where that probability is below 1/2.

    Parameters
    ----------
    probabilities : ndarray of float, shape (n_inputs, n_classes)
        Mean softmax over noisy copies (Eq. 4).
    sigma : float or ndarray of float, shape (n_inputs,)
        Noise level of the copies.
    y : ndarray of int, shape (n_inputs,), optional
        Class indices; None uses the top class.

    Returns
    -------
    radius : ndarray of float, shape (n_inputs,)

    Examples
    --------
    >>> approximate_radius(np.array([[0.2, 0.8]]), 0.5).round(4)
    array([0.4208])
    """
    if y is None:
        p = probabilities.max(axis=1)
    else:
        p = probabilities[np.arange(len(probabilities)), y]
    return gaussian_radius(sigma, np.clip(p, _P_CLIP, 1.0 - _P_CLIP))


class MultiStartFGSS(BaseSigmaSearch):
    """Sign search over noise levels ``sigma^2 = l * sigma0^2`` from several starts (Insta-RS Alg. 1, 3).

    Each level ``l`` in ``1 .. max_level`` is scored by the approximate
    certified radius of the soft smoothed classifier (mean softmax of ``n``
    noisy copies, Eq. 4; :func:`approximate_radius`). From each start
    ``(level, step)`` the search moves by ``step`` while the score does not
    decrease and stops at the first decrease or at the end of the range
    (Alg. 1, lines 3-11); the best of the starts' end levels wins (line 12;
    ties go to the smaller level). With ``per_input=True`` every input has
    its own search; all inputs still searching are sampled together in one
    engine call per move. With ``per_input=False`` one level is learned for
    the whole set by the approximate ACR, the mean of ``max(0, radius)``
    over inputs (Alg. 3, Eq. 5).

    A level is evaluated at most once per input (memoised), with its own
    independent noise (engine stage ``(SEARCH_STAGE, level)``), as each
    "compute" step of Alg. 1 draws fresh noise vectors. ``steps`` counts the
    distinct levels evaluated per input. This is where the savings over a
    grid come from: on a unimodal score curve the ascent from level 1 and
    the descent from level T together visit every level, whereas the Monte
    Carlo noise of independent draws makes each local search stop at the
    first apparent decrease. (Common random numbers across levels, as in
    :class:`GridSigmaSearch`, would smooth the curve and cost all T levels.)

    Parameters
    ----------
    sigma0 : float, default=0.25
        Base noise level; level ``l`` is ``sigma = sqrt(l) * sigma0``.
    max_level : int, default=16
        Largest level T (``sigma_max = sqrt(T) * sigma0``).
    starts : sequence of (int, int) pairs or None, default=None
        ``(level, step)`` pairs, levels in ``[1, max_level]`` and non-zero
        steps, searched in order. None means ``((1, 1), (max_level, -1))``.
    n : int, default=500
        Noisy samples per input and level (the paper's m = 500).
    per_input : bool, default=True
        One level per input (Alg. 1) or one for all inputs (Alg. 3).
    score : {"soft", "certified"}, default="soft"
        What a level is scored by: the paper's approximate radius of the soft
        smoothed classifier, or the Monte Carlo certified radius of the hard
        votes (``sigma * PhiInv(p_lower)`` of the top class's one-sided
        Clopper-Pearson bound at level ``alpha``; with labels 0 unless the top
        class is the label), the score :class:`GridSigmaSearch` maximises.
        The soft score falls faster with sigma than the certified one, so
        "soft" tends to pick smaller levels than the certificate that follows
        would reward.
    alpha : float, default=0.001
        Bound level of the "certified" score.

    References
    ----------
    C. Chen, K. Kong, P. Yu, J. Luque, T. Goldstein, F. Huang. Insta-RS:
    Instance-wise Randomized Smoothing for Improved Robustness and Accuracy
    (2021), Sec. 3.1 and App. B.1, B.4 (defaults).

    Examples
    --------
    >>> MultiStartFGSS().start_pairs()
    ((1, 1), (16, -1))
    """

    _parameter_constraints = {
        "sigma0": [Interval(Real, 0, None, closed="neither")],
        "max_level": [Interval(Integral, 1, None, closed="left")],
        "starts": ["array-like", None],
        "n": [SAMPLE_SIZE],
        "per_input": ["boolean"],
        "score": [StrOptions({"soft", "certified"})],
        "alpha": [Interval(Real, 0, 1, closed="neither")],
    }

    def __init__(self, sigma0=0.25, max_level=16, starts=None, n=500, per_input=True, score="soft", alpha=0.001):
        self.sigma0 = sigma0
        self.max_level = max_level
        self.starts = starts
        self.n = n
        self.per_input = per_input
        self.score = score
        self.alpha = alpha

    def start_pairs(self):
        """The ``(level, step)`` starts in use.

        Returns
        -------
        tuple of (int, int)
        """
        if self.starts is None:
            return ((1, 1), (int(self.max_level), -1))
        return tuple((int(level), int(step)) for level, step in self.starts)

    def _check_consistency(self):
        try:
            pairs = np.asarray(self.starts if self.starts is not None else [(1, 1)])
        except ValueError:  # ragged
            pairs = np.empty(0)
        if pairs.ndim != 2 or pairs.shape[1] != 2 or len(pairs) == 0 or pairs.dtype.kind not in "iu":
            raise ValueError("starts must be a non-empty sequence of (level, step) integer pairs; "
                             f"got {quoted(self.starts)}.")
        for level, step in self.start_pairs():
            if not 1 <= level <= self.max_level or step == 0:
                raise ValueError(f"Each start (level, step) needs 1 <= level <= max_level={self.max_level} "
                                 f"and step != 0; got {(level, step)}.")

    def level_sigma(self, level):
        """Noise level of level(s) ``l``: ``sqrt(l) * sigma0`` (cascading smoothing).

        Parameters
        ----------
        level : int or ndarray of int

        Returns
        -------
        float or ndarray of float
        """
        return np.sqrt(level) * self.sigma0

    def noise_levels(self):
        """The levels' noise levels ``sqrt(l) * sigma0``, ``l = 1, ..., max_level``."""
        return self.level_sigma(np.arange(1, self.max_level + 1))

    def _search(self, engine, X, y):
        n_inputs = len(X)
        if self.per_input:
            units, score = n_inputs, self._input_scorer(engine, X, y)
        else:
            units, score = 1, self._set_scorer(engine, X, y)
        memo = np.full((units, self.max_level), np.nan)
        levels = self._sign_search(memo, score)
        steps = (~np.isnan(memo)).sum(axis=1)
        if not self.per_input:
            levels, steps = np.repeat(levels, n_inputs), np.repeat(steps, n_inputs)
        return SigmaSearchResult(self.level_sigma(levels), steps)

    def _radius(self, engine, X, y, level):
        """Score of every input of ``X`` at ``level``: one packed engine call at stage (0, level)."""
        sigma = self.level_sigma(level)
        n_inputs = len(X)
        if self.score == "soft":
            probabilities = engine.mean_softmax(
                X, np.full(n_inputs, sigma), np.full(n_inputs, self.n), (SEARCH_STAGE, level))
            return approximate_radius(probabilities, sigma, y)
        counts = engine.class_counts(X, np.full(n_inputs, sigma), np.full(n_inputs, self.n), (SEARCH_STAGE, level))
        return top_class_radius(counts, self.n, sigma, self.alpha, y)

    def _input_scorer(self, engine, X, y):
        """``score(units, level)``: each input's score at ``level``, one engine call."""
        def score(units, level):
            return self._radius(engine.restricted(units), X[torch.as_tensor(units)], None if y is None else y[units],
                                level)
        return score

    def _set_scorer(self, engine, X, y):
        """``score([0], level)``: the approximate ACR of the whole set (Eq. 5)."""
        def score(units, level):
            return np.array([np.maximum(self._radius(engine, X, y, level), 0.0).mean()])
        return score

    def _sign_search(self, memo, score):
        """Multi-start sign search (Alg. 1 / Alg. 3), vectorised over units.

        Parameters
        ----------
        memo : ndarray of float, shape (n_units, max_level)
            Scores evaluated so far (NaN: not yet); filled in place.
        score : callable
            ``score(units, level)`` -> ndarray of float, shape (len(units),).

        Returns
        -------
        levels : ndarray of int, shape (n_units,)
            Best end level of the starts for each unit.
        """
        n_units, top = memo.shape

        def value(units, level):
            missing = units[np.isnan(memo[units, level - 1])]
            if len(missing):
                memo[missing, level - 1] = score(missing, level)
            return memo[units, level - 1]

        all_units = np.arange(n_units)
        best_level = np.zeros(n_units, dtype=np.int64)
        best_value = np.full(n_units, -np.inf)
        for start, step in self.start_pairs():
            # Every unit of a start moves in lock-step, so the active ones share one level.
            level = np.full(n_units, start, dtype=np.int64)
            value(all_units, start)
            active = all_units
            while len(active) and 1 <= start + step <= top:
                current = value(active, start)
                moved = value(active, start + step) >= current  # Alg. 1, line 7
                level[active[moved]] = start + step
                active = active[moved]
                start += step
            end_value = memo[all_units, level - 1]
            better = (end_value > best_value) | ((end_value == best_value) & (level < best_level))
            best_level = np.where(better, level, best_level)
            best_value = np.where(better, end_value, best_value)
        return best_level
