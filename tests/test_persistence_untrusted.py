"""Model files from elsewhere: nothing in a file runs code, allocates what its size does not justify, or loads
unauthenticated when a key is required.

Each hostile file starts from a valid saved model and is re-signed as a forger can (the unkeyed digest has no
secret). Loads that could exhaust memory run in a subprocess under an address-space limit, so that a defect fails
the test instead of the machine.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.experts import NoiseLevelExperts
from smoothsk.models import CifarResNet, FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import GridSigmaSearch
from smoothsk.training import FixedSigmaTraining

from conftest import forbid

load = SampleWiseSmoothedClassifier.load

#: Address-space limit of the subprocess that loads memory-hostile files (torch alone maps about 1.5 GB).
ADDRESS_SPACE_LIMIT = 4 * 2**30
#: Largest peak-RSS growth allowed while loading a hostile file of under 40 KB.
RSS_GROWTH_LIMIT_MB = 200


def read_file(path):
    """(JSON document, tensors as numpy arrays) of a saved model."""
    with safe_open(path, framework="np") as file:
        document = json.loads(file.metadata()["smoothsk"])
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118
    return document, tensors


def forge(path, document, tensors):
    """Write ``document`` and ``tensors`` (arrays or torch tensors) as an unkeyed model file with a valid digest, as
    a forger can."""
    tensors = {name: torch.as_tensor(array).clone() for name, array in tensors.items()}
    document = {**document, "tensors": {name: {"dtype": str(tensor.dtype).removeprefix("torch."),
                                               "shape": list(tensor.shape)} for name, tensor in tensors.items()}}
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode())
    for name in sorted(tensors):
        if tensors[name].numel():  # an empty tensor has no bytes (and no byte view)
            digest.update(tensors[name].reshape(-1).view(torch.uint8).numpy())
    save_file(tensors, path, metadata={"smoothsk": text, "smoothsk_sha256": digest.hexdigest()})
    return path


def forged_with(source, path, **params):
    """``source`` re-signed at ``path`` with ``params`` set in its document, as a forger can."""
    document, tensors = read_file(source)
    document["params"].update(params)
    return forge(path, document, tensors)


@pytest.fixture(scope="module")
def flat_mlp_file(tmp_path_factory):
    """A fitted FlatMLP (hidden 8) on 6 features, saved: the file every forgery here starts from."""
    X = np.random.RandomState(0).rand(40, 6).astype(np.float32)
    clf = SampleWiseSmoothedClassifier(FlatMLP, module__hidden=8, training=FixedSigmaTraining(0.25),
                                       sampler=FixedSampler(n=100, n0=10), max_epochs=1, random_state=0)
    path = tmp_path_factory.mktemp("model") / "model.safetensors"
    clf.fit(X, (X[:, 0] > 0.5).astype(np.int64)).save(path)
    return path


def refused_in_subprocess(paths):
    """Load each file in a fresh, memory-limited process; per file: (exception type, message, RSS growth in MB)."""
    script = textwrap.dedent(f"""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_LIMIT}, {ADDRESS_SPACE_LIMIT}))
        from smoothsk import SampleWiseSmoothedClassifier
        results = []
        for path in sys.argv[1:]:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            try:
                SampleWiseSmoothedClassifier.load(path)
                outcome = [None, ""]
            except Exception as error:
                outcome = [type(error).__name__, str(error)]
            growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
            results.append(outcome + [growth])
        print(json.dumps(results))
    """)
    done = subprocess.run([sys.executable, "-c", script, *map(str, paths)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def experts_file(fitted_experts, tmp_path_factory):
    """Three FlatMLP experts with a fitted selector, saved: the file the experts' forgeries start from."""
    path = tmp_path_factory.mktemp("experts") / "experts.safetensors"
    fitted_experts[0].save(path)
    return path


# ---------------------------------------------------------------- code execution

