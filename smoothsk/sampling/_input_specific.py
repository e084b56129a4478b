"""Input-specific sampling (ISS): per input, the smallest sample size whose radius decline is bounded.

Chen, Li, Yan, Li and Sheng (2022), "Input-Specific Robustness Certification
for Randomized Smoothing" (AAAI). A cheap pilot interval on the top-class
probability picks, through a precomputed map ``psi`` (Alg. 1, Eq. 5-6), how
many fresh samples the final Clopper-Pearson bound gets (Alg. 2).
"""

from dataclasses import dataclass
from functools import lru_cache
from numbers import Real

import numpy as np

from .._constraints import SAMPLE_SIZE, Interval, StrOptions
from ..statistics import certified_radius, check_noise_levels, clopper_pearson_interval, clopper_pearson_lower
from ._base import BaseTwoStageSampler

# psi is tabulated at p = N / _GRID_SIZE, N = 0 .. _GRID_SIZE (the paper's delta = 1e-4).
_GRID_SIZE = 10_000
# Absolute decline depends on decline / sigma: sigma is rounded up to 2 ** (j / _SIGMA_STEPS),
# so per-input noise levels share maps and the rounding only ever asks for more samples.
_SIGMA_STEPS = 32
_CACHED_MAPS = 128


def _radius_per_sigma(n_samples, p, alpha):
    """Radius (in units of sigma) certified from ``n_samples`` samples at frequency ``p`` (ISS Def. 1).

    ``Phi^-1(B(alpha; p k, k - p k + 1))`` with ``k = n_samples``, the
    one-sided Clopper-Pearson bound at the (real) count ``p k``; 0 where that
    bound is at most 1/2, since the certificate then abstains.

    Parameters
    ----------
    n_samples : ndarray of int, shape (n_points,)
        Sample sizes ``k``.
    p : ndarray of float, shape (n_points,)
        Top-class probabilities.
    alpha : float
        Failure probability of the bound.

    Returns
    -------
    radius : ndarray of float, shape (n_points,)
    """
    n_samples = np.asarray(n_samples, dtype=np.float64)
    return certified_radius(1.0, clopper_pearson_lower(p * n_samples, n_samples, alpha))


def _min_sample_size(p, target, n_max, alpha):
    """Smallest ``k`` in 1..n_max whose radius at ``p`` reaches ``target``, by bisection.

    The radius grows with ``k`` at fixed ``p``, so a bisection over ``k``
    (``ceil(log2(n_max))`` rounds, each one vectorised over all points) finds
    it. ``n_max`` is always admissible (its decline is 0), so it is returned
    where no smaller size reaches the target; ``n_max`` itself is never evaluated.

    Parameters
    ----------
    p : ndarray of float, shape (n_points,)
        Top-class probabilities.
    target : ndarray of float, shape (n_points,)
        Required radius in units of sigma, > 0.
    n_max : int
        Largest sample size.
    alpha : float
        Failure probability of the bound.

    Returns
    -------
    k : ndarray of int64, shape (n_points,)
    """
    low = np.zeros(len(p), dtype=np.int64)  # 0, or a size whose radius misses the target
    high = np.full(len(p), n_max, dtype=np.int64)  # n_max, or a size that reaches it
    active = np.flatnonzero(high - low > 1)
    while len(active):
        middle = (low[active] + high[active]) // 2
        reached = _radius_per_sigma(middle, p[active], alpha) >= target[active]
        high[active[reached]] = middle[reached]
        low[active[~reached]] = middle[~reached]
        active = active[high[active] - low[active] > 1]
    return high


@dataclass(frozen=True)
class _PsiMap:
    """The piecewise-constant map psi_ISS of ISS Eq. 6 on the grid ``p = N / grid_size``.

    Attributes
    ----------
    steps : ndarray of int64, shape (2 * grid_size + 1,)
        ``steps[2 N]`` is psi at the grid point ``N / grid_size`` and
        ``steps[2 N + 1]`` its value on the open cell between grid points ``N``
        and ``N + 1``.
    """

    steps: np.ndarray

    def max_over(self, low, high):
        """Largest value of psi_ISS on each interval ``[low, high]`` (Eq. 5 over the whole interval).

        Parameters
        ----------
        low, high : ndarray of float, shape (n_inputs,)
            Interval ends in [0, 1], ``low <= high``.

        Returns
        -------
        k : ndarray of int64, shape (n_inputs,)
        """
        grid_size = (len(self.steps) - 1) // 2
        first, last = _step_index(low, grid_size), _step_index(high, grid_size)
        bounds = np.empty(2 * len(first), dtype=np.int64)
        bounds[0::2], bounds[1::2] = first, last + 1
        # reduceat over [first, last + 1) for the even entries; the odd ones are discarded.
        padded = np.append(self.steps, 0)
        return np.maximum.reduceat(padded, bounds)[0::2]


