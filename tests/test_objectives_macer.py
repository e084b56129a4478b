"""MACER: the classification and soft-radius terms on a model of known output."""

from types import SimpleNamespace

import torch
from torch import nn

from smoothsk.training import Macer


class ConstantLogits(nn.Module):
    """Logits ``(1, 0, 0)`` for every input: class 0 wins under any noise."""

    def forward(self, x):
        return torch.tensor([1.0, 0.0, 0.0]).expand(len(x), 3)


def test_macer_radius_term_zero_for_misclassified():
    net = SimpleNamespace(module_=ConstantLogits(), noise_generator_=torch.Generator().manual_seed(0))
    X = torch.zeros((6, 4))
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    sigma = torch.tensor([0.25, 0.25, 0.25, 0.5, 0.5, 0.5])
    terms = Macer(num_noise=3, beta=1.0, gamma=8.0).terms(net, X, y, sigma)
    misclassified = y != 0
    assert torch.all(terms.radius[misclassified] == 0)
    # Correct samples: sigma / 2 * (gamma - (PhiInv(p_1) - PhiInv(p_2))), softmax(1, 0, 0).
    p = torch.softmax(torch.tensor([1.0, 0.0, 0.0]), dim=0)
    xi = torch.special.ndtri(p[0]) - torch.special.ndtri(p[1])
    torch.testing.assert_close(terms.radius[~misclassified], sigma[~misclassified] / 2 * (8.0 - xi))
    torch.testing.assert_close(terms.classification, -torch.log(p[y] + 1e-10))


def test_macer_hinge_inactive_beyond_gamma():
    net = SimpleNamespace(module_=ConstantLogits(), noise_generator_=torch.Generator().manual_seed(0))
    terms = Macer(num_noise=2, beta=1.0, gamma=0.5).terms(net, torch.zeros((2, 4)), torch.tensor([0, 0]),
                                                          torch.full((2,), 0.3))
    assert torch.all(terms.radius == 0)  # the gap (0.99) exceeds gamma


def test_macer_defers_the_radius_term_to_the_epoch_after_deferred_epochs():
    X, y, sigma = torch.zeros((3, 4)), torch.tensor([0, 0, 1]), torch.full((3,), 0.5)
    macer = Macer(num_noise=2, beta=1.0, gamma=8.0, lbd=3.0, deferred_epochs=2)

    def loss_in_epoch(epoch):  # from 0: skorch's history has an entry for the running epoch
        net = SimpleNamespace(module_=ConstantLogits(), noise_generator_=torch.Generator().manual_seed(0),
                              history=[{}] * (epoch + 1))
        return macer.loss(net, X, y, sigma)[0]

    net = SimpleNamespace(module_=ConstantLogits(), noise_generator_=torch.Generator().manual_seed(0))
    terms = macer.terms(net, X, y, sigma)
    assert torch.all(terms.radius[:2] > 0)
    for epoch in (0, 1):
        torch.testing.assert_close(loss_in_epoch(epoch), terms.classification.mean())
    torch.testing.assert_close(loss_in_epoch(2), (terms.classification + 3.0 * terms.radius).mean())
