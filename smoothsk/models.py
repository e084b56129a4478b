"""Small reference architectures. Each takes ``n_classes``, which the estimator fills in."""

import torch
from torch import nn

__all__ = ["DigitsCNN", "FlatMLP", "LeNet"]


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
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
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
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, n_classes),
        )

    def forward(self, x):
        return self.layers(x)