class TestNothingInAFileRunsCode:
    def test_compile_options_that_run_a_shell_command_are_refused(self, flat_mlp_file, tmp_path):
        """torch.compile's C++ build takes its flags from compile__options: a file must not set them."""
        marker = tmp_path / "owned"
        document, tensors = read_file(flat_mlp_file)
        document["params"]["compile"] = True
        document["params"]["compile__options"] = {"dict": {"cpp.march": (
            f"native -wrapper '/bin/sh,-c,touch {marker}; exec \"$0\" \"$@\"'")}}
        tensors = {name.replace("module_.", "module_._orig_mod.", 1): array for name, array in tensors.items()}
        evil = forge(tmp_path / "evil.safetensors", document, tensors)
        with pytest.raises(ValueError, match=r"evil\.safetensors: parameter 'compile' is not one a model file may "
                                             r"set") as refusal:
            load(evil).predict(np.zeros((1, 6), dtype=np.float32))
        assert "\n" not in str(refusal.value)
        assert not marker.exists()

    @pytest.mark.parametrize(("name", "value"), [
        ("torch_load_kwargs", {"dict": {"weights_only": False}}),
        ("callbacks", None),
        ("callbacks__print_log__sink", "print"),
        ("iterator_train", {"type": "torch.utils.data.DataLoader"}),
        ("iterator_valid__collate_fn", {"type": "smoothsk.models.FlatMLP"}),
        ("dataset", {"type": "skorch.dataset.Dataset"}),
        ("criterion", {"type": "torch.nn.CrossEntropyLoss"}),
        ("criterion__weight", [1.0, 2.0]),
        ("train_split", None),
        ("predict_nonlinearity", "auto"),
        ("use_caching", "auto"),
        ("compile__fullgraph", True),
    ])
    def test_parameters_outside_the_allow_list_are_refused_by_name(self, name, value, flat_mlp_file, tmp_path):
        evil = forged_with(flat_mlp_file, tmp_path / "evil.safetensors", **{name: value})
        with pytest.raises(ValueError, match=rf"evil\.safetensors: parameter '{name}' is not one a model file may "
                                             r"set"):
            load(evil)

    @pytest.mark.parametrize(("name", "value"), [
        ("module__hidden", {"class": "smoothsk.models.FlatMLP", "params": {"hidden": 8}}),
        ("optimizer__momentum", {"type": "smoothsk.models.FlatMLP"}),
        ("optimizer__momentum", {"class": "smoothsk.sampling.FixedSampler", "params": {"n": 10, "n0": 1}}),
        ("module__hidden", {"dict": {"a": 1}}),
        ("lr", [0.1]),
        ("alpha", {"tuple": [0.1]}),
    ])
    def test_plain_parameters_take_only_plain_values(self, name, value, flat_mlp_file, tmp_path):
        evil = forged_with(flat_mlp_file, tmp_path / "evil.safetensors", **{name: value})
        with pytest.raises(ValueError, match=rf"evil\.safetensors: parameter '{name}' must be "):
            load(evil)

    @pytest.mark.parametrize("name", ["smoothsk.models.FlatMLP", "smoothsk.regions.RegionStore", "torch.optim.SGD"])
    def test_only_components_are_built_from_the_file_s_values(self, name, flat_mlp_file, tmp_path):
        """A class on the allow-list is called with the file's values only if it is a component (get_params)."""
        document, tensors = read_file(flat_mlp_file)
        document["params"]["sampler"] = {"class": name, "params": {"hidden": 10**9}}
        evil = forge(tmp_path / "evil.safetensors", document, tensors)
        with pytest.raises(ValueError, match=rf"evil\.safetensors: parameter sampler names {name} as a component, "
                                             r"which it is not .*nothing was built"):
            load(evil)

    def test_deeply_nested_json_is_refused_in_one_line(self, flat_mlp_file, tmp_path):
        document, tensors = read_file(flat_mlp_file)
        document["params"]["module__hidden"] = json.loads("[" * 50 + "]" * 50)
        evil = forge(tmp_path / "evil.safetensors", document, tensors)
        with pytest.raises(ValueError, match=r"evil\.safetensors: .*nest"):
            load(evil)
        # Deeper than the JSON parser's own recursion: a ValueError, never a RecursionError.
        text = json.dumps(document, sort_keys=True, separators=(",", ":"))
        text = text.replace('"module__hidden":', '"module__hidden":' + "[" * 100_000 + "]" * 100_000 + ",\"x\":", 1)
        digest = hashlib.sha256(text.encode())
        for name in sorted(tensors):
            digest.update(np.ascontiguousarray(tensors[name]).tobytes())
        save_file({name: torch.as_tensor(array) for name, array in tensors.items()}, tmp_path / "deep.safetensors",
                  metadata={"smoothsk": text, "smoothsk_sha256": digest.hexdigest()})
        with pytest.raises(ValueError, match=r"deep\.safetensors: "):
            load(tmp_path / "deep.safetensors")


