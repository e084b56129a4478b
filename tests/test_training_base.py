"""What every training schedule shares: staging, resume, learning-rate switches, the history columns."""

import time

import numpy as np
import pytest
import torch
from sklearn.base import clone
from skorch.callbacks import Callback

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_digits_images
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import GridSigmaSearch, MultiStartFGSS
from smoothsk.training import (
    BaseTrainingSchedule,
    DataDependentTraining,
    FixedSigmaTraining,
    GaussianNoise,
    InstaRSTrain,
    Macer,
    PretrainFinetune,
    SmoothAdv,
    Stage,
)

from training_support import ObjectiveRecorder, StopAfter, digits_net, training_digits

#: Every schedule with its default objective, trained 2 epochs (``max_epochs``), and the stage of each epoch.
SCHEDULE_STAGES = [
    (FixedSigmaTraining(0.25), ["fixed", "fixed"]),
    (PretrainFinetune(pretrain_epochs=1, finetune_epochs=1, assignment=GridSigmaSearch(0.12, 0.5, 0.1, n=20)),
     ["pretrain", "finetune"]),
    (InstaRSTrain(update_every=1, stage1_epochs=1, stage2_epochs=1, num_noise=2), ["stage1", "stage2"]),
    (DataDependentTraining(lr=0.01, warmup_epochs=1), ["warmup", "data_dependent"]),
]


@pytest.mark.parametrize("schedule, stages", SCHEDULE_STAGES, ids=lambda value: type(value).__name__)
def test_stage_column_and_default_objective_built_once_per_stage(schedule, stages):
    """Every epoch row names its stage and its sigma time; an objective left at None is resolved once per fit."""
    X, y = training_digits()
    recorder = ObjectiveRecorder()
    net = digits_net(X[:100], y[:100], training=schedule, max_epochs=2, callbacks=[recorder])
    assert list(net.history[:, "training_stage"]) == stages
    assert all(seconds >= 0 for seconds in net.history[:, "sigma_time"])
    per_batch = np.repeat(stages, 2)  # 100 samples in batches of 50
    assert len(recorder.objectives) == len(per_batch)
    for stage in set(stages):
        used = [objective for objective, at in zip(recorder.objectives, per_batch, strict=True) if at == stage]
        assert all(objective is used[0] for objective in used)
    assert not hasattr(schedule, "objective_") and not hasattr(schedule, "stage_")


class LearningRateRecorder(Callback):
    """The live optimizer's learning rate at the start of every epoch."""

    def initialize(self):
        self.rates = []
        return self

    def on_epoch_begin(self, net, **kwargs):
        self.rates.append(net.optimizer_.param_groups[0]["lr"])


class TwoStages(BaseTrainingSchedule):
    """Stage "first" (``first_epochs``), then "second" (``second_epochs``) at learning rate 0.01, sigma 0.25.

    Each stage's ``before`` is recorded in ``entered_`` (stage, fresh); the
    one of "second" spends ``pause`` seconds choosing sigmas.
    """

    def __init__(self, first_epochs=2, second_epochs=3, pause=0.02):
        self.first_epochs = first_epochs
        self.second_epochs = second_epochs
        self.pause = pause

    def _begin(self, net, X, y):
        self.entered_ = []
        return True

    def _plan(self):
        return [Stage("first", self.first_epochs, GaussianNoise(), before=self._enter),
                Stage("second", self.second_epochs, GaussianNoise(), lr=0.01, before=self._enter_second)]

    def _enter(self, net, X, y, fresh):
        self.entered_.append(("first", fresh))

    def _enter_second(self, net, X, y, fresh):
        self.entered_.append(("second", fresh))
        with self._timing():
            time.sleep(self.pause)

    def batch_sigma(self, net, X, y, index):
        return torch.full((len(X),), 0.25, dtype=X.dtype, device=X.device)


def two_stage_net(**params):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)
    net = SampleWiseSmoothedClassifier(FlatMLP, training=TwoStages(), lr=0.1, batch_size=20,
                                       sampler=FixedSampler(n=10, n0=5), random_state=0, **params)
    return net, X, y


def test_run_trains_the_plan_with_lr_switch_and_sigma_time():
    net, X, y = two_stage_net()
    rates = LearningRateRecorder()
    net.set_params(callbacks=[rates]).fit(X, y)
    assert list(net.history[:, "training_stage"]) == ["first"] * 2 + ["second"] * 3
    assert net.training_.entered_ == [("first", True), ("second", True)]
    assert rates.rates == [0.1] * 2 + [0.01] * 3 and net.lr == 0.1
    # The search before "second" is logged in its first epoch, nothing in the others.
    seconds = net.history[:, "sigma_time"]
    assert seconds[2] >= 0.02 and seconds[:2] + seconds[3:] == [0.0] * 4
    net.fit(X, y)  # a refit (callbacks initialised again) starts the plan over at the estimator's rate
    assert len(net.history) == 5 and rates.rates == [0.1] * 2 + [0.01] * 3


