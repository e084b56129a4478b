"""Small reference architectures, the normalisation layer that puts a network in your data's units, and the
max pooling they use.

Each architecture takes ``n_classes``, which the estimator fills in.
"""

import functools
import inspect
from numbers import Integral, Real

import numpy as np
import torch
from torch import nn

from ._messages import quoted
from .experts import takes_noise_level

__all__ = ["DigitsCNN", "FlatMLP", "LeNet", "CaffeLeNet", "CifarResNet", "Normalize", "Normalized", "TiledMaxPool2d"]


class TiledMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d(kernel_size)`` (windows of k x k at stride k), computed faster in inference mode.

    In ``torch.inference_mode()``, where smoothsk's engine runs every noisy
    forward pass, each window's maximum is taken as elementwise maxima of
    ``k`` strided views along the rows, then along the columns. Torch's CPU
    pooling kernel, which also finds each maximum's index, took 1.6-12x as
    long on the reference networks' shapes (``docs/scaling.md``). The values
    are the same: a maximum rounds nothing, and NaN wins in both (a window of
    zeros of both signs may keep another of its zeros' signs). Elsewhere it
    is ``nn.MaxPool2d``: derivatives of either mode give a window's
    derivative to one of its tied maxima (``torch.maximum`` would split it),
    so training and attacks compute what they computed before. So does an
    input smaller than a window, or a setting of ``nn.MaxPool2d`` changed
    after construction.

    Parameters
    ----------
    kernel_size : int
        ``k`` >= 2, the side of a window and the stride; rows and columns
        beyond the last whole window are dropped, as ``nn.MaxPool2d`` drops
        them.

    Examples
    --------
    >>> TiledMaxPool2d(2)(torch.arange(16.0).view(1, 1, 4, 4))
    tensor([[[[ 5.,  7.],
              [13., 15.]]]])
    """

    def __init__(self, kernel_size):
        if not isinstance(kernel_size, Integral) or isinstance(kernel_size, bool) or kernel_size < 2:
            raise ValueError(f"kernel_size must be an int >= 2 (the side of a window and the stride); "
                             f"got {quoted(kernel_size)}.")
        super().__init__(int(kernel_size))

    def forward(self, x):
        """Pool ``x`` of shape (..., H, W) to (..., H // k, W // k), in ``x``'s memory layout."""
        k = self.kernel_size
        settings = (self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices)
        # Outside inference mode a derivative may be taken, forward-mode ones even under no_grad; other
        # settings, and an input smaller than a window, are nn.MaxPool2d's to pool or to refuse.
        if not (torch.is_inference_mode_enabled() and settings == (k, 0, 1, False, False) and min(x.shape[-2:]) >= k):
            return super().forward(x)
        x = x[..., :x.shape[-2] // k * k, :x.shape[-1] // k * k]
        rows = functools.reduce(torch.maximum, (x[..., offset::k, :] for offset in range(k)))
        return functools.reduce(torch.maximum, (rows[..., offset::k] for offset in range(k)))


class DigitsCNN(nn.Module):
    """A small CNN for the 8x8 digits, (n, 1, 8, 8) -> logits (n, n_classes).

    Parameters
    ----------
    n_classes : int, default=10
    width : int, default=16
        Channels of the first convolution (the second has twice as many).

    Attributes
    ----------
    input_shape : tuple of int
        The shape of one input it is made for.

    Examples
    --------
    >>> DigitsCNN()(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    """

    input_shape = (1, 8, 8)

    def __init__(self, n_classes=10, width=16):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            # Pooling before the ReLU: the same values (max and ReLU commute) on a quarter of them.
            nn.Conv2d(width, 2 * width, 3, padding=1), TiledMaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(2 * width * 16, 128), nn.ReLU(),
            nn.Linear(128, n_classes),
        )

    def forward(self, x):
        return self.layers(x)


class FlatMLP(nn.Module):
    """An MLP on flattened inputs of any size (its first layer is lazy).

    Parameters
    ----------
    n_classes : int, default=2
    hidden : int, default=64

    Attributes
    ----------
    input_shape : tuple of int or None
        The shape of one input it is made for: None, any shape (its first
        layer takes its size from the first batch).

    Examples
    --------
    >>> FlatMLP(n_classes=3)(torch.zeros(4, 5)).shape
    torch.Size([4, 3])
    """

    input_shape = None

    def __init__(self, n_classes=2, hidden=64):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.LazyLinear(hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, x):
        return self.layers(x)


class LeNet(nn.Module):
    """LeNet-5 style CNN for 28x28 single-channel images (MNIST).

    Parameters
    ----------
    n_classes : int, default=10

    Attributes
    ----------
    input_shape : tuple of int
        The shape of one input it is made for.

    Examples
    --------
    >>> LeNet()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    input_shape = (1, 28, 28)

    def __init__(self, n_classes=10):
        super().__init__()
        self.layers = nn.Sequential(
            # Each pooling before its ReLU: the same values (max and ReLU commute) on a quarter of them,
            # and the same parameter names as the classic order (pooling and ReLU have none).
            nn.Conv2d(1, 6, 5, padding=2), TiledMaxPool2d(2), nn.ReLU(),
            nn.Conv2d(6, 16, 5), TiledMaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, n_classes),
        )

    def forward(self, x):
        return self.layers(x)


class CaffeLeNet(nn.Module):
    """The LeNet of the published MNIST smoothing tables, (n, 1, 28, 28) -> logits (n, n_classes).

    Caffe's MNIST LeNet: two 5x5 convolutions of 20 and 50 channels without
    padding, each followed by 2x2 max pooling, then a dense layer of 500
    units (431,080 parameters at 10 classes, seven times :class:`LeNet`'s
    61,706, and 5.5 times its multiply-adds per image). It is the
    "lenet" of the code released with Jeong and Shin (2020), whose MNIST logs
    the published figures of ``benchmarks/bench_mnist.py`` come from; it
    reads pixels in [0, 1], with no normalisation layer.

    Parameters
    ----------
    n_classes : int, default=10

    Attributes
    ----------
    input_shape : tuple of int
        The shape of one input it is made for.

    Examples
    --------
    >>> CaffeLeNet()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    input_shape = (1, 28, 28)

    def __init__(self, n_classes=10):
        super().__init__()
        self.layers = nn.Sequential(
            # Each pooling before its ReLU, as in LeNet: the same values on a quarter of them.
            nn.Conv2d(1, 20, 5), TiledMaxPool2d(2), nn.ReLU(),
            nn.Conv2d(20, 50, 5), TiledMaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(50 * 4 * 4, 500), nn.ReLU(),
            nn.Linear(500, n_classes),
        )

    def forward(self, x):
        return self.layers(x)


class _BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1) shortcut."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6 * blocks + 2) for 32x32 RGB images (He et al. 2016's CIFAR design; 110 layers in Cohen et al.).

    The CIFAR-10 channel normalisation is inside the module, so noise is added
    in [0, 1] pixel space as in the smoothing papers.

    Parameters
    ----------
    n_classes : int, default=10
    blocks : int, default=3
        Residual blocks per stage (3 gives ResNet-20, 18 gives ResNet-110).
    width : int, default=16
        Channels of the first stage (doubled at each of the next two).

    Attributes
    ----------
    input_shape : tuple of int
        The shape of one input it is made for.

    Examples
    --------
    >>> CifarResNet(blocks=1)(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    input_shape = (3, 32, 32)

    def __init__(self, n_classes=10, blocks=3, width=16):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1))
        layers = [nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        channels = width
        for stage in range(3):
            out_channels = width * 2 ** stage
            for block in range(blocks):
                layers.append(_BasicBlock(channels, out_channels, 2 if stage and not block else 1))
                channels = out_channels
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, n_classes)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers((x - self.mean) / self.std)