class TestForgedExperts:
    """A module parameter names classes only from the allow-list, and only module classes; it builds nothing."""

    @pytest.mark.parametrize("name", ["os.system", "smoothsk_never_imported.Payload", "torch.nn.Linear"])
    def test_an_expert_class_outside_the_allow_list_is_refused_before_anything_is_built(
            self, name, experts_file, tmp_path, monkeypatch):
        forbid(monkeypatch, NoiseLevelExperts, "__init__", "a module was built from a refused file")
        forbid(monkeypatch, os, "system", "a class named in the file was called")
        experts = {"tuple": [{"type": "smoothsk.models.FlatMLP"}, {"type": name}, {"type": "smoothsk.models.FlatMLP"}]}
        evil = forged_with(experts_file, tmp_path / "evil.safetensors", module__experts=experts)
        with pytest.raises(ValueError, match=rf"evil\.safetensors: parameter module__experts\[1\] names the class "
                                             rf"'{name}', which is not on the allow-list.*nothing was imported"):
            load(evil)
        assert "smoothsk_never_imported" not in sys.modules

    @pytest.mark.parametrize("value", [
        {"tuple": [{"class": "smoothsk.models.FlatMLP", "params": {"hidden": 10**9}}] * 3},
        {"class": "smoothsk.experts.NoiseLevelExperts",
         "params": {"levels": [0.25], "experts": [{"type": "smoothsk.models.FlatMLP"}]}},
        [[{"type": "smoothsk.models.FlatMLP"}]] * 3,
        {"tuple": [{"type": "smoothsk.models.FlatMLP", "params": {}}] * 3},
    ], ids=["component items", "component", "nested", "class with extra keys"])
    def test_a_module_parameter_is_never_a_component_built_from_the_file(self, value, experts_file, tmp_path,
                                                                        monkeypatch):
        forbid(monkeypatch, NoiseLevelExperts, "__init__", "a module was built from a refused file")
        forbid(monkeypatch, FlatMLP, "__init__", "a module was built from the file's values")
        evil = forged_with(experts_file, tmp_path / "evil.safetensors", module__experts=value)
        with pytest.raises(ValueError, match=r"evil\.safetensors: parameter 'module__experts' must be None, a bool, "
                                             r"a number, a string, a module class \(\{'type': name\}\), or a list "
                                             r"or tuple of them; got "):
            load(evil)

    @pytest.mark.parametrize("name", ["smoothsk.sampling.FixedSampler", "torch.optim.SGD"])
    def test_a_module_parameter_names_only_module_classes(self, name, experts_file, tmp_path, monkeypatch):
        forbid(monkeypatch, NoiseLevelExperts, "__init__", "a module was built from a refused file")
        evil = forged_with(experts_file, tmp_path / "evil.safetensors", module__experts={"tuple": [{"type": name}] * 3})
        with pytest.raises(ValueError, match=rf"evil\.safetensors: parameter module__experts\[0\] names {name}, "
                                             r"which is not a module class"):
            load(evil)

    def test_many_experts_are_refused_by_the_module_s_budget(self, experts_file, tmp_path):
        """2,000 experts from 12 tensors of weights: the build on the meta device stops at the budget."""
        levels = {"tuple": [0.25 + i / 1000 for i in range(2000)]}
        experts = {"tuple": [{"type": "smoothsk.models.FlatMLP"}] * 2000}
        evil = forged_with(experts_file, tmp_path / "evil.safetensors", module__levels=levels,
                           module__experts=experts)
        with pytest.raises(ValueError, match=r"evil\.safetensors: the module_ built from the saved parameters would "
                                             r"hold more than the file's 12 tensors of it justify"):
            load(evil)


# ------------------------------------------------------------------ one clear error

def _one_region(tensors, **values):
    """``tensors`` with a region store of one region (a valid certificate, unless ``values`` replace some)."""
    region = {"centres": np.zeros((1, 6), np.float32), "radii": np.array([0.5]), "sigmas": np.array([0.25]),
              "predictions": np.array([1]), "p_lowers": np.array([0.9])}
    return {**tensors, **{f"regions_.{name}": values.get(name, array) for name, array in region.items()}}