def _step_index(p, grid_size):
    """Index into ``_PsiMap.steps`` of the grid point or open cell holding each ``p`` in [0, 1]."""
    scaled = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0) * grid_size
    cell = np.floor(scaled).astype(np.int64)
    return np.where(scaled == cell, 2 * cell, 2 * cell + 1)


@lru_cache(maxsize=_CACHED_MAPS)
def _psi_map(n_max, decline, decline_type, alpha, grid_size, sigma_index):
    """Build psi_ISS (ISS Alg. 1 with Eq. 6) for one setting; cached.

    Parameters
    ----------
    n_max : int
        The desired sample size (the paper's k-bar).
    decline : float
        U: in radius units (absolute) or as a fraction of the radius (relative).
    decline_type : {"absolute", "relative"}
    alpha : float
        Failure probability of the final bound.
    grid_size : int
        Number of cells of the p grid (1 / delta).
    sigma_index : int or None
        Absolute decline only: the map is that of sigma ``2 ** (sigma_index / _SIGMA_STEPS)``.

    Returns
    -------
    _PsiMap
    """
    p = np.arange(grid_size + 1) / grid_size
    full = _radius_per_sigma(np.full(len(p), n_max), p, alpha)
    if decline_type == "absolute":
        target = full - decline / 2.0 ** (sigma_index / _SIGMA_STEPS)
    else:
        target = (1.0 - decline) * full
    # Alg. 1: psi = 0 where the required radius is <= 0, else the smallest admissible k.
    points = np.zeros(len(p), dtype=np.int64)
    needed = np.flatnonzero(target > 0)
    points[needed] = _min_sample_size(p[needed], target[needed], n_max, alpha)
    # Eq. 6: a cell takes the larger value of its two grid points, which bounds psi inside
    # the cell because psi is quasi-convex (monotone for AD, U-shaped for RD) where it is
    # positive. A cell where psi jumps up from 0 holds the threshold p* at which the required
    # radius becomes positive; just above p*, psi tends to the smallest k whose radius at p*
    # is positive (AD) or to n_max (RD), so the cell also takes the smallest k with a positive
    # radius at its left grid point, which is at least that limit (n_max where none exists).
    cells = np.maximum(points[:-1], points[1:])
    jumps = np.flatnonzero((points[:-1] == 0) & (points[1:] > 0))
    smallest_positive = np.full(len(jumps), np.nextafter(0.0, 1.0))
    cells[jumps] = np.maximum(cells[jumps], _min_sample_size(p[jumps], smallest_positive, n_max, alpha))
    steps = np.empty(2 * grid_size + 1, dtype=np.int64)
    steps[0::2], steps[1::2] = points, cells
    steps.setflags(write=False)
    return _PsiMap(steps)


def _sigma_index(sigma):
    """Index ``j`` of the smallest grid noise level ``2 ** (j / _SIGMA_STEPS)`` that is >= sigma."""
    index = np.ceil(_SIGMA_STEPS * np.log2(sigma)).astype(np.int64)
    return index + (2.0 ** (index / _SIGMA_STEPS) < sigma)


def check_relative_decline(decline, decline_type):
    """Refuse a relative radius decline of 1 or more (both decline-bounded samplers use it).

    Parameters
    ----------
    decline : float
        The allowed radius decline ``U``.
    decline_type : {"absolute", "relative"}

    Raises
    ------
    ValueError
        If ``decline_type == "relative"`` and ``decline >= 1``.
    """
    if decline_type == "relative" and decline >= 1:
        raise ValueError(
            f"A relative decline must be below 1 (a decline of 1 allows any radius loss, so "
            f"every input would abstain); got decline={decline!r}.")


