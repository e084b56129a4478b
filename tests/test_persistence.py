"""Tests of ``save``/``load``: exact round trips, and files that are refused with a clear error."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from sklearn.exceptions import NotFittedError
from skorch.callbacks import EpochTimer, LRScheduler
from skorch.exceptions import DeviceWarning
from torch import nn
from torch.optim.lr_scheduler import MultiStepLR

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk import _persistence as persistence
from smoothsk.datasets import make_heterogeneous_margins
from smoothsk.experts import NoiseLevelExperts
from smoothsk.models import DigitsCNN, FlatMLP, Normalize, Normalized
from smoothsk.regions import OnlineBallAllocator
from smoothsk.sampling import FixedSampler, InputSpecificSampler
from smoothsk.sigma import CertifiedSigmaSelector, GridSigmaSearch, SemiElasticSigma, _selector
from smoothsk.training import GaussianNoise, Pretrained, PretrainFinetune

from conftest import LinearLogits

load = SampleWiseSmoothedClassifier.load


class TinyNet(nn.Module):
    """A user's own module: one linear layer on flattened digits."""

    def __init__(self, n_classes=10):
        super().__init__()
        self.linear = nn.Linear(64, n_classes)

    def forward(self, x):
        return self.linear(x.flatten(1))


class ShiftedNet(nn.Module):
    """A module that computes with state outside its ``state_dict``: a non-persistent buffer and an attribute."""

    initial_shift = 0.0  # what a code edit between saving and loading changes

    def __init__(self, n_classes=2):
        super().__init__()
        self.linear = nn.LazyLinear(n_classes)
        self.register_buffer("shift", torch.full((1,), self.initial_shift), persistent=False)
        self.scale = 1.0
        self.activation = torch.positive  # the identity, as a function attribute
        self.register_forward_hook(scaled_by(1.0))

    def forward(self, x):
        return self.linear(self.activation(self.scale * (x.flatten(1) - self.shift)))


def negate(module, inputs, output):
    """A forward hook: the module's logits negated."""
    return -output


def scaled_by(factor):
    """A forward hook (a closure) multiplying the module's logits by ``factor``."""
    def hook(module, inputs, output):
        return factor * output
    return hook


def replace_hooks(module, hook):
    """Remove the module's forward hooks and register ``hook`` instead."""
    module._forward_hooks.clear()
    module.register_forward_hook(hook)


class NormalisedNet(nn.Module):
    """A linear layer under spectral normalisation (a parametrization), its logits negated by a forward hook."""

    def __init__(self, n_classes=2):
        super().__init__()
        self.linear = nn.utils.parametrizations.spectral_norm(nn.Linear(2, n_classes))
        self.register_forward_hook(negate)

    def forward(self, x):
        return self.linear(x.flatten(1))


class RecurrentNet(nn.Module):
    """A GRU over the two features as a sequence (it keeps weak references to its weights), then a linear layer."""

    def __init__(self, n_classes=2):
        super().__init__()
        self.gru = nn.GRU(1, 4, batch_first=True)
        self.linear = nn.Linear(4, n_classes)

    def forward(self, x):
        return self.linear(self.gru(x.flatten(1).unsqueeze(-1))[0][:, -1])


class HookedNet(nn.Module):
    """Weight normalisation (a parametrization) and hooks made in ``__init__``: a lambda, a method, a closure."""

    def __init__(self, n_classes=2):
        super().__init__()
        self.linear = nn.utils.parametrizations.weight_norm(nn.Linear(2, n_classes))
        self.register_forward_hook(lambda module, args, output: output * 2)
        self.register_forward_pre_hook(self.centre)
        offset = 0.1
        self.linear.register_forward_hook(lambda module, args, output: output + offset)

    def centre(self, module, args):
        return (args[0] - 0.05,)

    def forward(self, x):
        return self.linear(x.flatten(1))


class ActivatedNet(nn.Module):
    """A linear layer, then an activation given as a module class (anything else: none)."""

    def __init__(self, n_classes=2, activation=nn.ReLU):
        super().__init__()
        self.linear = nn.Linear(2, n_classes)
        is_module = isinstance(activation, type) and issubclass(activation, nn.Module)
        self.activation = activation() if is_module else nn.Identity()

    def forward(self, x):
        return self.activation(self.linear(x.flatten(1)))


class LegacyNormNet(nn.Module):
    """A linear layer under the legacy hook-based ``spectral_norm``, which recomputes ``weight`` at every call."""

    def __init__(self, n_classes=2):
        super().__init__()
        self.linear = nn.utils.spectral_norm(nn.Linear(2, n_classes))

    def forward(self, x):
        return self.linear(x.flatten(1))


# ------------------------------------------------------------------- helpers

def read_file(path):
    """(metadata, JSON document, tensors as numpy arrays) of a saved model, read with safetensors itself."""
    with safe_open(path, framework="np") as file:
        metadata = file.metadata()
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118
    return metadata, json.loads(metadata["smoothsk"]), tensors


def write_file(path, document, tensors, digest=None):
    """Write a model file; ``digest=None`` re-signs it as the format documents it (a forger can).

    The digest is SHA-256 over the JSON document's bytes, then each tensor's
    bytes in sorted name order (``smoothsk._persistence``'s docstring).
    """
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    if digest is None:
        sha = hashlib.sha256(text.encode())
        for name in sorted(tensors):
            sha.update(np.ascontiguousarray(tensors[name]).tobytes())
        digest = sha.hexdigest()
    save_file(tensors, path, metadata={"smoothsk": text, "smoothsk_sha256": digest})


