"""Grid search over noise levels with Monte Carlo radius estimates (PFAT, Wang et al. 2021)."""

import math
from numbers import Real

import numpy as np

from .._constraints import SAMPLE_SIZE, Interval
from .._stages import SEARCH_STAGE
from ..statistics import top_class_radius
from ._base import BaseSigmaSearch, SigmaSearchResult

#: Most noise levels a grid may hold (PFAT's grids hold 18 or so; each level costs ``n`` samples per input).
MAX_GRID_LEVELS = 10_000


class GridSigmaSearch(BaseSigmaSearch):
    """Estimate the radius at every sigma of a grid and keep the best (PFAT Eq. 5 and 7).

    The grid is PFAT's ``{t * step : t a natural number, sigma_min <= t * step
    <= sigma_max}`` (with the defaults 0.15, 0.20, ..., 1.00: 18 points). Each
    input's radius at a grid sigma is estimated as in the certification the
    paper applies to every grid point (Cohen et al.'s CERTIFY, Eq. 2): the top
    class of ``n`` noisy samples and the radius ``sigma * PhiInv(p_lower)`` of
    its one-sided Clopper-Pearson bound at level ``alpha``. Without labels the
    search keeps the sigma of the largest radius (Eq. 7); with labels, the
    largest radius among grid points where the top class is the label (Eq. 5,
    the training-time assignment). Ties, including inputs whose radius is 0
    everywhere, go to the smallest sigma.

    All inputs are sampled together at each grid sigma (one packed engine call
    per grid point), and every grid sigma reuses the same standard-normal
    draws of an input (common random numbers: one engine stage for the whole
    grid), so radii at neighbouring sigmas are compared with less noise. This
    costs nothing in validity: the search uses only its own stage, and the
    certificate that follows draws fresh samples at the chosen sigma.

    Parameters
    ----------
    sigma_min : float, default=0.12
        Lower end of the grid's range, > 0.
    sigma_max : float, default=1.0
        Upper end of the grid's range, >= ``sigma_min``.
    step : float, default=0.05
        Grid interval (PFAT's sigma_interval); grid points are its multiples.
    n : int, default=500
        Noisy samples per input and grid point (PFAT's 500).
    alpha : float, default=0.001
        Failure probability of the Clopper-Pearson bound in the radius estimate.

    References
    ----------
    L. Wang, R. Zhai, D. He, L. Wang, L. Jian. Pretrain-to-Finetune
    Adversarial Training via Sample-wise Randomized Smoothing (2021), Sec. 4.2.

    Examples
    --------
    >>> GridSigmaSearch(0.2, 0.5, 0.1).grid_sigmas()
    array([0.2, 0.3, 0.4, 0.5])
    """

    _parameter_constraints = {
        "sigma_min": [Interval(Real, 0, None, closed="neither")],
        "sigma_max": [Interval(Real, 0, None, closed="neither")],
        "step": [Interval(Real, 0, None, closed="neither")],
        "n": [SAMPLE_SIZE],
        "alpha": [Interval(Real, 0, 1, closed="neither")],
    }

    def __init__(self, sigma_min=0.12, sigma_max=1.0, step=0.05, n=500, alpha=0.001):
        self.sigma_min = sigma_min
        self.sigma_max = sigma_max
        self.step = step
        self.n = n
        self.alpha = alpha

    def _check_consistency(self):
        if self.sigma_max < self.sigma_min:
            raise ValueError(f"sigma_max ({self.sigma_max}) must be >= sigma_min ({self.sigma_min}).")
        if len(self.grid_sigmas()) == 0:
            raise ValueError(f"No multiple of step={self.step} lies in [sigma_min, sigma_max] = "
                             f"[{self.sigma_min}, {self.sigma_max}]; the grid is empty.")

    def grid_sigmas(self):
        """The grid of noise levels searched.

        Returns
        -------
        sigmas : ndarray of float, shape (n_grid,)
            Multiples ``t * step`` (``t >= 1``) in ``[sigma_min, sigma_max]``,
            ascending, rounded to 12 decimals (so that ``3 * 0.05`` is
            ``0.15``), or to 3 significant digits of ``step`` for steps below
            1e-9; an end within ``1e-9 * step`` of a multiple counts as that
            multiple and stays the end itself.

        Raises
        ------
        ValueError
            If the grid would hold more than :data:`MAX_GRID_LEVELS` levels
            (checked before it is built).
        """
        # A tolerance keeps ends that are multiples of step up to rounding; clipping keeps them in the range.
        first, last = float(self.sigma_min) / self.step - 1e-9, float(self.sigma_max) / self.step + 1e-9
        # Counted before anything is built: a few bytes of parameters (a model file's) may not ask for a
        # grid of 10**8 levels, or one too long to count (an infinite ratio).
        if not last - first <= MAX_GRID_LEVELS:
            count = f"{math.floor(last) - math.ceil(first) + 1} noise levels" if math.isfinite(last) else "too many"
            raise ValueError(f"The grid of the multiples of step={self.step} in [sigma_min, sigma_max] = "
                             f"[{self.sigma_min}, {self.sigma_max}] has {count}, more than the {MAX_GRID_LEVELS} "
                             f"searched (each costs n={self.n} noisy samples per input); take a larger step.")
        first, last = max(1, math.ceil(first)), math.floor(last)
        decimals = max(12, 2 - int(np.floor(np.log10(self.step))))
        grid = np.round(np.arange(first, last + 1) * self.step, decimals)
        return np.clip(grid, self.sigma_min, self.sigma_max)

    def noise_levels(self):
        """The grid (:meth:`grid_sigmas`)."""
        return self.grid_sigmas()

    def _search(self, engine, X, y):
        sigmas = self.grid_sigmas()
        best = best_sigma_index(engine, X, sigmas, self.n, self.alpha, y)
        return SigmaSearchResult(sigmas[best], np.full(len(X), len(sigmas), dtype=np.int64))


