"""The engine and the estimator on an accelerator: the CUDA tests that ``benchmarks/gpu_check.sh`` runs.

``pytest tests/test_device.py --device cuda`` runs them on a GPU. Without
``--device`` they run on the CPU through the engine's accelerator path
(noise from the device's torch generator in seeded blocks, ``channels_last``),
so the suite checks their logic; tests that need a real device's memory or
streams are skipped there.
"""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats
from test_engine import Buckets, chi_square_statistic, exact_probabilities

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.engine import MonteCarloEngine
from smoothsk.metrics import average_certified_radius

from conftest import tiny_digits_classifier


@pytest.fixture
def device(request):
    """The device under test: ``--device`` (default cpu, where engines take the accelerator path)."""
    device = torch.device(request.config.getoption("--device"))
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.fail(f"--device {device} was asked for, but torch {torch.__version__} sees no CUDA device.")
    return device


@pytest.fixture
def accelerated(device, monkeypatch):
    """``device``, with every engine built in the test taking the accelerator path (on the CPU too)."""
    monkeypatch.setattr(MonteCarloEngine, "_accelerator_path", True)
    return device


def needs_cuda(device):
    if device.type != "cuda":
        pytest.skip("needs a CUDA device (--device cuda)")


def engine_on(device, module, batch_size, **params):
    """A ``MonteCarloEngine`` over ``module`` moved to ``device``, taking the accelerator path there."""
    engine = MonteCarloEngine(module.to(device), 3, batch_size=batch_size, device=device, **params)
    engine._accelerator_path = True
    return engine


@pytest.fixture
def inputs():
    """Six 1-feature inputs with a sigma each: (X (6, 1) tensor, x (6,), sigma (6,))."""
    x = np.array([-1.0, -0.3, 0.0, 0.2, 0.5, 1.2])
    sigma = np.array([1.0, 0.5, 1.0, 0.6, 0.8, 2.0])
    return torch.tensor(x, dtype=torch.float32)[:, None], x, sigma


