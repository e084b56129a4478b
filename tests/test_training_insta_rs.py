"""Insta-RS Train: the level update rule, its period, and the objective of each stage."""

from types import SimpleNamespace

import numpy as np
import torch
from sklearn.base import clone
from torch import nn

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._params import Components
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import MultiStartFGSS
from smoothsk.training import GaussianNoise, InstaRSTrain, SmoothAdv

from training_support import ObjectiveRecorder, SigmaRecorder, StopAfter, digits_net, training_digits


def test_instars_rule_moves_one_level():
    """Level update of Alg. 2 on a model whose smoothed predictions are known."""

    class Scaled(nn.Module):
        def forward(self, x):
            return 20.0 * x

    X = torch.tensor([[1.0, 0.0]] * 4)
    y = torch.tensor([0, 0, 1, 1])  # the model predicts class 0 at any of these noise levels
    schedule = InstaRSTrain(sigma0=0.1, max_level=3, num_noise=64)
    net = SimpleNamespace(module_=Scaled(), classes_=np.arange(2), certify_batch_size=100, device="cpu",
                          n_jobs=None, noise_generator_=torch.Generator().manual_seed(0),
                          train_sigmas_=0.1 * np.sqrt([1.0, 3.0, 1.0, 2.0]))
    new_levels = np.rint((schedule._update(net, X, y) / 0.1) ** 2)
    # Correct with a growing radius: up one level (clipped at 3); misclassified: down (clipped at 1).
    np.testing.assert_array_equal(new_levels, [2, 3, 1, 1])


def test_instars_levels_move_at_most_one_per_update():
    X, y = training_digits()
    recorder = SigmaRecorder()
    schedule = InstaRSTrain(sigma0=0.25, max_level=4, update_every=2, num_noise=4, stage1_epochs=7,
                            stage2_epochs=2, stage1_objective=GaussianNoise(), stage2_objective=GaussianNoise(),
                            stage2_lr=0.01)
    net = digits_net(X, y, training=schedule, callbacks=[recorder])
    assert recorder.stages == ["stage1"] * 7 + ["stage2"] * 2
    levels = np.rint((np.array([np.full(len(X), 0.25)] + recorder.sigmas) / 0.25) ** 2).astype(int)
    assert np.all((levels >= 1) & (levels <= 4))
    steps = np.abs(np.diff(levels, axis=0))
    assert steps.max() <= 1
    # Updates only at the start of epochs 2, 4, 6 (iter % L == 0); fixed in stage II.
    moved = steps.any(axis=1)
    update_epochs = np.array([False, True, False, True, False, True, False, False, False])
    assert moved.any() and not moved[~update_epochs].any()
    assert (levels[-1] > 1).any()
    np.testing.assert_array_equal(schedule.levels(net), levels[-1])
    np.testing.assert_array_equal([row["sigma_time"] > 0 for row in net.history], update_epochs)
    assert isinstance(schedule.default_sigma_search(), MultiStartFGSS)


def test_instars_reproducible_and_objective_per_stage():
    X, y = training_digits()
    recorder = ObjectiveRecorder()
    schedule = InstaRSTrain(update_every=1, stage1_epochs=2, stage2_epochs=1, num_noise=2,
                            stage1_objective=GaussianNoise(), stage2_objective=SmoothAdv(steps=1, num_noise=1))
    first = digits_net(X, y, training=schedule, callbacks=[recorder])
    second = digits_net(X, y, training=clone(schedule))
    np.testing.assert_array_equal(first.train_sigmas_, second.train_sigmas_)
    # 300 samples in batches of 50: 6 batches per epoch, 2 epochs of stage I, then 1 of stage II.
    kinds = [type(objective) for objective in recorder.objectives]
    assert kinds == [GaussianNoise] * 12 + [SmoothAdv] * 6
    assert first.training_.objective_.get_params() == schedule.stage2_objective.get_params()


def test_a_plan_started_over_resumes_from_its_own_epochs():
    # Every sample of the second call is new: its plan starts over. Interrupted after two epochs of
    # stage I, the next call finishes that stage I, not the first call's finished plan.
    X, y = training_digits()
    schedule = InstaRSTrain(update_every=10, stage1_epochs=3, stage2_epochs=1, num_noise=2,
                            stage1_objective=GaussianNoise(), stage2_objective=GaussianNoise())
    net = digits_net(X[:100], y[:100], training=schedule, callbacks=[("stop", StopAfter(0))])
    net.set_params(callbacks__stop__epochs=6).partial_fit(X[100:200], y[100:200])
    assert len(net.history) == 6
    net.partial_fit(X[100:200], y[100:200])
    assert list(net.history[:, "training_stage"]) == ["stage1"] * 3 + ["stage2"] + ["stage1"] * 3 + ["stage2"]


def test_the_default_search_stays_within_the_levels_training_reached():
    # Levels move one step per update: five updates from level 1 reach level 6 at most, of 16. A level training
    # never reached is a noise level the model never learned; the label-free search must not pick it.
    X, y = training_digits()
    schedule = InstaRSTrain(sigma0=0.25, max_level=16, update_every=1, stage1_epochs=5, stage2_epochs=0,
                            num_noise=2, stage1_objective=GaussianNoise(), stage2_objective=GaussianNoise())
    unfitted = SampleWiseSmoothedClassifier(FlatMLP, training=schedule)
    assert Components.of(unfitted).sigma_search.max_level == 16
    net = digits_net(X, y, training=schedule)
    reached = int(schedule.levels(net).max())
    assert 1 < reached <= 6
    search = Components.of(net).sigma_search
    assert isinstance(search, MultiStartFGSS) and search.max_level == reached
    assert search.start_pairs() == ((1, 1), (reached, -1))
    _, _, details = net.set_params(sampler=FixedSampler(n=100, n0=10)).certify(X[:20], return_details=True)
    assert details.sigma.max() <= 0.25 * np.sqrt(reached) + 1e-12
    # A search the user passes is capped the same way (its starts moved within the cap), never changed itself.
    explicit = MultiStartFGSS(sigma0=0.25, max_level=16, starts=((16, -1), (1, 2)), n=50)
    capped = Components.of(net.set_params(sigma_search=explicit)).sigma_search
    assert (capped.max_level, capped.starts, capped.n) == (reached, ((reached, -1), (1, 2)), 50)
    assert explicit.max_level == 16
    # search_levels="all": Alg. 1 as published, over every level.
    net.set_params(training__search_levels="all")
    assert Components.of(net).sigma_search is net.sigma_search
