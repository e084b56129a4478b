"""Training schedules: the stages of training, and each training sample's noise level in them."""

import time
from abc import abstractmethod
from contextlib import contextmanager

from .._components import Component
from ..experts import takes_noise_level
from ..sigma import FixedSigma
from ._stage import PLAN_START_KEY, STAGE_KEY, current_plan, resume


class BaseTrainingSchedule(Component):
    """Runs the stages of training and supplies per-sample sigma to each batch.

    A schedule declares its stages (:meth:`_plan`: name, epochs, objective,
    learning rate, what runs before each) and :meth:`run`, called by
    ``SampleWiseSmoothedClassifier.fit`` and ``partial_fit``, trains them:
    it resumes the plan where the history ends (:func:`resume`), switches
    the learning rate and drives skorch's own loop (``net.fit_loop``) once
    per stage, so callbacks, history, learning-rate schedulers and the
    epoch log work as in skorch. Every epoch row of the history names its
    stage (``"training_stage"``) and where its plan began (``"plan_start"``,
    see ``smoothsk.training._stage``), both written by :meth:`on_epoch_begin`,
    and the seconds spent choosing sigmas (``"sigma_time"``, written by the
    estimator's :class:`SigmaTimer` callback from :meth:`take_sigma_time`).

    The schedule a user passes is a parameter and is never changed: the
    estimator runs a clone of it (``net.training_``, made at every ``fit``
    and ``partial_fit`` call), and the run state (``stage_``, the stage
    being trained, ``objective_``, its objective, and ``plan_start_``)
    lives on that clone.
    What a later ``partial_fit`` resumes from lives on the estimator
    (``history``, ``train_sigmas_`` and ``train_keys_``).
    """

    #: Seconds spent choosing sigmas and not yet logged; each run's clone starts at 0.
    _sigma_seconds = 0.0
    #: Parameters that define the training sigmas: a later fit call keeps a sample's sigma only where
    #: the schedule's class and these values are the same (see ``smoothsk.training._per_sample``).
    _sigma_params = ()

    @abstractmethod
    def _plan(self):
        """The stages of this run, objectives resolved (defaults in place of None): list of Stage."""

    def _begin(self, net, X, y):
        """Set the run's state before its first stage (e.g. ``net.train_sigmas_``).

        Returns
        -------
        resumes : bool
            Whether the run continues the stage plan of ``net.history``
            (False: it starts the plan over from the next epoch).
        """
        return True

    def run(self, net, X, y, **fit_params):
        """Train ``net`` on ``X`` (torch.Tensor, (n, *shape)) and ``y`` (int64 tensor, (n,)).

        Called on the estimator's clone ``net.training_``. ``fit_params`` go
        to skorch's ``fit_loop``.
        """
        if self._begin(net, X, y):
            history = current_plan(net.history)
            self.plan_start_ = len(net.history) - len(history)
        else:
            history, self.plan_start_ = (), len(net.history)
        for stage, done, epochs in resume(self._plan(), history):
            if stage.before is not None:
                stage.before(net, X, y, done == 0)
            if stage.lr is not None:  # the live optimizer's; ``net.lr`` stays as given, so a refit starts over
                net.set_params(optimizer__lr=float(stage.lr))
            self.stage_, self.objective_ = stage.name, stage.objective
            self._fit_stage(net, X, y, done, epochs, fit_params)

    def _fit_stage(self, net, X, y, done, epochs, fit_params):
        """Train ``epochs`` epochs (None: ``max_epochs``) of the stage ``stage_``, ``done`` of it done before."""
        if epochs is None and net.max_epochs is None:
            raise ValueError(f"max_epochs=None: {type(self).__name__} trains for the estimator's max_epochs; set it "
                             "to an int >= 0.")
        if epochs is None or epochs > 0:
            net.fit_loop(X, y, epochs=epochs, **fit_params)

    @contextmanager
    def _timing(self):
        """Count the block's seconds as time spent choosing training sigmas."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sigma_seconds += time.perf_counter() - start

    def take_sigma_time(self):
        """Seconds spent choosing training sigmas since the last call (float); read at each epoch end."""
        seconds, self._sigma_seconds = self._sigma_seconds, 0.0
        return seconds

    @abstractmethod
    def batch_sigma(self, net, X, y, index):
        """Noise level of each sample of a batch.

        Parameters
        ----------
        net : SampleWiseSmoothedClassifier
        X : torch.Tensor, shape (batch, *input_shape)
        y : torch.Tensor of int64, shape (batch,)
        index : torch.Tensor of int64, shape (batch,)
            Positions of the samples in the training set.

        Returns
        -------
        sigma : torch.Tensor, shape (batch,)
            On the device and dtype of ``X``.
        """

    def on_epoch_begin(self, net):
        """Called at the start of each epoch; records its stage. Subclasses re-draw or update sigmas first."""
        net.history.record(STAGE_KEY, self.stage_)
        net.history.record(PLAN_START_KEY, self.plan_start_)

    def check_module(self, module):
        """Refuse, before anything is built, a ``module`` parameter this schedule cannot train.

        The default refuses a module of experts per noise level (one that
        takes the level, :class:`~smoothsk.experts.NoiseLevelExperts`):
        the training objectives call the module on noisy inputs alone.

        Parameters
        ----------
        module : torch.nn.Module instance or class
            The estimator's ``module`` parameter.

        Raises
        ------
        ValueError
        """
        if takes_noise_level(module):
            raise ValueError(f"{type(self).__name__} cannot train a module of experts per noise level: train each "
                             "expert at its level (one FixedSigmaTraining estimator each) and pass them as "
                             "NoiseLevelExperts(levels, experts) with training=Pretrained().")

    def default_sigma_search(self):
        """The test-time sigma search matching this schedule (used when none is given)."""
        return FixedSigma()

    def sigma_search_for(self, net, search):
        """The test-time search the estimator ``net`` runs: ``search``, or this schedule's restriction of it.

        Parameters
        ----------
        net : SampleWiseSmoothedClassifier
            The estimator, fitted or not.
        search : BaseSigmaSearch
            Its ``sigma_search`` parameter, or :meth:`default_sigma_search` where that is None.

        Returns
        -------
        search : BaseSigmaSearch
            ``search`` itself, unless a schedule's training state limits
            which noise levels it may choose (:class:`InstaRSTrain`).
        """
        return search

    def noise_levels(self):
        """The grid of noise levels the schedule works with: by default its test-time search's.

        Returns
        -------
        levels : ndarray of float, shape (K,), or None
            Ascending; None where the schedule has no grid (DDRS's continuous sigma).
        """
        return self.default_sigma_search().noise_levels()

    def assignment_levels(self):
        """The grid from which the schedule assigns each training sample's sigma by a labelled grid search (PFAT Eq. 5).

        Returns
        -------
        levels : ndarray of float, shape (K,), or None
            None (the default) for schedules that assign no such sigmas.
        """
        return None
