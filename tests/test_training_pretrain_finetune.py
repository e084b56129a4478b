"""PFAT's pretrain-to-finetune schedule: uniform sigmas, assignment, finetuning and its resume."""

import numpy as np
import pytest
from scipy import stats

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.models import FlatMLP
from smoothsk.sigma import CertifiedSigmaSelector, FixedSigma, GridSigmaSearch, SemiElasticSigma
from smoothsk.training import GaussianNoise, PretrainFinetune

from training_support import SigmaRecorder, digits_net, training_digits


def test_pretrain_finetune_sigmas():
    X, y = training_digits()
    recorder = SigmaRecorder()
    schedule = PretrainFinetune(sigma_min=0.12, sigma_max=0.5, pretrain_epochs=3, finetune_epochs=2,
                                finetune_lr=0.01, objective=GaussianNoise())
    net = digits_net(X, y, training=schedule, callbacks=[recorder])
    assert recorder.stages == ["pretrain"] * 3 + ["finetune"] * 2
    pretrain = np.array(recorder.sigmas[:3])
    assert np.all((pretrain >= 0.12) & (pretrain <= 0.5))
    assert np.all(pretrain[1:] != pretrain[:-1])  # redrawn every epoch
    # Uniform: Kolmogorov-Smirnov test at level 0.001 (fails wrongly with probability 0.001).
    assert stats.kstest(pretrain.ravel(), stats.uniform(0.12, 0.38).cdf).pvalue > 0.001
    # Assigned on PFAT's grid 0.15, 0.20, ..., 0.50 and fixed while finetuning.
    grid = GridSigmaSearch(0.12, 0.5, 0.05).grid_sigmas()
    assert np.all(np.isin(net.train_sigmas_, grid))
    assert len(np.unique(net.train_sigmas_)) > 1
    np.testing.assert_array_equal(recorder.sigmas[3], net.train_sigmas_)
    np.testing.assert_array_equal(recorder.sigmas[4], net.train_sigmas_)
    assert net.optimizer_.param_groups[0]["lr"] == 0.01 and net.lr == 0.1
    assert net.history[3, "sigma_time"] > 0 and net.history[4, "sigma_time"] == 0
    search = schedule.default_sigma_search()
    assert (search.sigma_min, search.sigma_max, search.step) == (0.12, 0.5, 0.05)


def test_pretrain_finetune_partial_fit_resumes_finetuning():
    X, y = training_digits()
    schedule = PretrainFinetune(pretrain_epochs=2, finetune_epochs=1, objective=GaussianNoise(),
                                assignment=GridSigmaSearch(0.12, 0.5, 0.05, n=50))
    net = digits_net(X, y, training=schedule)
    assigned = net.train_sigmas_.copy()
    net.partial_fit(X, y)
    assert list(net.history[:, "training_stage"]) == ["pretrain"] * 2 + ["finetune"] * 2
    np.testing.assert_array_equal(net.train_sigmas_, assigned)


def test_partial_fit_follows_changed_schedule_parameters():
    """Each fit call runs a clone of the current ``training``: parameters set in between take effect."""
    X, y = training_digits()
    schedule = PretrainFinetune(pretrain_epochs=1, finetune_epochs=1, objective=GaussianNoise(),
                                assignment=GridSigmaSearch(0.12, 0.5, 0.05, n=50))
    net = digits_net(X[:100], y[:100], training=schedule)
    first_run = net.training_
    net.set_params(training__finetune_epochs=3)
    net.partial_fit(X[:100], y[:100])  # the finetuning is now unfinished: 2 epochs complete it
    assert list(net.history[:, "training_stage"]) == ["pretrain"] + ["finetune"] * 3
    assert net.training_ is not first_run and net.training_.finetune_epochs == 3
    assert schedule.finetune_epochs == 1 and net.training is not schedule  # set_params replaced it by a clone


@pytest.mark.parametrize("params, message", [
    ({"sigma_min": 0.01, "sigma_max": 0.04},
     r"default assignment.*multiples of 0\.05.*\[0\.01, 0\.04\].*pass assignment="),
    ({"assignment": CertifiedSigmaSelector(levels=[0.25, 0.5])}, r"assignment=CertifiedSigmaSelector.*fit_sigma"),
    ({"assignment": SemiElasticSigma(base_sigma=0.25, r=0.1, k=1)}, r"assignment=SemiElasticSigma.*fit_sigma"),
], ids=["empty default grid", "selector", "semi-elastic"])
def test_assignment_refused_before_any_training(params, message):
    # The search that assigns the finetuning sigmas would only run after the pretraining epochs.
    X, y = training_digits()
    schedule = PretrainFinetune(pretrain_epochs=1, finetune_epochs=1, objective=GaussianNoise(), **params)
    net = SampleWiseSmoothedClassifier(FlatMLP, training=schedule, sigma_search=FixedSigma(0.25))
    with pytest.raises(ValueError, match=message):
        net.fit(X[:50], y[:50])
    assert not net.initialized_