class TestOneClearError:
    """What a file holds that loading cannot use is refused by loading, in one ValueError naming the file."""

    @pytest.mark.parametrize(("edit", "why"), [
        (lambda text: text.replace('"module__hidden":8', '"module__hidden":' + "9" * 5000), "digits"),
        (lambda text: text.replace('"sigma":0.25', '"sigma":' + str(10**30)), "64 bits"),
    ])
    def test_integers_beyond_64_bits_are_refused(self, edit, why, flat_mlp_file, tmp_path):
        """Python's int() refuses over 4300 digits (a ValueError not naming the file); a shorter huge sigma passed
        validation as a Real and raised OverflowError in certify."""
        document, tensors = read_file(flat_mlp_file)
        text = edit(json.dumps(document, sort_keys=True, separators=(",", ":")))
        digest = hashlib.sha256(text.encode())
        for name in sorted(tensors):
            digest.update(np.ascontiguousarray(tensors[name]).tobytes())
        path = tmp_path / "evil.safetensors"
        save_file({name: torch.as_tensor(array) for name, array in tensors.items()}, path,
                  metadata={"smoothsk": text, "smoothsk_sha256": digest.hexdigest()})
        with pytest.raises(ValueError, match=rf"evil\.safetensors: .*integers of at most 64 bits.*{why}") as refusal:
            load(path)
        assert "\n" not in str(refusal.value)

    LONG = "x" * 5000

    @pytest.mark.parametrize("edit", [
        lambda doc: doc.update(format_version=TestOneClearError.LONG),
        lambda doc: doc.update(format_version=0, library_version=TestOneClearError.LONG),
        lambda doc: doc.update(estimator=TestOneClearError.LONG),
        lambda doc: doc.update(classes_={"dtype": "<i8", "values": list(range(3000, 0, -1))}),
        lambda doc: doc.update(classes_={"dtype": TestOneClearError.LONG, "values": [0, 1]}),
        lambda doc: doc.update(input_shape_=[0] * 3000),
        lambda doc: doc["params"].update({TestOneClearError.LONG: 1}),
        lambda doc: doc["params"].update(module={"type": TestOneClearError.LONG}),
        lambda doc: doc["params"].update(module={"instance": TestOneClearError.LONG}),
        lambda doc: doc["params"].update(sampler={"class": "smoothsk.sampling.FixedSampler",
                                                  "params": {"n": TestOneClearError.LONG}}),
        lambda doc: doc["params"].update(sampler={"class": "smoothsk.sampling.FixedSampler",
                                                  "params": {TestOneClearError.LONG: 1}}),
        lambda doc: doc["params"].update(sampler={"class": TestOneClearError.LONG, "params": {}}),
        lambda doc: doc["params"].update(sampler={"weird": [TestOneClearError.LONG]}),
    ], ids=["format version", "library version", "estimator", "3000 unsorted labels", "labels' dtype",
            "input shape", "parameter name", "module type", "module instance", "component value", "component keyword",
            "component class", "malformed value"])
    def test_a_refusal_quotes_the_file_s_values_shortened(self, edit, flat_mlp_file, tmp_path):
        """Every refusal that quotes what a file holds shortens it: each of these quoted 5-17 kB."""
        document, tensors = read_file(flat_mlp_file)
        edit(document)
        with pytest.raises(ValueError, match=r"evil\.safetensors") as refusal:
            load(forge(tmp_path / "evil.safetensors", document, tensors))
        assert "\n" not in str(refusal.value) and len(str(refusal.value)) < 700, str(refusal.value)[:1000]

    def test_a_refusal_of_the_module_s_tensors_quotes_their_names_shortened(self, flat_mlp_file, tmp_path):
        """3,000 extra module tensors, listed in the manifest, gave a refusal of 159 kB."""
        document, tensors = read_file(flat_mlp_file)
        tensors = {**tensors, **{f"module_.extra_{i:04d}_{'x' * 30}": np.zeros(0, np.float32) for i in range(3000)}}
        with pytest.raises(ValueError, match=r"evil\.safetensors: the file has module_ tensors") as refusal:
            load(forge(tmp_path / "evil.safetensors", document, tensors))
        assert "\n" not in str(refusal.value) and len(str(refusal.value)) < 700

    @pytest.mark.parametrize(("dtype", "values"), [("<i8", [2**63, 1]), ("|i1", [300, 1]), ("<u8", [-1, 1])])
    def test_labels_out_of_their_dtype_s_range_are_refused(self, dtype, values, flat_mlp_file, tmp_path):
        """numpy raised OverflowError putting them in their array."""
        document, tensors = read_file(flat_mlp_file)
        document["classes_"] = {"dtype": dtype, "values": values}
        with pytest.raises(ValueError, match=r"evil\.safetensors: classes_ values .* do not fit their dtype"):
            load(forge(tmp_path / "evil.safetensors", document, tensors))

    @pytest.mark.parametrize("values", [[1, 1], [1, 0], ["b", "a"], [0, "a"]],
                             ids=["repeated", "unsorted", "unsorted strings", "mixed"])
    def test_labels_that_fit_cannot_leave_are_refused(self, values, flat_mlp_file, tmp_path):
        """fit keeps np.unique(y): a forged list of repeated or unsorted labels loaded and certified."""
        document, tensors = read_file(flat_mlp_file)
        document["classes_"] = {"dtype": "|O" if len({type(v) for v in values}) > 1 else np.array(values).dtype.str,
                                "values": values}
        with pytest.raises(ValueError, match=r"evil\.safetensors: classes_ .* distinct and sorted"):
            load(forge(tmp_path / "evil.safetensors", document, tensors))

    @pytest.mark.parametrize(("edit", "cause"), [
        (lambda document, tensors: tensors["sigma_search_.training_inputs"].__setitem__((0, 0), np.nan), "NaN"),
        (lambda document, tensors: tensors["sigma_search_.training_inputs"].__setitem__((0, 0), np.inf), "infinity"),
    ])
    def test_a_fitted_sigma_function_s_refusal_names_the_file(self, edit, cause, flat_mlp_file, tmp_path):
        """restore_fitted's own errors (here scikit-learn's, over several lines) become one naming the file."""
        document, tensors = read_file(flat_mlp_file)
        document["params"]["sigma_search"], document["sigma_search_"] = (
            {"class": "smoothsk.sigma.SemiElasticSigma",
             "params": {"base_sigma": 0.25, "k": 3, "offset": None, "r": 0.05}} for _ in range(2))
        tensors = {**tensors, "sigma_search_.training_inputs": np.random.RandomState(0).rand(40, 6),
                   "sigma_search_.offset": np.array(0.5)}
        load(forge(tmp_path / "valid.safetensors", document, tensors))
        edit(document, tensors)
        with pytest.raises(ValueError, match=rf"evil\.safetensors: .*{cause}") as refusal:
            load(forge(tmp_path / "evil.safetensors", document, tensors))
        assert "\n" not in str(refusal.value)

    @pytest.mark.parametrize(("name", "value"), [("alpha_share", {"type": "smoothsk.models.FlatMLP"}), ("n", 10**18)])
    def test_the_fitted_sigma_function_s_parameters_are_validated(self, name, value, flat_mlp_file, tmp_path):
        """sigma_search_'s parameters, like sigma_search's: a class as alpha_share, 10**18 samples loaded."""
        document, tensors = read_file(flat_mlp_file)
        document["params"]["sigma_search"], document["sigma_search_"] = (
            {"class": "smoothsk.sigma.CertifiedSigmaSelector", "params": {"levels": [0.25]}} for _ in range(2))
        tensors = {**tensors, "sigma_search_.levels": np.array([0.25]), "sigma_search_.selector_sigma": np.array(0.5)}
        load(forge(tmp_path / "valid.safetensors", document, tensors))
        document["sigma_search_"]["params"][name] = value
        with pytest.raises(ValueError, match=rf"evil\.safetensors: parameter 'sigma_search_' is invalid: .*'{name}'"):
            load(forge(tmp_path / "evil.safetensors", document, tensors))

    @pytest.mark.parametrize("error", [OverflowError("cannot convert float infinity to integer"), MemoryError()])
    def test_a_validation_no_check_foresaw_failing_is_a_refusal(self, error, flat_mlp_file, tmp_path, monkeypatch):
        """A component's validation that overflows or runs out of memory on a file's values (a grid's step of
        5e-324 did, before grids were counted) is the file's fault: one ValueError naming it."""
        evil = forged_with(flat_mlp_file, tmp_path / "evil.safetensors", sigma_search={
            "class": "smoothsk.sigma.GridSigmaSearch", "params": {"step": 0.05}})

        def fails(self):
            raise error

        monkeypatch.setattr(GridSigmaSearch, "grid_sigmas", fails)
        with pytest.raises(ValueError, match=r"evil\.safetensors: parameter 'sigma_search' is invalid") as refusal:
            load(evil)
        assert "\n" not in str(refusal.value)

    def test_a_refusal_over_several_lines_becomes_one(self, flat_mlp_file, tmp_path):
        """CertifiedSigmaSelector's refusal of its levels shows them, a 2-d tensor over several lines."""
        document, tensors = read_file(flat_mlp_file)
        document["params"]["sigma_search"], document["sigma_search_"] = (
            {"class": "smoothsk.sigma.CertifiedSigmaSelector", "params": {"levels": [0.25, 0.5]}} for _ in range(2))
        tensors = {**tensors, "sigma_search_.levels": np.zeros((2, 2), np.float16)}
        with pytest.raises(ValueError, match=r"evil\.safetensors: .*sigma_search_ levels must be") as refusal:
            load(forge(tmp_path / "evil.safetensors", document, tensors))
        assert "\n" not in str(refusal.value)

    @pytest.mark.parametrize("name", ["train_sigmas_", "train_keys_", "regions_.radii"])
    def test_arrays_in_dtypes_numpy_lacks_are_refused(self, name, flat_mlp_file, tmp_path):
        """A bfloat16 array outside the module raised TypeError (numpy has no bfloat16)."""
        document, tensors = read_file(flat_mlp_file)
        tensors = {**tensors, name: torch.as_tensor(tensors[name].astype(np.float32)).to(torch.bfloat16)}
        with pytest.raises(ValueError, match=rf"evil\.safetensors: tensor '{name}' has dtype torch.bfloat16"):
            load(forge(tmp_path / "evil.safetensors", document, tensors))

    @pytest.mark.parametrize("value", [np.nan, np.inf, 0.0, -1.0])
    def test_train_sigmas_must_be_noise_levels(self, value, flat_mlp_file, tmp_path):
        """A sigma that is not a positive finite number would reach training (partial_fit) and Insta-RS's search cap."""
        document, tensors = read_file(flat_mlp_file)
        sigmas = tensors["train_sigmas_"].copy()
        sigmas[0] = value
        with pytest.raises(ValueError, match=r"evil\.safetensors: train_sigmas_ must be finite and positive; got "):
            load(forge(tmp_path / "evil.safetensors", document, {**tensors, "train_sigmas_": sigmas}))

    def test_train_keys_must_be_uint64_keys_of_the_train_sigmas(self, flat_mlp_file, tmp_path):
        document, tensors = read_file(flat_mlp_file)
        for keys in (np.zeros((2, 3), np.float32), np.zeros(3, np.uint64)):
            with pytest.raises(ValueError, match=r"evil\.safetensors: train_keys_ must be a uint64 array of "
                                                 r"train_sigmas_'s shape"):
                load(forge(tmp_path / "evil.safetensors", document, {**tensors, "train_keys_": keys}))

    @pytest.mark.parametrize(("name", "value"), [
        ("predictions", np.array([7])), ("predictions", np.array([-2])), ("radii", np.array([np.nan])),
        ("radii", np.array([-1.0])), ("sigmas", np.array([0.0])), ("sigmas", np.array([np.inf])),
        ("p_lowers", np.array([1.5])), ("centres", np.full((1, 6), np.inf, np.float32)),
    ])
    def test_regions_hold_the_values_of_certificates(self, name, value, flat_mlp_file, tmp_path):
        """A region predicting class 7 of 2 loaded, then MemoryAllocator's certify raised IndexError."""
        document, tensors = read_file(flat_mlp_file)
        load(forge(tmp_path / "valid.safetensors", document, _one_region(tensors)))
        tensors = _one_region(tensors, **{name: value})
        with pytest.raises(ValueError, match=rf"evil\.safetensors: the region store's {name} hold values no "
                                             "certificate has"):
            load(forge(tmp_path / "evil.safetensors", document, tensors))


    @pytest.mark.parametrize(("name", "value"), [
        ("alpha", "A" * 5000), ("alpha", float("nan")), ("alpha", 1.5), ("weights", [1.0] * 10),
        ("weights", "f" * 5000), ("allocator", {"class": "x"}), ("allocator", "MemoryAllocator; " * 300),
        ("autocast", "float64"), ("n_calls", True), ("n_calls", -1), ("attributes", 1),
    ], ids=["long alpha", "NaN alpha", "alpha 1.5", "list of weights", "long weights", "allocator dict",
            "long allocator", "autocast float64", "bool n_calls", "negative n_calls", "one more attribute"])
    def test_the_region_store_s_owner_is_one_a_store_records(self, name, value, flat_mlp_file, tmp_path):
        """The owner's fields loaded whatever their type (a 5 kB alpha, NaN, a list of weights), to be quoted whole
        or compared with nonsense when the store was used."""
        document, tensors = read_file(flat_mlp_file)
        document["regions_"].update(weights="0" * 64, allocator="MemoryAllocator", alpha=0.001, autocast=None)
        load(forge(tmp_path / "valid.safetensors", document, _one_region(tensors)))
        document["regions_"][name] = value
        with pytest.raises(ValueError, match=rf"evil\.safetensors: the region store's {name}") as refusal:
            load(forge(tmp_path / "evil.safetensors", document, _one_region(tensors)))
        assert "\n" not in str(refusal.value) and len(str(refusal.value)) < 400

    def test_a_region_array_of_no_rows_at_all_is_refused_in_one_line(self, flat_mlp_file, tmp_path):
        """A 0-d array (another tensor's, swapped in by the fuzz) raised TypeError: len() of unsized object."""
        document, tensors = read_file(flat_mlp_file)
        tensors = {**_one_region(tensors), "regions_.radii": torch.tensor(0.5, dtype=torch.float64)}
        with pytest.raises(ValueError, match=r"evil\.safetensors: .*region array 'radii' has dtype float64 and shape "
                                             r"\(\); expected"):
            load(forge(tmp_path / "evil.safetensors", document, tensors))


