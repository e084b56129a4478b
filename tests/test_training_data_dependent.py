"""DDRS training: per-batch sigma ascent, warm-started across epochs and fit calls."""

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.models import FlatMLP
from smoothsk.training import DataDependentTraining

from training_support import SigmaRecorder, digits_net, training_digits


def test_data_dependent_sigmas_warm_start():
    X, y = training_digits()
    recorder = SigmaRecorder()
    schedule = DataDependentTraining(sigma_init=0.3, steps=1, lr=0.01, warmup_epochs=10)
    net = digits_net(X, y, training=schedule, max_epochs=13, callbacks=[recorder])
    sigmas = np.array(recorder.sigmas)
    assert recorder.stages == ["warmup"] * 10 + ["data_dependent"] * 3
    assert np.all(sigmas[:10] == 0.3)
    # For a confidently classified sample both probabilities sit at DDRS's clamps
    # (0.98, 0.02), so each gradient step adds exactly lr * (PhiInv(0.98) - PhiInv(0.02)) / 2:
    # after k epochs it is k steps from sigma_init only if every epoch starts where the last ended.
    step = 0.01 * (stats.norm.ppf(0.98) - stats.norm.ppf(0.02)) / 2
    assert np.mean(np.abs(sigmas[-1] - (0.3 + 3 * step)) < 1e-5) > 0.1
    net.set_params(max_epochs=1)
    net.partial_fit(X, y)  # continues from the stored sigmas
    assert np.mean(np.abs(net.train_sigmas_ - (0.3 + 4 * step)) < 1e-5) > 0.05
    assert net.history[-1, "sigma_time"] > 0 and net.history[0, "sigma_time"] == 0


def test_data_dependent_batch_sigma_starts_from_stored():
    X, y = training_digits()
    schedule = DataDependentTraining(sigma_init=0.3, steps=2, lr=1e-3, warmup_epochs=0)
    net = digits_net(X, y, training=schedule, max_epochs=1)
    stored = np.where(np.arange(len(X)) % 2 == 0, 0.8, 0.1)
    net.train_sigmas_ = stored.copy()
    index = torch.arange(40, 60)
    net.module_.train()
    run = net.training_  # the clone that trained the net holds the run's stage and search
    sigma = run.batch_sigma(net, torch.from_numpy(X[40:60]), torch.as_tensor(y[40:60]), index)
    assert torch.all(torch.abs(sigma.double() - torch.from_numpy(stored[40:60])) < 0.05)
    assert np.all(net.train_sigmas_[40:60] != stored[40:60])  # optimised and stored back
    np.testing.assert_allclose(net.train_sigmas_[40:60], sigma.double().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(net.train_sigmas_[:40], stored[:40])
    assert net.module_.training
    # Validation batches (module in eval mode) use the stored sigmas as they are.
    net.module_.eval()
    sigma = run.batch_sigma(net, torch.from_numpy(X[:20]), torch.as_tensor(y[:20]), torch.arange(20))
    np.testing.assert_array_equal(sigma.double().numpy(), stored[:20].astype(np.float32))


def test_sigmas_stay_where_the_schedule_bounds_allow():
    # A step of lr=1e-9 barely moves a sigma: nothing but a bound can lift sigma_init=0.001.
    X, y = training_digits()
    schedule = DataDependentTraining(sigma_init=0.001, steps=1, lr=1e-9, warmup_epochs=0, sigma_min=1e-4)
    net = digits_net(X[:100], y[:100], training=schedule, max_epochs=1)
    np.testing.assert_allclose(net.train_sigmas_, 0.001, atol=1e-6)
    assert net.training_.default_sigma_search().sigma_min == 1e-4


@pytest.mark.parametrize("params, message", [
    ({"sigma_init": 0.001}, r"sigma_init=0\.001 must lie in \[sigma_min, sigma_max\] = \[0\.01, None\]"),
    ({"sigma_init": 0.5, "sigma_max": 0.4}, r"sigma_init=0\.5 must lie in \[sigma_min, sigma_max\] = \[0\.01, 0\.4\]"),
    ({"sigma_init": 0.3, "sigma_min": 0.5, "sigma_max": 0.2}, r"sigma_max must be >= sigma_min; got 0\.2 and 0\.5"),
])
def test_sigma_init_outside_the_bounds_refused_before_training(params, message):
    X, y = training_digits()
    net = SampleWiseSmoothedClassifier(FlatMLP, training=DataDependentTraining(**params))
    with pytest.raises(ValueError, match=message):
        net.fit(X[:50], y[:50])
    assert not net.initialized_