@pytest.mark.parametrize("stopped, resumed, entered", [
    (1, ["first"] + ["second"] * 3, [("first", False), ("second", True)]),
    (3, ["second"] * 2, [("second", False)]),
    (5, ["second"] * 3, [("second", False)]),  # a finished plan trains its last stage again
], ids=["in first", "in second", "finished"])
def test_partial_fit_continues_the_stage_plan(stopped, resumed, entered):
    net, X, y = two_stage_net()
    net.set_params(callbacks=[StopAfter(stopped)]).fit(X, y)
    assert len(net.history) == stopped
    net.set_params(callbacks=[]).partial_fit(X, y)
    assert list(net.history[stopped:, "training_stage"]) == resumed
    assert net.training_.entered_ == entered


def test_stage_column_written_without_callbacks():
    """The stage column is resume state, not a log: written even with skorch's callbacks disabled."""
    net, X, y = two_stage_net(callbacks="disable")
    net.set_params(training__first_epochs=1, training__second_epochs=1).fit(X, y)
    assert list(net.history[:, "training_stage"]) == ["first", "second"]
    assert "sigma_time" not in net.history[-1]
    net.partial_fit(X, y)
    assert list(net.history[:, "training_stage"]) == ["first", "second", "second"]


def test_schedules_grid_searchable():
    X, y = training_digits()
    net = SampleWiseSmoothedClassifier(FlatMLP, training=InstaRSTrain(stage1_objective=SmoothAdv()))
    net = clone(net).set_params(training__update_every=3, training__stage1_objective__epsilon="adaptive")
    params = net.get_params()
    assert params["training__update_every"] == 3 and params["training__stage1_objective__epsilon"] == "adaptive"
    with pytest.raises(ValueError, match="sigma_min"):
        digits_net(X, y, training=PretrainFinetune(sigma_min=0.6, sigma_max=0.5))
    with pytest.raises(ValueError, match="num_noise"):
        digits_net(X, y, training=InstaRSTrain(stage1_objective=Macer(num_noise=0)))


@pytest.mark.parametrize("schedule", [
    PretrainFinetune(sigma_min=0.12, sigma_max=0.5, pretrain_epochs=3, finetune_epochs=2, finetune_lr=0.01,
                     objective=SmoothAdv(epsilon="adaptive", steps=1, num_noise=2),
                     assignment=GridSigmaSearch(0.12, 0.5, 0.05, n=100)),
    InstaRSTrain(max_level=4, update_every=1, num_noise=4, stage1_epochs=4, stage2_epochs=1,
                 stage1_objective=GaussianNoise(), stage2_objective=Macer(num_noise=4)),
], ids=lambda schedule: type(schedule).__name__)
def test_end_to_end_digits_per_sample_sigmas(schedule):
    X, y = load_digits_images()
    net = digits_net(X[:400], y[:400], training=schedule)
    assert net.train_sigmas_.shape == (400,) and len(np.unique(net.train_sigmas_)) > 1
    net.set_params(sigma_search=clone(schedule.default_sigma_search()).set_params(n=100))
    prediction, radius, details = net.certify(X[1500:1520], return_details=True)
    assert np.all(radius >= 0) and np.mean(prediction == y[1500:1520]) > 0.5
    assert np.all((details.sigma >= 0.12) & (details.sigma <= 1.0))


@pytest.mark.parametrize("schedule, levels, assignment_levels", [
    (FixedSigmaTraining(0.3), [0.3], None),
    (InstaRSTrain(sigma0=0.5, max_level=3), [0.5, 0.5 * np.sqrt(2), 0.5 * np.sqrt(3)], None),
    (DataDependentTraining(), None, None),
    # PFAT: its assignment's grid (by default multiples of 0.05 in [sigma_min, sigma_max], Eq. 5)...
    (PretrainFinetune(0.2, 0.35), [0.2, 0.25, 0.3, 0.35], [0.2, 0.25, 0.3, 0.35]),
    (PretrainFinetune(0.2, 0.6, assignment=GridSigmaSearch(0.2, 0.6, step=0.2)), [0.2, 0.4, 0.6], [0.2, 0.4, 0.6]),
    # ...and where the assignment is no grid search, its test-time search's grid (Eq. 7), none assigned from it.
    (PretrainFinetune(0.2, 0.35, assignment=MultiStartFGSS(sigma0=0.3, max_level=2)), [0.2, 0.25, 0.3, 0.35], None),
], ids=repr)
def test_noise_levels_are_the_grid_of_the_schedule(schedule, levels, assignment_levels):
    for name, expected in (("noise_levels", levels), ("assignment_levels", assignment_levels)):
        actual = getattr(schedule, name)()
        if expected is None:
            assert actual is None, name
        else:
            np.testing.assert_allclose(actual, expected, rtol=1e-12, err_msg=name)