# ------------------------------------------------------------------ allocation

def _hostile_files(flat_mlp_file, folder):
    """Small forged files, each asking for far more memory than its size justifies, by what they ask for."""
    document, tensors = read_file(flat_mlp_file)

    def variant(name, edit, new_tensors=tensors):
        changed = json.loads(json.dumps(document))
        edit(changed)
        return name, forge(folder / f"{name}.safetensors", changed, new_tensors)

    def wide_labels(doc):
        doc["classes_"]["dtype"] = "<U500000000"
        doc["classes_"]["values"] = ["0", "1"]

    def resnet(blocks):
        def edit(doc):
            doc["params"]["module"] = {"type": "smoothsk.models.CifarResNet"}
            doc["params"]["module__blocks"] = blocks
            doc["params"]["module__width"] = 2
            doc["params"].pop("module__hidden")
            doc["input_shape_"] = [3, 32, 32]
        return edit

    resnet_tensors = {**{name: array for name, array in tensors.items() if not name.startswith("module_.")},
                      **{f"module_.{key}": value.numpy() for key, value in CifarResNet(n_classes=2, blocks=1, width=2)
                         .state_dict().items()}}
    resnet_tensors = {name: (np.zeros((0, 3072), np.float32) if name == "regions_.centres" else array)
                      for name, array in resnet_tensors.items()}

    def lazy_probe(doc):  # the lazy layer is materialised on one input: input_shape_ alone sizes it (256 MiB)
        doc["params"].update(module__hidden=0, certify_batch_size=1)
        doc["input_shape_"] = [2**26]

    lazy_tensors = {**tensors, "module_.layers.1.weight": np.zeros((0, 2**26), np.float32),
                    "module_.layers.1.bias": np.zeros(0, np.float32),
                    "module_.layers.3.weight": np.zeros((2, 0), np.float32),
                    "regions_.centres": np.zeros((0, 2**26), np.float32)}

    def selector_probe(doc):  # a selector (here the module's class) runs on one input of input_shape_ when built
        resnet(1)(doc)
        doc["params"]["certify_batch_size"] = 1
        doc["input_shape_"] = [3, 4096, 4096]
        doc["params"]["sigma_search"] = doc["sigma_search_"] = {
            "class": "smoothsk.sigma.CertifiedSigmaSelector",
            "params": {"alpha_share": 0.5, "fit_selector": True, "levels": [0.25, 0.5], "n": 10000, "n0": 100,
                       "selector": None, "selector_epochs": None, "selector_objective": None, "selector_sigma": 0.25,
                       "target_neighbors": None}}

    selector_tensors = {**resnet_tensors, "regions_.centres": np.zeros((0, 3 * 4096 * 4096), np.float32),
                        "sigma_search_.levels": np.array([0.25, 0.5]), "sigma_search_.selector_sigma": np.array(0.25),
                        **{f"sigma_search_.selector.{key}": value.numpy() for key, value in
                           CifarResNet(n_classes=2, blocks=1, width=2).state_dict().items()}}
    return dict([
        variant("wide_labels", wide_labels),
        variant("hidden", lambda doc: doc["params"].update(module__hidden=10**9)),
        variant("blocks", resnet(10**7), resnet_tensors),
        variant("input_shape", lambda doc: doc.update(input_shape_=[10**6, 10**6])),
        variant("sampler_n", lambda doc: doc["params"].update(
            sampler={"class": "smoothsk.sampling.FixedSampler", "params": {"n": 10**18, "n0": 10}})),
        variant("batch", lambda doc: doc["params"].update(certify_batch_size=10**12)),
        variant("lazy_probe", lazy_probe, lazy_tensors),
        variant("selector_probe", selector_probe, selector_tensors),
        variant("component", lambda doc: doc["params"].update(
            sampler={"class": "smoothsk.models.FlatMLP", "params": {"hidden": 10**9}})),
        # A grid of 10**8 noise levels: 0.8 GB before anything is certified.
        variant("grid", lambda doc: doc["params"].update(sigma_search={
            "class": "smoothsk.sigma.GridSigmaSearch", "params": {"sigma_min": 0.1, "sigma_max": 1.0, "step": 1e-8}})),
        variant("pretrain_grid", lambda doc: doc["params"].update(training={
            "class": "smoothsk.training.PretrainFinetune", "params": {"sigma_max": 1e7}})),
    ])


