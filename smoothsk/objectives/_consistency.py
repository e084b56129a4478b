"""Consistency regularization of the noisy copies' predictions (Jeong and Shin, NeurIPS 2020)."""

import math
from numbers import Real

import torch
import torch.nn.functional as F

from .._constraints import HasMethods, Interval
from ._base import BaseObjective, GaussianNoise


class Consistency(BaseObjective):
    """Cross-entropy on noisy copies plus a penalty on their disagreement (Jeong and Shin 2020, Eq. 6).

    With ``m`` noisy copies ``x + delta_k`` of an input (``delta_k`` of its own
    sigma), ``p_k = softmax(f(x + delta_k))`` and their mean ``p_bar``, the loss
    of one input is::

        (1/m) sum_k CE(f(x + delta_k), y)  +  lbd * (1/m) sum_k KL(p_bar || p_k)  +  eta * H(p_bar)

    averaged over the batch. The KL term pulls the copies' predictions
    together, so the smoothed classifier's top-class probability, and with it
    the certified radius, grows where the base classifier is consistent under
    noise; the entropy term makes the mean prediction confident. The copies
    come from ``base``: Gaussian noise (Cohen et al.'s training) or SmoothAdv's
    noisy adversarial inputs (the paper's "SmoothAdv + Consistency"). Each
    sample's copies use its own sigma, so every schedule (fixed, PFAT,
    Insta-RS, DDRS) trains with it.

    Parameters
    ----------
    lbd : float, default=10.0
        Weight of the KL term, >= 0 (the paper's lambda: 10 for MNIST at
        sigma 0.25, 5 at 0.5 and 1.0; 10 or 20 for CIFAR-10).
    eta : float, default=0.5
        Weight of the entropy of the mean prediction, >= 0 (the paper's 0.5).
    base : GaussianNoise, SmoothAdv or None, default=None
        The noisy copies and their cross-entropy, with at least 2 copies
        (``num_noise``); None means ``GaussianNoise(num_noise=2)``, the
        paper's m = 2.

    Notes
    -----
    The KL divergence runs from the mean prediction to each copy's, and the
    gradient flows through both, as in the authors' released code; their
    "default" loss (the one of all their tables) is this one. ``log p_bar``
    is computed from the copies' log-probabilities (a log-sum-exp), so the loss
    and its gradient stay finite where a class probability underflows to 0 in
    float32; the authors' ``kl_div(log p_k, p_bar)`` has a NaN gradient there
    (their clamp at 1e-20 covers the entropy only), which made LeNet's training
    at lr 0.05 diverge on MNIST.

    References
    ----------
    Jeong and Shin, "Consistency regularization for certified robustness of
    smoothed classifiers", NeurIPS 2020.

    Examples
    --------
    >>> from smoothsk.training import SmoothAdv
    >>> Consistency(lbd=5.0, base=SmoothAdv(epsilon=1.0, steps=10, num_noise=4))
    Consistency(base=SmoothAdv(steps=10), lbd=5.0)
    """

    _parameter_constraints = {
        "lbd": [Interval(Real, 0, None, closed="left")],
        "eta": [Interval(Real, 0, None, closed="left")],
        "base": [HasMethods(["noisy_logits"]), None],
    }

    def __init__(self, lbd=10.0, eta=0.5, base=None):
        self.lbd = lbd
        self.eta = eta
        self.base = base

    def _default_component(self, name):
        return GaussianNoise(num_noise=2)

    def _check_consistency(self):
        if self._component("base").num_noise < 2:
            raise ValueError(f"Consistency needs at least 2 noisy copies per input to compare; base has "
                             f"num_noise={self._component('base').num_noise}.")

    def loss(self, net, X, y, sigma):
        logits = self._component("base").noisy_logits(net, X, y, sigma)
        copies = len(logits) // len(X)
        cross_entropy = net.criterion_(logits, y.repeat(copies))
        log_p = F.log_softmax(logits, dim=1).view(copies, len(X), -1)
        # log p_bar from the copies' logarithms: finite where a probability underflows to 0, where
        # the gradient of p_bar * log(p_bar) through p_bar.log() is -inf * 0 = NaN.
        log_p_bar = torch.logsumexp(log_p, dim=0) - math.log(copies)
        p_bar = log_p_bar.exp()
        # KL(p_bar || p_k) per copy and input, then the mean over the copies (Eq. 6).
        kl = (p_bar * (log_p_bar - log_p)).sum(dim=2).mean(dim=0)
        entropy = -(p_bar * log_p_bar).sum(dim=1)
        return cross_entropy + (self.lbd * kl + self.eta * entropy).mean(), logits[:len(X)]
