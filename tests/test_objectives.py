"""The training objectives: GaussianNoise, and a finite loss that training decreases for every objective."""

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk._constraints import InvalidParameterError
from smoothsk.objectives._base import gaussian_copies
from smoothsk.training import Consistency, FixedSigmaTraining, GaussianNoise, Macer, SmoothAdv

from training_support import digits_net, training_digits


class FakeNet:
    """What an objective uses of the estimator: module_, criterion_, noise_generator_."""

    def __init__(self, module, seed=0):
        self.module_ = module
        self.criterion_ = torch.nn.CrossEntropyLoss()
        self.noise_generator_ = torch.Generator().manual_seed(seed)


OBJECTIVES = [
    GaussianNoise(num_noise=2),
    SmoothAdv(epsilon=0.5, steps=2, num_noise=2),
    SmoothAdv(epsilon="adaptive", steps=2, num_noise=2),
    Macer(num_noise=4),
    Consistency(lbd=5.0),
    Consistency(lbd=2.0, base=SmoothAdv(epsilon=0.5, steps=2, num_noise=2)),
]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=repr)
def test_objective_loss_finite_and_decreasing(objective):
    X, y = training_digits()
    # From a briefly trained model: MACER's radius term only counts correctly classified
    # samples, so from scratch its loss first grows with the accuracy.
    net = digits_net(X, y, training=FixedSigmaTraining(0.25), max_epochs=3)
    X_t, y_t = torch.from_numpy(X[:100]), torch.as_tensor(y[:100])
    sigma = torch.linspace(0.1, 0.5, 100)
    net.module_.train()
    optimizer = torch.optim.SGD(net.module_.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss, logits = objective.loss(net, X_t, y_t, sigma)
        assert logits.shape == (100, 10)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.97 * np.mean(losses[:5])


class TestGaussianNoise:
    def test_each_sample_gets_noise_of_its_own_sigma(self):
        # 3 samples of 2000 features at sigma 0.1, 1, 5: sum of squares / sigma^2
        # ~ chi2(2000 * num_noise); two-sided check with error probability 1e-6.
        X = torch.stack([torch.zeros(2000), torch.ones(2000), torch.full((2000,), -3.0)])
        sigma = torch.tensor([0.1, 1.0, 5.0])
        noisy = gaussian_copies(FakeNet(None), X, sigma, num_noise=2)
        assert noisy.shape == (6, 2000)
        m = 2 * 2000
        for i in range(3):
            noise = torch.cat([noisy[i] - X[i], noisy[3 + i] - X[i]]).double()
            statistic = float((noise ** 2).sum()) / float(sigma[i]) ** 2
            assert stats.chi2.ppf(0.5e-6, m) < statistic < stats.chi2.ppf(1 - 0.5e-6, m)

    def test_loss_is_cross_entropy_on_noisy_copies(self):
        torch.manual_seed(0)
        module = torch.nn.Linear(4, 3)
        X, y, sigma = torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0]), torch.full((5,), 0.5)
        loss, logits = GaussianNoise(num_noise=2).loss(FakeNet(module, seed=7), X, y, sigma)
        noisy = gaussian_copies(FakeNet(None, seed=7), X, sigma, 2)
        expected = torch.nn.functional.cross_entropy(module(noisy), y.repeat(2))
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(logits, module(noisy[:5]))
        loss.backward()
        assert module.weight.grad is not None

    def test_invalid_num_noise(self):
        with pytest.raises(InvalidParameterError, match="'num_noise' parameter of GaussianNoise"):
            GaussianNoise(num_noise=0).validate()