def test_small_files_cannot_make_loading_allocate(flat_mlp_file, tmp_path):
    """Every file is under 40 KB (the selector's holds two ResNets) and refused in one line, naming what it asks
    for, within the RSS bound."""
    files = _hostile_files(flat_mlp_file, tmp_path)
    assert all(path.stat().st_size < 40_000 for path in files.values())
    results = dict(zip(files, refused_in_subprocess(files.values()), strict=True))
    expected = {"wide_labels": "classes_", "hidden": "module_", "blocks": "module_", "input_shape": "input_shape_",
                "sampler_n": "sampler", "batch": "certify_batch_size", "component": "sampler",
                "lazy_probe": "module_", "selector_probe": "sigma_search_ selector", "grid": "sigma_search",
                "pretrain_grid": "training"}
    for name, (error, message, growth) in results.items():
        assert error == "ValueError", f"{name}: {error}: {message[:300]}"
        assert "\n" not in message and f"{name}.safetensors" in message and expected[name] in message, message
        assert growth < RSS_GROWTH_LIMIT_MB, f"{name}: peak RSS grew by {growth:.0f} MB"


def test_many_labels_cannot_widen_one_another(flat_mlp_file, tmp_path):
    """A string dtype is as wide as the longest label, for every label: 5,000 labels and one of 50,000 characters
    (a 90 KB file) asked for 1 GB."""
    document, tensors = read_file(flat_mlp_file)
    document["classes_"] = {"dtype": "<U50000", "values": ["x" * 50_000] + [str(i) for i in range(5000)]}
    path = forge(tmp_path / "labels.safetensors", document, tensors)
    assert path.stat().st_size < 100_000
    ((error, message, growth),) = refused_in_subprocess([path])
    assert error == "ValueError" and "labels.safetensors: classes_ of 5001 labels" in message, message[:300]
    assert growth < RSS_GROWTH_LIMIT_MB, f"peak RSS grew by {growth:.0f} MB"


