"""What the tests of the training schedules and objectives share: a small digits estimator, recorders, snapshots."""

from functools import cache

import torch
from skorch.callbacks import Callback
from torch import nn

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_digits_images
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler


@cache
def training_digits():
    """The first 300 digits: X float32 (300, 1, 8, 8), y int64 (300,). Do not mutate."""
    X, y = load_digits_images()
    return X[:300], y[:300]


def digits_net(X, y, training=None, max_epochs=0, module=FlatMLP, **params):
    """A small MLP estimator on the digits; ``max_epochs=0`` only initialises it."""
    net = SampleWiseSmoothedClassifier(
        module, module__hidden=32, training=training, max_epochs=max_epochs, lr=0.1,
        optimizer__momentum=0.9, batch_size=50, sampler=FixedSampler(n=200, n0=20), random_state=0, **params)
    return net.fit(X, y)


class StopAfter(Callback):
    """Interrupts training at the end of epoch ``epochs`` of the history (as skorch's EarlyStopping)."""

    def __init__(self, epochs):
        self.epochs = epochs

    def on_epoch_end(self, net, **kwargs):
        if len(net.history) == self.epochs:
            raise KeyboardInterrupt


class SigmaRecorder(Callback):
    """Copies ``net.train_sigmas_`` and the stage at the end of every epoch."""

    def initialize(self):
        self.sigmas, self.stages = [], []
        return self

    def on_epoch_end(self, net, **kwargs):
        self.sigmas.append(net.train_sigmas_.copy())
        self.stages.append(net.history[-1, "training_stage"])


class ObjectiveRecorder(Callback):
    """Keeps the objective the schedule's run uses at every training batch (the objects, kept alive)."""

    def initialize(self):
        self.objectives = []
        return self

    def on_batch_begin(self, net, batch=None, training=None, **kwargs):
        if training:
            self.objectives.append(net.training_.objective_)


class ModeRecorder(nn.Module):
    """An MLP that records whether it was in training mode at each forward pass."""

    def __init__(self, n_classes=10, hidden=32):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
        self.modes = []

    def forward(self, x):
        self.modes.append(self.training)
        return self.layers(x)


def snapshot(module):
    """A copy of every tensor of ``module``'s state_dict (parameters and buffers).

    Parameters
    ----------
    module : torch.nn.Module

    Returns
    -------
    dict of str to torch.Tensor
    """
    return {key: value.detach().clone() for key, value in module.state_dict().items()}


def assert_bit_identical(module, saved):
    """Assert that every state_dict tensor of ``module`` equals the ``saved`` one exactly (dtype and values).

    Parameters
    ----------
    module : torch.nn.Module
    saved : dict of str to torch.Tensor
        A :func:`snapshot`.
    """
    state = module.state_dict()
    assert state.keys() == saved.keys()
    for key, value in state.items():
        assert value.dtype == saved[key].dtype and torch.equal(value, saved[key]), key
