"""Insta-RS Train: lazily updated per-sample noise levels (Insta-RS Sec. 3.2, Alg. 2)."""

import math
from numbers import Integral, Real

import numpy as np
from sklearn.base import clone

from .._constraints import HasMethods, Interval, StrOptions
from .._modes import evaluating
from .._stages import LEVEL_UPDATE_STAGE
from ..objectives import SmoothAdv
from ..sigma import MultiStartFGSS
from ..sigma._fgss import approximate_radius
from ._per_sample import PerSampleSchedule, training_engine
from ._stage import Stage

#: The two training stages (Alg. 2 lines 2-11 and 12-14).
STAGE_1 = "stage1"
STAGE_2 = "stage2"


class InstaRSTrain(PerSampleSchedule):
    """Two-stage training with per-sample sigma^2 on the grid ``l * sigma0^2``.

    *Stage I* (``stage1_epochs``): every sample starts at level ``l = 1``
    (``sigma = sigma0``). At the start of every ``update_every``-th epoch all
    levels are updated at once (Alg. 2 lines 4-10, vectorised over the
    training set, the soft smoothed classifier of Eq. 4 estimated with
    ``num_noise`` noisy copies per sample, packed by the Monte Carlo engine):

    - down one level if the soft smoothed classifier at the current level
      misclassifies the sample;
    - up one level if it classifies it correctly at the current level and at
      the next one, and the approximate radius ``sigma * PhiInv(g_soft(x)_y)``
      (Sec. 3.1) is larger at the next one;

    levels stay in ``[1, max_level]``. *Stage II* (``stage2_epochs``) finetunes
    with the levels fixed, at learning rate ``stage2_lr``.

    ``partial_fit`` (or ``fit`` with ``warm_start=True``) resumes an unfinished
    stage I with the current levels; a finished run finetunes
    ``stage2_epochs`` more epochs. Levels follow the samples, not the rows:
    a sample (input and label) the previous call trained (with the same
    ``sigma0`` and ``max_level``) keeps its level, a new one starts at
    level 1, and where no sample is known the stage plan starts over (a
    later call resumes that new plan, even if it was interrupted).

    Parameters
    ----------
    sigma0 : float, default=0.25
        Base noise level, > 0: ``sigma^2 = l * sigma0^2``.
    max_level : int, default=16
        Largest level ``T``, >= 1 (sigma up to ``sqrt(T) * sigma0``).
    update_every : int, default=10
        Update period ``L`` in epochs, >= 1.
    num_noise : int, default=8
        Noisy copies ``m_2`` per sample for the soft smoothed classifier.
    stage1_epochs, stage2_epochs : int, default=150, 150
        Epochs of each stage (the estimator's ``max_epochs`` is not used).
    stage1_objective, stage2_objective : BaseObjective or None, default=None
        Batch losses ``M_1``, ``M_2``; None means
        ``SmoothAdv(epsilon="adaptive")`` (setting 3, the paper's best).
    stage2_lr : float or None, default=0.001
        Learning rate of stage II (App. B.4); None keeps the optimizer's.
    search_levels : {"trained", "all"}, default="trained"
        The noise levels a test-time :class:`~smoothsk.sigma.MultiStartFGSS`
        may choose once the estimator is fitted: up to the largest sigma
        training assigned (``"trained"``), or up to the search's own
        ``max_level`` (``"all"``, Alg. 1 as published). Training assigns
        levels with the labels (Alg. 2), so a level no sample reached is a
        noise level the model never learned; the label-free search scores
        it by the soft top-class radius, which a model whose noisy votes
        collapse onto one class maximises. On the digits, searching all 16
        levels certified 0.338 at r = 0 (ACR 0.345), up to the 8 training
        reached 0.871 (ACR 0.591) (``benchmarks/bench_insta_rs_range.py``).
        Either way the certificate is the same kind (``g`` at the chosen
        sigma); only which sigma is searched changes.

    Notes
    -----
    Defaults follow Insta-RS App. B.2 and B.4 (sigma0 = 0.25, T = 16, L = 10,
    m_2 = 8, 150 + 150 epochs, stage II learning rate 0.001). Settings 1-3 of
    the paper are ``GaussianNoise()`` / ``SmoothAdv("adaptive")`` in the two
    stages. The history's ``"sigma_time"`` column holds the seconds each
    level update took.

    References
    ----------
    Chen et al., "Insta-RS: Instance-wise randomized smoothing for improved
    robustness and accuracy", Alg. 2.

    Examples
    --------
    >>> from smoothsk.training import GaussianNoise
    >>> InstaRSTrain(stage1_objective=GaussianNoise(), stage2_objective=GaussianNoise())
    InstaRSTrain(stage1_objective=GaussianNoise(), stage2_objective=GaussianNoise())
    """

    _parameter_constraints = {
        "sigma0": [Interval(Real, 0, None, closed="neither")],
        "max_level": [Interval(Integral, 1, None, closed="left")],
        "update_every": [Interval(Integral, 1, None, closed="left")],
        "num_noise": [Interval(Integral, 1, None, closed="left")],
        "stage1_epochs": [Interval(Integral, 0, None, closed="left")],
        "stage2_epochs": [Interval(Integral, 0, None, closed="left")],
        "stage1_objective": [HasMethods(["loss"]), None],
        "stage2_objective": [HasMethods(["loss"]), None],
        "stage2_lr": [Interval(Real, 0, None, closed="neither"), None],
        "search_levels": [StrOptions({"trained", "all"})],
    }

    _sigma_params = ("sigma0", "max_level")

    def __init__(self, sigma0=0.25, max_level=16, update_every=10, num_noise=8, stage1_epochs=150,
                 stage2_epochs=150, stage1_objective=None, stage2_objective=None, stage2_lr=0.001,
                 search_levels="trained"):
        self.sigma0 = sigma0
        self.max_level = max_level
        self.update_every = update_every
        self.num_noise = num_noise
        self.stage1_epochs = stage1_epochs
        self.stage2_epochs = stage2_epochs
        self.stage1_objective = stage1_objective
        self.stage2_objective = stage2_objective
        self.stage2_lr = stage2_lr
        self.search_levels = search_levels

    def default_sigma_search(self):
        """Insta-RS's test-time search: multi-start FGSS on the same levels (Alg. 1)."""
        return MultiStartFGSS(sigma0=self.sigma0, max_level=self.max_level)

    def sigma_search_for(self, net, search):
        """``search``; a ``MultiStartFGSS`` capped at the largest sigma training assigned (``search_levels``).

        The cap is the largest level ``l`` of the search's grid with
        ``sqrt(l) * sigma0 <= max(net.train_sigmas_)``, at least 1; its starts
        are moved within it. Before ``fit`` (no ``train_sigmas_``), with
        ``search_levels="all"`` or another kind of search, ``search`` as given.
        """
        sigmas = getattr(net, "train_sigmas_", None)
        if self.search_levels == "all" or sigmas is None or not len(sigmas) or not isinstance(search, MultiStartFGSS):
            return search
        # Levels are sigma0 * sqrt(l): the tolerance keeps a reached level from rounding down to the one below.
        reached = max(1, math.floor((float(np.max(sigmas)) / search.sigma0) ** 2 * (1 + 1e-9)))
        if reached >= search.max_level:
            return search
        starts = None if search.starts is None else tuple((min(level, reached), step) for level, step in search.starts)
        return clone(search).set_params(max_level=reached, starts=starts)

    def levels(self, net):
        """Current level ``l`` of each training sample, ``sigma^2 = l * sigma0^2``.

        Returns
        -------
        levels : ndarray of int64, shape (n_train,)
        """
        return np.rint((net.train_sigmas_ / self.sigma0) ** 2).astype(np.int64)

    def _begin(self, net, X, y):
        # New samples start at level 1; where none is known, the stage plan starts over too.
        return bool(self._carry(net, X, y, self.sigma0).any())

    def on_epoch_begin(self, net):
        # Level 1 is the schedule's own start: new samples are known once an epoch trains them, with the
        # epoch that marks a plan started over (so an interrupted new plan is resumed, not started again).
        self._settle(net)
        super().on_epoch_begin(net)

    def _default_component(self, name):
        return SmoothAdv(epsilon="adaptive") if name in ("stage1_objective", "stage2_objective") else None

    def _plan(self):
        return [Stage(STAGE_1, self.stage1_epochs, self._component("stage1_objective")),
                Stage(STAGE_2, self.stage2_epochs, self._component("stage2_objective"), lr=self.stage2_lr)]

    def _fit_stage(self, net, X, y, done, epochs, fit_params):
        if self.stage_ == STAGE_2:
            super()._fit_stage(net, X, y, done, epochs, fit_params)
            return
        # Stage I in runs of epochs that end just before each update epoch (iter % L == 0).
        end = done + epochs
        while done < end:
            epoch = done + 1
            if epoch % self.update_every == 0:
                with self._timing(), evaluating(net.module_):
                    net.train_sigmas_ = self._update(net, X, y)
            run = min(self.update_every - epoch % self.update_every, end - done)
            super()._fit_stage(net, X, y, done, run, fit_params)
            done += run

    def _update(self, net, X, y):
        """Alg. 2 lines 5-10 for every training sample at once; returns the new sigmas.

        Call it with the module in eval mode (:func:`~smoothsk._modes.evaluating`).
        """
        level = self.levels(net)
        sigma_cur = self.sigma0 * np.sqrt(level)
        sigma_fur = self.sigma0 * np.sqrt(level + 1)
        engine = training_engine(net)
        # The same stage for both levels: common noise directions, so the comparison
        # of the two radii is not swamped by Monte Carlo noise.
        n_samples = np.full(len(X), self.num_noise)
        g_cur = engine.mean_softmax(X, sigma_cur, n_samples, LEVEL_UPDATE_STAGE)
        g_fur = engine.mean_softmax(X, sigma_fur, n_samples, LEVEL_UPDATE_STAGE)
        y = y.cpu().numpy()
        radius_cur = approximate_radius(g_cur, sigma_cur, y)
        radius_fur = approximate_radius(g_fur, sigma_fur, y)
        wrong = g_cur.argmax(axis=1) != y
        grows = (g_fur.argmax(axis=1) == y) & (radius_cur < radius_fur)
        level = np.where(wrong, level - 1, np.where(grows, level + 1, level))
        # Alg. 2 writes min(sigma^2 - sigma0^2, sigma0^2) and max(sigma^2 + sigma0^2, T sigma0^2),
        # which would pin every level to 1 or T; the text (Sec. 3.2, App. B.4: "all sigma_i
        # within [0.25, 1]") means a clip to [sigma0^2, T sigma0^2], done here.
        level = np.clip(level, 1, self.max_level)
        return self.sigma0 * np.sqrt(level)
