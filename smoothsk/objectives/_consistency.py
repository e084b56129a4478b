"""Consistency regularization of the noisy copies' predictions (Jeong and Shin, NeurIPS 2020)."""

from numbers import Real

import torch.nn.functional as F

from .._constraints import HasMethods, Interval
from ._base import BaseObjective, GaussianNoise

#: Probabilities are clamped to this before their logarithm in the entropy (as the authors' code does).
_LOG_FLOOR = 1e-20


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
    "default" loss (the one of all their tables) is this one.

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
        p_bar = log_p.exp().mean(dim=0)
        # KL(p_bar || p_k) per copy and input, then the mean over the copies (Eq. 6).
        kl = F.kl_div(log_p, p_bar.expand_as(log_p), reduction="none").sum(dim=2).mean(dim=0)
        entropy = -(p_bar * p_bar.clamp_min(_LOG_FLOOR).log()).sum(dim=1)
        return cross_entropy + (self.lbd * kl + self.eta * entropy).mean(), logits[:len(X)]
