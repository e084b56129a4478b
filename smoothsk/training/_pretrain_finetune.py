"""PFAT's pretrain-to-finetune schedule (PFAT Sec. 4.2, Alg. 1)."""

from numbers import Integral, Real

import numpy as np
import torch

from .._constraints import HasMethods, Interval
from .._modes import evaluating
from ..objectives import SmoothAdv
from ..sigma import BaseCertifiedSigma, GridSigmaSearch
from ._per_sample import PerSampleSchedule, training_engine, uniform_sigmas
from ._stage import Stage

#: The two stages (Alg. 1 lines 2-4 and 12-14).
PRETRAIN = "pretrain"
FINETUNE = "finetune"

#: Grid step and Monte Carlo samples of PFAT's sigma assignment (Eq. 5, App. A.1).
_GRID_STEP = 0.05
_ASSIGN_SAMPLES = 500
#: Samples per grid point of PFAT's test-time search (App. A.1).
_TEST_SAMPLES = 1000


class PretrainFinetune(PerSampleSchedule):
    """Pretrain with random per-sample sigma, assign each sample its best sigma, finetune.

    1. *Pretrain* for ``pretrain_epochs``: every epoch each training sample
       draws ``sigma ~ U(sigma_min, sigma_max)`` anew (PFAT Eq. 4).
    2. *Assign*: each training sample gets the sigma of ``assignment``, a
       sigma search that uses the labels (by default PFAT Eq. 5: the grid
       ``{0.05 t}`` within ``[sigma_min, sigma_max]``, 500 Monte Carlo
       samples, the largest radius among correct predictions), run packed
       over the whole training set through the Monte Carlo engine.
    3. *Finetune* for ``finetune_epochs`` with these sigmas fixed, at
       learning rate ``finetune_lr``.

    The learning rate of the live optimizer is changed for the finetune
    stage (skorch's ``set_params(optimizer__lr=...)``); the estimator's ``lr``
    stays the pretraining rate, so a refit starts over as configured. A
    learning-rate scheduler callback keeps stepping across the stages.

    ``partial_fit`` (or ``fit`` with ``warm_start=True``) resumes: an
    unfinished pretraining is completed, and a finished run finetunes
    ``finetune_epochs`` more epochs with the assigned sigmas: a sample
    (input and label) assigned before (with the same ``sigma_min``,
    ``sigma_max`` and ``assignment``) keeps its sigma in whatever row, a
    new one is assigned, and so is one whose assignment failed or was
    interrupted.

    Parameters
    ----------
    sigma_min, sigma_max : float, default=0.12, 0.50
        Range of the pretraining sigmas and of the default assignment grid,
        0 < sigma_min < sigma_max.
    pretrain_epochs, finetune_epochs : int, default=150, 150
        Epochs of each stage (the estimator's ``max_epochs`` is not used).
    finetune_lr : float or None, default=0.001
        Learning rate of the finetune stage; None keeps the optimizer's.
    objective : BaseObjective or None, default=None
        Batch loss of both stages; None means
        ``SmoothAdv(epsilon=1.0, steps=2, num_noise=4)`` (Alg. 1 line 1).
    assignment : BaseSigmaSearch or None, default=None
        Search that assigns the training sigmas, called with labels; None
        means ``GridSigmaSearch(sigma_min, sigma_max, step=0.05, n=500)``
        (so ``[sigma_min, sigma_max]`` must hold a multiple of 0.05). A
        certified sigma function (``BaseCertifiedSigma``), which needs
        fitting to a trained model, is refused. Both are checked before
        any training.

    Notes
    -----
    Defaults follow PFAT App. A.1/A.2 (150 + 150 epochs, finetune learning
    rate 0.001, range [0.12, 0.50] with a 4-sample 2-step SmoothAdv).
    The history's ``"training_stage"`` column says which stage each epoch
    belongs to and ``"sigma_time"`` holds the seconds the assignment took
    (in the first finetune epoch).

    References
    ----------
    PFAT: "Pretrain-to-finetune adversarial training via sample-wise
    randomized smoothing", Alg. 1, Eq. 3-5.

    Examples
    --------
    >>> PretrainFinetune(sigma_max=1.0, pretrain_epochs=5, finetune_epochs=5)
    PretrainFinetune(finetune_epochs=5, pretrain_epochs=5, sigma_max=1.0)
    """

    _parameter_constraints = {
        "sigma_min": [Interval(Real, 0, None, closed="neither")],
        "sigma_max": [Interval(Real, 0, None, closed="neither")],
        "pretrain_epochs": [Interval(Integral, 0, None, closed="left")],
        "finetune_epochs": [Interval(Integral, 0, None, closed="left")],
        "finetune_lr": [Interval(Real, 0, None, closed="neither"), None],
        "objective": [HasMethods(["loss"]), None],
        "assignment": [HasMethods(["search"]), None],
    }

    _sigma_params = ("sigma_min", "sigma_max", "assignment")

    def __init__(self, sigma_min=0.12, sigma_max=0.50, pretrain_epochs=150, finetune_epochs=150,
                 finetune_lr=0.001, objective=None, assignment=None):
        self.sigma_min = sigma_min
        self.sigma_max = sigma_max
        self.pretrain_epochs = pretrain_epochs
        self.finetune_epochs = finetune_epochs
        self.finetune_lr = finetune_lr
        self.objective = objective
        self.assignment = assignment

    def _check_consistency(self):
        if self.sigma_min >= self.sigma_max:
            raise ValueError(f"sigma_min must be < sigma_max; got {self.sigma_min} and {self.sigma_max}.")
        # The assignment runs only after the pretraining epochs: refuse one that cannot run now.
        if isinstance(self.assignment, BaseCertifiedSigma):
            raise ValueError(
                f"assignment={type(self.assignment).__name__}(...) is a certified sigma function, which must "
                "first be fitted to a trained model (fit_sigma); PretrainFinetune calls its assignment as it "
                "is. Pass a sigma search such as GridSigmaSearch, or None for PFAT's grid.")
        if self.assignment is None and len(self._default_component("assignment").grid_sigmas()) == 0:
            raise ValueError(
                f"The default assignment searches the multiples of {_GRID_STEP} in [sigma_min, sigma_max] = "
                f"[{self.sigma_min}, {self.sigma_max}], and none lies there: widen the range or pass "
                "assignment=GridSigmaSearch(sigma_min, sigma_max, step=...) with a finer step.")

    def default_sigma_search(self):
        """PFAT's test-time search: the same grid, 1,000 samples per point (Eq. 7, App. A.1)."""
        return GridSigmaSearch(sigma_min=self.sigma_min, sigma_max=self.sigma_max,
                               step=_GRID_STEP, n=_TEST_SAMPLES)

    def noise_levels(self):
        """The grid of its assignment (Eq. 5), or of its test-time search (Eq. 7) where the assignment has none."""
        levels = self.assignment_levels()
        return self.default_sigma_search().noise_levels() if levels is None else levels

    def assignment_levels(self):
        """The grid of its assignment where that is a grid search (Eq. 5; the default is), else None."""
        assignment = self._component("assignment")
        return assignment.noise_levels() if isinstance(assignment, GridSigmaSearch) else None

    def _default_component(self, name):
        if name == "objective":
            return SmoothAdv(epsilon=1.0, steps=2, num_noise=4)
        if name == "assignment":
            return GridSigmaSearch(sigma_min=self.sigma_min, sigma_max=self.sigma_max, step=_GRID_STEP,
                                   n=_ASSIGN_SAMPLES)
        return None

    def _begin(self, net, X, y):
        self.assignment_ = self._component("assignment")  # the search of Eq. 5, resolved once per run
        self.known_ = self._carry(net, X, y, self.sigma_min)  # the samples whose assigned sigma a finetuning keeps
        return True

    def _plan(self):
        objective = self._component("objective")
        return [Stage(PRETRAIN, self.pretrain_epochs, objective, before=self._draw),
                Stage(FINETUNE, self.finetune_epochs, objective, lr=self.finetune_lr, before=self._assign)]

    def _draw(self, net, X, y, fresh):
        """Uniform sigmas for the training set (Eq. 4); every pretraining epoch then draws its own."""
        net.train_sigmas_ = uniform_sigmas(net, len(X), self.sigma_min, self.sigma_max)

    def _assign(self, net, X, y, fresh):
        """PFAT Eq. 5 / Alg. 1 line 11: each training sample's sigma, searched with its label.

        Done for every sample when the finetuning starts; a resumed finetuning
        keeps the sigmas of the samples it finetuned before and assigns the new ones.
        """
        rows = np.ones(len(X), dtype=bool) if fresh else ~self.known_
        if rows.any():
            subset = torch.from_numpy(rows)
            with self._timing(), evaluating(net.module_):
                sigma = self.assignment_.search(training_engine(net), X[subset], y[subset].cpu().numpy()).sigma
            net.train_sigmas_[rows] = sigma
            self._settle(net, rows)

    def on_epoch_begin(self, net):
        if self.stage_ == PRETRAIN:  # Eq. 4 / Alg. 1 line 3: fresh sigmas every epoch
            net.train_sigmas_ = uniform_sigmas(net, len(net.train_sigmas_), self.sigma_min, self.sigma_max)
        super().on_epoch_begin(net)
