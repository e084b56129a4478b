"""No training: a network trained elsewhere, smoothed and certified as it is (scikit-learn's ``cv="prefit"``)."""

from numbers import Real

import torch

from .._constraints import Interval
from ..sigma import FixedSigma
from ._base import BaseTrainingSchedule


class Pretrained(BaseTrainingSchedule):
    """Train nothing: ``fit`` takes the module as trained and fits only what certification needs.

    With this schedule the estimator's ``module`` must be a trained module
    instance; ``fit(X, y)`` runs no epoch and never writes a weight (the
    module's weights stay bit-identical), learns ``classes_`` and the input
    shape from ``X`` and ``y`` (``partial_fit(X, y, classes=...)`` when
    ``y`` lacks a class), checks the module's width against the classes,
    and fits a certified sigma function (e.g. a
    :class:`~smoothsk.sigma.CertifiedSigmaSelector`'s selector) on ``X`` and
    ``y`` with the module as it is. Certificates are those of the
    estimator's components about this module (``g`` at ``sigma`` with the
    default search).

    Parameters
    ----------
    sigma : float, default=0.25
        The noise level the network was trained for: the default test-time
        search is ``FixedSigma(sigma)``. For a
        :class:`~smoothsk.experts.NoiseLevelExperts` module the certified
        sigma function chooses among the module's levels instead.

    Examples
    --------
    >>> Pretrained(sigma=0.5).default_sigma_search()
    FixedSigma(sigma=0.5)
    """

    _parameter_constraints = {"sigma": [Interval(Real, 0, None, closed="neither")]}

    def __init__(self, sigma=0.25):
        self.sigma = sigma

    def check_module(self, module):
        """Refuse a module class, which ``fit`` would build untrained (before anything is built).

        Parameters
        ----------
        module : torch.nn.Module instance or class
            The estimator's ``module`` parameter.

        Raises
        ------
        ValueError
            If ``module`` is not a ``torch.nn.Module`` instance.
        """
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"training=Pretrained() certifies a trained network as it is: module must be the "
                             f"trained torch.nn.Module instance, not {module!r} (a class would be built untrained). "
                             "After load, pass set_params(module=estimator.module_).")

    def _plan(self):
        return []

    def batch_sigma(self, net, X, y, index):
        raise RuntimeError("Pretrained trains no batch.")  # no stage, so no batch: unreachable

    def default_sigma_search(self):
        return FixedSigma(self.sigma)
