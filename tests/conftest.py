"""Shared fixtures: fixed seeds, the digits, a small trained estimator, closed-form models.

The closed-form models are written here once and imported by the test modules
(``from conftest import LinearLogits``).
"""

import random

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_digits_images
from smoothsk.engine import MonteCarloEngine
from smoothsk.experts import NoiseLevelExperts
from smoothsk.models import DigitsCNN, FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import CertifiedSigmaSelector, FixedSigma
from smoothsk.training import FixedSigmaTraining, Pretrained


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="device of tests/test_device.py: cpu (the engine's accelerator path on the CPU, the "
                          "default) or a CUDA device such as cuda (run by benchmarks/gpu_check.sh)")


@pytest.fixture(autouse=True)
def _fixed_seeds():
    """Every test starts from the same global random state."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def digits():
    """The bundled digits: X float32 (1797, 1, 8, 8) in [0, 1], y int64 (1797,)."""
    return load_digits_images()


@pytest.fixture(scope="session")
def digits_split(digits):
    """A small train/test split of the digits: (X_train (600, ...), y_train, X_test (100, ...), y_test)."""
    X, y = digits
    return X[:600], y[:600], X[1000:1100], y[1000:1100]


@pytest.fixture(scope="session")
def fitted_digits_cnn(digits_split):
    """A DigitsCNN estimator trained once per session at sigma 0.25 (do not mutate: clone or copy it)."""
    X_train, y_train, _, _ = digits_split
    clf = SampleWiseSmoothedClassifier(
        DigitsCNN, module__width=8, training=FixedSigmaTraining(0.25), sampler=FixedSampler(n=200, n0=20),
        max_epochs=8, lr=0.05, optimizer__momentum=0.9, batch_size=32, certify_batch_size=256, random_state=0)
    return clf.fit(X_train, y_train)


def untrained_experts(selector_epochs=1, **params):
    """Three untrained FlatMLP experts (levels 0.25, 0.5, 1) used as they are, an unfitted selector, and data.

    ``Pretrained`` with a ``CertifiedSigmaSelector(n=200, selector_epochs=...)``;
    the experts' weights are as built, seeded. ``params`` override the
    estimator's.

    Returns
    -------
    estimator : SampleWiseSmoothedClassifier
        Not fitted.
    X : ndarray of float32, shape (60, 5)
    y : ndarray of int64, shape (60,)
    """
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    experts = [FlatMLP(n_classes=2) for _ in range(3)]
    for expert in experts:
        expert(torch.zeros(1, 5))  # trained elsewhere: its lazy layer has its shape
    clf = SampleWiseSmoothedClassifier(
        NoiseLevelExperts((0.25, 0.5, 1.0), experts), training=Pretrained(), max_epochs=0, random_state=0,
        sigma_search=CertifiedSigmaSelector(n=200, n0=20, selector_epochs=selector_epochs),
        sampler=FixedSampler(n=200, n0=20), **params)
    return clf, X, y


@pytest.fixture(scope="session")
def fitted_experts():
    """:func:`untrained_experts` with the selector fitted on its 60 inputs (do not mutate): what a round trip needs.

    Returns
    -------
    estimator : SampleWiseSmoothedClassifier
    X : ndarray of float32, shape (60, 5)
    y : ndarray of int64, shape (60,)
    """
    clf, X, y = untrained_experts()
    return clf.fit(X, y), X, y


def forbid(monkeypatch, owner, name, reason):
    """Make ``owner.name`` fail the test with ``reason`` when called: work that must not start (or run again)."""

    def called(*args, **kwargs):
        raise AssertionError(reason)

    monkeypatch.setattr(owner, name, called)


def tiny_digits_classifier(module=DigitsCNN, **params):
    """An unfitted estimator: a 4-channel DigitsCNN, 2 epochs, ``FixedSampler(n=40, n0=10)``; ``params`` override."""
    params = {"module__width": 4, "max_epochs": 2, "lr": 0.05, "optimizer__momentum": 0.9, "batch_size": 32,
              "sampler": FixedSampler(n=40, n0=10), "certify_batch_size": 200, "random_state": 0, **params}
    return SampleWiseSmoothedClassifier(module, **params)


class LinearLogits(torch.nn.Module):
    """Binary linear classifier with logits ``(-z, z)``, ``z = w . x + b`` (computed in float64).

    Its smoothed classifier at any sigma equals itself, and the exact
    certified radius of ``x`` is ``|z| / ||w||``: the distance to the boundary.

    Parameters
    ----------
    weight : sequence of float, shape (n_features,)
    bias : float
    """

    def __init__(self, weight=(1.0, -1.0), bias=0.0):
        super().__init__()
        self.register_buffer("weight", torch.as_tensor(np.asarray(weight, dtype=np.float64)))
        self.register_buffer("bias", torch.as_tensor(float(bias), dtype=torch.float64))
        # skorch's optimizer needs a parameter; it does not take part in the output.
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        z = x.flatten(1).double() @ self.weight + self.bias
        return torch.stack([-z, z], dim=1).float()


@pytest.fixture
def make_linear_classifier():
    """Factory of fitted estimators around a fixed :class:`LinearLogits` (no training).

    ``make_linear_classifier(weight, bias=0.0, sigma=0.5, n=1000, n0=100, alpha=0.05, input_shape=None, **params)``
    returns a fitted estimator with classes ``[0, 1]`` (class 1 where
    ``z > 0``) for inputs of shape ``input_shape`` (default
    ``(len(weight),)``), certifying at ``FixedSigma(sigma)`` with
    ``FixedSampler(n, n0)``; ``params`` go to the estimator and override
    these defaults (e.g. ``sampler``, ``random_state``, ``n_jobs``).
    """

    def make(weight, bias=0.0, sigma=0.5, n=1000, n0=100, alpha=0.05, input_shape=None, **params):
        weight = [float(w) for w in weight]
        params = {"training": FixedSigmaTraining(sigma), "sigma_search": FixedSigma(sigma),
                  "sampler": FixedSampler(n=n, n0=n0), "alpha": alpha, "random_state": 0,
                  "certify_batch_size": 500, **params}
        clf = SampleWiseSmoothedClassifier(LinearLogits, module__weight=weight, module__bias=float(bias),
                                           max_epochs=0, **params)
        X_fit = np.zeros((2,) + tuple(input_shape or (len(weight),)), dtype=np.float32)
        return clf.fit(X_fit, [0, 1])

    return make


#: Weight of the four-feature linear model the sigma searches are tested on (``||w|| = 1``).
SEARCH_WEIGHT = (0.5, -0.5, 0.5, 0.5)


@pytest.fixture(scope="session")
def linear_data():
    """300 inputs around the boundary of ``LinearLogits(SEARCH_WEIGHT)``, distances spread over [0, 3].

    Returns
    -------
    X : ndarray of float32, shape (300, 4)
    y : ndarray of int64, shape (300,)
        The model's class of each input (1 where ``w . x > 0``).
    distance : ndarray of float64, shape (300,)
        Distance of each input to the boundary: the exact radius of the smoothed classifier.
    """
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4)).astype(np.float32) * 1.5
    z = X.astype(np.float64) @ np.asarray(SEARCH_WEIGHT)
    return X, (z > 0).astype(np.int64), np.abs(z) / np.linalg.norm(SEARCH_WEIGHT)


def linear_engine(batch_size=1000, root_seed=0):
    """A Monte Carlo engine around ``LinearLogits(SEARCH_WEIGHT)`` (two classes)."""
    return MonteCarloEngine(LinearLogits(SEARCH_WEIGHT).eval(), 2, batch_size, root_seed=root_seed)


class StageSpy(MonteCarloEngine):
    """An engine that records the stage of every noise stream it hands out (in ``stages``, a list)."""

    stages = None

    def class_counts(self, X, sigma, n_samples, stage):
        self.stages.append(tuple(stage))
        return super().class_counts(X, sigma, n_samples, stage)

    def mean_softmax(self, X, sigma, n_samples, stage):
        self.stages.append(tuple(stage))
        return super().mean_softmax(X, sigma, n_samples, stage)

    def standard_normal(self, X, n_copies, stage):
        self.stages.append(tuple(stage))
        return super().standard_normal(X, n_copies, stage)


# --------------------------------------------------------------------------------------------
# A closed-form model whose smoothed classifier depends on sigma (for certificates about
# G(x) = g(x, sigma(x))): the slab classifier and a level selector, both exact at every sigma.

class SlabLogits(torch.nn.Module):
    """Binary classifier of one coordinate: class 1 inside the slab ``|x[axis]| < half_width``.

    Its smoothed classifier depends on sigma: under ``N(0, sigma^2 I)`` noise
    ``P(class 1 at x) = Phi((h - x_a) / sigma) - Phi((-h - x_a) / sigma)``
    (:func:`slab_probability`), so the slab's class shrinks as sigma grows and
    vanishes for ``sigma > h / PhiInv(3/4)``.

    Parameters
    ----------
    half_width : float
        ``h``, half the width of the slab.
    axis : int
        Coordinate of the flattened input that the slab is about.
    """

    def __init__(self, half_width=1.0, axis=0):
        super().__init__()
        self.half_width = float(half_width)
        self.axis = int(axis)
        self.unused = torch.nn.Parameter(torch.zeros(1))  # skorch's optimizer needs one

    def forward(self, x):
        inside = (x.flatten(1)[:, self.axis].double().abs() < self.half_width).float()
        return torch.stack([1.0 - inside, inside], dim=1)


def slab_probability(coordinate, sigma, half_width=1.0):
    """Exact probability of class 1 of :class:`SlabLogits` under Gaussian noise.

    Parameters
    ----------
    coordinate : array-like of float
        ``x[axis]`` of each input (broadcast against ``sigma``).
    sigma : array-like of float
        Noise level.
    half_width : float

    Returns
    -------
    ndarray of float
    """
    from scipy.stats import norm

    coordinate, sigma = np.asarray(coordinate, dtype=float), np.asarray(sigma, dtype=float)
    return norm.cdf((half_width - coordinate) / sigma) - norm.cdf((-half_width - coordinate) / sigma)


class LevelSelectorLogits(torch.nn.Module):
    """Selector over K noise levels from one coordinate: level k where ``x[axis]`` lies in cell k.

    Cell k is ``[thresholds[k-1], thresholds[k])`` (``-inf``/``+inf`` at the
    ends), so K = ``len(thresholds) + 1``; the logits are the one-hot cell
    index. Its smoothed version at noise ``s`` is exact
    (:func:`selector_level_probabilities`).

    Parameters
    ----------
    thresholds : sequence of float, increasing, shape (K - 1,)
    axis : int
    """

    def __init__(self, thresholds=(0.0,), axis=1):
        super().__init__()
        self.register_buffer("thresholds", torch.as_tensor(np.asarray(thresholds, dtype=np.float64)))
        self.axis = int(axis)
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        cell = torch.bucketize(x.flatten(1)[:, self.axis].double(), self.thresholds, right=True)
        return torch.nn.functional.one_hot(cell, len(self.thresholds) + 1).float()


def selector_level_probabilities(coordinate, s, thresholds):
    """Exact level probabilities of :class:`LevelSelectorLogits` under ``N(0, s^2 I)`` noise.

    Parameters
    ----------
    coordinate : array-like of float, shape (n,)
        ``x[axis]`` of each input.
    s : float
        The selector's noise level.
    thresholds : sequence of float, shape (K - 1,)

    Returns
    -------
    ndarray of float, shape (n, K)
        Row i: probability that the noisy selector picks each level.
    """
    from scipy.stats import norm

    edges = np.concatenate([[-np.inf], np.asarray(thresholds, dtype=float), [np.inf]])
    cdf = norm.cdf((edges[None, :] - np.asarray(coordinate, dtype=float)[:, None]) / s)
    return np.diff(cdf, axis=1)
