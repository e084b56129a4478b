"""What a certified sigma function is given to fit: the trained classifier and the estimator's training settings."""

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .. import _stages
from ..engine import MonteCarloEngine
from ..experts import takes_noise_level
from ..sampling import FixedSampler


def classifier_levels(module, training):
    """The classifier's grid of noise levels: what a certified sigma function chooses among by default.

    A module of experts per level (:class:`~smoothsk.experts.NoiseLevelExperts`)
    serves its levels only; any other classifier, the training schedule's grid.

    Parameters
    ----------
    module : torch.nn.Module instance or class
        The classifier (a class has no levels of its own).
    training : BaseTrainingSchedule or None

    Returns
    -------
    levels : ndarray of float, shape (K,), or None
        Ascending; None where neither has a grid.
    """
    if isinstance(module, torch.nn.Module) and takes_noise_level(module):
        return np.sort(np.asarray(module.levels, dtype=np.float64))
    return None if training is None else training.noise_levels()


@dataclass(frozen=True, eq=False)
class SigmaFitContext:
    """The trained classifier and the estimator's settings, as a certified sigma function's ``fit`` sees them.

    The estimator builds it (:meth:`from_estimator`) at the end of ``fit``
    and passes it to :meth:`~smoothsk.sigma.BaseCertifiedSigma.fit_sigma`:
    a sigma function reads what it needs here, never the estimator. A
    function that trains a module of its own (the selector of
    :class:`~smoothsk.sigma.CertifiedSigmaSelector`) builds it like the
    classifier's and trains it with the estimator's optimizer, epochs and
    batch size, from seeds of its own purposes (:meth:`seed`).

    Attributes
    ----------
    classifier : torch.nn.Module
        The trained classifier (the estimator's ``module_``). Read it, never
        change it: a selector starts from a copy of its weights.
    n_classes : int
        Number of classes the classifier scores.
    certify_batch_size : int
        The estimator's noisy copies per forward pass.
    n_jobs : int or None
        The estimator's ``n_jobs``.
    levels : ndarray of float, shape (K,), or None
        The training schedule's grid of noise levels
        (``BaseTrainingSchedule.noise_levels()``); None where it has none.
        For a classifier of experts per level
        (:class:`~smoothsk.experts.NoiseLevelExperts`), its levels, ascending.
    assignment_levels : ndarray of float, shape (K',), or None
        The grid from which the schedule assigned ``train_sigmas`` by a
        labelled grid search (PFAT Eq. 5;
        ``BaseTrainingSchedule.assignment_levels()``), else None.
    train_sigmas : ndarray of float, shape (n_train,), or None
        Each training sample's sigma at the end of training (``train_sigmas_``).
    module_class : type or None
        With ``module_params``, the module factory:
        ``module_class(**module_params, n_classes=K)`` is a new module like
        the classifier with K outputs (for experts per level, like one
        expert: the first expert's class, no parameters). None where the
        estimator's module is an instance or a class that takes no
        ``n_classes``.
    module_params : dict
        The estimator's ``module__`` parameters (empty for experts).
    optimizer_factory : callable
        ``optimizer_factory(parameters)``: the estimator's optimizer on
        ``parameters``, with its ``lr`` and ``optimizer__`` parameters.
    max_epochs : int
        The estimator's ``max_epochs``.
    batch_size : int or None
        The estimator's training batch size; None for the whole training
        set (skorch's -1).
    device : torch.device
        The estimator's device.
    random_state : int, RandomState instance or None
        The estimator's; :meth:`seed` derives the seed of each purpose from it.
    certify_samples : int
        Noisy samples per input of the estimator's certificates at most (its
        sampler's ``prediction_sample_size``: ``n``, or ``n_max``): the
        budget at which a training target's radius is estimated.
    """

    classifier: torch.nn.Module
    n_classes: int
    certify_batch_size: int
    n_jobs: int | None
    levels: np.ndarray | None
    assignment_levels: np.ndarray | None
    train_sigmas: np.ndarray | None
    module_class: type | None
    module_params: dict
    optimizer_factory: Callable
    max_epochs: int
    batch_size: int | None
    device: torch.device
    random_state: object
    certify_samples: int

    def classifier_engine(self, root_seed):
        """A :class:`~smoothsk.engine.MonteCarloEngine` on the trained classifier, seeded by ``root_seed``.

        With the estimator's ``certify_batch_size``, ``device`` and
        ``n_jobs``, inputs keyed by their row; ``engine.module`` is
        ``classifier`` (sample it in eval mode).
        """
        return MonteCarloEngine(self.classifier, self.n_classes, self.certify_batch_size, self.device, self.n_jobs,
                                root_seed=root_seed)

    def seed(self, salt):
        """The estimator's seed for one purpose: ``salt`` is one of :mod:`smoothsk._stages`' ``*_SALT`` values.

        Equal to the seed the estimator derives for that salt
        (:func:`smoothsk._stages.seed`; from a RandomState, the next draw).

        Returns
        -------
        int
        """
        return _stages.seed(self.random_state, salt)

    @classmethod
    def from_estimator(cls, estimator):
        """The context of a fitted (or loaded) ``SampleWiseSmoothedClassifier``.

        Reads its parameters and fitted attributes only. On a loaded
        estimator, which has no ``training_``, ``levels`` and
        ``assignment_levels`` are None.

        Parameters
        ----------
        estimator : SampleWiseSmoothedClassifier
            With ``module_`` and ``classes_``.

        Returns
        -------
        SigmaFitContext
        """
        training = getattr(estimator, "training_", None)
        module, module_params = estimator.module, estimator.get_params_for("module")
        levels = classifier_levels(estimator.module_, training)
        if takes_noise_level(estimator.module_):  # a new module like the classifier is one expert
            module, module_params = type(estimator.module_.experts[0]), {}
        takes_classes = isinstance(module, type) and "n_classes" in inspect.signature(module).parameters
        options = {key: value for key, value in estimator.get_params_for("optimizer").items() if key != "lr"}
        return cls(
            classifier=estimator.module_,
            n_classes=len(estimator.classes_),
            certify_batch_size=estimator.certify_batch_size,
            n_jobs=estimator.n_jobs,
            levels=levels,
            assignment_levels=None if training is None else training.assignment_levels(),
            train_sigmas=getattr(estimator, "train_sigmas_", None),
            module_class=module if takes_classes else None,
            module_params=module_params,
            optimizer_factory=functools.partial(estimator.optimizer, lr=estimator.lr, **options),
            max_epochs=estimator.max_epochs,
            batch_size=None if estimator.batch_size == -1 else int(estimator.batch_size),
            device=torch.device(estimator.device),
            random_state=estimator.random_state,
            # sampler=None is the estimator's default FixedSampler (smoothsk._params, above this layer).
            certify_samples=int((FixedSampler() if estimator.sampler is None else estimator.sampler)
                                .prediction_sample_size))
