"""Input, label, parameter, device and module checks (smoothsk._validation), through the estimator's methods.

Every refused call raises before any sampling or training and leaves the
fitted estimator as it was.
"""

import copy

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import DataConversionWarning, NotFittedError

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.models import DigitsCNN
from smoothsk.training import GaussianNoise

from conftest import tiny_digits_classifier


def state_of(clf):
    """What a failed call must leave unchanged."""
    return {"module": clf.module_, "weights": copy.deepcopy(clf.module_.state_dict()),
            "regions": copy.deepcopy(clf.regions_), "classes": clf.classes_.copy(),
            "epochs": len(clf.history), "train_sigmas": clf.train_sigmas_.copy()}


def assert_same_state(clf, before):
    after = state_of(clf)
    assert after["module"] is before["module"]
    for name, tensor in before["weights"].items():
        torch.testing.assert_close(after["weights"][name], tensor, rtol=0, atol=0)
    for field in ("centres", "radii", "sigmas", "predictions"):
        np.testing.assert_array_equal(getattr(after["regions"], field), getattr(before["regions"], field))
    np.testing.assert_array_equal(after["classes"], before["classes"])
    np.testing.assert_array_equal(after["train_sigmas"], before["train_sigmas"])
    assert after["epochs"] == before["epochs"]


def count_forward_calls(clf):
    """A list that grows by one per forward pass of ``clf.module_``."""
    calls = []
    clf.module_.register_forward_pre_hook(lambda module, args: calls.append(len(args[0])))
    return calls


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")


class TestModuleCheck:
    """``fit`` passes one input through the new module and checks its logits before training."""

    def test_module_with_more_outputs_than_classes_is_refused(self, digits):
        X, y = digits
        eight = y < 8
        clf = SampleWiseSmoothedClassifier(DigitsCNN(n_classes=10, width=4), max_epochs=1, random_state=0)
        with pytest.raises(ValueError, match=r"logits of shape \(1, 8\).*8 classes.*found \(1, 10\)"):
            clf.fit(X[eight][:64], y[eight][:64])

    def test_inputs_the_module_rejects_are_refused_with_their_shapes(self, digits):
        X, y = digits[0][:64], digits[1][:64]
        with pytest.raises(ValueError, match=r"DigitsCNN rejected one input of shape \(1, 64\).*"
                                             r"X has shape \(64, 64\)") as error:
            tiny_digits_classifier().fit(X.reshape(64, 64), y)
        assert isinstance(error.value.__cause__, RuntimeError)

    @needs_no_cuda
    def test_unavailable_device_is_refused(self, digits):
        with pytest.raises(ValueError, match=r"device='cuda'.*CUDA is not available.*'cpu'"):
            tiny_digits_classifier(device="cuda").fit(digits[0][:64], digits[1][:64])

    def test_refused_refit_keeps_the_fitted_estimator(self, digits):
        X, y = digits[0][:64], digits[1][:64]
        clf = tiny_digits_classifier(max_epochs=1).fit(X, y)
        before = state_of(clf)
        with pytest.raises(ValueError, match="rejected one input"):
            clf.fit(X.reshape(64, 64), y)
        assert_same_state(clf, before)
        assert clf.input_shape_ == (1, 8, 8) and len(clf.certify(X[:2])[0]) == 2


SHAPE = (1, 4, 4)


def good_X(n=3):
    """Valid inputs for the estimator of :class:`TestValidation`: (n, 1, 4, 4)."""
    return np.random.default_rng(0).normal(size=(n,) + SHAPE).astype(np.float32)


def bad_inputs():
    X = good_X()
    nan, inf = X.copy(), X.copy()
    nan[1, 0, 2, 2] = np.nan
    inf[0, 0, 0, 0] = -np.inf
    return [
        pytest.param(nan, "Input X contains NaN", id="nan"),
        pytest.param(inf, "Input X contains infinity", id="inf"),
        pytest.param(X[:, :, :3, :3], "X has 9 features, but .* is expecting 16 features", id="features"),
        pytest.param(X.reshape(3, 16, 1), r"inputs of shape \(16, 1\), but .* fitted on inputs of shape "
                     r"\(1, 4, 4\)", id="shape"),
        pytest.param(X[0], "leading batch axis", id="no-batch-axis"),
        pytest.param(X[0].ravel(), "Expected 2D array, got 1D array", id="one-dimensional"),
        pytest.param(X[:0], r"0 sample\(s\) .* minimum of 1 is required", id="empty"),
    ]


