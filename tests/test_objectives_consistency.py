"""Consistency regularization (Jeong and Shin 2020): the loss on closed-form models, and what it trains."""

import math

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._constraints import InvalidParameterError
from smoothsk.datasets import load_digits_images
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import GridSigmaSearch
from smoothsk.training import Consistency, FixedSigmaTraining, GaussianNoise, Macer, PretrainFinetune, SmoothAdv

from training_support import training_digits


class FakeNet:
    """What an objective uses of the estimator: module_, criterion_, noise_generator_."""

    def __init__(self, module, seed=0):
        self.module_ = module
        self.criterion_ = torch.nn.CrossEntropyLoss()
        self.noise_generator_ = torch.Generator().manual_seed(seed)


class ConstantLogits(torch.nn.Module):
    """Logits (0, log 3) whatever the input: every noisy copy predicts p = (1/4, 3/4)."""

    def forward(self, x):
        return torch.tensor([0.0, math.log(3.0)]).expand(len(x), 2)


class SignLogits(torch.nn.Module):
    """Predicts (1/4, 3/4) where x_0 > 0 and (3/4, 1/4) where x_0 < 0."""

    def forward(self, x):
        half_log_3 = 0.5 * math.log(3.0) * torch.sign(x[:, 0])
        return torch.stack([-half_log_3, half_log_3], dim=1)


def test_agreeing_copies_cost_the_cross_entropy_plus_eta_times_the_entropy():
    """All copies predict (1/4, 3/4): the KL term is 0, and the rest is known in closed form."""
    X, y, sigma = torch.zeros(5, 3), torch.ones(5, dtype=torch.int64), torch.full((5,), 0.5)
    for lbd, eta in [(10.0, 0.5), (0.0, 2.0), (3.0, 0.0)]:
        loss, logits = Consistency(lbd=lbd, eta=eta).loss(FakeNet(ConstantLogits()), X, y, sigma)
        entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
        assert loss.item() == pytest.approx(-math.log(0.75) + eta * entropy, rel=1e-6)
        assert logits.shape == (5, 2)


def test_without_its_terms_it_is_its_base_objective():
    """lbd = eta = 0 leaves the base's cross-entropy on the same noisy copies (same generator)."""
    X, y = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 1, 0])
    sigma = torch.linspace(0.2, 1.0, 6)
    for base in (GaussianNoise(num_noise=3), SmoothAdv(epsilon=0.3, steps=2, num_noise=2)):
        module = torch.nn.Linear(4, 2)
        expected, _ = base.loss(FakeNet(module, seed=3), X, y, sigma)
        got, _ = Consistency(lbd=0.0, eta=0.0, base=base).loss(FakeNet(module, seed=3), X, y, sigma)
        assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_disagreeing_copies_are_penalised_by_their_divergence_from_the_mean():
    """At x_0 = 0 two noisy copies land on opposite sides with probability 1/2. Then p_bar = (1/2, 1/2) and
    KL(p_bar || p_k) = log(4/3) / 2 for both copies; else 0. So the KL term is log(4/3) / 4 in expectation."""
    X, y, sigma = torch.zeros(4000, 1), torch.zeros(4000, dtype=torch.int64), torch.full((4000,), 1.0)
    losses = [Consistency(lbd=lbd, eta=0.0).loss(FakeNet(SignLogits(), seed=1), X, y, sigma)[0].item()
              for lbd in (0.0, 1.0)]
    # The share of disagreeing inputs has standard deviation sqrt(1/4 / 4000) = 0.0079: 6 of them (error
    # probability under 1e-8) times log(4/3) / 2 is 0.0068.
    assert losses[1] - losses[0] == pytest.approx(math.log(4 / 3) / 4, abs=0.0068)


