"""Small reference architectures. Each takes ``n_classes``, which the estimator fills in."""

import torch
from torch import nn

__all__ = ["DigitsCNN", "FlatMLP", "LeNet", "CifarResNet"]


class DigitsCNN(nn.Module):
    """A small CNN for the 8x8 digits, (n, 1, 8, 8) -> logits (n, n_classes).

    Parameters
    ----------
    n_classes : int, default=10
    width : int, default=16
        Channels of the first convolution (the second has twice as many).

    Examples
    --------
    >>> DigitsCNN()(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    """

    def __init__(self, n_classes=10, width=16):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            # Pooling before the ReLU: the same values (max and ReLU commute) on a quarter of them.
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
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

    Examples
    --------
    >>> FlatMLP(n_classes=3)(torch.zeros(4, 5)).shape
    torch.Size([4, 3])
    """

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

    Examples
    --------
    >>> LeNet()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(self, n_classes=10):
        super().__init__()
        self.layers = nn.Sequential(
            # Each pooling before its ReLU: the same values (max and ReLU commute) on a quarter of them,
            # and the same parameter names as the classic order (pooling and ReLU have none).
            nn.Conv2d(1, 6, 5, padding=2), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(6, 16, 5), nn.MaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, n_classes),
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

    Examples
    --------
    >>> CifarResNet(blocks=1)(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

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
