"""Certification split by chunks of inputs over joblib workers: threads, dask.distributed, ray."""

import copy
import importlib.util
import threading

import joblib
import numpy as np
import pytest
import torch
from sklearn.base import clone

from smoothsk import SampleWiseSmoothedClassifier, _certification
from smoothsk.certificates import Certificates
from smoothsk.regions import OnlineBallAllocator
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma, MultiStartFGSS
from smoothsk.training import FixedSigmaTraining

from conftest import SEARCH_WEIGHT, LinearLogits

FIELDS = ("prediction", "radius", "sigma", "p_lower", "n_samples", "search_steps", "region")


def with_params(fitted, **params):
    """A copy of a fitted estimator with other (certificate-neutral) parameters."""
    other = clone(fitted)
    other.__dict__.update({k: copy.deepcopy(v) for k, v in fitted.__dict__.items() if k.endswith("_")})
    return other.set_params(**params)


def assert_same_certificates(details, reference):
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(details, field), getattr(reference, field), err_msg=field)


@pytest.fixture
def chunk_calls(monkeypatch):
    """Records (number of inputs, one_worker) of every one-pass certification."""
    calls = []
    original = _certification._certify_chunk

    def recording(smoothing, X_chunk, *args, one_worker=False, **kwargs):
        calls.append((len(X_chunk), one_worker))
        return original(smoothing, X_chunk, *args, one_worker=one_worker, **kwargs)

    monkeypatch.setattr(_certification, "_certify_chunk", recording)
    return calls


@pytest.fixture(scope="module")
def reference(fitted_digits_cnn, digits_split):
    X = digits_split[2][:23]
    return X, fitted_digits_cnn.certify(X, return_details=True)[2]


class TestChunks:
    @pytest.mark.parametrize("n_jobs", [2, 3])
    def test_chunks_in_threads_give_the_one_pass_certificates(self, fitted_digits_cnn, reference, chunk_calls,
                                                              n_jobs):
        X, expected = reference
        details = with_params(fitted_digits_cnn, n_jobs=n_jobs).certify(X, return_details=True)[2]
        assert_same_certificates(details, expected)
        # Split into chunks, each with an in-process engine (no nested parallelism).
        assert len(chunk_calls) == 2 * n_jobs and sum(size for size, _ in chunk_calls) == len(X)
        assert all(one_worker for _, one_worker in chunk_calls)

    def test_stateful_allocator_keeps_one_pass(self, fitted_digits_cnn, reference, chunk_calls):
        X = reference[0]
        one = with_params(fitted_digits_cnn, allocator=OnlineBallAllocator())
        expected = one.certify(X, return_details=True)[2]
        parallel = with_params(fitted_digits_cnn, allocator=OnlineBallAllocator(), n_jobs=2)
        details = parallel.certify(X, return_details=True)[2]
        assert_same_certificates(details, expected)
        assert chunk_calls == [(len(X), False), (len(X), False)]
        assert parallel.regions_.digest() == one.regions_.digest()

    def test_set_level_sigma_search_keeps_one_pass(self, make_linear_classifier, linear_data, chunk_calls):
        # One sigma learned for the whole set (Insta-RS Alg. 3): chunks would each learn their own.
        X = linear_data[0][:13]
        search = MultiStartFGSS(sigma0=0.25, max_level=8, n=50, per_input=False)
        one = make_linear_classifier(SEARCH_WEIGHT, sigma_search=search, n=300, n0=30, alpha=0.01)
        expected = one.certify(X, return_details=True)[2]
        details = with_params(one, n_jobs=2).certify(X, return_details=True)[2]
        assert_same_certificates(details, expected)
        assert np.unique(details.sigma).size == 1
        assert chunk_calls == [(len(X), False), (len(X), False)]

    def test_checkpointed_run_chunks_each_checkpoint_chunk(self, fitted_digits_cnn, reference, chunk_calls,
                                                           tmp_path):
        X, expected = reference
        clf = with_params(fitted_digits_cnn, n_jobs=2)
        details = clf.certify(X, return_details=True, checkpoint=tmp_path / "run.ckpt", checkpoint_every=10)[2]
        assert_same_certificates(details, expected)
        # Checkpoint chunks of 10, 10 and 3 inputs, each split into 2 * n_jobs (at most one per input).
        assert len(chunk_calls) == 4 + 4 + 3 and all(one_worker for _, one_worker in chunk_calls)
        assert not (tmp_path / "run.ckpt").exists()

    def test_one_input_uses_the_engine_workers(self, fitted_digits_cnn, reference, chunk_calls):
        X, expected = reference
        details = with_params(fitted_digits_cnn, n_jobs=2).certify(X[:1], return_details=True)[2]
        assert_same_certificates(details, Certificates(**{f: getattr(expected, f)[:1] for f in FIELDS}))
        assert chunk_calls == [(1, False)]


