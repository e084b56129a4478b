"""Resumable certification (``certify(checkpoint=...)``): resume, refusal, regions, file safety."""

import copy
import json
import os
import re
from collections import OrderedDict

import joblib
import numpy as np
import pytest
import torch

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier, _certification, _checkpoint
from smoothsk._checkpoint import parameters_digest
from smoothsk._npz import NpzArchive
from smoothsk.regions import MemoryAllocator, OnlineBallAllocator, TransductiveLPAllocator
from smoothsk.sampling import FixedSampler, InputSpecificSampler, SequentialSampler
from smoothsk.sigma import CertifiedSigmaSelector, GridSigmaSearch, MultiStartFGSS, SemiElasticSigma
from smoothsk.statistics import certified_radius, clopper_pearson_lower
from smoothsk.training import FixedSigmaTraining

from conftest import LinearLogits, SlabLogits, forbid
from npz_support import npy_bytes, write_npz

WEIGHT, BIAS = (1.0, -2.0), 0.1


class InterruptingSampler(FixedSampler):
    """FixedSampler that records each call's size and raises on call number ``fail_at``."""

    calls = []
    fail_at = None

    def _certify(self, engine, X, sigma, alpha, stage):
        InterruptingSampler.calls.append(len(X))
        if len(InterruptingSampler.calls) == InterruptingSampler.fail_at:
            raise RuntimeError("interrupted")
        return super()._certify(engine, X, sigma, alpha, stage)


class CrashingAllocator(OnlineBallAllocator):
    """OnlineBallAllocator that raises after allocating (regions stored, nothing returned) when ``crash``."""

    crash = False

    def _allocate(self, regions, X, sigma, certify_fn):
        certificates = super()._allocate(regions, X, sigma, certify_fn)
        if CrashingAllocator.crash:
            raise RuntimeError("crashed after allocating")
        return certificates