def fit_two_features(module=ShiftedNet, **params):
    """A fitted estimator around ``module``, and the 20 two-feature inputs it was fitted on."""
    X = np.linspace(-1, 1, 40, dtype=np.float32).reshape(20, 2)
    clf = SampleWiseSmoothedClassifier(module, max_epochs=1, lr=0.1, sampler=FixedSampler(n=100, n0=10),
                                       random_state=0, **params).fit(X, np.arange(20) % 2)
    return clf, X


def certify_exactly(clf, X):
    prediction, radius, details = clf.certify(X, return_details=True)
    return prediction, radius, details.sigma, details.p_lower, details.n_samples


def assert_same_certificates(a, b, X):
    for left, right in zip(certify_exactly(a, X), certify_exactly(b, X), strict=True):
        np.testing.assert_array_equal(left, right, strict=True)


def params_repr(clf):
    return {name: repr(value) for name, value in clf.get_params(deep=False).items()}


@pytest.fixture(scope="module")
def saved_cnn(fitted_digits_cnn, tmp_path_factory):
    """The session's fitted DigitsCNN saved once (the fixture itself is only read)."""
    path = tmp_path_factory.mktemp("saved") / "cnn.safetensors"
    fitted_digits_cnn.save(path)
    return path


# ---------------------------------------------------------------- round trips