class ThreadRecordingLogits(LinearLogits):
    """:class:`LinearLogits` that records, per forward pass, whether it ran in the main thread and torch's threads."""

    calls = []

    def forward(self, x):
        type(self).calls.append((threading.current_thread() is threading.main_thread(), torch.get_num_threads()))
        return super().forward(x)


@pytest.fixture
def four_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


class TestThreadShares:
    @pytest.mark.parametrize("n_inputs", [1, 8], ids=["batches of one input", "chunks of inputs"])
    def test_thread_workers_share_the_processes_torch_threads(self, linear_data, four_torch_threads, n_inputs):
        # Two workers each running torch's four threads would run eight on four cores: each takes two.
        clf = SampleWiseSmoothedClassifier(
            ThreadRecordingLogits, module__weight=list(SEARCH_WEIGHT), max_epochs=0, training=FixedSigmaTraining(0.5),
            sigma_search=FixedSigma(0.5), sampler=FixedSampler(n=2000, n0=100), certify_batch_size=500, n_jobs=2,
            random_state=0).fit(np.zeros((2, 4), dtype=np.float32), [0, 1])
        ThreadRecordingLogits.calls.clear()
        clf.certify(linear_data[0][:n_inputs])
        in_workers = {threads for main, threads in ThreadRecordingLogits.calls if not main}
        in_main = {threads for main, threads in ThreadRecordingLogits.calls if main}
        assert in_workers == {2}
        assert in_main <= {4}  # a single batch (one input's selection copies) runs here, with every thread
        # Afterwards this thread, and any thread started later, have the process's four again.
        started_later = []
        thread = threading.Thread(target=lambda: started_later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert (torch.get_num_threads(), started_later) == (4, [4])


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        yield client


class TestClusters:
    def test_dask_cluster_gives_the_one_pass_certificates(self, fitted_digits_cnn, reference, dask_client):
        X, expected = reference
        clf = with_params(fitted_digits_cnn, n_jobs=-1)
        from distributed import get_task_stream

        with get_task_stream(client=dask_client) as tasks, joblib.parallel_config(backend="dask"):
            details = clf.certify(X, return_details=True)[2]
        assert_same_certificates(details, expected)
        # The chunks ran in the cluster's worker processes, not in this one.
        workers = {task["worker"] for task in tasks.data}
        assert workers and workers <= set(dask_client.scheduler_info()["workers"])

    @pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
    def test_ray_gives_the_one_pass_certificates(self, fitted_digits_cnn, reference):
        import ray
        from ray.util.joblib import register_ray

        X, expected = reference
        register_ray()
        ray.init(num_cpus=2, include_dashboard=False)
        try:
            with joblib.parallel_config(backend="ray"):
                details = with_params(fitted_digits_cnn, n_jobs=2).certify(X, return_details=True)[2]
        finally:
            ray.shutdown()
        assert_same_certificates(details, expected)