class PlantedPickle:
    """Unpickling it creates the file ``marker`` (what a malicious pickle could do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture(autouse=True)
def _no_interruption():
    InterruptingSampler.calls, InterruptingSampler.fail_at = [], None
    CrashingAllocator.crash = False
    yield
    InterruptingSampler.calls, InterruptingSampler.fail_at = [], None
    CrashingAllocator.crash = False


@pytest.fixture
def make_clf(make_linear_classifier):
    """A linear estimator whose sampler can be interrupted (``n=100, n0=10``); ``params`` override."""

    def make(**params):
        return make_linear_classifier(WEIGHT, BIAS, n=100, n0=10,
                                      sampler=InterruptingSampler(n=100, n0=10), **params)

    return make


def inputs(n=25, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 2)).astype(np.float32)


def interrupt(clf, X, path, every=10, fail_at=2):
    """Run ``certify`` until the sampler's call ``fail_at`` raises; returns the checkpoint's bytes."""
    InterruptingSampler.calls, InterruptingSampler.fail_at = [], fail_at
    with pytest.raises(RuntimeError, match="interrupted"):
        clf.certify(X, checkpoint=path, checkpoint_every=every)
    InterruptingSampler.calls, InterruptingSampler.fail_at = [], None
    return path.read_bytes()


def assert_same_store(store, expected):
    for field in ("centres", "radii", "sigmas", "predictions", "p_lowers"):
        np.testing.assert_array_equal(getattr(store, field), getattr(expected, field))
    assert store.n_calls == expected.n_calls


class TestResume:
    def test_resumes_after_an_interruption(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        expected = clf.certify(X, return_details=True)
        interrupt(clf, X, path)
        resumed = clf.certify(X, return_details=True, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == [10, 5]  # the finished first chunk is not redone
        assert not path.exists()
        for before, after in zip(expected[:2], resumed[:2], strict=True):
            np.testing.assert_array_equal(after, before)
        np.testing.assert_array_equal(resumed[2].p_lower, expected[2].p_lower)

    def test_resume_with_regions_equals_an_uninterrupted_run(self, make_clf, tmp_path):
        X, path = inputs(), tmp_path / "certify.ckpt"
        uninterrupted = make_clf(allocator=OnlineBallAllocator())
        expected = uninterrupted.certify(X, return_details=True, checkpoint=tmp_path / "other", checkpoint_every=10)
        clf = make_clf(allocator=OnlineBallAllocator())
        interrupt(clf, X, path)
        resumed = clf.certify(X, return_details=True, checkpoint=path, checkpoint_every=10)
        np.testing.assert_array_equal(resumed[1], expected[1])
        np.testing.assert_array_equal(resumed[2].region, expected[2].region)
        assert_same_store(clf.regions_, uninterrupted.regions_)

    def test_with_regions_each_chunk_is_a_call_of_its_own(self, make_clf, tmp_path):
        # A stateful classifier's answers depend on the queries before: a checkpointed run is its
        # chunks certified one call after another (each call draws fresh noise), which the docs state.
        X = inputs()
        chunked = make_clf(allocator=OnlineBallAllocator())
        calls = [chunked.certify(X[start:start + 10], return_details=True) for start in (0, 10, 20)]
        clf = make_clf(allocator=OnlineBallAllocator())
        run = clf.certify(X, return_details=True, checkpoint=tmp_path / "run.ckpt", checkpoint_every=10)
        np.testing.assert_array_equal(run[1], np.concatenate([call[1] for call in calls]))
        np.testing.assert_array_equal(run[2].p_lower, np.concatenate([call[2].p_lower for call in calls]))
        assert_same_store(clf.regions_, chunked.regions_)

    def test_a_saved_estimator_resumes_in_a_new_process(self, make_clf, tmp_path):
        # A crash loses the regions allocated in memory; an estimator saved
        # before the run (its store is the run's initial store) resumes from
        # the store recorded with the last finished chunk.
        X, path = inputs(), tmp_path / "certify.ckpt"
        uninterrupted = make_clf(allocator=OnlineBallAllocator())
        expected = uninterrupted.certify(X, checkpoint=tmp_path / "other", checkpoint_every=10)
        clf = make_clf(allocator=OnlineBallAllocator())
        saved = copy.deepcopy(clf)
        interrupt(clf, X, path)
        resumed = saved.certify(X, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == [10, 5]
        np.testing.assert_array_equal(resumed[1], expected[1])
        assert_same_store(saved.regions_, uninterrupted.regions_)


class CallbackLike:
    """An object holding a reference to itself (as a callback may hold its owner)."""

    def __init__(self):
        self.threshold = 1
        self.owner = self


def slab_classifier(sigma_search):
    """A slab estimator (no training) with a fitted certified sigma function and an interruptible sampler."""
    clf = SampleWiseSmoothedClassifier(SlabLogits, training=FixedSigmaTraining(0.25), sigma_search=sigma_search,
                                       sampler=InterruptingSampler(n=100, n0=10), alpha=0.01, max_epochs=0,
                                       random_state=0)
    return clf.fit(inputs(20, seed=3), [0, 1] * 10)


class TestSameRun:
    """An unchanged run resumes: its fingerprint depends on values, never on object identity or query counts."""

    def test_a_copy_with_a_module_instance_resumes(self, tmp_path):
        X, path = inputs(), tmp_path / "certify.ckpt"
        clf = SampleWiseSmoothedClassifier(LinearLogits(WEIGHT, BIAS), training=FixedSigmaTraining(0.5),
                                           sampler=InterruptingSampler(n=100, n0=10), max_epochs=0, random_state=0)
        clf.fit(inputs(2), [0, 1])
        saved = copy.deepcopy(clf)  # equal tensors, other objects
        interrupt(clf, X, path)
        saved.certify(X, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == [10, 5]

    def test_a_selector_saved_before_and_loaded_after_the_crash_resumes(self, tmp_path):
        X, path, model = inputs(), tmp_path / "certify.ckpt", tmp_path / "model.safetensors"
        clf = slab_classifier(CertifiedSigmaSelector(levels=(0.25, 1.0), n=100, n0=10, selector_epochs=1))
        expected = clf.certify(X)
        clf.save(model)
        interrupt(clf, X, path)
        loaded = SampleWiseSmoothedClassifier.load(model, allowed_classes=[SlabLogits, InterruptingSampler])
        resumed = loaded.certify(X, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == [10, 5]
        np.testing.assert_array_equal(resumed[1], expected[1])

    def test_semi_elastic_sigma_resumes_after_its_index_was_queried(self, tmp_path):
        X, path = inputs(), tmp_path / "certify.ckpt"
        clf = slab_classifier(SemiElasticSigma(k=3))
        interrupt(clf, X, path)
        clf.predict(X)  # queries the neighbour index again
        clf.certify(X, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == [10, 5]

    def test_another_fitted_sigma_function_is_refused(self, tmp_path):
        X, path = inputs(), tmp_path / "certify.ckpt"
        clf = slab_classifier(SemiElasticSigma(k=3))
        saved = interrupt(clf, X, path)
        other = slab_classifier(SemiElasticSigma(k=3)).set_params(max_epochs=0)
        other.fit(inputs(20, seed=4), [0, 1] * 10)  # same parameters, other training inputs
        with pytest.raises(ValueError, match=r"another run.*sigma function"):
            other.certify(X, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == []
        assert path.read_bytes() == saved

    def test_a_module_instance_configured_otherwise_is_another_run(self, tmp_path):
        # half_width is an attribute, outside the state_dict the weights part digests.
        X, path = inputs(), tmp_path / "certify.ckpt"
        clf = SampleWiseSmoothedClassifier(SlabLogits(half_width=1.0), training=FixedSigmaTraining(0.5),
                                           sampler=InterruptingSampler(n=100, n0=10), max_epochs=0, random_state=0)
        clf.fit(inputs(2), [0, 1])
        interrupt(clf, X, path)
        clf.module_.half_width = 0.5
        with pytest.raises(ValueError, match=r"another run.*parameters"):
            clf.certify(X, checkpoint=path, checkpoint_every=10)

    def test_the_order_of_a_sequential_module_parameter_counts(self):
        # Same names, same weights, same state_dict: another forward (relu before or after the linear map).
        linear, relu = torch.nn.Linear(2, 2), torch.nn.ReLU()
        first = torch.nn.Sequential(OrderedDict(linear=linear, relu=relu))
        second = torch.nn.Sequential(OrderedDict(relu=relu, linear=linear))
        assert parameters_digest({"module": first}) != parameters_digest({"module": second})

    def test_the_items_of_a_list_subclass_count(self):
        class Levels(list):
            pass

        assert parameters_digest({"levels": Levels([0.25, 0.5])}) != parameters_digest({"levels": Levels([1.0, 2.0])})

    def test_parameters_that_refer_to_themselves_are_digested(self):
        first, second = CallbackLike(), CallbackLike()
        assert parameters_digest({"callback": first}) == parameters_digest({"callback": second})
        second.threshold = 2
        assert parameters_digest({"callback": first}) != parameters_digest({"callback": second})

    def test_a_random_state_instance_resumes_with_the_recorded_seed(self, make_clf, tmp_path):
        # The run's noise comes from the root seed recorded in the checkpoint, as with random_state=None.
        X, path = inputs(), tmp_path / "certify.ckpt"
        expected = make_clf(random_state=np.random.RandomState(0)).certify(X, return_details=True)
        clf = make_clf(random_state=np.random.RandomState(0))
        interrupt(clf, X, path)
        resumed = clf.certify(X, return_details=True, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == [10, 5]
        np.testing.assert_array_equal(resumed[2].p_lower, expected[2].p_lower)


class TestRegions:
    def test_resume_does_not_drop_regions_of_other_calls(self, make_clf, tmp_path):
        # The regression: a resumed run replaced regions_ with its snapshot (18 of 18 regions dropped).
        clf, X, path = make_clf(allocator=OnlineBallAllocator()), inputs(), tmp_path / "certify.ckpt"
        saved = interrupt(clf, X, path)
        clf.certify(inputs(18, seed=1))  # another call allocates regions meanwhile
        store = copy.deepcopy(clf.regions_)
        with pytest.raises(ValueError, match=r"regions_ changed since"):
            clf.certify(X, checkpoint=path, checkpoint_every=10)
        assert_same_store(clf.regions_, store)
        assert path.read_bytes() == saved

    def test_crash_in_the_first_chunk_leaves_no_orphan_regions(self, make_clf, tmp_path):
        X, path = inputs(), tmp_path / "certify.ckpt"
        expected = make_clf(allocator=OnlineBallAllocator()).certify(X, checkpoint=path, checkpoint_every=10)
        clf = make_clf(allocator=CrashingAllocator())
        CrashingAllocator.crash = True
        with pytest.raises(RuntimeError, match="crashed"):
            clf.certify(X, checkpoint=path, checkpoint_every=10)
        assert len(clf.regions_) == 0 and clf.regions_.n_calls == 0
        CrashingAllocator.crash = False
        np.testing.assert_array_equal(clf.certify(X, checkpoint=path, checkpoint_every=10)[1], expected[1])

    def test_reset_regions_since_the_interruption_is_refused(self, make_clf, tmp_path):
        clf, X, path = make_clf(allocator=OnlineBallAllocator()), inputs(), tmp_path / "certify.ckpt"
        clf.certify(inputs(5, seed=2))  # regions before the run
        interrupt(clf, X, path)
        clf.reset_regions()
        with pytest.raises(ValueError, match=r"regions_ changed since"):
            clf.certify(X, checkpoint=path, checkpoint_every=10)


class TestOtherRuns:
    @pytest.mark.parametrize("change, part", [
        pytest.param(lambda clf, X: (clf, X[::-1].copy()), "inputs", id="inputs"),
        pytest.param(lambda clf, X: (clf.set_params(alpha=0.01), X), "parameters", id="parameters"),
        pytest.param(lambda clf, X: (clf.module_.bias.fill_(-0.4) and clf, X), "weights", id="weights"),
        # Outside the state_dict, but part of what the module computes with.
        pytest.param(lambda clf, X: (clf.module_.register_buffer("sign", -torch.ones(()), persistent=False) or clf,
                                     X), "weights", id="non-persistent buffer"),
        pytest.param(lambda clf, X: (setattr(clf.module_, "scale", 2.0) or clf, X), "weights", id="attribute"),
    ])
    def test_checkpoint_of_another_run_is_refused_and_kept(self, make_clf, tmp_path, change, part):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        saved = interrupt(clf, X, path)
        with torch.no_grad():
            clf, X = change(clf, X)
        with pytest.raises(ValueError, match=rf"another run.*{part}.*delete .* or pass another checkpoint path"):
            clf.certify(X, checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == []
        assert path.read_bytes() == saved

    def test_other_chunk_size_is_refused(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        with pytest.raises(ValueError, match="checkpoint_every"):
            clf.certify(X, checkpoint=path, checkpoint_every=5)

    def test_parameters_that_differ_deep_inside_are_another_run(self, make_clf, tmp_path):
        # scikit-learn elides long reprs: these two searches have the same repr.
        starts = [(1, 1)] * 40
        first = MultiStartFGSS(max_level=3, n=20, starts=starts + [(2, 1)])
        second = MultiStartFGSS(max_level=3, n=20, starts=starts + [(3, -1)])
        assert repr(first) == repr(second)
        clf, X, path = make_clf(sigma_search=first), inputs(6), tmp_path / "certify.ckpt"
        interrupt(clf, X, path, every=3)
        clf.set_params(sigma_search=second)
        with pytest.raises(ValueError, match="parameters"):
            clf.certify(X, checkpoint=path, checkpoint_every=3)


class TestFileSafety:
    def test_planted_pickle_is_not_unpickled(self, make_clf, tmp_path):
        clf, path, marker = make_clf(), tmp_path / "certify.ckpt", tmp_path / "code-ran"
        joblib.dump(PlantedPickle(marker), path)
        with pytest.raises(ValueError, match="not a smoothsk certify checkpoint"):
            clf.certify(inputs(), checkpoint=path, checkpoint_every=10)
        assert not marker.exists()
        assert InterruptingSampler.calls == []

    def test_truncated_checkpoint_is_refused_and_kept(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        truncated = interrupt(clf, X, path)[:200]
        path.write_bytes(truncated)
        with pytest.raises(ValueError, match="not a smoothsk certify checkpoint.*delete"):
            clf.certify(X, checkpoint=path, checkpoint_every=10)
        assert path.read_bytes() == truncated

    def test_a_checkpoint_swapped_for_a_fifo_once_its_magic_was_read_is_refused_unread(self, make_clf, tmp_path,
                                                                                       monkeypatch):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)

        def swapped_first(name):  # another process renames a FIFO over the checkpoint between the two opens
            os.mkfifo(tmp_path / "fifo")
            os.replace(tmp_path / "fifo", name)
            return NpzArchive(name)

        monkeypatch.setattr(_checkpoint, "NpzArchive", swapped_first)
        with pytest.raises(ValueError, match=r"is not a readable checkpoint \(not a regular file \(a FIFO\)\); delete"):
            clf.certify(X, checkpoint=path, checkpoint_every=10)

    def test_checkpoint_is_arrays_and_a_json_header(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode())
            assert data["certificates/radius"].shape == (10,)
        assert header["chunks_done"] == 1 and isinstance(header["root_seed"], int)
        assert {"inputs", "parameters", "weights", "version"} <= set(header["parts"])

    @pytest.mark.parametrize("interrupted", [False, True], ids=["dangling link", "link to an interrupted run"])
    def test_a_symbolic_link_leaves_no_checkpoint_behind(self, make_clf, tmp_path, interrupted):
        # The regression: chunks were written to the link's target, and the end removed the link alone.
        clf, X = make_clf(), inputs()
        target, link = tmp_path / "target.ckpt", tmp_path / "link.ckpt"
        link.symlink_to(target)
        if interrupted:
            interrupt(clf, X, target)
        clf.certify(X, checkpoint=link, checkpoint_every=10)
        assert InterruptingSampler.calls == ([10, 5] if interrupted else [10, 10, 5])
        assert not target.exists()

    @pytest.mark.parametrize("every", [0, -1, 2.5, "10", True])
    def test_bad_chunk_size_is_refused_before_touching_the_file(self, make_clf, tmp_path, every):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        saved = interrupt(clf, X, path)
        with pytest.raises(ValueError, match="checkpoint_every must be a positive int"):
            clf.certify(X, checkpoint=path, checkpoint_every=every)
        assert path.read_bytes() == saved
        assert InterruptingSampler.calls == []

    @pytest.mark.parametrize("folder", ["missing", "a-file"])
    def test_a_folder_it_cannot_write_in_is_refused_before_sampling(self, make_clf, tmp_path, folder):
        (tmp_path / "a-file").write_text("not a folder")
        path = tmp_path / folder / "certify.ckpt"
        with pytest.raises(ValueError, match=rf"checkpoint .*{folder}.* (does not exist|is not a directory)"):
            make_clf().certify(inputs(), checkpoint=path, checkpoint_every=10)
        assert InterruptingSampler.calls == []

    @pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes in any folder")
    def test_a_read_only_folder_is_refused_before_sampling(self, make_clf, tmp_path):
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        try:
            with pytest.raises(ValueError, match=r"checkpoint .*read-only.* not writable"):
                make_clf().certify(inputs(), checkpoint=folder / "certify.ckpt", checkpoint_every=10)
        finally:
            folder.chmod(0o700)
        assert InterruptingSampler.calls == []


def tamper(path, header=None, arrays=None, **options):
    """Rewrite the checkpoint at ``path``: ``header`` entries and ``arrays`` (name -> array or ``.npy`` bytes)
    replaced, the rest kept; ``options`` go to :func:`npz_support.write_npz`. Returns the new bytes."""
    with np.load(path, allow_pickle=False) as data:
        members = {name: data[name] for name in data.files}
    recorded = json.loads(bytes(members["header"]).decode())
    members["header"] = np.frombuffer(json.dumps({**recorded, **(header or {})}).encode(), dtype=np.uint8)
    write_npz(path, {**members, **(arrays or {})}, **options)
    return path.read_bytes()


def recorded(path, name):
    with np.load(path, allow_pickle=False) as data:
        return data[name].copy()


@pytest.mark.parametrize("params", [
    pytest.param({"sampler": FixedSampler(n=100, n0=10)}, id="fixed"),
    pytest.param({"sampler": InputSpecificSampler(n_max=300)}, id="input-specific"),
    pytest.param({"sampler": SequentialSampler(n_max=300)}, id="sequential"),
    pytest.param({"sampler": FixedSampler(n=100, n0=10),
                  "sigma_search": GridSigmaSearch(sigma_min=0.25, sigma_max=1.0, step=0.25, n=50)}, id="grid search"),
    *[pytest.param({"sampler": FixedSampler(n=100, n0=10), "allocator": allocator}, id=type(allocator).__name__)
      for allocator in (OnlineBallAllocator(), TransductiveLPAllocator(), MemoryAllocator())],
])
def test_every_run_reads_back_its_own_checkpoint(make_linear_classifier, tmp_path, monkeypatch, params):
    # The content checks refuse no file a run writes: a kept checkpoint returns every certificate unsampled.
    clf, X, path = make_linear_classifier(WEIGHT, BIAS, **params), inputs(), tmp_path / "certify.ckpt"
    saved = copy.deepcopy(clf)
    expected = clf.certify(X, return_details=True, checkpoint=path, checkpoint_every=10, keep_checkpoint=True)
    assert (expected[1] > 0).any()
    forbid(monkeypatch, _certification, "certify_rows", "sampled instead of reading the checkpoint")
    for run in (clf, saved):  # the store after the run, and the store it started from
        again = run.certify(X, return_details=True, checkpoint=path, checkpoint_every=10, keep_checkpoint=True)
        np.testing.assert_array_equal(again[1], expected[1])


KEY, OTHER_KEY = b"k" * 32, b"o" * 32


class TestKeyedCheckpoint:
    """With checkpoint_key, a checkpoint resumes only if a holder of the key wrote it and nothing changed since."""

    def test_a_keyed_run_resumes_with_the_certificates_of_one_pass(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        expected = make_clf().certify(X, return_details=True)
        self._interrupt_keyed(clf, X, path)
        assert "hmac" in np.load(path).files
        resumed = clf.certify(X, return_details=True, checkpoint=path, checkpoint_every=10, checkpoint_key=KEY)
        np.testing.assert_array_equal(resumed[1], expected[1])
        np.testing.assert_array_equal(resumed[0], expected[0])

    @pytest.mark.parametrize("edit", [
        # What the checks without a key let through: a larger sigma and n_samples allow a larger radius.
        lambda path: {"arrays": {"certificates/sigma": recorded(path, "certificates/sigma") * 1e6,
                                 "certificates/n_samples": recorded(path, "certificates/n_samples") * 10**9}},
        lambda path: {"arrays": {"certificates/prediction": 1 - recorded(path, "certificates/prediction").clip(0)}},
        lambda path: {"header": {"root_seed": 7}},
        lambda path: {"arrays": {"hmac": np.zeros(32, np.uint8)}},
    ], ids=["larger radii", "other predictions", "header", "hmac"])
    def test_any_edit_is_refused(self, make_clf, tmp_path, edit):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        self._interrupt_keyed(clf, X, path)
        tamper(path, **edit(path))
        TestHostileCheckpoint.refused(clf, X, path, r"not written with this key, or edited since", key=KEY)

    def test_the_key_is_needed_both_ways(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        self._interrupt_keyed(clf, X, path)
        TestHostileCheckpoint.refused(clf, X, path, "authenticated with a key; pass it")
        TestHostileCheckpoint.refused(clf, X, path, "not written with this key", key=OTHER_KEY)
        plain = tmp_path / "plain.ckpt"
        interrupt(clf, X, plain)
        TestHostileCheckpoint.refused(clf, X, plain, "without authentication, but a key was given", key=KEY)

    @pytest.mark.parametrize("key", [b"short", "a" * 32])
    def test_a_key_that_is_not_long_bytes_is_refused_before_any_work(self, make_clf, tmp_path, key):
        clf, X = make_clf(), inputs()
        with pytest.raises(TypeError, match="checkpoint_key must be None or bytes of at least 16 bytes"):
            clf.certify(X, checkpoint=tmp_path / "certify.ckpt", checkpoint_key=key)
        assert InterruptingSampler.calls == [] and not (tmp_path / "certify.ckpt").exists()

    def test_a_key_without_a_checkpoint_is_refused(self, make_clf):
        # It was ignored: no file, nothing authenticated, and no word of it.
        with pytest.raises(ValueError, match="checkpoint_key authenticates a checkpoint file: pass checkpoint"):
            make_clf().certify(inputs(), checkpoint_key=KEY)

    @pytest.mark.parametrize("one, other", [
        ({"header": np.array(5, np.uint8)}, {"header": np.array([5], np.uint8)}),
        ({"h": np.zeros(2, [("a", "u1"), ("b", "u1")])}, {"h": np.zeros(2, [("x", "u1"), ("y", "u1")])}),
        ({"a": np.zeros(2, np.uint8)}, {"a": np.zeros((2, 1), np.uint8)}),
    ], ids=["0-d and 1-d", "field names", "shapes"])
    def test_the_authentication_tells_apart_arrays_of_the_same_bytes(self, one, other):
        assert not np.array_equal(_checkpoint._authentication(KEY, one), _checkpoint._authentication(KEY, other))

    @staticmethod
    def _interrupt_keyed(clf, X, path):
        InterruptingSampler.calls, InterruptingSampler.fail_at = [], 2
        with pytest.raises(RuntimeError, match="interrupted"):
            clf.certify(X, checkpoint=path, checkpoint_every=10, checkpoint_key=KEY)
        InterruptingSampler.calls, InterruptingSampler.fail_at = [], None


class TestHostileCheckpoint:
    """A checkpoint is read within bounds set by the run, and its contents are checked before any sampling."""

    @staticmethod
    def refused(clf, X, path, words="", key=None):
        """Assert that resuming from ``path`` is refused, naming it, before sampling, and leaves it as it was."""
        saved = path.read_bytes()
        name = re.escape(str(path))
        with pytest.raises(ValueError, match=rf"{name}.*{words}.*delete {name}") as error:
            clf.certify(X, checkpoint=path, checkpoint_every=10, checkpoint_key=key)
        assert "\n" not in str(error.value)
        assert InterruptingSampler.calls == []
        assert path.read_bytes() == saved

    def test_a_header_that_inflates_past_its_limit_is_refused(self, make_clf, tmp_path):
        # The regression, scaled down: a header padded with whitespace (valid JSON) and deflated was read in full.
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        padded = json.dumps(json.loads(bytes(recorded(path, "header")).decode())) + " " * (4 << 20)
        tamper(path, arrays={"header": np.frombuffer(padded.encode(), dtype=np.uint8)}, compress=True)
        self.refused(clf, X, path, "header")

    def test_the_guarantee_is_the_run_s_never_the_file_s(self, make_clf, tmp_path):
        # The header's statement came back as every certificate's guarantee (and every CSV row's).
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        honest = clf.certify(X, return_details=True, checkpoint=path, checkpoint_every=10, keep_checkpoint=True)[2]
        tamper(path, header={"guarantee": "fake guarantee: exact"})
        resumed = clf.certify(X, return_details=True, checkpoint=path, checkpoint_every=10)[2]
        assert resumed.guarantee == honest.guarantee != "fake guarantee: exact"

    @pytest.mark.parametrize(("edit", "words"), [
        (lambda header: b"\xff" * 100_000, "UnicodeDecodeError"),
        (lambda header: json.dumps({**json.loads(header), "format": "x" * 100_000}).encode(), "format 'xxx"),
        (lambda header: json.dumps({**json.loads(header), "format_version": True}).encode(), "format version True"),
    ], ids=["not UTF-8", "long format", "bool version"])
    def test_a_header_of_no_checkpoint_is_refused_in_a_short_line(self, make_clf, tmp_path, edit, words):
        # The UnicodeDecodeError's repr quoted the 100 kB header whole; True passed for format version 1.
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        tamper(path, arrays={"header": np.frombuffer(edit(bytes(recorded(path, "header"))), dtype=np.uint8)})
        with pytest.raises(ValueError, match=words) as error:
            clf.certify(X, checkpoint=path, checkpoint_every=10)
        assert len(str(error.value)) < 500 and "\n" not in str(error.value)

    def test_sizes_the_zip_directory_claims_are_refused_before_reading(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        tamper(path, file_sizes={"header": 5 << 30}, compress=True)
        self.refused(clf, X, path, "header")

    def test_an_array_declaring_more_rows_than_the_run_is_refused_before_reading(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        radius = recorded(path, "certificates/radius")
        tamper(path, arrays={"certificates/radius": npy_bytes(radius, shape=(10 ** 12,))})
        self.refused(clf, X, path, "certificates/radius")

    @pytest.mark.parametrize(("name", "dtype"), [("certificates/prediction", np.uint64),
                                                 ("certificates/n_samples", np.int32),
                                                 ("certificates/radius", np.float16), ("regions/radii", ">f8")])
    def test_an_array_of_another_dtype_than_written_is_refused(self, make_clf, tmp_path, name, dtype):
        # uint64 predictions joined the next chunk's int64 ones as float64: an IndexError decoding the labels.
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        tamper(path, arrays={name: recorded(path, name).astype(dtype)})
        self.refused(clf, X, path, name)

    def test_a_deeply_nested_header_is_refused(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        tamper(path, arrays={"header": np.frombuffer(b"[" * 100_000, dtype=np.uint8)})
        self.refused(clf, X, path, "not a smoothsk certify checkpoint")

    def test_an_encrypted_member_is_refused(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        tamper(path, encrypted=("certificates/radius",))
        self.refused(clf, X, path, "certificates/radius")

    @pytest.mark.parametrize("name, change, words", [
        ("certificates/radius", lambda a: a * np.nan, "radius"),
        ("certificates/radius", lambda a: -np.abs(a) - 1, "radius"),
        ("certificates/prediction", lambda a: a * 0 + 7, "prediction"),
        ("certificates/prediction", lambda a: a.astype(np.float64), "prediction"),
        ("certificates/sigma", lambda a: a * 0, "sigma"),
        ("certificates/sigma", lambda a: a * np.inf, "sigma"),
        ("certificates/n_samples", lambda a: a * 0 - 1, "n_samples"),
        ("certificates/p_lower", lambda a: a + 2, "p_lower"),
        ("certificates/region", lambda a: a * 0 + 5, "region"),
        ("certificates/radius", lambda a: a[:9], "radius"),
        ("certificates/radius", lambda a: a.reshape(2, 5), "radius"),
    ])
    def test_certificates_the_run_cannot_have_made_are_refused(self, make_clf, tmp_path, name, change, words):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        with np.errstate(invalid="ignore"):
            tamper(path, arrays={name: change(recorded(path, name))})
        self.refused(clf, X, path, words)

    def test_a_radius_above_what_its_samples_certify_is_refused(self, make_clf, tmp_path):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        n, sigma, prediction = (recorded(path, f"certificates/{name}") for name in ("n_samples", "sigma", "prediction"))
        largest = np.where(prediction == ABSTAIN, 0.0, certified_radius(sigma, clopper_pearson_lower(n, n, clf.alpha)))
        assert largest.max() > 0
        tamper(path, arrays={"certificates/radius": largest * (1 + 1e-6)})
        self.refused(clf, X, path, "largest radius its sigma and n_samples certify at alpha=0.05")
        tamper(path, arrays={"certificates/radius": largest})  # the bound itself: all n_samples of one class
        np.testing.assert_array_equal(clf.certify(X, checkpoint=path, checkpoint_every=10)[1][:10], largest)

    @pytest.mark.parametrize("entry, value, words", [
        ("chunks_done", 4, "chunks_done"), ("chunks_done", 0, "chunks_done"), ("chunks_done", "1", "chunks_done"),
        ("chunks_done", 2, r"certificates/\w+ is declared with shape \(10,\) .* not shape \(20,\)"),
        ("root_seed", "seed", "root_seed"), ("root_seed", -1, "root_seed"),
        ("regions_attributes", [], "regions_attributes"), ("regions_attributes", {"n_calls": "x"}, "regions_attr"),
        ("regions_attributes", {"n_calls": 0, "weights": None, "allocator": None, "alpha": 1e300, "autocast": None},
         r"regions_attributes: alpha is 1e\+300; expected None or a float in \(0, 1\)"),
    ])
    def test_a_header_the_run_cannot_have_written_is_refused(self, make_clf, tmp_path, entry, value, words):
        clf, X, path = make_clf(), inputs(), tmp_path / "certify.ckpt"
        interrupt(clf, X, path)
        tamper(path, header={entry: value})
        self.refused(clf, X, path, words)

    def test_recorded_regions_of_another_input_shape_are_refused(self, make_clf, tmp_path):
        # With the header's digest made to match, as a planted file would.
        from smoothsk.regions._store import RegionStore
        clf = make_clf(allocator=OnlineBallAllocator())
        X, path, saved = inputs(), tmp_path / "certify.ckpt", copy.deepcopy(clf)
        interrupt(clf, X, path)
        arrays, attributes = clf.regions_.to_arrays()
        arrays["centres"] = np.repeat(arrays["centres"], 2, axis=1)
        planted = RegionStore(**arrays, **attributes)  # unchecked: what a forger digests
        tamper(path, header={"regions_done": planted.digest()}, arrays={"regions/centres": arrays["centres"]})
        self.refused(saved, X, path, "regions/centres")