class InputSpecificSampler(BaseTwoStageSampler):
    """Input-specific sample sizes with a bounded radius decline (ISS, Chen et al. 2022).

    Each input first gets ``k0 = n0_fraction * n_max`` pilot samples; their
    top class is the candidate and their two-sided Clopper-Pearson interval
    ``[p_low, p_up]`` brackets its probability. The input then gets ``k_hat``
    fresh samples, the largest value of the map psi_ISS on that interval
    (ISS Eq. 5), and the one-sided bound on the candidate uses only those
    (Alg. 2). psi(p) is the smallest sample size whose radius at top-class
    probability p is at most ``decline`` below the radius at ``n_max``
    (absolute decline, Def. 1) or at most a fraction ``decline`` of it
    (relative decline, Def. 2), where the radius certified with ``k``
    samples at probability p is ``sigma * Phi^-1(B(alpha; p k, k - p k + 1))``
    (0 if that bound is at most 1/2). Inputs whose radius is small anyway get
    few samples (none when even ``n_max`` could not certify more than the
    allowed decline), confident ones more, and, with probability at least
    ``1 - alpha``, no input loses more than ``decline`` of its expected radius
    at ``n_max`` (Prop. 1). How much this saves depends on the distribution
    of p over the inputs: psi is largest at p = 1 for AD (0.45 ``n_max`` at
    sigma 0.25, U = 0.05) and, for RD, also just above the p where the radius
    at ``n_max`` becomes positive (there it tends to ``n_max``).

    Parameters
    ----------
    n_max : int, default=100_000
        The desired sample size (the paper's k-bar): the decline is measured
        against the radius at this size, and no input gets more estimation samples.
    decline : float, default=0.05
        The bound U on the radius decline: in radius units for
        ``"absolute"``, a fraction in (0, 1) of the radius for ``"relative"``.
    decline_type : {"absolute", "relative"}, default="absolute"
        Absolute decline (AD, Def. 1) or relative decline (RD, Def. 2).
    n0_fraction : float, default=0.01
        Pilot share ``k0 / n_max`` (the paper's default; at least one pilot sample).

    Notes
    -----
    **Soundness.** The pilot (engine stage ``(*stage, 0)``) and estimation
    (``(*stage, 1)``) samples are independent, and the candidate class and
    ``k_hat`` are functions of the pilot alone. Given the pilot, the
    candidate's estimation count is binomial with ``k_hat`` trials, so the
    one-sided bound at level ``alpha`` fails with probability at most
    ``alpha`` whatever ``k_hat`` is (``k_hat = 0`` abstains): each
    certificate holds with probability ``1 - alpha`` unconditionally, and
    ``alpha`` need not be split with the pilot. The pilot interval, also at
    level ``alpha`` as in Alg. 2, only governs the decline guarantee of Prop. 1.
    Unlike the authors' code, the pilot counts never enter the final bound
    (they chose its sample size), and sample sizes need not be multiples of
    a batch size: the engine packs all inputs' samples into full batches.

    **The map.** psi is tabulated at ``p = N delta`` with ``delta = 1e-4``
    and held constant on each cell at the larger of its ends (Eq. 6), which
    bounds psi from above because psi is quasi-convex where positive
    (monotone for AD, U-shaped for RD); the cell where psi jumps up from 0 is
    handled separately (see ``_psi_map``). Because the RD map is not
    quasi-convex across that jump, ``k_hat`` is the maximum of psi_ISS over
    the whole interval ``[p_low, p_up]`` rather than at its two ends. Any
    ``k >= psi(p)`` also satisfies the bound, since the radius grows with
    ``k`` at fixed p; the tests check psi_ISS against a scan over every k.
    Absolute decline depends on ``decline / sigma``; sigma is rounded up to
    the grid ``2 ** (j / 32)`` (steps of 2.2 %), which can only raise the
    sample size, so the decline bound still holds.

    **Cost.** One map is a bisection of ``ceil(log2(n_max))`` rounds over at
    most 10,001 grid points: at most 1.7e5 Beta quantiles, 0.2-0.4 s on one
    CPU core at ``n_max = 100,000`` (a scan over every k needs 3e6 to 3e8).
    Maps are cached per ``(n_max, decline, decline_type, alpha, delta)``
    and, for AD, per grid sigma (128 maps kept), so AD with per-input noise
    levels spanning a ratio ``s`` builds at most
    ``32 log2(s) + 1`` maps once. Looking ``k_hat`` up is vectorised and
    negligible next to sampling.

    References
    ----------
    R. Chen, J. Li, J. Yan, P. Li and B. Sheng, "Input-Specific Robustness
    Certification for Randomized Smoothing", AAAI 2022.

    Examples
    --------
    >>> sampler = InputSpecificSampler(n_max=100_000, decline=0.05)
    >>> sampler.sample_size([0.5, 0.9, 0.99, 1.0], sigma=0.25).tolist()
    [0, 594, 2249, 45371]
    >>> sampler.prediction_sample_size
    100000
    """

    _parameter_constraints = {
        "n_max": [SAMPLE_SIZE],
        "decline": [Interval(Real, 0, None, closed="neither")],
        "decline_type": [StrOptions({"absolute", "relative"})],
        "n0_fraction": [Interval(Real, 0, 1, closed="right")],
    }

    def __init__(self, n_max=100_000, decline=0.05, decline_type="absolute", n0_fraction=0.01):
        self.n_max = n_max
        self.decline = decline
        self.decline_type = decline_type
        self.n0_fraction = n0_fraction

    def _check_consistency(self):
        check_relative_decline(self.decline, self.decline_type)

    @property
    def prediction_sample_size(self):
        """int: ``n_max``: ``predict``'s test has no radius to aim at, so it gets the unaccelerated size."""
        return int(self.n_max)

    def sample_size(self, p, sigma, alpha=0.001):
        """Estimation samples psi_ISS(p) spent on an input with top-class probability p (ISS Eq. 6).

        The pilot's ``k0`` samples come on top; in :meth:`certify` an input
        gets the largest of these values over its pilot interval.

        Parameters
        ----------
        p : array-like of float, any shape
            Top-class probabilities in [0, 1].
        sigma : float or array-like of float, broadcastable to ``p``
            Noise levels (> 0); the relative decline does not depend on them.
        alpha : float, default=0.001
            Failure probability of the certificate.

        Returns
        -------
        k : ndarray of int64, shape of ``np.broadcast(p, sigma)``
            0 where even ``n_max`` samples would not certify more than the
            allowed decline (in particular for p <= 1/2), at most ``n_max``.
        """
        self.validate()
        p, sigma = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(sigma, dtype=np.float64))
        if not np.all((p >= 0) & (p <= 1)):
            raise ValueError("p must be probabilities in [0, 1].")
        check_noise_levels(sigma)
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1); got {alpha!r}.")
        flat = p.ravel()
        return self._max_over(flat, flat, sigma.ravel(), alpha).reshape(p.shape)

    def _max_over(self, low, high, sigma, alpha):
        """Largest psi_ISS on each ``[low, high]`` at each input's noise level (Eq. 5).

        Parameters
        ----------
        low, high : ndarray of float, shape (n_inputs,)
            Interval ends.
        sigma : ndarray of float, shape (n_inputs,)
            Noise level per input.
        alpha : float

        Returns
        -------
        k : ndarray of int64, shape (n_inputs,)
        """
        absolute = self.decline_type == "absolute"
        groups = _sigma_index(sigma) if absolute else np.zeros(len(sigma), dtype=np.int64)
        k = np.zeros(len(sigma), dtype=np.int64)
        for group in np.unique(groups):
            rows = groups == group
            psi_map = _psi_map(int(self.n_max), float(self.decline), self.decline_type, float(alpha),
                               _GRID_SIZE, int(group) if absolute else None)
            k[rows] = psi_map.max_over(low[rows], high[rows])
        return k

    def _selection_size(self):
        return max(1, round(self.n0_fraction * self.n_max))

    def _estimation_sizes(self, candidate_count, n_selection, sigma, alpha):
        # Alg. 2, lines 1-5: the pilot's two-sided interval gives k_hat; lines 6-13 then use
        # fresh samples only (the pilot chose k_hat, so it stays out of the bound).
        p_low, p_up = clopper_pearson_interval(candidate_count, n_selection, alpha)
        return self._max_over(p_low, p_up, sigma, alpha)
