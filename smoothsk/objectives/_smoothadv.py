"""SmoothAdv: adversarial training of the soft smoothed classifier (Salman et al. 2019)."""

from numbers import Integral, Real

import torch

from .._constraints import Interval, StrOptions
from .._modes import evaluating
from ._base import BaseNoisyCopiesObjective, expand_sigma, gaussian_noise, repeat_inputs, running_epoch


class SmoothAdv(BaseNoisyCopiesObjective):
    """Cross-entropy on noisy copies of PGD adversarial inputs of the smoothed classifier.

    For each input ``x`` with noise level ``sigma`` the objective draws ``m``
    noise vectors ``eta_j ~ N(0, sigma^2 I)`` and runs ``steps`` steps of L2
    PGD on the soft smoothed classifier (PFAT Eq. 3, Insta-RS Eq. 6)::

        x' = argmax_{||x' - x|| <= epsilon}  -log( (1/m) sum_j softmax(f(x' + eta_j))_y )

    with the same noise vectors throughout, then returns the mean cross-entropy
    of ``f(x' + eta_j)`` over the ``m`` copies. The module is in eval mode
    during the attack (batch norm, dropout) and back in its previous mode for
    the loss. Each PGD step moves ``2 * epsilon / steps`` along the normalised
    gradient and projects back onto the ball (Salman et al.'s PGD). Inputs are
    not clipped to a box: the model's input space is not assumed bounded.

    Parameters
    ----------
    epsilon : float or "adaptive", default=1.0
        L2 radius of the attack, >= 0; "adaptive" uses ``2 * sigma`` for each
        sample (Insta-RS App. B.2).
    steps : int, default=2
        PGD steps, >= 1.
    num_noise : int, default=4
        Noise vectors ``m`` per input.
    warmup_epochs : int, default=0
        Epsilon grows linearly over the first ``warmup_epochs`` epochs of
        training: in epoch ``t`` (from 0) it is ``epsilon * min(1, (t + 1) / warmup_epochs)``
        (Salman et al.); 0 means no warm-up.

    Notes
    -----
    The defaults are PFAT's sample-wise model for ``sigma in [0.12, 0.50]``
    (App. A.2, Table 5: 4 samples, 2 steps, epsilon = 1.0).

    References
    ----------
    Salman et al., "Provably robust deep learning via adversarially trained
    smoothed classifiers", NeurIPS 2019.

    Examples
    --------
    >>> SmoothAdv(epsilon="adaptive", steps=4)
    SmoothAdv(epsilon='adaptive', steps=4)
    """

    _parameter_constraints = {
        "epsilon": [Interval(Real, 0, None, closed="left"), StrOptions({"adaptive"})],
        "steps": [Interval(Integral, 1, None, closed="left")],
        "num_noise": [Interval(Integral, 1, None, closed="left")],
        "warmup_epochs": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, epsilon=1.0, steps=2, num_noise=4, warmup_epochs=0):
        self.epsilon = epsilon
        self.steps = steps
        self.num_noise = num_noise
        self.warmup_epochs = warmup_epochs

    def attack_radius(self, net, sigma):
        """Attack radius of each sample in the current epoch.

        Parameters
        ----------
        net : SampleWiseSmoothedClassifier
            Its ``history`` gives the epoch for the warm-up.
        sigma : torch.Tensor, shape (batch,)

        Returns
        -------
        epsilon : torch.Tensor, shape (batch,)
        """
        if self.epsilon == "adaptive":
            epsilon = 2.0 * sigma
        else:
            epsilon = torch.full_like(sigma, float(self.epsilon))
        if self.warmup_epochs:
            epsilon = epsilon * min(1.0, (running_epoch(net) + 1) / self.warmup_epochs)
        return epsilon

    def attack(self, net, X, y, noise, epsilon):
        """L2 PGD on the soft smoothed classifier with fixed noise (PFAT Eq. 3).

        Parameters
        ----------
        net : SampleWiseSmoothedClassifier
        X : torch.Tensor, shape (batch, *input_shape)
            Clean inputs.
        y : torch.Tensor of int64, shape (batch,)
        noise : torch.Tensor, shape (num_noise * batch, *input_shape)
            Noise of copy ``k`` of input ``i`` in row ``k * batch + i``.
        epsilon : torch.Tensor, shape (batch,)
            Attack radius per input.

        Returns
        -------
        X_adv : torch.Tensor, shape (batch, *input_shape)
            Adversarial inputs, ``||X_adv[i] - X[i]|| <= epsilon[i]``; no graph attached.
        """
        module = net.module_
        step = expand_sigma(2.0 * epsilon / self.steps, X)
        radius = expand_sigma(epsilon, X)
        delta = torch.zeros_like(X)
        num_noise = len(noise) // len(X)
        with evaluating(module), torch.enable_grad():
            for _ in range(self.steps):
                delta.requires_grad_(True)
                logits = module(repeat_inputs(X + delta, num_noise) + noise)
                probabilities = torch.softmax(logits, dim=1).view(num_noise, len(X), -1).mean(dim=0)
                objective = -torch.log(probabilities.gather(1, y[:, None]).clamp_min(1e-12)).sum()
                (gradient,) = torch.autograd.grad(objective, delta)
                norm = expand_sigma(gradient.flatten(1).norm(dim=1), X)
                delta = delta.detach() + step * gradient / norm.clamp_min(1e-12)
                norm = expand_sigma(delta.flatten(1).norm(dim=1), X)
                delta = delta * torch.clamp(radius / norm.clamp_min(1e-12), max=1.0)
        return (X + delta).detach()

    def noisy_logits(self, net, X, y, sigma):
        noise = gaussian_noise(net, X, sigma, self.num_noise)
        epsilon = self.attack_radius(net, sigma)
        X_adv = self.attack(net, X, y, noise, epsilon) if bool((epsilon > 0).any()) else X
        return net.module_(repeat_inputs(X_adv, self.num_noise) + noise)
