"""One noise level for every training sample (Cohen et al. 2019, SmoothAdv, MACER)."""

from numbers import Real

import numpy as np
import torch

from .._constraints import HasMethods, Interval
from ..objectives import GaussianNoise
from ..sigma import FixedSigma
from ._base import BaseTrainingSchedule
from ._per_sample import sample_keys
from ._stage import Stage

#: The stage of every epoch.
FIXED = "fixed"


class FixedSigmaTraining(BaseTrainingSchedule):
    """One stage, one noise level for every sample (Cohen / SmoothAdv / MACER).

    Trains for the estimator's ``max_epochs`` at every ``fit`` and
    ``partial_fit`` call; every epoch's ``"training_stage"`` is ``"fixed"``.

    Parameters
    ----------
    sigma : float, default=0.25
        Training noise level, > 0.
    objective : BaseObjective or None, default=None
        Batch loss; None means :class:`GaussianNoise`.

    Examples
    --------
    >>> FixedSigmaTraining(0.5).default_sigma_search()
    FixedSigma(sigma=0.5)
    """

    _parameter_constraints = {
        "sigma": [Interval(Real, 0, None, closed="neither")],
        "objective": [HasMethods(["loss"]), None],
    }

    _sigma_params = ("sigma",)

    def __init__(self, sigma=0.25, objective=None):
        self.sigma = sigma
        self.objective = objective

    def _default_component(self, name):
        return GaussianNoise() if name == "objective" else None

    def _plan(self):
        return [Stage(FIXED, None, self._component("objective"))]

    def _begin(self, net, X, y):
        net.train_sigmas_, net.train_keys_ = np.full(len(X), float(self.sigma)), sample_keys(self, X, y)
        return True

    def batch_sigma(self, net, X, y, index):
        return torch.full((len(X),), float(self.sigma), dtype=X.dtype, device=X.device)

    def default_sigma_search(self):
        return FixedSigma(self.sigma)
