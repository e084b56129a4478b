"""Reference architectures."""

import contextlib
import copy
import re

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk._presets import MODULES
from smoothsk.models import CaffeLeNet, DigitsCNN, FlatMLP, LeNet, Normalize, Normalized, TiledMaxPool2d
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import Pretrained


@pytest.mark.parametrize("module, shape", [
    (DigitsCNN(n_classes=7, width=4), (5, 1, 8, 8)),
    (FlatMLP(n_classes=7, hidden=8), (5, 13)),
    (FlatMLP(n_classes=7), (5, 2, 3, 3)),
    (LeNet(n_classes=7), (5, 1, 28, 28)),
    (CaffeLeNet(n_classes=7), (5, 1, 28, 28)),
])
def test_logits_shape_and_gradients(module, shape):
    logits = module(torch.randn(shape))
    assert logits.shape == (5, 7)
    logits.sum().backward()
    assert all(p.grad is not None for p in module.parameters())


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_built_in_architecture_declares_the_inputs_it_takes(name):
    # The command line checks a data file against it before any weights are read.
    module_class = MODULES[name]
    if module_class.input_shape is None:  # any shape: the flat MLP sizes its first layer lazily
        assert module_class is FlatMLP
        return
    logits = module_class(n_classes=3).eval()(torch.zeros((2,) + module_class.input_shape))
    assert logits.shape == (2, 3)


def test_caffe_lenet_has_the_published_networks_layers():
    # Jeong and Shin's released "lenet": conv 1->20 5x5, conv 20->50 5x5, dense 800->500->classes.
    shapes = [tuple(parameter.shape) for parameter in CaffeLeNet().parameters()]
    assert shapes == [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)]


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


@pytest.mark.parametrize("model_class, shape", [(LeNet, (1, 28, 28)), (CaffeLeNet, (1, 28, 28)),
                                                (DigitsCNN, (1, 8, 8))])
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