class TestEngine:
    def test_counts_follow_the_exact_probabilities(self, device, inputs):
        X, x, sigma = inputs
        counts = engine_on(device, Buckets(), 2048, root_seed=5).class_counts(X, sigma, 20_000, (1,))
        assert chi_square_statistic(counts, exact_probabilities(x, sigma)) < stats.chi2.ppf(1 - 1e-6, df=12)

    def test_counts_do_not_depend_on_the_batch_the_workers_or_the_subset(self, device, inputs):
        X, _, sigma = inputs
        counts = engine_on(device, Buckets(), 700, root_seed=5).class_counts(X, sigma, 4000, (1,))
        split = engine_on(device, Buckets(), 33, n_jobs=3, root_seed=5).class_counts(X, sigma, 4000, (1,))
        np.testing.assert_array_equal(split, counts)
        rows = np.array([4, 1])
        subset = engine_on(device, Buckets(), 700, root_seed=5).restricted(rows).class_counts(
            X[rows], sigma[rows], 4000, (1,))
        np.testing.assert_array_equal(subset, counts[rows])

    def test_counts_match_the_cpu_path_in_distribution(self, device, inputs):
        # The device's generator and the CPU's Philox draw different noise from
        # the same seeds, so the counts differ; their distributions must not.
        X, _, sigma = inputs
        on_device = engine_on(device, Buckets(), 1000, root_seed=5).class_counts(X, sigma, 20_000, (1,))
        on_cpu = MonteCarloEngine(Buckets(), 3, batch_size=1000, root_seed=5).class_counts(X, sigma, 20_000, (1,))
        for row_device, row_cpu in zip(on_device, on_cpu, strict=True):
            table = np.array([row_device, row_cpu])
            table = table[:, table.sum(axis=0) > 0]
            if table.shape[1] > 1:
                assert stats.chi2_contingency(table).pvalue > 1e-6

    def test_out_of_memory_halves_the_batch_and_keeps_the_counts(self, device):
        needs_cuda(device)
        # 2**19 copies of a 3x256x256 image need 412 GB of noise: more than any one GPU holds.
        X = torch.zeros((1, 3, 256, 256))
        reference = engine_on(device, Buckets(), 4096, root_seed=3).class_counts(X, 1.0, 2 ** 19, (1,))
        engine = engine_on(device, Buckets(), 2 ** 19, root_seed=3)
        with pytest.warns(RuntimeWarning, match="Out of memory"):
            counts = engine.class_counts(X, 1.0, 2 ** 19, (1,))
        assert engine.batch_size < 2 ** 19
        np.testing.assert_array_equal(counts, reference)

    def test_no_host_synchronisation_per_batch(self, device, inputs):
        needs_cuda(device)
        X, _, sigma = inputs

        def synchronisations(n_batches):
            engine = engine_on(device, Buckets(), 128, root_seed=5)
            engine.class_counts(X, sigma, 128, (1,))  # warm-up: first-call allocations
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    engine.class_counts(X, sigma, 128 * n_batches // len(X), (1,))
            finally:
                torch.cuda.set_sync_debug_mode("default")
            return sum("synchronizing" in str(warning.message) for warning in caught)

        assert synchronisations(600) == synchronisations(60)

    def test_half_precision_inputs_are_counted(self, device, inputs):
        X, x, sigma = inputs
        counts = engine_on(device, Buckets(), 1000, root_seed=5).class_counts(X.to(torch.bfloat16), sigma, 4000, (1,))
        assert (counts.sum(axis=1) == 4000).all()
        # bfloat16 rounds each noisy copy to 8 bits of mantissa: the distribution barely moves.
        np.testing.assert_allclose(counts / 4000, exact_probabilities(x, sigma), atol=0.05)


class TestEstimator:
    @pytest.fixture
    def fitted_on_device(self, accelerated, digits_split):
        X_train, y_train, _, _ = digits_split
        return tiny_digits_classifier(device=str(accelerated), max_epochs=3).fit(X_train, y_train)

    def test_certificates_are_reproducible_on_the_device(self, fitted_on_device, digits_split):
        X_test = digits_split[2][:20]
        first, second = fitted_on_device.certify(X_test), fitted_on_device.certify(X_test)
        np.testing.assert_array_equal(first[0], second[0])
        np.testing.assert_array_equal(first[1], second[1])

    def test_bfloat16_certificates_agree_with_float32(self, fitted_on_device, digits_split):
        _, _, X_test, y_test = digits_split
        full = fitted_on_device.certify(X_test)
        half = fitted_on_device.set_params(certify_autocast="bfloat16").certify(X_test)
        assert np.mean(full[0] == half[0]) >= 0.9
        acr_full, acr_half = average_certified_radius(y_test, *full), average_certified_radius(y_test, *half)
        assert abs(acr_half - acr_full) <= 0.1 * acr_full

    def test_a_model_saved_on_the_device_certifies_alike_on_the_cpu(self, fitted_on_device, digits_split, tmp_path):
        _, _, X_test, y_test = digits_split
        fitted_on_device.save(tmp_path / "model.safetensors")
        loaded = SampleWiseSmoothedClassifier.load(tmp_path / "model.safetensors")
        for name, tensor in fitted_on_device.module_.state_dict().items():
            torch.testing.assert_close(loaded.module_.state_dict()[name].cpu(), tensor.cpu(), rtol=0, atol=0)
        on_device = fitted_on_device.certify(X_test)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(MonteCarloEngine, "_accelerator_path", False)
            on_cpu = loaded.set_params(device="cpu").certify(X_test)
        assert np.mean(on_device[0] == on_cpu[0]) >= 0.9
        acr_device, acr_cpu = average_certified_radius(y_test, *on_device), average_certified_radius(y_test, *on_cpu)
        assert abs(acr_cpu - acr_device) <= 0.1 * acr_device
