"""Training objectives: how one batch with per-sample noise levels becomes a loss."""

from abc import abstractmethod
from numbers import Integral

import torch

from .._components import Component
from .._constraints import Interval


def expand_sigma(sigma, X):
    """Reshape per-sample sigma (batch,) to broadcast against X (batch, *input_shape)."""
    return sigma.view((-1,) + (1,) * (X.dim() - 1))


def running_epoch(net):
    """The epoch being trained, from 0: one less than the epochs ``net.history`` has begun (0 before any)."""
    return max(len(net.history) - 1, 0)


def gaussian_noise(net, X, sigma, num_noise):
    """Gaussian noise for ``num_noise`` copies of each input, from the net's training generator.

    Parameters
    ----------
    net : SampleWiseSmoothedClassifier
        Supplies ``noise_generator_``.
    X : torch.Tensor, shape (batch, *input_shape)
    sigma : torch.Tensor, shape (batch,)
    num_noise : int

    Returns
    -------
    noise : torch.Tensor, shape (num_noise * batch, *input_shape)
        Row ``k * batch + i`` is noise of standard deviation ``sigma[i]``
        for copy ``k`` of input ``i``.
    """
    shape = (num_noise * len(X),) + tuple(X.shape[1:])
    noise = torch.randn(shape, generator=net.noise_generator_, device=X.device, dtype=X.dtype)
    return noise * expand_sigma(sigma.repeat(num_noise), noise)


def repeat_inputs(X, num_noise):
    """Inputs laid out as the copies of :func:`gaussian_noise`: (num_noise * batch, *input_shape)."""
    return X.repeat((num_noise,) + (1,) * (X.dim() - 1))


def gaussian_copies(net, X, sigma, num_noise):
    """``num_noise`` Gaussian noisy copies of each input: inputs plus :func:`gaussian_noise` (same parameters).

    Returns
    -------
    noisy : torch.Tensor, shape (num_noise * batch, *input_shape)
        Copy ``k * batch + i`` is ``X[i] + sigma[i] * noise``.
    """
    return repeat_inputs(X, num_noise) + gaussian_noise(net, X, sigma, num_noise)


class BaseObjective(Component):
    """Turns (inputs, labels, per-sample sigma) into a loss inside the training step."""

    @abstractmethod
    def loss(self, net, X, y, sigma):
        """Loss of one batch.

        Parameters
        ----------
        net : SampleWiseSmoothedClassifier
            The estimator being trained (``module_``, ``criterion_``,
            ``noise_generator_``).
        X : torch.Tensor, shape (batch, *input_shape)
            Clean inputs on the net's device.
        y : torch.Tensor of int64, shape (batch,)
            Class indices.
        sigma : torch.Tensor, shape (batch,)
            Noise level of each sample.

        Returns
        -------
        loss : torch.Tensor, scalar
            Differentiable loss.
        logits : torch.Tensor, shape (batch, n_classes)
            Logits on one noisy copy per sample, for skorch's callbacks.
        """


class BaseNoisyCopiesObjective(BaseObjective):
    """Cross-entropy on ``num_noise`` noisy copies of each input, whose logits :meth:`noisy_logits` gives.

    :class:`Consistency` regularises the copies' predictions of any such objective.
    """

    @abstractmethod
    def noisy_logits(self, net, X, y, sigma):
        """Logits on the noisy copies of one batch.

        Parameters
        ----------
        net, X, y, sigma
            As for :meth:`BaseObjective.loss`.

        Returns
        -------
        torch.Tensor, shape (num_noise * batch, n_classes)
            Row ``k * batch + i``: copy ``k`` of input ``i``.
        """

    def loss(self, net, X, y, sigma):
        logits = self.noisy_logits(net, X, y, sigma)
        return net.criterion_(logits, y.repeat(len(logits) // len(X))), logits[:len(X)]


class GaussianNoise(BaseNoisyCopiesObjective):
    """Cross-entropy on Gaussian noisy copies (Cohen et al. 2019 training).

    Each sample gets noise of its own sigma, so every schedule shares this
    objective whatever the source of sigma.

    Parameters
    ----------
    num_noise : int, default=1
        Noisy copies per sample per step.

    Examples
    --------
    >>> GaussianNoise(num_noise=2)
    GaussianNoise(num_noise=2)
    """

    _parameter_constraints = {"num_noise": [Interval(Integral, 1, None, closed="left")]}

    def __init__(self, num_noise=1):
        self.num_noise = num_noise

    def noisy_logits(self, net, X, y, sigma):
        return net.module_(gaussian_copies(net, X, sigma, self.num_noise))