class ScaledLogits(torch.nn.Module):
    """Logits (0, -scale * w): a class whose softmax underflows to exactly 0 in float32 at scale 200."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return torch.stack([torch.zeros(len(x)), -self.scale * self.weight.expand(len(x))], dim=1)


def test_its_gradient_is_finite_where_a_class_probability_underflows():
    """exp(-200) is 0 in float32: the loss is finite and so must its gradient be (no NaN step)."""
    assert float(torch.softmax(torch.tensor([0.0, -200.0]), dim=0)[1]) == 0.0
    module = ScaledLogits(200.0)
    X, y, sigma = torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64), torch.full((4,), 0.5)
    loss, _ = Consistency(lbd=10.0, eta=0.5).loss(FakeNet(module), X, y, sigma)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(module.weight.grad).all()


@pytest.mark.parametrize(("base", "match"), [(GaussianNoise(num_noise=1), "at least 2 noisy copies"),
                                             (Macer(), "base")])
def test_a_base_without_two_noisy_copies_is_refused_before_training(base, match):
    X, y = training_digits()
    clf = SampleWiseSmoothedClassifier(DigitsCNN, training=FixedSigmaTraining(0.25, Consistency(base=base)),
                                       max_epochs=1)
    with pytest.raises((ValueError, InvalidParameterError), match=match):
        clf.fit(X[:50], y[:50])
    assert not hasattr(clf, "module_")


def copy_disagreement(clf, X, sigma, copies=8):
    """Mean total-variation distance between single noisy copies' predictions and their mean, on X."""
    generator = torch.Generator().manual_seed(0)
    X_t = torch.from_numpy(X)
    with torch.no_grad():
        p = torch.stack([torch.softmax(clf.module_.eval()(X_t + sigma * torch.randn(X_t.shape, generator=generator)),
                                       dim=1) for _ in range(copies)])
    return float((p - p.mean(dim=0)).abs().sum(dim=2).mean() / 2)


def test_it_trains_copies_to_agree():
    """Against Gaussian training of the same net, Consistency makes noisy copies agree more."""
    X, y = load_digits_images()
    common = {"module__width": 8, "max_epochs": 6, "lr": 0.05, "optimizer__momentum": 0.9, "batch_size": 32,
              "random_state": 0}
    disagreement = {}
    for name, objective in (("gaussian", GaussianNoise(num_noise=2)), ("consistency", Consistency(lbd=10.0))):
        clf = SampleWiseSmoothedClassifier(DigitsCNN, training=FixedSigmaTraining(0.5, objective), **common)
        disagreement[name] = copy_disagreement(clf.fit(X[:600], y[:600]), X[600:800], 0.5)
    assert disagreement["consistency"] < 0.8 * disagreement["gaussian"], disagreement


def test_per_sample_schedules_train_with_it():
    """PFAT's per-sample sigmas reach the objective: one short run, a finite loss every epoch."""
    X, y = training_digits()
    clf = SampleWiseSmoothedClassifier(
        DigitsCNN, module__width=4, max_epochs=2, batch_size=50, random_state=0,
        training=PretrainFinetune(0.25, 0.75, pretrain_epochs=1, finetune_epochs=1, objective=Consistency(),
                                  assignment=GridSigmaSearch(sigma_min=0.25, sigma_max=0.75, step=0.25, n=20)))
    clf.fit(X[:100], y[:100])
    assert np.all(np.isfinite(clf.history[:, "train_loss"])) and len(np.unique(clf.train_sigmas_)) > 1


def test_a_model_trained_with_it_saves_and_loads(tmp_path):
    X, y = training_digits()
    clf = SampleWiseSmoothedClassifier(
        DigitsCNN, module__width=4, training=FixedSigmaTraining(0.25, Consistency(lbd=5.0, base=SmoothAdv(
            epsilon=0.5, steps=1, num_noise=2))), max_epochs=1, sampler=FixedSampler(n=50, n0=10), random_state=0)
    clf.fit(X[:100], y[:100]).save(tmp_path / "model.safetensors")
    loaded = SampleWiseSmoothedClassifier.load(tmp_path / "model.safetensors")
    assert repr(loaded.training) == repr(clf.training)
    np.testing.assert_array_equal(loaded.certify(X[200:205])[1], clf.certify(X[200:205])[1])