# -------------------------------------------------------------- authentication

KEY, OTHER_KEY = b"k" * 32, b"o" * 32


class TestKeyedFiles:
    @pytest.fixture
    def keyed(self, make_linear_classifier, tmp_path):
        clf = make_linear_classifier([1.0, -1.0])
        clf.save(tmp_path / "keyed.safetensors", key=KEY)
        return clf, tmp_path / "keyed.safetensors"

    def test_the_right_key_loads_the_same_classifier(self, keyed):
        clf, path = keyed
        X = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
        loaded = load(path, key=KEY, module=clf.module)
        np.testing.assert_array_equal(loaded.certify(X)[1], clf.certify(X)[1])

    def test_another_key_or_no_key_is_refused(self, keyed):
        clf, path = keyed
        with pytest.raises(ValueError, match=r"keyed\.safetensors: .*not written with this key"):
            load(path, key=OTHER_KEY, module=clf.module)
        with pytest.raises(ValueError, match=r"keyed\.safetensors: .*authenticated with a key.*key="):
            load(path, module=clf.module)

    def test_an_unkeyed_file_is_refused_when_a_key_is_given(self, make_linear_classifier, tmp_path):
        clf = make_linear_classifier([1.0, -1.0])
        clf.save(tmp_path / "plain.safetensors")
        with pytest.raises(ValueError, match=r"plain\.safetensors: .*not authenticated"):
            load(tmp_path / "plain.safetensors", key=KEY, module=clf.module)

    def test_every_edited_byte_is_detected(self, keyed):
        clf, path = keyed
        original = path.read_bytes()
        header_length = int.from_bytes(original[:8], "little")
        # A byte in the JSON document, in a tensor, and the last byte of the file.
        document_at = original.index(b"alpha")
        for offset in (document_at + 8, 8 + header_length + 3, len(original) - 1):
            edited = bytearray(original)
            edited[offset] ^= 0x01
            path.write_bytes(bytes(edited))
            with pytest.raises(ValueError, match=r"keyed\.safetensors: "):
                load(path, key=KEY, module=clf.module)

    @pytest.mark.parametrize("key", [b"short", "a string", 12345])
    def test_keys_must_be_long_bytes(self, key, make_linear_classifier, tmp_path):
        clf = make_linear_classifier([1.0, -1.0])
        with pytest.raises((TypeError, ValueError), match=r"key must be"):
            clf.save(tmp_path / "model.safetensors", key=key)


@pytest.mark.parametrize(("name", "value", "match"), [
    ("device", None, "device None is not one a model file may name"),
    ("device", "meta", "device 'meta' is not one a model file may name"),
    ("n_jobs", 5000, "n_jobs=5000 asks for more workers than the 256"),
])
def test_settings_that_break_certify_or_spawn_threads_are_refused(name, value, match, flat_mlp_file, tmp_path):
    """device None or 'meta' loaded and failed in certify; n_jobs=5000 started threads until it failed."""
    evil = forged_with(flat_mlp_file, tmp_path / "evil.safetensors", **{name: value})
    with pytest.raises(ValueError, match=rf"evil\.safetensors: {match}"):
        load(evil)