class TestValidation:
    """Every invalid call raises before any sampling and leaves the fitted estimator unchanged."""

    @pytest.fixture
    def clf(self, make_linear_classifier):
        clf = make_linear_classifier(np.linspace(-1, 1, 16), 0.1, n=50, n0=10, input_shape=SHAPE)
        clf.regions_.append(np.ones((1, 16)), [0.5], [0.5], [1], [0.9])  # some fitted state to keep
        return clf

    @pytest.mark.parametrize("method", ["certify", "predict", "predict_proba"])
    @pytest.mark.parametrize("X, message", bad_inputs())
    def test_bad_inputs(self, clf, method, X, message):
        before, calls = state_of(clf), count_forward_calls(clf)
        with pytest.raises(ValueError, match=message):
            getattr(clf, method)(X)
        assert calls == []
        assert_same_state(clf, before)

    @pytest.mark.parametrize("y, sample_weight, message", [
        pytest.param([0, 1], None, "X has 3 inputs but y has 2 labels", id="y-length"),
        pytest.param([[0, 1]] * 3, None, r"y must be one label per input \(shape \(n,\)\), got shape \(3, 2\)",
                     id="y-shape"),
        pytest.param([0, 1, 1], [1.0, 2.0], "X has 3 inputs but sample_weight has 2 weights", id="weight-length"),
    ])
    def test_score_refuses_labels_or_weights_of_another_shape_before_sampling(self, clf, y, sample_weight, message):
        before, calls = state_of(clf), count_forward_calls(clf)
        with pytest.raises(ValueError, match=message):
            clf.score(good_X(), y, sample_weight=sample_weight)
        assert calls == []
        assert_same_state(clf, before)

    @pytest.mark.parametrize("X, message", bad_inputs())
    def test_score_refuses_bad_inputs_as_predict_does(self, clf, X, message):
        with pytest.raises(ValueError, match=message):
            clf.score(X, [0, 1, 1])

    def test_score_ravels_a_column_vector_y_with_a_warning(self, clf):
        y = np.array([0, 1, 1])
        with pytest.warns(DataConversionWarning, match="column-vector y"):
            assert clf.score(good_X(), y[:, None]) == clf.score(good_X(), y)

    def test_flat_inputs_of_the_right_size_are_accepted(self, clf):
        X = good_X()
        np.testing.assert_array_equal(clf.certify(X.reshape(3, 16))[1], clf.certify(X)[1])

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
    def test_float_tensors_of_any_precision_are_accepted(self, clf, dtype):
        X = torch.from_numpy(good_X()).to(dtype)
        expected = clf.certify(X.float().numpy(), return_details=True)
        found = clf.certify(X, return_details=True)
        for a, b in zip(found[:2], expected[:2], strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(found[2].p_lower, expected[2].p_lower)

    @pytest.mark.parametrize("method, y, message", [
        pytest.param(method, y, message, id=f"{method}-{name}")
        for method in ("fit", "partial_fit") for name, y, message in [
            ("length", [0, 1], "X has 3 inputs but y has 2 labels"),
            ("no-y", None, "requires y"),
            ("continuous", [0.5, 1.5, 2.5], "Unknown label type"),
        ]] + [
        pytest.param("fit", [1, 1, 1], "at least 2 classes", id="fit-one-class"),
        pytest.param("fit", [0, -1, 1], "ABSTAIN", id="fit-abstain-label"),
        pytest.param("partial_fit", [0, 1, 7], r"labels \[7\] not among classes_", id="partial_fit-unknown"),
    ])
    def test_bad_labels(self, clf, y, message, method):
        before, calls = state_of(clf), count_forward_calls(clf)
        with pytest.raises(ValueError, match=message):
            getattr(clf, method)(good_X(), y)
        assert calls == []
        assert_same_state(clf, before)

    @pytest.mark.parametrize("params, message", [
        pytest.param({"alpha": 0.0}, "'alpha' parameter", id="alpha-0"),
        pytest.param({"alpha": 1.0}, "'alpha' parameter", id="alpha-1"),
        pytest.param({"alpha": -0.5}, "'alpha' parameter", id="alpha-negative"),
        pytest.param({"sigma_search__sigma": 0.0}, "'sigma' parameter of FixedSigma", id="sigma-0"),
        pytest.param({"sigma_search__sigma": -1.0}, "'sigma' parameter of FixedSigma", id="sigma-negative"),
        pytest.param({"training__sigma": 0.0}, "'sigma' parameter of FixedSigmaTraining", id="training-sigma"),
        pytest.param({"sampler__n": 0}, "'n' parameter of FixedSampler", id="n-0"),
        pytest.param({"sampler__n": -5}, "'n' parameter of FixedSampler", id="n-negative"),
        pytest.param({"sampler__n0": 0}, "'n0' parameter of FixedSampler", id="n0-0"),
        pytest.param({"certify_batch_size": 0}, "'certify_batch_size' parameter", id="batch-size"),
        pytest.param({"certify_autocast": "float64"}, "'certify_autocast' parameter", id="autocast"),
        pytest.param({"certify_memory_format": "nhwc"}, "'certify_memory_format' parameter", id="memory-format"),
        pytest.param({"training__objective": GaussianNoise(num_noise=0)}, "'num_noise' parameter", id="num-noise"),
    ])
    @pytest.mark.parametrize("method", ["certify", "predict", "predict_proba", "fit"])
    def test_bad_parameters(self, clf, params, message, method):
        clf.set_params(**params)
        before, calls = state_of(clf), count_forward_calls(clf)
        args = (good_X(), [0, 1, 1]) if method == "fit" else (good_X(),)
        with pytest.raises(ValueError, match=message):
            getattr(clf, method)(*args)
        assert calls == []
        assert_same_state(clf, before)

    @pytest.mark.parametrize("method", ["certify", "predict", "predict_proba", "score", "reset_regions"])
    def test_not_fitted(self, method):
        clf = SampleWiseSmoothedClassifier(DigitsCNN)
        args = {"certify": (good_X(),), "predict": (good_X(),), "predict_proba": (good_X(),),
                "score": (good_X(), [0, 1, 1]), "reset_regions": ()}[method]
        with pytest.raises(NotFittedError, match="SampleWiseSmoothedClassifier instance is not fitted"):
            getattr(clf, method)(*args)

    @pytest.mark.parametrize("params", [{"dataset": torch.utils.data.TensorDataset}, {"dataset__length": 3}],
                             ids=["class", "option"])
    def test_a_dataset_the_training_would_ignore_is_refused(self, clf, params):
        unfitted = clone(clf).set_params(**params)
        with pytest.raises(ValueError, match="dataset is not used: smoothsk trains on its own indexed dataset"):
            unfitted.fit(good_X(), [0, 1, 1])
        assert not hasattr(unfitted, "module_")

    @pytest.mark.parametrize("key", ["iterator_train__num_workers", "iterator_train__sampler",
                                     "iterator_valid__collate_fn"])
    @pytest.mark.parametrize("method", ["fit", "partial_fit"])
    def test_iterator_options_the_tensor_batches_do_not_take_are_refused(self, clf, key, method):
        unfitted = clone(clf).set_params(**{key: 2})
        with pytest.raises(ValueError, match=rf"{key} is not an option of smoothsk's training batches"):
            getattr(unfitted, method)(good_X(), [0, 1, 1])
        assert not hasattr(unfitted, "module_")

    def test_sample_weight_is_refused(self, clf):
        before = state_of(clf)
        with pytest.raises(TypeError, match="sample_weight"):
            clf.fit(good_X(), [0, 1, 1], sample_weight=np.ones(3))
        assert_same_state(clf, before)

    @needs_no_cuda
    @pytest.mark.parametrize("method", ["certify", "predict", "predict_proba", "fit", "partial_fit"])
    def test_unavailable_device_is_refused_before_changing_anything(self, clf, method):
        clf.set_params(device="cuda")
        before, calls = state_of(clf), count_forward_calls(clf)
        args = (good_X(), [0, 1, 1]) if method in ("fit", "partial_fit") else (good_X(),)
        with pytest.raises(ValueError, match=r"device='cuda'.*CUDA is not available.*'cpu'"):
            getattr(clf, method)(*args)
        assert calls == []
        assert_same_state(clf, before)