def best_sigma_index(engine, X, sigmas, n, alpha, y=None):
    """Index of the noise level with the largest estimated radius, per input (PFAT Eq. 5 and 7).

    The first maximum over the levels of :func:`sigma_radii`: ties,
    including inputs whose radius is 0 everywhere, go to the first sigma of
    ``sigmas``.

    Parameters
    ----------
    engine, X, sigmas, n, alpha, y
        As in :func:`sigma_radii`.

    Returns
    -------
    best : ndarray of int, shape (n_inputs,)
        Index into ``sigmas``.
    """
    return sigma_radii(engine, X, sigmas, n, alpha, y).argmax(axis=0)  # Eq. 7 (first maximum among ties)


def sigma_radii(engine, X, sigmas, n, alpha, y=None, budget=None):
    """Estimated radius of each input at each noise level (PFAT Eq. 2; with labels Eq. 5).

    Each input's radius at each sigma is CERTIFY's ``sigma * PhiInv(p_lower)``
    of the top class of ``n`` noisy samples (one-sided Clopper-Pearson bound
    at level ``alpha``); with labels, 0 where the top class is not the
    label (Eq. 5). All inputs are sampled together at each sigma, with the
    same standard-normal draws at every sigma (one engine stage,
    ``(SEARCH_STAGE,)``: common random numbers).

    Parameters
    ----------
    engine : MonteCarloEngine
    X : torch.Tensor, shape (n_inputs, *input_shape)
    sigmas : ndarray of float, shape (n_sigmas,)
        Candidate noise levels.
    n : int
        Noisy samples per input and sigma.
    alpha : float
        Failure probability of each bound.
    y : ndarray of int, shape (n_inputs,), optional
        Class indices.
    budget : int, optional
        Estimate the radius a certificate from ``budget`` samples would get
        instead: the bound of the same top-class frequency over ``budget``
        samples (the counts scaled to ``budget`` and rounded). ``n`` samples
        cap every radius at ``sigma * PhiInv(alpha ** (1 / n))``, which
        favours large sigmas where the certificate that follows draws many
        more (at ``n = 500`` a sigma-0.5 radius stops at 1.1, at ``n =
        10,000`` at 1.6). None: ``n``.

    Returns
    -------
    radius : ndarray of float, shape (n_sigmas, n_inputs)
        ``radius[g, i]``: input ``i``'s estimated radius at ``sigmas[g]``.
    """
    n_inputs = len(X)
    n_samples = np.full(n_inputs, n, dtype=np.int64)
    radius = np.empty((len(sigmas), n_inputs))
    for g, sigma in enumerate(sigmas):
        # One stage for all sigmas: common random numbers across sigmas.
        counts = engine.class_counts(X, np.full(n_inputs, sigma), n_samples, (SEARCH_STAGE,))
        if budget is not None:
            counts = np.rint(counts * (budget / n)).astype(np.int64)
        radius[g] = top_class_radius(counts, counts.sum(axis=1), sigma, alpha, y)  # Eq. 2; with labels Eq. 5
    return radius
