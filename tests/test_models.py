"""Reference architectures."""

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.models import DigitsCNN, FlatMLP, LeNet
from smoothsk.sampling import FixedSampler


@pytest.mark.parametrize("module, shape", [
    (DigitsCNN(n_classes=7, width=4), (5, 1, 8, 8)),
    (FlatMLP(n_classes=7, hidden=8), (5, 13)),
    (FlatMLP(n_classes=7), (5, 2, 3, 3)),
    (LeNet(n_classes=7), (5, 1, 28, 28)),
])
def test_logits_shape_and_gradients(module, shape):
    logits = module(torch.randn(shape))
    assert logits.shape == (5, 7)
    logits.sum().backward()
    assert all(p.grad is not None for p in module.parameters())


def test_digits_cnn_width():
    assert DigitsCNN(width=6).layers[0].out_channels == 6
    assert DigitsCNN(width=6).layers[2].out_channels == 12


def test_estimator_passes_the_number_of_classes():
    X = np.random.default_rng(0).normal(size=(30, 1, 8, 8)).astype(np.float32)
    y = np.arange(30) % 3
    clf = SampleWiseSmoothedClassifier(DigitsCNN, module__width=2, max_epochs=1,
                                       sampler=FixedSampler(n=10, n0=5), random_state=0).fit(X, y)
    assert clf.module_.layers[-1].out_features == 3


def test_flat_mlp_lazy_layer_is_materialised_before_training():
    X = np.random.default_rng(0).normal(size=(20, 11)).astype(np.float32)
    clf = SampleWiseSmoothedClassifier(FlatMLP, max_epochs=1, sampler=FixedSampler(n=10, n0=5),
                                       random_state=0).fit(X, np.arange(20) % 2)
    assert clf.module_.layers[1].weight.shape == (64, 11)
    assert all(not isinstance(p, torch.nn.parameter.UninitializedParameter) for p in clf.module_.parameters())


def classic_order(model):
    """``model`` with each ReLU before its pooling, as LeNet-5 and most CNNs write it (the same parameters)."""
    layers = list(model.layers)
    for index, layer in enumerate(layers[:-1]):
        if isinstance(layer, torch.nn.MaxPool2d) and isinstance(layers[index + 1], torch.nn.ReLU):
            layers[index], layers[index + 1] = layers[index + 1], layer
    classic = type(model)()
    classic.layers = torch.nn.Sequential(*layers)
    return classic


@pytest.mark.parametrize("model_class, shape", [(LeNet, (1, 28, 28)), (DigitsCNN, (1, 8, 8))])
def test_pooling_before_relu_computes_the_classic_network_bit_for_bit(model_class, shape):
    # The pooling runs before its ReLU to save work; logits and gradients must stay those of the classic order.
    torch.manual_seed(0)
    model = model_class()
    classic = classic_order(model)
    assert [type(layer) for layer in classic.layers] != [type(layer) for layer in model.layers]
    assert list(classic.state_dict()) == list(model.state_dict())
    x = torch.randn((64,) + shape)
    logits, classic_logits = model(x), classic(x)
    assert torch.equal(logits, classic_logits)
    logits.logsumexp(dim=1).sum().backward()
    gradients = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad()
    classic_logits.logsumexp(dim=1).sum().backward()
    for gradient, parameter in zip(gradients, model.parameters(), strict=True):
        assert torch.equal(gradient, parameter.grad)