class TestTiledMaxPool2d:
    """``TiledMaxPool2d(k)``: ``nn.MaxPool2d(k)``'s values in inference mode, and ``nn.MaxPool2d`` elsewhere."""

    @staticmethod
    def awkward_inputs():
        """(3, 8, 7, 9): odd sizes to crop, NaN (at each place of a window), infinities, signed zeros and ties."""
        torch.manual_seed(0)
        x = torch.randn(3, 8, 7, 9)
        x[0, 0, 0, 0], x[0, 0, 1, 3], x[0, 1, 2, 5], x[0, 1, 5, 4] = (float("nan"),) * 4
        x[1, 2, 3, 4], x[2, 1, 1, 1] = float("inf"), -float("inf")
        x[2, :, :4, :4] = torch.tensor([[-0.0, 0.0, 0.0, -0.0], [0.0, -0.0, -0.0, 0.0]] * 2)
        x[1, 3] = 0.5
        return x

    @pytest.mark.parametrize("kernel_size", [2, 3])
    @pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
    def test_values_and_layout_are_max_pool_2ds_in_inference_mode(self, kernel_size, memory_format):
        x = self.awkward_inputs().contiguous(memory_format=memory_format)
        with torch.inference_mode():
            pooled = TiledMaxPool2d(kernel_size)(x)
        expected = torch.nn.MaxPool2d(kernel_size)(x)
        # Equal values; a window of zeros of both signs may keep another one's sign, which no comparison sees.
        torch.testing.assert_close(pooled, expected, rtol=0, atol=0, equal_nan=True)
        assert pooled.is_contiguous(memory_format=memory_format)

    def test_gradient_goes_to_one_of_tied_maxima_as_max_pool_2ds(self):
        # torch.maximum would split it between them: training must not change with the layer.
        x = self.awkward_inputs().nan_to_num(posinf=9.0, neginf=-9.0).requires_grad_()
        TiledMaxPool2d(2)(x).sum().backward()
        gradient, x.grad = x.grad, None
        torch.nn.MaxPool2d(2)(x).sum().backward()
        assert torch.equal(gradient, x.grad)

    # torch's forward-mode AD scripts its decompositions when first used, which warns in torch 2.13.
    @pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
    @pytest.mark.parametrize("context", [contextlib.nullcontext, torch.no_grad])
    def test_forward_mode_derivatives_are_max_pool_2ds(self, context):
        # Forward-mode AD needs no input that requires grad, and runs under no_grad too.
        x = self.awkward_inputs().nan_to_num(posinf=9.0, neginf=-9.0)
        tangent = torch.randn_like(x)
        with context():
            _, derivative = torch.func.jvp(TiledMaxPool2d(2), (x,), (tangent,))
            _, expected = torch.func.jvp(torch.nn.MaxPool2d(2), (x,), (tangent,))
        assert torch.equal(derivative, expected)

    def test_inference_mode_does_not_run_torchs_pooling_kernel(self, monkeypatch):
        # What the layer is for: the speed of certification, which samples in inference mode.
        def refused(*args, **kwargs):
            raise AssertionError("torch's max pooling ran")
        monkeypatch.setattr(torch.nn.functional, "max_pool2d", refused)
        with torch.inference_mode():
            assert TiledMaxPool2d(2)(torch.randn(2, 3, 4, 4)).shape == (2, 3, 2, 2)

    @pytest.mark.parametrize("settings, shape", [({"ceil_mode": True}, (1, 1, 5, 5)), ({"padding": 1}, (1, 1, 4, 4)),
                                                 ({"stride": 1}, (1, 1, 4, 4)), ({}, (1, 1, 1, 5))])
    def test_settings_changed_after_construction_or_inputs_smaller_than_a_window_are_max_pool_2ds(self, settings,
                                                                                                 shape):
        pool = TiledMaxPool2d(2)
        for name, value in settings.items():
            setattr(pool, name, value)
        x = torch.randn(shape)
        with torch.inference_mode():
            try:
                expected = torch.nn.MaxPool2d(2, **settings)(x)
            except RuntimeError as error:
                with pytest.raises(RuntimeError, match=re.escape(str(error))):
                    pool(x)
            else:
                assert torch.equal(pool(x), expected)

    @pytest.mark.parametrize("kernel_size", [1, 0, True, 2.0, (2, 2), "2"])
    def test_a_kernel_size_other_than_an_int_of_at_least_2_is_refused(self, kernel_size):
        with pytest.raises(ValueError, match=r"^kernel_size must be an int >= 2 .*; got "):
            TiledMaxPool2d(kernel_size)

    @pytest.mark.parametrize("model_class", [LeNet, CaffeLeNet, DigitsCNN])
    @pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
    def test_networks_logits_are_those_with_max_pool_2d(self, model_class, memory_format):
        torch.manual_seed(0)
        model = model_class().eval()
        pooled_by_torch = copy.deepcopy(model)
        for index, layer in enumerate(pooled_by_torch.layers):
            if isinstance(layer, TiledMaxPool2d):
                pooled_by_torch.layers[index] = torch.nn.MaxPool2d(layer.kernel_size)
        assert [type(layer) for layer in pooled_by_torch.layers] != [type(layer) for layer in model.layers]
        # A blank border, as digits have: windows of equal values (the bias alone) after the first convolution.
        x = torch.zeros((64,) + model_class.input_shape)
        x[..., 2:-2, 2:-2] = torch.rand((64,) + model_class.input_shape)[..., 2:-2, 2:-2]
        x = x.contiguous(memory_format=memory_format)
        model.to(memory_format=memory_format)
        pooled_by_torch.to(memory_format=memory_format)
        with torch.inference_mode():
            assert torch.equal(model(x), pooled_by_torch(x))


class TestNormalize:
    """``Normalize``: x -> (x - mean) / std per channel (dimension 1), its statistics in buffers."""

    def test_images_are_normalized_per_channel(self):
        x = torch.rand(4, 3, 5, 5)
        mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
        expected = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        torch.testing.assert_close(Normalize(mean, std)(x), expected, rtol=0, atol=0)

    def test_flat_inputs_are_normalized_per_feature(self):
        x = torch.rand(6, 2)
        torch.testing.assert_close(Normalize((1.0, -2.0), (0.5, 4.0))(x),
                                   torch.stack([(x[:, 0] - 1.0) / 0.5, (x[:, 1] + 2.0) / 4.0], dim=1))

    def test_one_value_applies_to_every_channel(self):
        x = torch.rand(2, 3, 4, 4)
        torch.testing.assert_close(Normalize(0.5, 0.25)(x), (x - 0.5) / 0.25)

    def test_statistics_are_persistent_buffers(self):
        state = Normalize((0.1, 0.2), (0.3, 0.4)).state_dict()
        assert sorted(state) == ["mean", "std"]
        torch.testing.assert_close(state["std"], torch.tensor([0.3, 0.4]))
        assert Normalize((0.1, 0.2), (0.3, 0.4)).constructor_params() == {
            "mean": (pytest.approx(0.1), pytest.approx(0.2)), "std": (pytest.approx(0.3), pytest.approx(0.4))}

    @pytest.mark.parametrize("mean, std, match", [
        ((0.5, 0.5), (0.2, 0.0), r"std must be > 0 for every channel and finite; got \[0.2, 0.0\]"),
        ((0.5,), (-1.0,), r"std must be > 0"),
        ((0.5, 0.5, 0.5), (0.2, 0.2), r"mean and std must have one value per channel, as many each: 3 means, 2 stds"),
        ((float("nan"),), (1.0,), r"mean must be finite"),
        ((0.0,), (float("inf"),), r"std must be > 0 for every channel and finite"),
        ((), (), r"mean must hold at least one value"),
        ("0.5", (1.0,), r"mean must be a number or a sequence of numbers"),
    ])
    def test_bad_statistics_are_refused_in_one_line(self, mean, std, match):
        with pytest.raises(ValueError, match=match) as info:
            Normalize(mean, std)
        assert "\n" not in str(info.value)

    def test_inputs_with_another_number_of_channels_are_refused(self):
        # (1, 3, 1, 1) statistics would broadcast a 1-channel image to 3 channels without a word.
        with pytest.raises(ValueError, match=r"3 channels \(mean, std\), but its input has 1 \(shape \(2, 1, 4, 4\)\)"):
            Normalize((0.1, 0.2, 0.3), (1.0, 1.0, 1.0))(torch.zeros(2, 1, 4, 4))