def _statistics(mean, std):
    """``mean`` and ``std`` as float64 arrays of one value per channel, checked (one-line ValueErrors)."""
    values = {}
    for name, value in (("mean", mean), ("std", std)):
        items = np.atleast_1d(np.asarray(value, dtype=object))
        if items.ndim != 1 or not all(isinstance(item, Real) and not isinstance(item, bool) for item in items):
            raise ValueError(f"Normalize: {name} must be a number or a sequence of numbers, one per channel; "
                             f"got {value!r}.")
        if len(items) == 0:
            raise ValueError(f"Normalize: {name} must hold at least one value (one per channel, or one for all).")
        values[name] = items.astype(np.float64)
    mean, std = values["mean"], values["std"]
    if len(mean) != len(std):
        raise ValueError(f"Normalize: mean and std must have one value per channel, as many each: {len(mean)} "
                         f"means, {len(std)} stds.")
    if not np.all(np.isfinite(mean)):
        raise ValueError(f"Normalize: mean must be finite; got {mean.tolist()}.")
    if not np.all((std > 0) & np.isfinite(std)):
        raise ValueError(f"Normalize: std must be > 0 for every channel and finite; got {std.tolist()}.")
    return mean, std


class Normalize(nn.Module):
    """x -> (x - mean) / std per channel: the first layer of Cohen et al.'s models.

    Inside the module, it keeps noise, sigma and certified radii in the
    units of the data the estimator is given (pixels in [0, 1], say): the
    noise is added to ``x`` before this layer, so a radius certified around
    ``x`` is a distance between such inputs. Normalising the data before
    the estimator instead certifies radii in normalised units (see the user
    guide, "sigma and the radius are in the units of X").

    Parameters
    ----------
    mean : float or sequence of float, length C
        Per-channel means (dimension 1 of the input: the channels of an
        image batch ``(n, C, H, W)``, the features of a flat batch
        ``(n, C)``); one value applies to every channel.
    std : float or sequence of float, length C
        Per-channel standard deviations, each finite and > 0.

    Attributes
    ----------
    mean, std : torch.Tensor of float32, shape (C,)
        Persistent buffers: they are part of ``state_dict``, and so of a
        saved model file.

    Raises
    ------
    ValueError
        One line naming the parameter: values that are not numbers, none,
        a non-finite mean, a std that is not finite and > 0, or lengths that
        differ.

    Examples
    --------
    >>> layer = Normalize((0.5, 0.25), (0.5, 0.25))
    >>> layer(torch.tensor([[1.0, 0.25]]))
    tensor([[1., 0.]])
    """

    def __init__(self, mean, std):
        super().__init__()
        mean, std = _statistics(mean, std)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, x):
        """The normalised inputs.

        Parameters
        ----------
        x : torch.Tensor, shape (batch, C, ...)

        Returns
        -------
        torch.Tensor, shape (batch, C, ...)

        Raises
        ------
        ValueError
            If ``x`` has another number of channels than the statistics
            (except one value for all), which broadcasting would otherwise
            turn into C channels without a word.
        """
        channels = self.mean.shape[0]
        if channels != 1 and (x.ndim < 2 or x.shape[1] != channels):
            raise ValueError(f"Normalize has statistics for {channels} channels (mean, std), but its input has "
                             f"{x.shape[1] if x.ndim >= 2 else 'no'} (shape {tuple(x.shape)}): the channels are "
                             "dimension 1 of (batch, C, ...).")
        shape = (1, channels) + (1,) * max(0, x.ndim - 2)
        return (x - self.mean.view(shape)) / self.std.view(shape)

    def constructor_params(self):
        """The statistics this layer was built with.

        Returns
        -------
        dict
            ``{"mean": tuple of float, "std": tuple of float}``.
        """
        return {"mean": tuple(self.mean.tolist()), "std": tuple(self.std.tolist())}

    def extra_repr(self):
        return f"mean={list(self.constructor_params()['mean'])}, std={list(self.constructor_params()['std'])}"


