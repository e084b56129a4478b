"""MACER: certify-and-train by maximising the soft certified radius (Zhai et al. 2020)."""

from dataclasses import dataclass
from numbers import Integral, Real

import torch

from .._constraints import Interval
from ..statistics import soft_margin
from ._base import BaseObjective, gaussian_copies, running_epoch


@dataclass
class MacerTerms:
    """The two per-sample parts of the MACER loss.

    Attributes
    ----------
    classification : torch.Tensor, shape (batch,)
        Cross-entropy of the soft smoothed classifier, ``-log g_soft(x)_y``.
    radius : torch.Tensor, shape (batch,)
        ``sigma / 2 * max(0, gamma - xi)`` where
        ``xi = PhiInv(p_1) - PhiInv(p_2)`` is the gap of the top two
        probabilities of the beta-tempered soft smoothed classifier, for
        samples whose top class is the label; 0 for the others.
    logits : torch.Tensor, shape (batch, n_classes)
        Logits on the first noisy copy of each sample.
    """

    classification: torch.Tensor
    radius: torch.Tensor
    logits: torch.Tensor


class Macer(BaseObjective):
    """Soft smoothed cross-entropy plus a hinge on the soft certified radius.

    With ``k`` noisy copies ``x + eta_j``, ``eta_j ~ N(0, sigma^2 I)``, of a
    sample ``(x, y)`` the loss is (Zhai et al. 2020, Eq. 8-10)::

        -log( (1/k) sum_j softmax(f(x + eta_j))_y )
            + lbd * sigma / 2 * max(0, gamma - xi) * 1[top class of g_beta == y]

    where ``g_beta = (1/k) sum_j softmax(beta * f(x + eta_j))`` and
    ``xi = PhiInv(p_1) - PhiInv(p_2)`` its top-two gap: the radius term pushes
    the soft radius of correctly classified samples up to ``gamma``, and is 0
    for misclassified samples. Each sample uses its own ``sigma``.

    Parameters
    ----------
    num_noise : int, default=16
        Noisy copies ``k`` per sample.
    beta : float, default=16.0
        Inverse temperature of the softmax in the radius term, > 0.
    gamma : float, default=8.0
        Hinge threshold on ``xi``, > 0.
    lbd : float, default=12.0
        Weight of the radius term, >= 0.
    deferred_epochs : int, default=0
        The radius term's weight is 0 in the first ``deferred_epochs``
        epochs of training (epoch ``t``, from 0, with ``t < deferred_epochs``)
        and ``lbd`` after: the network first learns to classify noisy
        inputs. Jeong and Shin's MNIST runs defer it to the first
        learning-rate drop (their ``--deferred``, 30 of 90 epochs); from
        the first epoch, LeNet at sigma 0.5 and 1.0 collapses to one class.

    Notes
    -----
    Defaults: MACER's CIFAR-10 setting (k = 16, beta = 16, gamma = 8,
    lambda = 12), also used by PFAT (Table 4) and DDRS (Sec. 4.3).
    Probabilities are clipped to ``[eps, 1 - eps]`` (machine epsilon)
    before ``PhiInv``, so ``xi`` stays finite; a clipped gap exceeds
    ``gamma`` and contributes no gradient, as MACER's removal of infinite gaps.

    References
    ----------
    Zhai et al., "MACER: Attack-free and scalable robust training via
    maximizing certified radius", ICLR 2020.

    Examples
    --------
    >>> Macer(lbd=4.0)
    Macer(lbd=4.0)
    """

    _parameter_constraints = {
        "num_noise": [Interval(Integral, 1, None, closed="left")],
        "beta": [Interval(Real, 0, None, closed="neither")],
        "gamma": [Interval(Real, 0, None, closed="neither")],
        "lbd": [Interval(Real, 0, None, closed="left")],
        "deferred_epochs": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, num_noise=16, beta=16.0, gamma=8.0, lbd=12.0, deferred_epochs=0):
        self.num_noise = num_noise
        self.beta = beta
        self.gamma = gamma
        self.lbd = lbd
        self.deferred_epochs = deferred_epochs

    def terms(self, net, X, y, sigma):
        """The classification and radius terms of each sample.

        Parameters are those of :meth:`loss`.

        Returns
        -------
        MacerTerms
        """
        logits = net.module_(gaussian_copies(net, X, sigma, self.num_noise))
        logits = logits.view(self.num_noise, len(X), -1)
        probabilities = torch.softmax(logits, dim=2).mean(dim=0)
        classification = -torch.log(probabilities.gather(1, y[:, None])[:, 0] + 1e-10)
        tempered = torch.softmax(self.beta * logits, dim=2).mean(dim=0)
        eps = torch.finfo(tempered.dtype).eps
        gap, top_class = soft_margin(tempered, (eps, 1 - eps))  # xi of Eq. 9
        correct = top_class == y
        hinge = torch.relu(self.gamma - gap) * correct
        return MacerTerms(classification, sigma / 2 * hinge, logits[0])

    def loss(self, net, X, y, sigma):
        terms = self.terms(net, X, y, sigma)
        lbd = self.lbd if self.deferred_epochs == 0 or running_epoch(net) >= self.deferred_epochs else 0.0
        return (terms.classification + lbd * terms.radius).mean(), terms.logits