class TestNormalized:
    """``Normalized``: a network behind ``Normalize``, rebuilt from its class and statistics."""

    def test_output_is_the_network_on_normalized_inputs(self):
        net = FlatMLP(n_classes=3, hidden=4)
        x = torch.rand(5, 2)
        model = Normalized(net, (1.0, 2.0), (0.5, 0.25))
        torch.testing.assert_close(model(x), net((x - torch.tensor([1.0, 2.0])) / torch.tensor([0.5, 0.25])))
        assert model.net is net  # an instance is used as it is

    def test_a_class_is_built_with_the_number_of_classes(self):
        model = Normalized(LeNet, 0.1307, 0.3081, n_classes=4)
        assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 4)
        assert model.constructor_params() == {"net": LeNet, "mean": (pytest.approx(0.1307),),
                                              "std": (pytest.approx(0.3081),)}

    def test_the_estimator_trains_it_with_noise_in_the_units_of_x(self):
        X = np.random.default_rng(0).normal(size=(30, 1, 8, 8)).astype(np.float32)
        clf = SampleWiseSmoothedClassifier(Normalized, module__net=DigitsCNN, module__mean=(0.5,), module__std=(0.25,),
                                           max_epochs=1, sampler=FixedSampler(n=10, n0=5), random_state=0)
        clf.fit(X, np.arange(30) % 3)
        assert isinstance(clf.module_.net, DigitsCNN) and clf.module_.net.layers[-1].out_features == 3

    def test_radii_are_in_the_units_of_x(self, make_linear_classifier):
        """Noise added before the normalisation: radii are distances between inputs, not normalised ones.

        The network's boundary is u_0 = 0 in normalised units, x_0 = MEAN in the units of X, so the
        exact radius of x is |x_0 - MEAN|. Each certificate is wrong (its class, or a radius beyond
        that) with probability <= alpha: the count of wrong ones is bounded at error probability 1e-6.
        """
        mean, std, alpha, n_inputs = 0.3, 0.5, 0.05, 200
        linear = make_linear_classifier((1.0, 0.0)).module_
        clf = SampleWiseSmoothedClassifier(
            Normalized(linear, (mean, 0.0), (std, 1.0)), training=Pretrained(), sigma_search=FixedSigma(0.5),
            sampler=FixedSampler(n=1000, n0=100), alpha=alpha, random_state=0).fit(np.zeros((2, 2), np.float32), [0, 1])
        x0 = np.random.default_rng(5).uniform(mean - 1.0, mean + 1.0, n_inputs)
        X = np.column_stack([x0, np.zeros(n_inputs)]).astype(np.float32)
        prediction, radius = clf.certify(X)
        certified = prediction != ABSTAIN
        distance = np.abs(x0 - mean)
        bound = stats.binom.isf(1e-6, n_inputs, alpha)
        assert (certified & ((prediction != (x0 > mean)) | (radius > distance))).sum() <= bound
        assert np.median(radius[certified] / distance[certified]) > 0.5  # not vacuous
        # The same radii read in normalised units (noise added after the normalisation) break it: this can fail.
        assert (certified & (radius / std > distance)).sum() > bound

    def test_a_module_taking_the_noise_level_is_refused(self, fitted_experts):
        with pytest.raises(ValueError, match="takes the noise level"):
            Normalized(fitted_experts[0].module_, 0.0, 1.0)

    def test_not_a_module_is_refused(self):
        with pytest.raises(TypeError, match="net must be a torch.nn.Module instance or class; got 3"):
            Normalized(3, 0.0, 1.0)
