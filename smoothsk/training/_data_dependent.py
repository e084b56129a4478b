"""Training with data-dependent smoothing (DDRS Sec. 3.6, Alg. 2)."""

from numbers import Integral, Real

from .._constraints import HasMethods, Interval
from .._modes import evaluating
from ..objectives import GaussianNoise
from ..sigma import GradientSigmaSearch
from ._per_sample import PerSampleSchedule, training_engine
from ._stage import Stage, completed_epochs

#: The stage, and the label of its first ``warmup_epochs`` epochs (sigma_init, K = 0).
DATA_DEPENDENT = "data_dependent"
WARMUP = "warmup"


class DataDependentTraining(PerSampleSchedule):
    """Per-batch gradient ascent of each sample's sigma, warm-started across epochs.

    Every sample keeps a sigma (``net.train_sigmas_``, starting at
    ``sigma_init``). After ``warmup_epochs`` epochs at ``sigma_init``, each
    training batch first runs ``steps`` iterations of DDRS's OptimizeSigma
    (Alg. 1: stochastic gradient ascent of the soft radius over sigma, with
    the reparameterisation trick; :class:`~smoothsk.sigma.GradientSigmaSearch`)
    on its samples, from their current sigmas, stores the result and trains
    the batch with it (Alg. 2). So each sample's sigma continues from the
    value of the previous epoch. Trains for the estimator's ``max_epochs``;
    ``partial_fit`` (or ``warm_start``) continues from the stored sigmas of
    the samples it trained before (with the same ``sigma_init`` and bounds), in
    whatever row; new samples start at ``sigma_init``.
    Validation batches use the stored sigmas without optimising them.

    Parameters
    ----------
    sigma_init : float, default=0.25
        Starting sigma of every sample, > 0 (DDRS: the sigma the model is
        trained with).
    steps : int, default=1
        Gradient iterations per batch after the warm-up (DDRS Sec. 4.1: K = 1).
    lr : float, default=1e-4
        Step size alpha of the gradient ascent (DDRS Sec. 3.6).
    warmup_epochs : int, default=50
        Epochs at ``sigma_init`` before sigmas are optimised (DDRS Sec. 4.1:
        50 of 200 epochs with K = 0).
    objective : BaseObjective or None, default=None
        Batch loss ("TrainFunction"); None means :class:`GaussianNoise`.
    sigma_min, sigma_max : float, float or None, default=0.01, None
        Bounds every ascent step clips sigma to (in training and in
        :meth:`default_sigma_search`; None: no upper bound); ``sigma_init``
        must lie between them. The paper leaves sigma free; the lower bound
        keeps the noise from vanishing.

    Notes
    -----
    The history's ``"sigma_time"`` column holds the seconds spent optimising
    sigmas in each epoch. DDRS's step size is tuned to CIFAR-10 and ImageNet;
    inputs of few dimensions need a larger ``lr`` for sigmas to move.

    References
    ----------
    Alfarra et al., "Data dependent randomized smoothing", UAI 2022, Alg. 2.

    Examples
    --------
    >>> DataDependentTraining(sigma_init=0.5, lr=0.01, warmup_epochs=2)
    DataDependentTraining(lr=0.01, sigma_init=0.5, warmup_epochs=2)
    """

    _parameter_constraints = {
        "sigma_init": [Interval(Real, 0, None, closed="neither")],
        "steps": [Interval(Integral, 0, None, closed="left")],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "warmup_epochs": [Interval(Integral, 0, None, closed="left")],
        "objective": [HasMethods(["loss"]), None],
        "sigma_min": [Interval(Real, 0, None, closed="neither")],
        "sigma_max": [Interval(Real, 0, None, closed="neither"), None],
    }

    _sigma_params = ("sigma_init", "sigma_min", "sigma_max")

    def __init__(self, sigma_init=0.25, steps=1, lr=1e-4, warmup_epochs=50, objective=None, sigma_min=0.01,
                 sigma_max=None):
        self.sigma_init = sigma_init
        self.steps = steps
        self.lr = lr
        self.warmup_epochs = warmup_epochs
        self.objective = objective
        self.sigma_min = sigma_min
        self.sigma_max = sigma_max

    def _check_consistency(self):
        if self.sigma_max is not None and self.sigma_max < self.sigma_min:
            raise ValueError(f"sigma_max must be >= sigma_min; got {self.sigma_max} and {self.sigma_min}.")
        if self.sigma_init < self.sigma_min or (self.sigma_max is not None and self.sigma_init > self.sigma_max):
            raise ValueError(f"sigma_init={self.sigma_init} must lie in [sigma_min, sigma_max] = "
                             f"[{self.sigma_min}, {self.sigma_max}], the bounds every ascent step is clipped to.")

    def default_sigma_search(self):
        """DDRS's certification-time OptimizeSigma from ``sigma_init`` at the same step size and bounds (Sec. 3.6)."""
        return GradientSigmaSearch(sigma_init=self.sigma_init, lr=self.lr, sigma_min=self.sigma_min,
                                   sigma_max=self.sigma_max)

    def _begin(self, net, X, y):
        # Alg. 1 with K = steps, resolved once per run and used on every batch.
        self.search_ = GradientSigmaSearch(sigma_init=self.sigma_init, steps=self.steps, lr=self.lr,
                                           sigma_min=self.sigma_min, sigma_max=self.sigma_max)
        self._carry(net, X, y, self.sigma_init)
        self._settle(net)  # sigma_init is the schedule's own start: new samples are known from now on
        return True

    def _default_component(self, name):
        return GaussianNoise() if name == "objective" else None

    def _plan(self):
        return [Stage(DATA_DEPENDENT, None, self._component("objective"))]

    def on_epoch_begin(self, net):
        # The epochs of the warm-up (K = 0) carry its label; the warm-up counts epochs over all fit calls.
        done = completed_epochs(net.history, WARMUP, DATA_DEPENDENT)
        self.stage_ = WARMUP if done < self.warmup_epochs else DATA_DEPENDENT
        super().on_epoch_begin(net)

    def batch_sigma(self, net, X, y, index):
        if self.stage_ == DATA_DEPENDENT and self.steps and net.module_.training:
            rows = index.cpu().numpy()
            with self._timing(), evaluating(net.module_):
                net.train_sigmas_[rows] = self.search_.ascend(training_engine(net), X, net.train_sigmas_[rows]).sigma
        return super().batch_sigma(net, X, y, index)