class Normalized(nn.Module):
    """A classifier that normalises its inputs first: ``net(Normalize(mean, std)(x))``.

    The module to give the estimator for a network trained on normalised
    inputs (Cohen et al.'s ImageNet and CIFAR-10 models): noise is added to
    ``x``, before the normalisation, so sigma and the certified radii are in
    the units of the estimator's ``X``. A model file records it as its class
    with :meth:`constructor_params` (the network's class and the statistics)
    and loads it without a module argument, unlike
    ``torch.nn.Sequential(Normalize(...), net)``, which a file records as an
    instance that ``load`` must be given again.

    Parameters
    ----------
    net : torch.nn.Module instance or class
        The network, returning (batch, n_classes) logits. An instance is used
        as it is (never copied); a class is built with ``n_classes`` when it
        takes it, else with no arguments. A module that takes the noise
        level (:class:`~smoothsk.experts.NoiseLevelExperts`) is refused: put
        the normalisation inside each expert.
    mean, std : float or sequence of float
        The statistics of :class:`Normalize`.
    n_classes : int or None, default=None
        Passed to a class ``net`` that takes it (the estimator fills it in).

    Attributes
    ----------
    normalize : Normalize
    net : torch.nn.Module

    Notes
    -----
    Saving rebuilds the module from its constructor parameters, as loading
    will, and refuses one whose network its class does not build so (a
    ``FlatMLP(hidden=32)``, whose class builds ``hidden=64``): give such a
    network as a class whose ``__init__`` takes only ``n_classes``, or pass
    the module to ``load`` again.

    Examples
    --------
    >>> model = Normalized(LeNet, mean=0.1307, std=0.3081, n_classes=10)
    >>> model(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    >>> from smoothsk import SampleWiseSmoothedClassifier
    >>> clf = SampleWiseSmoothedClassifier(Normalized, module__net=LeNet, module__mean=(0.1307,),
    ...                                    module__std=(0.3081,))
    """

    def __init__(self, net, mean, std, n_classes=None):
        super().__init__()
        self.normalize = Normalize(mean, std)
        if isinstance(net, type) and issubclass(net, nn.Module):
            takes_classes = n_classes is not None and "n_classes" in inspect.signature(net).parameters
            net = net(n_classes=n_classes) if takes_classes else net()
        elif not isinstance(net, nn.Module):
            raise TypeError(f"Normalized: net must be a torch.nn.Module instance or class; got {net!r}.")
        if takes_noise_level(net):
            raise ValueError(f"Normalized: the {type(net).__name__} takes the noise level (module(x, sigma)); "
                             "put the normalisation inside each of its experts instead.")
        self.net = net
        # The statistics go where the network is (a network on a GPU stays there).
        state = next(iter(net.state_dict().values()), None)
        if state is not None and not state.is_meta:
            self.normalize.to(state.device)

    def forward(self, x):
        return self.net(self.normalize(x))

    def constructor_params(self):
        """What a model file records to rebuild this module: the network's class and the statistics.

        Returns
        -------
        dict
            ``{"net": type, "mean": tuple of float, "std": tuple of float}``.
        """
        return {"net": type(self.net), **self.normalize.constructor_params()}