class TestRoundTrip:
    def test_digits_cnn_certifies_and_predicts_bit_identically(self, fitted_digits_cnn, saved_cnn, digits_split):
        X_test = digits_split[2][:30]
        loaded = load(saved_cnn)
        assert_same_certificates(fitted_digits_cnn, loaded, X_test)
        np.testing.assert_array_equal(loaded.predict(X_test), fitted_digits_cnn.predict(X_test), strict=True)
        np.testing.assert_array_equal(loaded.predict_proba(X_test), fitted_digits_cnn.predict_proba(X_test))
        for key, tensor in fitted_digits_cnn.module_.state_dict().items():
            assert torch.equal(loaded.module_.state_dict()[key], tensor)
        np.testing.assert_array_equal(loaded.classes_, fitted_digits_cnn.classes_, strict=True)
        np.testing.assert_array_equal(loaded.train_sigmas_, fitted_digits_cnn.train_sigmas_, strict=True)
        assert loaded.input_shape_ == fitted_digits_cnn.input_shape_
        assert list(loaded.history) == list(fitted_digits_cnn.history)
        assert params_repr(loaded) == params_repr(fitted_digits_cnn)

    def test_every_component_non_default_and_string_labels(self, digits, tmp_path):
        """Nested components, per-sample sigmas, string labels and allocated regions all survive."""
        X, y = digits
        labels = np.array(list("abcdefghij"))[y]
        clf = SampleWiseSmoothedClassifier(
            DigitsCNN, module__width=4,
            training=PretrainFinetune(sigma_min=0.12, sigma_max=0.5, pretrain_epochs=1, finetune_epochs=1,
                                      finetune_lr=0.01, objective=GaussianNoise(num_noise=2),
                                      assignment=GridSigmaSearch(0.12, 0.5, 0.1, n=20)),
            sigma_search=GridSigmaSearch(0.12, 0.5, 0.1, n=20),
            sampler=InputSpecificSampler(n_max=300, decline=0.1, n0_fraction=0.1),
            allocator=OnlineBallAllocator(order="descending"),
            alpha=0.01, lr=0.05, batch_size=50, random_state=0).fit(X[:300], labels[:300])
        clf.certify(X[1000:1020])
        assert len(clf.regions_) > 0
        clf.save(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors")

        assert params_repr(loaded) == params_repr(clf)
        assert loaded.classes_.dtype == clf.classes_.dtype
        np.testing.assert_array_equal(loaded.classes_, clf.classes_, strict=True)
        assert len(np.unique(clf.train_sigmas_)) > 1  # assigned per sample by the grid search
        np.testing.assert_array_equal(loaded.train_sigmas_, clf.train_sigmas_, strict=True)
        saved_arrays, saved_attributes = clf.regions_.to_arrays()
        loaded_arrays, loaded_attributes = loaded.regions_.to_arrays()
        assert loaded_attributes == saved_attributes
        for name, array in saved_arrays.items():
            np.testing.assert_array_equal(loaded_arrays[name], array, strict=True)
        # The loaded regions take part as before: both continue the online allocation identically.
        assert_same_certificates(clf, loaded, X[1100:1120])
        np.testing.assert_array_equal(loaded.predict(X[1200:1210]), clf.predict(X[1200:1210]), strict=True)

    @pytest.mark.parametrize("labels", [
        np.arange(10, dtype=np.int32), np.arange(10, dtype=np.float64) * 2,
        np.array(list("abcdefghij")), np.array(["cat", "dog"] * 5, dtype=object)], ids=repr)
    def test_labels_keep_their_dtype(self, labels, digits, tmp_path):
        X, _ = digits
        clf = SampleWiseSmoothedClassifier(TinyNet, max_epochs=0, sampler=FixedSampler(n=50, n0=10),
                                           random_state=0).fit(X[:10], labels)
        clf.save(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors", module=TinyNet)
        assert loaded.classes_.dtype == clf.classes_.dtype
        np.testing.assert_array_equal(loaded.classes_, clf.classes_, strict=True)
        np.testing.assert_array_equal(loaded.predict(X[:5]), clf.predict(X[:5]), strict=True)

    @pytest.mark.parametrize("module", [RecurrentNet, HookedNet, LegacyNormNet])
    def test_modules_whose_state_is_all_in_their_tensors_round_trip(self, module, tmp_path):
        """Weak references, functions and torch's hook tables differ in every copy, but hold no state the file lacks."""
        clf, X = fit_two_features(module)
        clf.save(tmp_path / "model.safetensors")
        assert_same_certificates(clf, load(tmp_path / "model.safetensors", module=module), X)

    def test_regions_of_a_module_with_hooks_made_in_init_survive_save_and_load(self, tmp_path):
        """The loaded module's hooks are new function objects equal to the saved ones: its regions are kept."""
        clf, X = fit_two_features(HookedNet, allocator=OnlineBallAllocator())
        clf.certify(X[:5])
        clf.save(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors", module=HookedNet)
        assert len(loaded.regions_) == len(clf.regions_) > 0
        assert_same_certificates(clf, loaded, X[5:8])

    def test_parametrized_module_with_a_hook_round_trip(self, tmp_path):
        """Its parametrization and its hook (registered under another handle id when rebuilt) are the saved ones."""
        clf, X = fit_two_features(NormalisedNet)
        clf.save(tmp_path / "model.safetensors")
        assert_same_certificates(clf, load(tmp_path / "model.safetensors", module=NormalisedNet), X)

    @pytest.mark.skipif(torch.cuda.is_available(), reason="tests the fallback where CUDA is missing")
    def test_saved_on_cuda_loads_on_cpu(self, fitted_digits_cnn, saved_cnn, digits_split, tmp_path):
        """Tensors are always stored from the CPU; a file saved with device='cuda' loads with device='cpu'."""
        _, document, tensors = read_file(saved_cnn)
        document["params"]["device"] = "cuda"
        write_file(tmp_path / "cuda.safetensors", document, tensors)
        with pytest.warns(DeviceWarning, match="CUDA is not available"):
            loaded = load(tmp_path / "cuda.safetensors")
        assert loaded.device == "cpu"
        assert_same_certificates(fitted_digits_cnn, loaded, digits_split[2][:10])


# ------------------------------------------------------------ what is saved

class TestSaveRefuses:
    @pytest.mark.parametrize(("params", "named"), [
        ({"random_state": np.random.RandomState(0)}, "random_state"),
        ({"sampler": FixedSampler(n=100, n0=np.array([10]))}, "sampler.n0"),
        ({"module__weight": [1.0, {"a": 1}]}, r"module__weight\[1\]"),
        ({"optimizer__momentum": FixedSampler}, "optimizer__momentum"),
    ], ids=["RandomState", "array inside a component", "dict in a plain list", "class as a plain value"])
    def test_values_outside_the_format_name_the_parameter(self, params, named, make_linear_classifier, tmp_path):
        clf = make_linear_classifier([1.0, -1.0])
        vars(clf).update(params)  # as set after fit, without skorch re-initialising anything
        with pytest.raises(ValueError, match=rf"Cannot save parameter {named}="):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []  # nothing written, not even a temporary file

    def test_a_path_that_cannot_be_written_is_refused_naming_it_before_any_work(self, make_linear_classifier,
                                                                                 tmp_path, monkeypatch):
        clf = make_linear_classifier([1.0, -1.0])
        monkeypatch.setattr(persistence, "_check_rebuilt", lambda *args: pytest.fail("checked the rebuild first"))
        for path, reason in [(tmp_path, "it is a directory"),
                             (tmp_path / "no" / "m.safetensors", "its folder .* does not exist")]:
            with pytest.raises(ValueError, match=rf"Cannot save {path}: {reason}"):
                clf.save(path)

    @pytest.mark.parametrize(("edit", "named"), [
        (lambda module: module.shift.fill_(0.7), "shift"), (lambda module: setattr(module, "scale", 2.0), "scale"),
        (lambda module: module.register_forward_hook(negate), "_forward_hooks"),
        (lambda module: setattr(module, "activation", torch.tanh), "activation"),
        (lambda module: replace_hooks(module, scaled_by(-1.0)), "_forward_hooks")],
        ids=["non-persistent buffer", "attribute", "hook", "function attribute", "closure hook"])
    def test_module_state_outside_the_state_dict_is_refused_naming_it(self, edit, named, tmp_path):
        """The file holds the state_dict only: a module computing with more would load as another classifier."""
        clf, _ = fit_two_features()
        edit(clf.module_)
        with pytest.raises(ValueError, match=rf"Cannot save .*model\.safetensors: module_ holds state that the file "
                                             rf"cannot hold.*: {named} differs.*state outside its state_dict \(a "
                                             r"non-persistent buffer, an attribute changed after construction, a "
                                             r"hook added to it\)"):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []

    def test_selector_state_outside_its_state_dict_is_refused_naming_it(self, make_linear_classifier, tmp_path):
        # bias 3: the input at 0 is class 1 at every level, so the selector has a target to learn.
        clf = make_linear_classifier([1.0, -1.0], bias=3.0, sigma_search=CertifiedSigmaSelector(
            levels=(0.25, 0.5), selector=ShiftedNet, n=50, n0=10))
        clf.sigma_search_.selector_module_.shift.fill_(0.7)
        with pytest.raises(ValueError, match=r"Cannot save .*: sigma_search_ holds state that the file cannot hold"
                                             r".*: selector_module_\.shift differs"):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []

    def test_attribute_set_on_the_estimator_is_refused_naming_it(self, make_linear_classifier, tmp_path):
        """skorch lists it among the parameters, which the class cannot be rebuilt with: refused, not saved."""
        clf = make_linear_classifier([1.0, -1.0])
        clf.threshold = 0.3
        with pytest.raises(ValueError, match=r"Cannot save parameter threshold: SampleWiseSmoothedClassifier takes "
                                             r"no such parameter"):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []

    def test_unfitted(self, tmp_path):
        with pytest.raises(NotFittedError, match="SampleWiseSmoothedClassifier instance is not fitted"):
            SampleWiseSmoothedClassifier(TinyNet).save(tmp_path / "model.safetensors")

    def test_parameters_that_can_name_code_are_not_saved_and_say_so(self, make_linear_classifier, tmp_path):
        clf = make_linear_classifier([1.0, -1.0], callbacks=[EpochTimer()], iterator_train__shuffle=False,
                                     predict_nonlinearity=lambda logits: logits)
        with pytest.warns(UserWarning, match=r"^callbacks, iterator_train__shuffle, predict_nonlinearity not "
                                             r"saved: a model file sets only"):
            clf.save(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors", module=clf.module)
        assert loaded.callbacks is None and loaded.predict_nonlinearity == "auto"
        assert "iterator_train__shuffle" not in loaded.get_params()
        X = np.array([[0.3, 0.1], [-0.2, 0.4]], dtype=np.float32)
        assert_same_certificates(clf, loaded, X)

    def test_a_fitted_learning_rate_scheduler_is_left_out_with_the_warning(self, tmp_path):
        # Its scheduler holds the optimizer, whose state is keyed by the module's parameters.
        scheduler = LRScheduler(policy=MultiStepLR, milestones=[1], gamma=0.1)
        clf, X = fit_two_features(callbacks=[("lr_drop", scheduler)], optimizer__momentum=0.9)
        with pytest.warns(UserWarning, match=r"^callbacks not saved"):
            clf.save(tmp_path / "model.safetensors")
        assert_same_certificates(clf, load(tmp_path / "model.safetensors", module=ShiftedNet), X)


# ------------------------------------------------------------- what is refused

class TestLoadRefuses:
    def test_a_directory_is_refused_naming_it(self, tmp_path):
        with pytest.raises(ValueError, match=rf"{tmp_path}: it is a directory, not a smoothsk model file"):
            load(tmp_path)

    def test_flipped_tensor_byte(self, saved_cnn, tmp_path):
        data = bytearray(saved_cnn.read_bytes())
        data[-1] ^= 0x01  # the last byte belongs to the last tensor's data
        (tmp_path / "flipped.safetensors").write_bytes(data)
        with pytest.raises(ValueError, match=r"flipped\.safetensors: the content does not match its SHA-256 digest"):
            load(tmp_path / "flipped.safetensors")

    def test_edited_json(self, saved_cnn, tmp_path):
        data = saved_cnn.read_bytes()
        # the estimator's alpha, and the region store's owner alpha once the store was used
        assert data.count(b'alpha\\":0.001,') >= 1
        # A same-length edit of the header text: the file stays valid safetensors.
        (tmp_path / "edited.safetensors").write_bytes(data.replace(b'alpha\\":0.001,', b'alpha\\":0.5,  ', 1))
        with pytest.raises(ValueError, match=r"edited\.safetensors: the content does not match its SHA-256 digest"):
            load(tmp_path / "edited.safetensors")

    @pytest.mark.parametrize("version", [0, 2, 4, "3", 3.0])
    def test_unknown_format_version(self, version, saved_cnn, tmp_path):
        _, document, tensors = read_file(saved_cnn)
        document["format_version"] = version
        write_file(tmp_path / "other.safetensors", document, tensors)
        with pytest.raises(ValueError, match=rf"other\.safetensors: format version {version!r} is not the one this "
                                             r"smoothsk reads \(3\)"):
            load(tmp_path / "other.safetensors")

    @pytest.mark.parametrize(("forge", "message"), [
        ("drop", r"the content does not match its SHA-256 digest"),
        ("reshape", r"the content does not match its SHA-256 digest"),
        ("drop, re-sign the old manifest", r"tensors \['module_.layers.0.weight'\] are missing from the file"),
        ("reshape, re-sign the old manifest",
         r"tensor 'module_.layers.0.weight' has .* but the manifest says .*reshaped"),
        ("drop and re-sign", r"module_ tensors \['layers.0.weight'\] are missing from the file"),
        ("reshape and re-sign",
         r"module_ tensor 'layers.0.weight' has .*\[8, 1, 3, 2\].* in the file, but the DigitsCNN"),
        ("reshape regions and re-sign", r"region array 'centres' has dtype float32 and shape \(0, 63\)"),
    ])
    def test_missing_or_reshaped_tensor(self, forge, message, saved_cnn, tmp_path):
        """Caught by the digest, the manifest, or (after a consistent forgery) against the module the params build."""
        metadata, document, tensors = read_file(saved_cnn)
        name = "regions_.centres" if "regions" in forge else "module_.layers.0.weight"
        if forge.startswith("drop"):
            del tensors[name]
        else:
            tensors[name] = tensors[name][..., :-1].copy()  # one value fewer along the last axis
        if forge.endswith("re-sign"):
            document["tensors"] = {key: {"dtype": str(array.dtype), "shape": list(array.shape)}
                                   for key, array in tensors.items()}
            write_file(tmp_path / "forged.safetensors", document, tensors)
        elif forge.endswith("old manifest"):
            write_file(tmp_path / "forged.safetensors", document, tensors)
        else:
            write_file(tmp_path / "forged.safetensors", document, tensors, digest=metadata["smoothsk_sha256"])
        with pytest.raises(ValueError, match=rf"forged\.safetensors: .*{message}"):
            load(tmp_path / "forged.safetensors")

    @pytest.mark.parametrize("name", ["os.system", "subprocess.Popen", "smoothsk_never_imported.Payload"])
    @pytest.mark.parametrize("role", ["component", "class"])
    def test_class_outside_the_allow_list_is_neither_imported_nor_called(self, name, role, saved_cnn, tmp_path,
                                                                         monkeypatch):
        def forbidden(*args, **kwargs):
            raise AssertionError("a class named in the file was called")

        monkeypatch.setattr(os, "system", forbidden)
        monkeypatch.setattr(subprocess, "Popen", forbidden)
        _, document, tensors = read_file(saved_cnn)
        if role == "component":
            document["params"]["sampler"] = {"class": name, "params": {"command": "echo owned"}}
        else:
            document["params"]["optimizer"] = {"type": name}
        write_file(tmp_path / "evil.safetensors", document, tensors)
        where = "sampler" if role == "component" else "optimizer"
        with pytest.raises(ValueError, match=rf"evil\.safetensors: parameter {where} names the class '{name}', "
                                             r"which is not on the allow-list.*nothing was imported"):
            load(tmp_path / "evil.safetensors")
        assert "smoothsk_never_imported" not in sys.modules

    def test_user_module_class_needs_explicit_allowance(self, digits, tmp_path):
        X, y = digits
        clf = SampleWiseSmoothedClassifier(TinyNet, max_epochs=1, lr=0.1, sampler=FixedSampler(n=100, n0=10),
                                           random_state=0).fit(X[:200], y[:200])
        clf.save(tmp_path / "model.safetensors")
        with pytest.raises(ValueError, match=r"parameter module names the class '.*TinyNet', which is not on"):
            load(tmp_path / "model.safetensors")
        for loaded in (load(tmp_path / "model.safetensors", module=TinyNet),
                       load(tmp_path / "model.safetensors", allowed_classes=[TinyNet])):
            assert loaded.module is TinyNet
            assert_same_certificates(clf, loaded, X[1000:1010])

    def test_module_instance_must_be_passed_again(self, digits, tmp_path):
        X, y = digits
        clf = SampleWiseSmoothedClassifier(TinyNet(), max_epochs=1, lr=0.1, sampler=FixedSampler(n=100, n0=10),
                                           random_state=0).fit(X[:200], y[:200])
        clf.save(tmp_path / "model.safetensors")
        with pytest.raises(ValueError, match=r"saved as an instance of '.*TinyNet'.*load\(path, module=\.\.\.\)"):
            load(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors", module=TinyNet())
        assert_same_certificates(clf, loaded, X[1000:1010])

    def test_parameter_the_estimator_does_not_take_names_the_file(self, make_linear_classifier, tmp_path):
        make_linear_classifier([1.0, -1.0]).save(tmp_path / "model.safetensors")
        _, document, tensors = read_file(tmp_path / "model.safetensors")
        document["params"]["threshold"] = 0.3
        write_file(tmp_path / "forged.safetensors", document, tensors)
        with pytest.raises(ValueError, match=r"forged\.safetensors: parameter 'threshold' is not one a model file "
                                             r"may set"):
            load(tmp_path / "forged.safetensors", module=LinearLogits)

    def test_files_that_are_not_smoothsk_models(self, tmp_path):
        (tmp_path / "garbage.bin").write_bytes(b"not a model at all, just some bytes")
        with pytest.raises(ValueError, match=r"garbage\.bin: not a readable safetensors file"):
            load(tmp_path / "garbage.bin")
        save_file({"weight": np.zeros(3, dtype=np.float32)}, tmp_path / "plain.safetensors")
        with pytest.raises(ValueError, match=r"plain\.safetensors: not a smoothsk model file"):
            load(tmp_path / "plain.safetensors")


# ------------------------------------------------------------------ certified sigma functions

@pytest.fixture(scope="module")
def heterogeneous_margins():
    """64-dimensional inputs whose best noise level differs between class groups (300 to fit, 100 to test)."""
    X, y = make_heterogeneous_margins(n_samples=400, n_features=64, random_state=0)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def fitted_selector_model(heterogeneous_margins):
    """TinyNet with a CertifiedSigmaSelector trained in fit (its default selector: TinyNet with K outputs)."""
    X, y = heterogeneous_margins
    return SampleWiseSmoothedClassifier(
        TinyNet, module__n_classes=12, max_epochs=5, lr=0.1, sampler=FixedSampler(n=200, n0=20), random_state=0,
        sigma_search=CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), selector_sigma=0.5, n=200, n0=20,
                                            selector_epochs=5)).fit(X[:300], y[:300])


def assert_same_g_certificates(a, b, X):
    """Identical certificates of G, including the selector's radius cap and samples, and predictions."""
    assert_same_certificates(a, b, X)
    for left, right in zip(a.certify(X, return_details=True)[2:], b.certify(X, return_details=True)[2:],
                           strict=True):
        np.testing.assert_array_equal(left.radius_cap, right.radius_cap, strict=True)
        np.testing.assert_array_equal(left.sigma_samples, right.sigma_samples, strict=True)
    np.testing.assert_array_equal(a.predict(X), b.predict(X), strict=True)


class TestCertifiedSigmaFunctions:
    def test_trained_selector_round_trip(self, fitted_selector_model, heterogeneous_margins, tmp_path):
        clf = fitted_selector_model
        clf.save(tmp_path / "selector.safetensors")
        loaded = load(tmp_path / "selector.safetensors", module=TinyNet)
        fitted = loaded.sigma_search_
        assert isinstance(fitted, CertifiedSigmaSelector) and fitted is not loaded.sigma_search
        assert params_repr(fitted) == params_repr(clf.sigma_search_)
        np.testing.assert_array_equal(fitted.levels_, clf.sigma_search_.levels_, strict=True)
        np.testing.assert_array_equal(fitted.train_levels_, clf.sigma_search_.train_levels_, strict=True)
        for key, tensor in clf.sigma_search_.selector_module_.state_dict().items():
            assert torch.equal(fitted.selector_module_.state_dict()[key], tensor)
        X_test = heterogeneous_margins[0][300:340]
        _, _, details = clf.certify(X_test, return_details=True)
        assert len(np.unique(details.sigma)) > 1  # the selector chooses: the test would see a wrong one
        assert_same_g_certificates(clf, loaded, X_test)

    def test_selector_noise_resolved_at_fit_survives_a_new_default(self, heterogeneous_margins, tmp_path,
                                                                    monkeypatch):
        # selector_sigma=None: the file must keep the noise the selector was trained with, so that a later
        # version's default (here the module constant moved) certifies the same G from the same file.
        X, y = heterogeneous_margins
        clf = SampleWiseSmoothedClassifier(
            TinyNet, module__n_classes=12, max_epochs=2, lr=0.1, sampler=FixedSampler(n=200, n0=20), random_state=0,
            sigma_search=CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), n=200, n0=20, selector_epochs=2,
                                                certify_reachable_levels=False)).fit(X[:300], y[:300])
        clf.save(tmp_path / "selector.safetensors")
        prediction, radius, details = clf.certify(X[300:340], return_details=True)
        monkeypatch.setattr(_selector, "SELECTOR_NOISE_PER_LEVEL", 3 * _selector.SELECTOR_NOISE_PER_LEVEL)
        loaded = load(tmp_path / "selector.safetensors", module=TinyNet)
        prediction_after, radius_after, details_after = loaded.certify(X[300:340], return_details=True)
        np.testing.assert_array_equal(prediction_after, prediction, strict=True)
        np.testing.assert_array_equal(radius_after, radius, strict=True)
        np.testing.assert_array_equal(details_after.radius_cap, details.radius_cap, strict=True)

    def test_semi_elastic_round_trip(self, digits, tmp_path):
        X, y = digits
        clf = SampleWiseSmoothedClassifier(TinyNet, max_epochs=1, lr=0.1, sampler=FixedSampler(n=200, n0=20),
                                           sigma_search=SemiElasticSigma(0.25, r=0.01, k=5),
                                           random_state=0).fit(X[:200], y[:200])
        clf.save(tmp_path / "semi.safetensors")
        loaded = load(tmp_path / "semi.safetensors", module=TinyNet)
        assert loaded.sigma_search_.offset_ == clf.sigma_search_.offset_
        np.testing.assert_array_equal(loaded.sigma_search_.sigma(X[1000:1040]), clf.sigma_search_.sigma(X[1000:1040]),
                                      strict=True)
        assert_same_g_certificates(clf, loaded, X[1000:1040])

    def test_selector_instance_is_refused_naming_it(self, make_linear_classifier, tmp_path):
        clf = make_linear_classifier([1.0, -1.0], sigma_search=CertifiedSigmaSelector(
            levels=(0.25, 0.5), selector=FlatMLP(n_classes=2), fit_selector=False, n=50, n0=10))
        with pytest.raises(ValueError, match=r"Cannot save parameter sigma_search_\.selector=FlatMLP"):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []

    def test_sigma_function_without_a_file_form_is_refused_not_dropped(self, make_linear_classifier, tmp_path):
        """A saved file must not silently lose the fitted sigma function its certificates need."""

        class Unsavable(SemiElasticSigma):
            fitted_arrays = None

        clf = make_linear_classifier([1.0, -1.0], sigma_search=Unsavable(0.5, r=0.1, k=1))
        with pytest.raises(ValueError, match=r"Cannot save sigma_search_ \(the fitted Unsavable\): .*fitted_arrays"):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []

    @pytest.mark.parametrize(("forge", "message"), [
        ("drop selector weight", r"sigma_search_ selector tensors \['linear.weight'\] are missing from the file"),
        ("reshape selector weight", r"sigma_search_ selector tensor 'linear.weight' has .*\[3, 63\].* in the file"),
        ("level out of range", r"sigma_search_ levels must be a non-empty float64 vector of distinct finite"),
        ("target out of range", r"sigma_search_ train_levels must be an int64 vector of indices into the 3 levels"),
        ("negative noise", r"sigma_search_ selector_sigma must be a float64 scalar noise level > 0"),
        ("extra array", r"sigma_search_ has arrays \['payload'\] that a CertifiedSigmaSelector does not use"),
        ("no entry", r"the file holds sigma_search_ tensors .* but no sigma_search_ entry"),
        ("foreign class", r"parameter sigma_search_ names the class 'os.system', which is not on the allow-list"),
    ])
    def test_forged_selector_state_is_refused(self, forge, message, fitted_selector_model, tmp_path):
        """Each forgery is re-signed (a forger can): it is caught by the checks of what was loaded."""
        fitted_selector_model.save(tmp_path / "selector.safetensors")
        _, document, tensors = read_file(tmp_path / "selector.safetensors")
        weight = "sigma_search_.selector.linear.weight"
        if forge == "drop selector weight":
            del tensors[weight]
        elif forge == "reshape selector weight":
            tensors[weight] = tensors[weight][:, :-1].copy()
        elif forge == "level out of range":
            tensors["sigma_search_.levels"] = np.array([0.25, -0.5, 1.0])
        elif forge == "negative noise":
            tensors["sigma_search_.selector_sigma"] = np.array(-0.5)
        elif forge == "target out of range":
            tensors["sigma_search_.train_levels"] = tensors["sigma_search_.train_levels"] + 3
        elif forge == "extra array":
            tensors["sigma_search_.payload"] = np.zeros(2)
        elif forge == "no entry":
            document["sigma_search_"] = None
        else:
            document["sigma_search_"]["class"] = "os.system"
        document["tensors"] = {key: {"dtype": str(array.dtype), "shape": list(array.shape)}
                               for key, array in tensors.items()}
        write_file(tmp_path / "forged.safetensors", document, tensors)
        with pytest.raises(ValueError, match=rf"forged\.safetensors: .*{message}"):
            load(tmp_path / "forged.safetensors", module=TinyNet)

    def test_forged_semi_elastic_inputs_are_refused(self, make_linear_classifier, tmp_path):
        clf = make_linear_classifier([1.0, -1.0], sigma_search=SemiElasticSigma(0.5, r=0.1, k=1))
        clf.save(tmp_path / "semi.safetensors")
        _, document, tensors = read_file(tmp_path / "semi.safetensors")
        tensors["sigma_search_.training_inputs"] = np.zeros((2, 3))  # the inputs have 2 features
        document["tensors"] = {key: {"dtype": str(array.dtype), "shape": list(array.shape)}
                               for key, array in tensors.items()}
        write_file(tmp_path / "forged.safetensors", document, tensors)
        with pytest.raises(ValueError, match=r"forged\.safetensors: sigma_search_ of a SemiElasticSigma must hold "
                                             r"exactly 'training_inputs' \(float64, shape \(n_train >= k=1, 2\)\)"):
            load(tmp_path / "forged.safetensors", module=clf.module)


class TestModuleClassParameters:
    """A module parameter may name module classes (a module built from the classes of its parts)."""

    def test_a_module_parameter_may_be_a_module_class(self, tmp_path):
        clf, X = fit_two_features(ActivatedNet, module__activation=nn.Tanh)
        clf.save(tmp_path / "model.safetensors")
        with pytest.raises(ValueError, match=r"parameter module__activation names the class 'torch\.nn\.modules\."
                                             r"activation\.Tanh', which is not on the allow-list"):
            load(tmp_path / "model.safetensors", allowed_classes=[ActivatedNet])
        loaded = load(tmp_path / "model.safetensors", allowed_classes=[ActivatedNet, nn.Tanh])
        assert loaded.module__activation is nn.Tanh
        assert_same_certificates(clf, loaded, X)

    @pytest.mark.parametrize("value", [FixedSampler, (nn.Tanh, [nn.ReLU])])
    def test_module_parameters_name_only_module_classes_alone_or_in_a_list_or_tuple(self, value, tmp_path):
        clf, _ = fit_two_features(ActivatedNet, module__activation=value)
        with pytest.raises(ValueError, match=r"Cannot save parameter module__activation.*: a saved model holds "
                                             r"only None, bools, numbers, strings, module classes, and lists or "
                                             r"tuples of them"):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []


class TestNoiseLevelExperts:
    """A module of experts per noise level is saved as its class, its levels and its experts' classes."""

    def test_experts_and_their_selector_round_trip_without_a_module_argument(self, fitted_experts, tmp_path):
        clf, X, _ = fitted_experts
        clf.save(tmp_path / "experts.safetensors")
        loaded = load(tmp_path / "experts.safetensors")
        assert loaded.module is NoiseLevelExperts
        assert loaded.get_params_for("module") == {"levels": (0.25, 0.5, 1.0), "experts": (FlatMLP,) * 3}
        assert loaded.module_.levels == clf.module_.levels
        for key, tensor in clf.module_.state_dict().items():
            assert torch.equal(loaded.module_.state_dict()[key], tensor), key
        for key, tensor in clf.sigma_search_.selector_module_.state_dict().items():
            assert torch.equal(loaded.sigma_search_.selector_module_.state_dict()[key], tensor), key
        _, _, details = clf.certify(X, return_details=True)
        assert len(np.unique(details.sigma)) > 1  # the selector routes inputs to several experts
        assert_same_g_certificates(clf, loaded, X)

    def test_a_loaded_set_of_experts_is_refit_only_as_the_trained_instance(self, fitted_experts, tmp_path):
        clf, X, y = fitted_experts
        clf.save(tmp_path / "experts.safetensors")
        loaded = load(tmp_path / "experts.safetensors")
        with pytest.raises(ValueError, match=r"module must be the trained torch\.nn\.Module instance.*"
                                             r"set_params\(module=estimator\.module_\)"):
            loaded.fit(X, y)

    def test_expert_classes_not_on_the_allow_list_need_explicit_allowance(self, tmp_path):
        X = np.random.default_rng(0).normal(size=(20, 64)).astype(np.float32)
        y = (X[:, 0] > 0).astype(np.int64)
        clf = SampleWiseSmoothedClassifier(
            NoiseLevelExperts((0.25, 0.5), [TinyNet(n_classes=2), TinyNet(n_classes=2)]), training=Pretrained(),
            sampler=FixedSampler(n=100, n0=10), max_epochs=0, random_state=0).fit(X, y)
        clf.save(tmp_path / "experts.safetensors")
        with pytest.raises(ValueError, match=r"parameter module__experts\[0\] names the class '.*TinyNet', which "
                                             r"is not on the allow-list.*allowed_classes=\[TheClass\]"):
            load(tmp_path / "experts.safetensors")
        loaded = load(tmp_path / "experts.safetensors", allowed_classes=[TinyNet])
        assert loaded.get_params_for("module")["experts"] == (TinyNet, TinyNet)
        assert_same_certificates(clf, loaded, X)

    def test_the_estimator_s_own_module_parameters_are_refused_beside_the_experts(self, tmp_path):
        """The instance gives the module's parameters: others would rebuild another module."""
        X = np.random.default_rng(0).normal(size=(20, 5)).astype(np.float32)
        experts = NoiseLevelExperts((0.25, 0.5), (FlatMLP, FlatMLP), n_classes=2)
        clf = SampleWiseSmoothedClassifier(experts, module__levels=(0.25, 0.5), module__experts=(FlatMLP, FlatMLP),
                                           training=Pretrained(), sampler=FixedSampler(n=100, n0=10),
                                           max_epochs=0, random_state=0).fit(X, (X[:, 0] > 0).astype(np.int64))
        with pytest.raises(ValueError, match=r"Cannot save module__experts, module__levels: the module is a "
                                             r"NoiseLevelExperts instance, saved as its class and its "
                                             r"constructor_params\(\)"):
            clf.save(tmp_path / "experts.safetensors")
        assert os.listdir(tmp_path) == []

    def test_experts_their_classes_cannot_rebuild_are_refused_at_saving(self, tmp_path):
        """A FlatMLP of another width than its class's default: the file could not rebuild it."""
        X = np.random.default_rng(0).normal(size=(20, 5)).astype(np.float32)
        experts = [FlatMLP(n_classes=2, hidden=8), FlatMLP(n_classes=2)]
        for expert in experts:
            expert(torch.zeros(1, 5))
        clf = SampleWiseSmoothedClassifier(NoiseLevelExperts((0.25, 0.5), experts), training=Pretrained(),
                                           sampler=FixedSampler(n=100, n0=10), max_epochs=0,
                                           random_state=0).fit(X, (X[:, 0] > 0).astype(np.int64))
        with pytest.raises(ValueError, match=r"Cannot save .*experts\.safetensors: module_ tensor "
                                             r"'experts\.0\.layers\.1\.weight' has .*\[8, 5\].* in the file, "
                                             r"but the NoiseLevelExperts built from the saved parameters has"):
            clf.save(tmp_path / "experts.safetensors")
        assert os.listdir(tmp_path) == []


class TestNormalizedModules:
    """A network behind ``Normalize``: saved safely, its statistics as tensors, the units of X kept."""

    MEAN, STD = (0.5, -1.0), (0.25, 2.0)

    def test_normalized_class_round_trips_without_a_module_argument(self, tmp_path):
        clf, X = fit_two_features(Normalized, module__net=FlatMLP, module__mean=self.MEAN, module__std=self.STD)
        clf.save(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors")
        assert loaded.module is Normalized and loaded.get_params_for("module") == {
            "net": FlatMLP, "mean": self.MEAN, "std": self.STD}
        torch.testing.assert_close(loaded.module_.normalize.std, torch.tensor(self.STD), rtol=0, atol=0)
        assert_same_certificates(clf, loaded, X)

    def test_normalized_instance_round_trips_as_its_class_and_statistics(self, tmp_path):
        """A trained network wrapped afterwards (what ``smoothsk certify --normalize`` does) loads back alone."""
        trained, X = fit_two_features(FlatMLP)
        clf, _ = fit_two_features(Normalized(trained.module_, self.MEAN, self.STD), training=Pretrained())
        clf.save(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors")
        assert loaded.module is Normalized and loaded.get_params_for("module")["net"] is FlatMLP
        assert_same_certificates(clf, loaded, X)

    def test_sequential_with_normalize_loads_only_with_its_module_given_again(self, tmp_path):
        """``nn.Sequential`` gives no constructor parameters: the file names an instance it cannot rebuild."""
        def network():
            return nn.Sequential(Normalize(self.MEAN, self.STD), nn.Linear(2, 2))

        clf, X = fit_two_features(network())
        clf.save(tmp_path / "model.safetensors")
        with pytest.raises(ValueError, match=r"the module was saved as an instance of 'torch\.nn\.modules\."
                                             r"container\.Sequential'.*load\(path, module=\.\.\.\)"):
            load(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors", module=network())
        torch.testing.assert_close(loaded.module_[0].mean, torch.tensor(self.MEAN), rtol=0, atol=0)
        assert_same_certificates(clf, loaded, X)

    def test_statistics_changed_after_fit_are_saved_with_the_weights(self, tmp_path):
        clf, X = fit_two_features(Normalized, module__net=FlatMLP, module__mean=self.MEAN, module__std=self.STD)
        clf.module_.normalize.std.mul_(2)  # a buffer: in the state_dict, so the file holds the new values
        clf.save(tmp_path / "model.safetensors")
        loaded = load(tmp_path / "model.safetensors")
        torch.testing.assert_close(loaded.module_.normalize.std, 2 * torch.tensor(self.STD), rtol=0, atol=0)
        assert_same_certificates(clf, loaded, X)

    def test_a_network_its_class_cannot_rebuild_is_refused_at_saving(self, tmp_path):
        X = np.linspace(-1, 1, 40, dtype=np.float32).reshape(20, 2)
        net = FlatMLP(n_classes=2, hidden=8)
        net(torch.zeros(1, 2))
        clf = SampleWiseSmoothedClassifier(Normalized(net, self.MEAN, self.STD), training=Pretrained(),
                                           sampler=FixedSampler(n=100, n0=10), max_epochs=0,
                                           random_state=0).fit(X, np.arange(20) % 2)
        with pytest.raises(ValueError, match=r"Cannot save .*model\.safetensors: module_ tensor "
                                             r"'net\.layers\.1\.weight' has .*\[8, 2\].* in the file, "
                                             r"but the Normalized built from the saved parameters has"):
            clf.save(tmp_path / "model.safetensors")
        assert os.listdir(tmp_path) == []
