"""Pretrained: fit trains nothing; a trained module is smoothed and certified as it is."""

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._constraints import InvalidParameterError
from smoothsk.experts import NoiseLevelExperts
from smoothsk.sampling import FixedSampler
from smoothsk.training import Pretrained

from conftest import LinearLogits
from training_support import assert_bit_identical, snapshot


def linear_data(n_samples=40):
    """Inputs of 2 features and the labels of ``LinearLogits()`` (class 1 where ``x0 > x1``).

    Returns
    -------
    X : ndarray of float32, shape (n_samples, 2)
    y : ndarray of int64, shape (n_samples,)
    """
    X = np.random.default_rng(0).normal(size=(n_samples, 2)).astype(np.float32)
    return X, (X[:, 0] > X[:, 1]).astype(np.int64)


class TrainedLinear(torch.nn.Module):
    """A linear layer with fixed weights and a batch-norm layer (its buffers change on a forward in training mode).

    Parameters
    ----------
    n_classes : int
    """

    def __init__(self, n_classes=2):
        super().__init__()
        torch.manual_seed(3)
        self.norm = torch.nn.BatchNorm1d(2)
        self.linear = torch.nn.Linear(2, n_classes)
        with torch.no_grad():
            self.norm.running_mean.fill_(0.5)
            self.norm.running_var.fill_(2.0)

    def forward(self, x):
        return self.linear(self.norm(x))


class RecordingConstruction(torch.nn.Module):
    """A module class that counts how often it is built (``constructions``)."""

    constructions = 0

    def __init__(self, n_classes=2):
        super().__init__()
        type(self).constructions += 1
        self.linear = torch.nn.Linear(2, n_classes)

    def forward(self, x):
        return self.linear(x)


def pretrained_classifier(module, **params):
    """An estimator with ``training=Pretrained()`` around ``module``; ``params`` override the defaults."""
    params = {"training": Pretrained(), "max_epochs": 4, "lr": 0.5, "sampler": FixedSampler(n=100, n0=10),
              "random_state": 0, **params}
    return SampleWiseSmoothedClassifier(module, **params)


class TestPretrained:
    def test_fit_runs_no_epoch_and_leaves_every_weight_and_buffer_as_it_was(self):
        module = TrainedLinear().train()  # in training mode: a forward pass there would move its statistics
        saved = snapshot(module)
        X, y = linear_data()
        clf = pretrained_classifier(module).fit(X, y)
        clf.partial_fit(X, y)
        clf.certify(X[:5])
        clf.predict_proba(X[:5])
        assert len(clf.history) == 0
        assert_bit_identical(module, saved)
        assert_bit_identical(clf.module_, saved)

    def test_certificates_are_at_the_given_sigma(self):
        X, y = linear_data()
        clf = pretrained_classifier(LinearLogits(), training=Pretrained(sigma=0.5)).fit(X, y)
        _, _, details = clf.certify(X[:8], return_details=True)
        np.testing.assert_array_equal(details.sigma, 0.5)

    def test_the_smoothed_classifier_is_the_given_module_s(self):
        # LinearLogits smoothed is itself: away from its boundary, predict returns its class.
        X, y = linear_data(200)
        far = np.abs(X[:, 0] - X[:, 1]) / np.sqrt(2) > 1.0
        clf = pretrained_classifier(LinearLogits(), sampler=FixedSampler(n=200, n0=20)).fit(X, y)
        np.testing.assert_array_equal(clf.predict(X[far]), y[far])

    def test_classes_come_from_y_or_partial_fit_s_classes(self):
        X, y = linear_data()
        assert pretrained_classifier(LinearLogits()).fit(X, y * 2 + 3).classes_.tolist() == [3, 5]
        clf = pretrained_classifier(RecordingConstruction(n_classes=3)).partial_fit(X, y, classes=[0, 1, 2])
        assert clf.classes_.tolist() == [0, 1, 2]

    def test_a_module_of_another_width_than_the_classes_is_refused(self):
        X, y = linear_data()
        with pytest.raises(ValueError, match=r"logits of shape \(1, 2\)"):
            pretrained_classifier(RecordingConstruction(n_classes=3)).fit(X, y)

    @pytest.mark.parametrize("module, module_params", [
        (RecordingConstruction, {}),
        (NoiseLevelExperts, {"module__levels": (0.25,), "module__experts": (RecordingConstruction,)}),
    ], ids=["a class", "experts class"])
    def test_a_module_class_is_refused_at_fit_before_anything_is_built(self, module, module_params):
        RecordingConstruction.constructions = 0
        X, y = linear_data()
        clf = pretrained_classifier(module, **module_params)
        with pytest.raises(ValueError, match=r"training=Pretrained\(\).*trained torch.nn.Module instance"):
            clf.fit(X, y)
        assert RecordingConstruction.constructions == 0
        assert not hasattr(clf, "module_")

    def test_invalid_sigma_is_refused(self):
        with pytest.raises(InvalidParameterError, match="'sigma' parameter of Pretrained"):
            Pretrained(sigma=0.0).validate()
