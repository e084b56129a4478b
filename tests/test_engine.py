"""The Monte Carlo engine: distribution, reproducibility under any split, packing, memory bound."""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import smoothsk.engine as engine_module
from smoothsk.engine import NOISE_BLOCK, MonteCarloEngine, _NoiseSource, _splitmix64, runs_channels_last, stage_key

THRESHOLDS = (-0.5, 0.4)


class Buckets(torch.nn.Module):
    """Classifies a 1-feature input by the interval of ``THRESHOLDS`` it falls in (3 classes), on any device.

    Under noise ``N(0, sigma^2)`` the class probabilities of input ``x`` are
    differences of ``Phi((t - x) / sigma)``: the engine must reproduce them.
    """

    def __init__(self):
        super().__init__()
        self.register_buffer("thresholds", torch.tensor(THRESHOLDS))

    def forward(self, x):
        bucket = torch.bucketize(x.flatten(1)[:, 0].contiguous(), self.thresholds.to(x.dtype))
        return 10.0 * torch.nn.functional.one_hot(bucket, 3).to(x.dtype)


class Recorder(torch.nn.Module):
    """Wraps a module and records every batch it receives."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.batches = []

    def forward(self, x):
        self.batches.append(x.clone())
        return self.module(x)


def exact_probabilities(x, sigma):
    """Class probabilities of :class:`Buckets` at inputs x (n,) and noise levels sigma (n,)."""
    cdf = stats.norm.cdf((np.asarray(THRESHOLDS)[None, :] - x[:, None]) / sigma[:, None])
    return np.diff(np.hstack([np.zeros((len(x), 1)), cdf, np.ones((len(x), 1))]), axis=1)


def reference_counts(module, x, sigma, n, batch_size=100):
    """A plain per-input loop (Cohen et al.'s style): the engine's specification."""
    counts = np.zeros((len(x), 3), dtype=np.int64)
    with torch.no_grad():
        for i in range(len(x)):
            remaining = n
            while remaining:
                size = min(batch_size, remaining)
                remaining -= size
                batch = x[i:i + 1].repeat(size, 1)
                prediction = module(batch + sigma[i] * torch.randn_like(batch)).argmax(dim=1)
                counts[i] += np.bincount(prediction.numpy(), minlength=3)
    return counts


def chi_square_statistic(counts, probabilities):
    expected = counts.sum(axis=1, keepdims=True) * probabilities
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.fixture(params=["cpu path", "accelerator path"])
def noise_path(request, monkeypatch):
    """Runs a test on the CPU path and on the accelerator path (device generator, channels_last)."""
    monkeypatch.setattr(MonteCarloEngine, "_accelerator_path", request.param == "accelerator path")
    return request.param


@pytest.fixture
def inputs():
    """Six 1-feature inputs with different sigma each: (X (6, 1) tensor, x (6,), sigma (6,))."""
    x = np.array([-1.0, -0.3, 0.0, 0.2, 0.5, 1.2])
    sigma = np.array([1.0, 0.5, 1.0, 0.6, 0.8, 2.0])
    return torch.tensor(x, dtype=torch.float32)[:, None], x, sigma


@pytest.mark.usefixtures("noise_path")
class TestDistribution:
    def test_counts_follow_the_exact_probabilities_like_a_reference_loop(self, inputs):
        # Goodness of fit of 6 inputs x 3 classes: 12 degrees of freedom; each
        # test rejects a correct sampler with probability 1e-6.
        X, x, sigma = inputs
        n = 4000
        probabilities = exact_probabilities(x, sigma)
        engine = MonteCarloEngine(Buckets(), 3, batch_size=700, root_seed=0)
        counts = engine.class_counts(X, sigma, n, stage=(1,))
        loop = reference_counts(Buckets(), X, sigma, n)
        critical = stats.chi2.ppf(1 - 1e-6, df=len(x) * 2)
        assert chi_square_statistic(loop, probabilities) < critical  # the test accepts the reference
        assert chi_square_statistic(counts, probabilities) < critical
        # Engine and reference loop are samples of the same law (homogeneity, 12 dof).
        homogeneity = sum(stats.chi2_contingency(np.stack([c, r]) + 0.0)[0] for c, r in zip(counts, loop, strict=True))
        assert homogeneity < critical

    def test_swapped_sigmas_are_detected(self, inputs):
        # The goodness-of-fit check above can fail: counts of inputs sampled at
        # each other's sigma are rejected.
        X, x, sigma = inputs
        engine = MonteCarloEngine(Buckets(), 3, batch_size=700, root_seed=0)
        counts = engine.class_counts(X, sigma[::-1].copy(), 4000, stage=(1,))
        assert chi_square_statistic(counts, exact_probabilities(x, sigma)) > stats.chi2.ppf(1 - 1e-6, df=12)

    def test_noise_is_standard_gaussian_times_sigma(self):
        # 2 inputs of 64 features, 512 copies each: per-input sample mean and
        # variance of the noise against their exact laws (bounds at 1e-6).
        recorder = Recorder(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3)))
        X = torch.stack([torch.zeros(1, 8, 8), torch.full((1, 8, 8), 3.0)])
        sigma = np.array([0.25, 2.0])
        MonteCarloEngine(recorder, 3, batch_size=300, root_seed=0).class_counts(X, sigma, 512, (1,))
        noisy = torch.cat(recorder.batches).double()
        for i, (rows, s) in enumerate(zip((noisy[:512], noisy[512:]), sigma, strict=True)):
            noise = (rows - X[i].double()).flatten().numpy() / s
            m = noise.size
            z = stats.norm.ppf(1 - 1e-6 / 2)
            assert abs(noise.mean()) < z / np.sqrt(m)
            assert abs(noise.var() - 1) < z * np.sqrt(2 / m) + 1e-3
        # Copies of different inputs and different copies are not the same noise.
        first, second = (noisy[:512] - X[0]) / 0.25, (noisy[512:] - X[1]) / 2.0
        assert abs(np.corrcoef(first.flatten(), second.flatten())[0, 1]) < 0.05
        assert len(torch.unique(first[:, 0, 0, 0])) == 512

    def test_standard_normal_is_the_noise_class_counts_adds(self):
        # With X = 0 and sigma = 1 the module sees exactly the unscaled noise.
        recorder = Recorder(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)))
        engine = MonteCarloEngine(recorder, 3, batch_size=50, root_seed=7)
        X = torch.zeros(5, 4)
        engine.class_counts(X, 1.0, 30, (0, 3))
        seen = torch.cat(recorder.batches).view(5, 30, 4)
        torch.testing.assert_close(engine.standard_normal(X, 30, (0, 3)), seen, rtol=0, atol=0)
        rows = np.array([1, 4])
        torch.testing.assert_close(engine.restricted(rows).standard_normal(X[rows], 30, (0, 3)), seen[rows],
                                   rtol=0, atol=0)

    def test_identical_inputs_get_independent_noise(self):
        engine = MonteCarloEngine(Buckets(), 3, batch_size=256, root_seed=0)
        counts = engine.class_counts(torch.zeros(20, 1), np.ones(20), 200, (1,))
        assert len(np.unique(counts, axis=0)) > 10


@pytest.mark.usefixtures("noise_path")
class TestReproducibility:
    @pytest.fixture
    def model(self):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 5)).eval()

    @pytest.fixture
    def X(self):
        return torch.randn(13, 1, 4, 4, generator=torch.Generator().manual_seed(1))

    def counts(self, model, X, n_samples, stage=(1,), **kwargs):
        params = {"batch_size": 97, "root_seed": 3, **kwargs}
        return MonteCarloEngine(model, 5, **params).class_counts(X, np.linspace(0.3, 1.5, len(X)), n_samples, stage)

    def test_same_seed_and_stage_same_counts(self, model, X):
        np.testing.assert_array_equal(self.counts(model, X, 300), self.counts(model, X, 300))

    def test_other_stage_or_seed_other_counts(self, model, X):
        base = self.counts(model, X, 300)
        assert not np.array_equal(base, self.counts(model, X, 300, stage=(2,)))
        assert not np.array_equal(base, self.counts(model, X, 300, root_seed=4))

    def test_stage_keys_distinguish_trailing_zeros(self):
        stages = [(), (0,), (0, 0), (1,), (1, 0), (1, 0, 0), (0, 1), (7,)]
        assert len({stage_key(0, stage) for stage in stages}) == len(stages)
        assert stage_key(0, (1,)) != stage_key(1, (1,))

    @pytest.mark.parametrize("n_jobs", [2, 3, -1])
    def test_any_n_jobs_gives_identical_counts(self, model, X, n_jobs):
        n_samples = np.arange(13) * 37 + 5
        np.testing.assert_array_equal(self.counts(model, X, n_samples, n_jobs=n_jobs),
                                      self.counts(model, X, n_samples))

    @pytest.mark.parametrize("batch_size", [1, 50, NOISE_BLOCK, 1000])
    def test_any_batch_size_gives_identical_counts(self, model, X, batch_size):
        n_samples = np.arange(13) * 37 + 5
        np.testing.assert_array_equal(self.counts(model, X, n_samples, batch_size=batch_size),
                                      self.counts(model, X, n_samples))

    def test_restricted_rows_get_the_noise_of_their_position(self, model, X):
        n_samples = np.arange(13) * 37 + 5
        full = self.counts(model, X, n_samples)
        engine = MonteCarloEngine(model, 5, batch_size=97, root_seed=3)
        sigma = np.linspace(0.3, 1.5, len(X))
        rows = np.array([11, 2, 7, 3])
        subset = engine.restricted(rows).class_counts(X[rows], sigma[rows], n_samples[rows], (1,))
        np.testing.assert_array_equal(subset, full[rows])
        # Restricting twice composes the positions.
        inner = np.array([3, 0])
        nested = engine.restricted(rows).restricted(inner).class_counts(
            X[rows[inner]], sigma[rows[inner]], n_samples[rows[inner]], (1,))
        np.testing.assert_array_equal(nested, full[rows[inner]])

    def test_more_samples_extend_the_same_stream(self, model, X):
        # Copy j's noise does not depend on how many copies are drawn, so the
        # first 300 copies of a 600-copy run are those of a 300-copy run.
        recorder = Recorder(model)
        MonteCarloEngine(recorder, 5, batch_size=1000, root_seed=0).class_counts(X[:1], 1.0, 300, (1,))
        MonteCarloEngine(recorder, 5, batch_size=1000, root_seed=0).class_counts(X[:1], 1.0, 600, (1,))
        short, long = recorder.batches
        torch.testing.assert_close(long[:300], short, rtol=0, atol=0)

    def test_mean_softmax_is_split_invariant(self, model, X):
        sigma = np.linspace(0.3, 1.5, len(X))
        single = MonteCarloEngine(model, 5, batch_size=97, root_seed=3).mean_softmax(X, sigma, 200, (1,))
        parallel = MonteCarloEngine(model, 5, batch_size=64, n_jobs=3, root_seed=3).mean_softmax(X, sigma, 200, (1,))
        np.testing.assert_allclose(parallel, single, rtol=1e-12)


class TestPacking:
    def test_batches_are_full_and_never_exceed_batch_size(self):
        recorder = Recorder(Buckets())
        n_samples = np.array([30, 0, 250, 7, 90, 1])
        engine = MonteCarloEngine(recorder, 3, batch_size=64, root_seed=0)
        counts = engine.class_counts(torch.zeros(6, 1), np.ones(6), n_samples, (1,))
        sizes = [len(batch) for batch in recorder.batches]
        total = int(n_samples.sum())
        # Packed across inputs: only the last batch may be partial.
        assert sizes == [64] * (total // 64) + [total % 64]
        np.testing.assert_array_equal(counts.sum(axis=1), n_samples)

    def test_batch_holds_copies_of_several_inputs(self):
        recorder = Recorder(torch.nn.Identity())
        X = torch.arange(4.0)[:, None]
        MonteCarloEngine(recorder, 1, batch_size=1000, root_seed=0).class_counts(X, 1e-6, 10, (1,))
        (batch,) = recorder.batches
        np.testing.assert_allclose(batch[:, 0].numpy(), np.repeat(np.arange(4.0), 10), atol=1e-4)

    def test_no_samples(self):
        recorder = Recorder(Buckets())
        engine = MonteCarloEngine(recorder, 3, batch_size=64, root_seed=0)
        assert engine.class_counts(torch.zeros(3, 1), 1.0, 0, (1,)).tolist() == [[0] * 3] * 3
        assert engine.class_counts(torch.zeros(0, 1), 1.0, 5, (1,)).shape == (0, 3)
        assert not recorder.batches

    def test_runs_without_autograd(self):
        seen = []

        class Probe(torch.nn.Module):
            def forward(self, x):
                seen.append(torch.is_inference_mode_enabled())
                return torch.zeros(len(x), 2)

        MonteCarloEngine(Probe(), 2, batch_size=10, root_seed=0).class_counts(torch.zeros(2, 3), 1.0, 15, (1,))
        assert seen and all(seen)


class NoiseLevelRecorder(torch.nn.Module):
    """A module that takes each row's noise level (``module(x, sigma)``) and records both, per batch.

    Attributes
    ----------
    batches : list of (torch.Tensor, torch.Tensor)
        The noisy copies of each call and the level of each of its rows (a
        scalar level expanded to the batch).
    """

    takes_noise_level = True

    def __init__(self):
        super().__init__()
        self.batches = []

    def forward(self, x, sigma):
        sigma = torch.as_tensor(sigma)
        self.batches.append((x.clone(), (sigma.expand(len(x)) if sigma.ndim == 0 else sigma).clone()))
        return torch.zeros(len(x), 2, dtype=x.dtype)


@pytest.mark.usefixtures("noise_path")
class TestNoiseLevel:
    @pytest.mark.parametrize("soft", [False, True], ids=["counts", "softmax"])
    def test_a_module_that_takes_the_noise_level_is_given_each_row_s(self, soft):
        # 5 inputs of 64 features, input i all 100 i (so a copy's input is its rounded mean / 100), each
        # at its own level. Batches of 70 copies hold two inputs at different levels, or (70..140) one.
        sigma = np.array([0.25, 2.0, 0.5, 0.25, 1.0])
        n_samples = np.array([50, 200, 30, 40, 50])
        X = (100.0 * torch.arange(5.0))[:, None].repeat(1, 64)
        recorder = NoiseLevelRecorder()
        engine = MonteCarloEngine(recorder, 2, batch_size=70, root_seed=0)
        (engine.mean_softmax if soft else engine.class_counts)(X, sigma, n_samples, (1,))
        assert any(len(torch.unique(levels)) > 1 for _, levels in recorder.batches)  # mixed levels in one batch
        noisy = torch.cat([batch for batch, _ in recorder.batches]).double()
        levels = torch.cat([levels for _, levels in recorder.batches]).double().numpy()
        owner = torch.round(noisy.mean(dim=1) / 100).long().numpy()
        np.testing.assert_array_equal(owner, np.repeat(np.arange(5), n_samples))
        np.testing.assert_array_equal(levels, sigma[owner].astype(np.float32))
        # The level given is the one each copy's noise was drawn at: ||noise||^2 / level^2 ~ chi2(64).
        scaled = ((noisy - X[owner].double()) ** 2).sum(dim=1).numpy() / levels**2
        low, high = stats.chi2.ppf([1e-9, 1 - 1e-9], df=64)
        assert np.all((scaled > low) & (scaled < high))


class LogitsOfWidth(torch.nn.Module):
    """(n, d) -> (n, width) logits voting class ``width - 1`` where x_0 > 5, else class 0."""

    def __init__(self, width):
        super().__init__()
        self.width = width

    def forward(self, x):
        logits = torch.zeros((len(x), self.width))
        logits[:, 0] = 1.0
        logits[:, -1] = 2.0 * (x[:, 0] > 5)
        return logits


class TestModuleOutputWidth:
    # A module scoring another number of classes than the engine's: a vote for
    # class >= n_classes would land in the next input's row of the counts.
    @pytest.mark.parametrize("width", [1, 3])
    @pytest.mark.parametrize("soft", [False, True])
    @pytest.mark.parametrize("batch_size", [7, 1000])
    def test_is_refused_naming_both_widths(self, width, soft, batch_size):
        engine = MonteCarloEngine(LogitsOfWidth(width), n_classes=2, batch_size=batch_size, root_seed=0)
        X = torch.tensor([[10.0, 0.0], [0.0, 0.0]])
        sample = engine.mean_softmax if soft else engine.class_counts
        with pytest.raises(ValueError, match=rf"returned {width} logits per input; expected n_classes=2"):
            sample(X, sigma=0.1, n_samples=10, stage=(1,))


class NaNWherePositive(torch.nn.Module):
    """(n, 1) -> (n, 2) logits: NaN where x_0 > 0 (a module undefined there), else class 0."""

    def forward(self, x):
        logits = torch.zeros((len(x), 2))
        logits[:, 0] = 1.0
        logits[x[:, 0] > 0] = float("nan")
        return logits


class TestUndefinedOutputs:
    # A copy whose logits are NaN has no class: it must not vote for one (torch's
    # argmax would give it the NaN's index), else a broken model is certified.
    @pytest.mark.parametrize("n_jobs", [None, 2])
    def test_copies_with_nan_logits_vote_for_no_class_with_a_warning(self, n_jobs):
        # Batches of 70 copies straddle the inputs' 500, and two workers each count a part.
        X = torch.zeros((3, 1))
        engine = MonteCarloEngine(NaNWherePositive(), n_classes=2, batch_size=70, root_seed=0, n_jobs=n_jobs)
        # The copies with x + noise <= 0 (the same streams standard_normal draws) vote class 0; the rest, none.
        below = (engine.standard_normal(X, 500, (1,))[:, :, 0] <= 0).sum(dim=1).numpy()
        undefined = rf"NaN logits for {1500 - below.sum()} of 1500 noisy copies"
        with pytest.warns(RuntimeWarning, match=undefined):
            counts = engine.class_counts(X, sigma=1.0, n_samples=500, stage=(1,))
        np.testing.assert_array_equal(counts, np.stack([below, np.zeros(3, dtype=np.int64)], axis=1))
        with pytest.warns(RuntimeWarning, match=undefined):
            soft = engine.mean_softmax(X, sigma=1.0, n_samples=500, stage=(1,))
        np.testing.assert_allclose(soft[:, 0], counts[:, 0] / 500 * (np.e / (np.e + 1)), rtol=1e-12)
        np.testing.assert_allclose(soft[:, 1], counts[:, 0] / 500 / (np.e + 1), rtol=1e-12)

    def test_infinite_logits_are_a_class_in_soft_mode_too(self):
        # [inf, 0]: argmax votes class 0; the softmax must give it all the mass, with no NaN warning.
        class InfiniteFirst(torch.nn.Module):
            def forward(self, x):
                return torch.stack([torch.full((len(x),), float("inf")), torch.zeros(len(x))], dim=1)

        engine = MonteCarloEngine(InfiniteFirst(), n_classes=2, batch_size=100, root_seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(engine.class_counts(torch.zeros((1, 1)), 1.0, 50, (1,)), [[50, 0]])
            np.testing.assert_array_equal(engine.mean_softmax(torch.zeros((1, 1)), 1.0, 50, (1,)), [[1.0, 0.0]])

    @pytest.mark.parametrize("sigma", [np.nan, 0.0, -1.0, np.inf, 1e38])
    def test_a_sigma_that_is_not_positive_or_overflows_the_noise_is_refused(self, sigma):
        engine = MonteCarloEngine(Buckets(), n_classes=3, batch_size=100, root_seed=0)
        with pytest.raises(ValueError, match=r"sigma must be positive and at most 3\.4\d*e\+37 for float32 noise"):
            engine.class_counts(torch.zeros((2, 1)), sigma=[1.0, sigma], n_samples=10, stage=(1,))

    def test_float64_inputs_take_larger_sigmas(self):
        engine = MonteCarloEngine(Buckets(), n_classes=3, batch_size=100, root_seed=0)
        counts = engine.class_counts(torch.zeros((1, 1), dtype=torch.float64), sigma=1e38, n_samples=10, stage=(1,))
        assert counts.sum() == 10


class TestMeanSoftmax:
    def test_rows_sum_to_one_and_match_counts_for_confident_models(self, inputs):
        X, x, sigma = inputs
        engine = MonteCarloEngine(Buckets(), 3, batch_size=100, root_seed=0)
        n_samples = np.array([100, 0, 300, 50, 1, 220])
        soft = engine.mean_softmax(X, sigma, n_samples, (1,))
        assert soft.dtype == np.float64
        np.testing.assert_allclose(soft.sum(axis=1), (n_samples > 0).astype(float), rtol=1e-12)
        # Buckets' logits are 10 * one-hot: softmax is the hard vote up to e^-10 per class.
        counts = engine.class_counts(X, sigma, n_samples, (1,))
        expected = counts / np.maximum(n_samples, 1)[:, None]
        np.testing.assert_allclose(soft, expected, atol=3e-4)

    def test_scalar_sample_count(self, inputs):
        X, _, sigma = inputs
        soft = MonteCarloEngine(Buckets(), 3, batch_size=100, root_seed=0).mean_softmax(X, sigma, 40, (1,))
        np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-12)


class TestDtypes:
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_precision_inputs_get_the_float32_noisy_copies_rounded(self, dtype):
        # The module then sees round(x + sigma * e) with e and the sum in float32: a fixed function
        # (the rounding) of the float32 noisy input, so the certificate is about that function
        # smoothed at the nominal sigma. Noise or sigma rounded to the half type before the sum
        # would make the module's input depend on x beyond x + sigma * e (and sigma 0.3 is not a
        # half-precision number).
        X = torch.linspace(-2.0, 2.0, 6, dtype=dtype).view(2, 3)
        recorder = Recorder(torch.nn.Identity())
        engine = MonteCarloEngine(recorder, 3, batch_size=64, root_seed=0)
        engine.class_counts(X.float(), 0.3, 10, (1,))
        engine.class_counts(X, 0.3, 10, (1,))
        single, half = recorder.batches
        assert half.dtype == dtype
        torch.testing.assert_close(half, single.to(dtype), rtol=0, atol=0)


class OutOfMemoryAbove(torch.nn.Module):
    """Wraps a module and raises the device's out-of-memory error on batches larger than ``limit``."""

    def __init__(self, module, limit):
        super().__init__()
        self.module = module
        self.limit = limit
        self.sizes = []

    def forward(self, x):
        self.sizes.append(len(x))
        if len(x) > self.limit:
            raise torch.OutOfMemoryError(f"test: {len(x)} copies do not fit")
        return self.module(x)


class TestAcceleratorPath:
    def test_the_switch_takes_another_noise_path(self):
        recorder = Recorder(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3)))
        X = torch.zeros(2, 3, 4, 4)
        MonteCarloEngine(recorder, 3, batch_size=100, root_seed=0).class_counts(X, 1.0, 50, (1,))
        engine = MonteCarloEngine(recorder, 3, batch_size=100, root_seed=0)
        engine._accelerator_path = True
        engine.class_counts(X, 1.0, 50, (1,))
        cpu, accelerator = recorder.batches
        assert not torch.equal(cpu, accelerator)
        # 4-D batches go through the module in channels_last layout on the accelerator path only.
        assert accelerator.is_contiguous(memory_format=torch.channels_last) and not accelerator.is_contiguous()
        assert cpu.is_contiguous()

    def test_counts_follow_the_exact_probabilities_at_any_split(self, inputs, monkeypatch):
        monkeypatch.setattr(MonteCarloEngine, "_accelerator_path", True)
        X, x, sigma = inputs
        counts = MonteCarloEngine(Buckets(), 3, batch_size=700, root_seed=5).class_counts(X, sigma, 4000, (1,))
        assert chi_square_statistic(counts, exact_probabilities(x, sigma)) < stats.chi2.ppf(1 - 1e-6, df=12)
        split = MonteCarloEngine(Buckets(), 3, batch_size=33, n_jobs=3, root_seed=5).class_counts(X, sigma, 4000, (1,))
        np.testing.assert_array_equal(split, counts)


def small_convnet(in_channels=3):
    """A convolution and a linear read-out over (n, in_channels, 4, 4) inputs: 3 logits."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(in_channels, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(64, 3)).eval()


class TestMemoryFormat:
    @pytest.mark.parametrize("memory_format, module, input_dim, accelerated, expected", [
        ("auto", small_convnet(), 4, False, True),  # a CPU conv net: its fastest layout
        ("auto", torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3)), 4, False, False),  # an MLP
        ("auto", torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3)), 4, True, True),  # accelerators
        ("auto", small_convnet(), 2, False, False),  # not an image batch
        ("contiguous", small_convnet(), 4, True, False),
        ("channels_last", torch.nn.Flatten(), 4, False, True),
        ("channels_last", torch.nn.Flatten(), 3, False, False),
    ])
    def test_the_layout_is_a_function_of_the_setting_module_and_device(self, memory_format, module, input_dim,
                                                                        accelerated, expected):
        assert runs_channels_last(memory_format, module, input_dim, accelerated) is expected

    @pytest.mark.parametrize("memory_format, channels_last", [("auto", True), ("contiguous", False)])
    def test_batches_and_weights_run_in_the_chosen_layout_with_the_weights_unchanged(self, memory_format,
                                                                                     channels_last):
        module = small_convnet()
        weights = {name: value.clone() for name, value in module.state_dict().items()}
        recorder = Recorder(module)
        MonteCarloEngine(recorder, 3, batch_size=64, root_seed=0, memory_format=memory_format).class_counts(
            torch.rand(3, 3, 4, 4), 0.5, 100, (1,))
        conv = module[0].weight
        for batch in recorder.batches:
            assert batch.is_contiguous(memory_format=torch.channels_last) is channels_last
            assert batch.is_contiguous() is not channels_last
        assert conv.is_contiguous(memory_format=torch.channels_last) is channels_last
        for name, value in module.state_dict().items():
            assert torch.equal(value, weights[name]), name

    @pytest.mark.parametrize("channels", [1, 3])
    def test_the_module_sees_the_noise_standard_normal_gives_in_either_layout(self, channels):
        # Noise is written in memory order, so in channels_last the (height, width, channel) order; each copy's
        # values are the same draws in both layouts (a permutation of them for several channels; none for one),
        # and standard_normal, which the gradient searches differentiate through, follows the layout too.
        X = torch.zeros(2, channels, 4, 4)
        seen = {}
        for memory_format in ("channels_last", "contiguous"):
            recorder = Recorder(small_convnet(channels))
            engine = MonteCarloEngine(recorder, 3, batch_size=7, root_seed=3, memory_format=memory_format)
            engine.class_counts(X, 1.0, 10, (2,))
            seen[memory_format] = torch.cat(recorder.batches).view(2, 10, channels, 4, 4)
            assert torch.equal(engine.standard_normal(X, 10, (2,)), seen[memory_format])
        last, standard = seen["channels_last"], seen["contiguous"]
        assert torch.equal(last.flatten(2).sort(dim=2).values, standard.flatten(2).sort(dim=2).values)
        assert torch.equal(last, standard) is (channels == 1)

    def test_counts_follow_the_exact_probabilities_in_channels_last(self, inputs):
        X, x, sigma = inputs
        images = X.view(-1, 1, 1, 1).expand(-1, 2, 2, 2).contiguous()
        engine = MonteCarloEngine(Buckets(), 3, batch_size=700, root_seed=5, memory_format="channels_last")
        counts = engine.class_counts(images, sigma, 4000, (1,))
        assert chi_square_statistic(counts, exact_probabilities(x, sigma)) < stats.chi2.ppf(1 - 1e-6, df=12)


class InferenceModeRecorder(torch.nn.Module):
    """``Buckets``, recording whether each batch ran in ``torch.inference_mode``."""

    def __init__(self):
        super().__init__()
        self.buckets = Buckets()
        self.modes = []

    def forward(self, x):
        self.modes.append(torch.is_inference_mode_enabled())
        return self.buckets(x)


@pytest.mark.parametrize("n_jobs", [1, 2])
@pytest.mark.parametrize("soft", [False, True])
def test_every_noisy_forward_pass_runs_in_inference_mode(inputs, n_jobs, soft):
    # Inference mode is per thread; layers such as TiledMaxPool2d take their fast path only there.
    X, _, sigma = inputs
    recorder = InferenceModeRecorder()
    engine = MonteCarloEngine(recorder, 3, batch_size=50, root_seed=0, n_jobs=n_jobs)
    (engine.mean_softmax if soft else engine.class_counts)(X, sigma, 200, (1,))
    assert len(recorder.modes) >= 2 and all(recorder.modes)


class TestOutOfMemory:
    @pytest.mark.parametrize("soft", [False, True])
    def test_batch_is_halved_until_it_fits_with_the_same_results(self, inputs, soft):
        X, _, sigma = inputs
        n_samples = np.array([300, 0, 41, 500, 7, 260])
        reference = MonteCarloEngine(Buckets(), 3, batch_size=60, root_seed=2)
        module = OutOfMemoryAbove(Buckets(), limit=64)
        engine = MonteCarloEngine(module, 3, batch_size=256, root_seed=2)
        method = "mean_softmax" if soft else "class_counts"
        with pytest.warns(RuntimeWarning, match="Out of memory on cpu") as record:
            result = getattr(engine, method)(X, sigma, n_samples, (1,))
        assert [str(w.message).split(";")[0] for w in record] == [
            "Out of memory on cpu at 256 noisy copies per forward pass",
            "Out of memory on cpu at 128 noisy copies per forward pass"]
        np.testing.assert_array_equal(result, getattr(reference, method)(X, sigma, n_samples, (1,)))
        assert engine.batch_size == 64 and max(module.sizes[-10:]) == 64

    def test_out_of_memory_at_one_copy_is_raised(self, inputs):
        X, _, sigma = inputs
        engine = MonteCarloEngine(OutOfMemoryAbove(Buckets(), limit=0), 3, batch_size=4, root_seed=0)
        with (pytest.warns(RuntimeWarning, match="retrying at 1 "),
              pytest.raises(torch.OutOfMemoryError, match="test: 1 copies do not fit")):
            engine.class_counts(X, sigma, 10, (1,))


class TestAutocast:
    def test_module_runs_in_the_requested_precision(self):
        seen = []

        class Probe(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(4, 3)

            def forward(self, x):
                logits = self.linear(x)
                seen.append(logits.dtype)
                return logits

        X = torch.randn(3, 4)
        for autocast in (None, torch.bfloat16):
            counts = MonteCarloEngine(Probe(), 3, batch_size=64, root_seed=0, autocast=autocast).class_counts(
                X, 0.5, 100, (1,))
            assert counts.sum() == 300
        # Five batches each: the one context, entered per batch, leaves autocast off after the call.
        assert set(seen[:5]) == {torch.float32} and set(seen[5:]) == {torch.bfloat16}
        assert not torch.is_autocast_enabled("cpu")


def test_cpu_noise_blocks_whose_seeds_agree_in_32_bits_differ():
    # The accelerators seed a torch generator with a 64-bit hash of (stage, input, block); torch's CPU
    # generator would keep only its low 32 bits, so two blocks of one input among ~2**16 would share their
    # noise. Find such a pair and check that the CPU's noise tells them apart.
    key, seen = stage_key(0, (1,)), {}
    for block in range(1 << 20):
        low = _splitmix64(_splitmix64(key ^ 0) ^ block) & 0xFFFFFFFF
        if low in seen:
            break
        seen[low] = block
    first, second = seen[low], block
    source = _NoiseSource(key, (4,), torch.float32, torch.device("cpu"))
    noise = torch.empty(2, NOISE_BLOCK, 4)
    for out, chosen in zip(noise, (first, second), strict=True):
        source.fill_segments(out, [(0, chosen * NOISE_BLOCK, (chosen + 1) * NOISE_BLOCK)])
    assert not torch.equal(noise[0], noise[1])


class TestCpuNoise:
    """The CPU's keyed Philox + Box-Muller noise: its law, its pairs, and its independence of the split."""

    @staticmethod
    def draw(dtype, input_shape, n_copies, input_id=0):
        source = _NoiseSource(stage_key(0, (7,)), input_shape, dtype, torch.device("cpu"))
        noise = torch.empty((n_copies,) + input_shape, dtype=dtype)
        source.fill_segments(noise, [(input_id, 0, n_copies)])
        return noise

    @pytest.mark.parametrize("dtype, shape", [(torch.float32, (1, 8, 8)), (torch.float64, (1, 8, 8)),
                                              (torch.float32, (9,))])
    def test_values_follow_the_standard_normal_law(self, dtype, shape):
        # 2**20 values (an odd copy size takes the path through a scratch buffer) in 60 equiprobable bins
        # plus two tail bins beyond |z| = 4; a correct sampler fails with probability 1e-6.
        values = self.draw(dtype, shape, (1 << 20) // int(np.prod(shape))).double().flatten().numpy()
        inner = stats.norm.ppf(np.linspace(stats.norm.cdf(-4), stats.norm.cdf(4), 61))[1:-1]
        edges = np.concatenate([[-np.inf, -4.0], inner, [4.0, np.inf]])
        observed = np.histogram(values, edges)[0]
        expected = len(values) * np.diff(stats.norm.cdf(edges))
        assert ((observed - expected) ** 2 / expected).sum() < stats.chi2.ppf(1 - 1e-6, df=len(observed) - 1)
        assert np.abs(values).max() < (8.653 if dtype == torch.float64 else 6.765)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_lower_precisions_round_the_float32_noise(self, dtype):
        assert torch.equal(self.draw(dtype, (9,), 50), self.draw(torch.float32, (9,), 50).to(dtype))

    def test_tail_mass_beyond_4_5_is_the_normal_s(self):
        # Beyond |z| = 4.5 a true normal puts 6.8e-6 of its mass: the count in 2**23 values lies within
        # a Poisson interval at 1e-6 (a cut below about 4.6 or a mis-scaled radius fails; the uniform's
        # resolution is checked exactly by the next test).
        values = self.draw(torch.float32, (64,), (1 << 23) // 64).flatten().numpy()
        tail = int((np.abs(values) > 4.5).sum())
        mean = len(values) * 2 * stats.norm.sf(4.5)
        assert stats.poisson.ppf(1e-6 / 2, mean) <= tail <= stats.poisson.ppf(1 - 1e-6 / 2, mean)

    @pytest.mark.parametrize("dtype, bits", [(torch.float32, 32), (torch.float64, 53)])
    def test_the_radius_grid_reaches_the_documented_cut(self, dtype, bits):
        # A pair's radius is sqrt(-2 log u), u = (k + 0.5) 2**-bits for the word's k: the smallest k gives
        # the cut (6.764 in float32, 8.652 in float64), the next one the next radius of the grid. A coarser
        # uniform (16 or 20 bits) gives other radii here.
        source = _NoiseSource(0, (2,), dtype, torch.device("cpu"))
        words_per_pair = 2 if dtype == torch.float64 else 1
        words = torch.zeros((2, words_per_pair), dtype=torch.int64)
        words[1, 0] = 1 << (11 if dtype == torch.float64 else 0)
        out = torch.empty((2, 2), dtype=dtype)
        source._box_muller(out, words)
        radii = out.double().norm(dim=1).numpy()
        np.testing.assert_allclose(radii, np.sqrt(-2 * np.log(np.array([0.5, 1.5]) * 2.0 ** -bits)), rtol=1e-6)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_radius_and_angle_come_from_separate_bits(self, dtype):
        # Words that differ only in the angle's bits (float32: the high 32 bits; float64: the second word)
        # give pairs of one radius and other directions; words that differ only in u's bits give one
        # direction and other radii. An angle read from u's bits fails this.
        source = _NoiseSource(0, (2,), dtype, torch.device("cpu"))
        u_bits, angle_bits = ((lambda k: k << 11, lambda k: k << 11) if dtype == torch.float64
                              else (lambda k: k, lambda k: k << 32))
        words_per_pair = 2 if dtype == torch.float64 else 1
        angle_word = words_per_pair - 1
        words = torch.zeros((3, words_per_pair), dtype=torch.int64)
        words[:, 0] = u_bits(12345)
        words[1, angle_word] += angle_bits(1 << 28)
        words[2, 0] = u_bits(7 << 26)
        out = torch.empty((3, 2), dtype=dtype)
        source._box_muller(out, words)
        radii, directions = out.norm(dim=1), torch.atan2(out[:, 1], out[:, 0])
        assert torch.isclose(radii[0], radii[1]) and not torch.isclose(directions[0], directions[1])
        assert torch.isclose(directions[0], directions[2]) and not torch.isclose(radii[0], radii[2])

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_the_two_values_of_a_pair_are_independent(self, dtype):
        # Box-Muller's cosine and sine halves share a radius: were the angle drawn from the radius's bits,
        # or a radius reused across pairs, their squares would correlate. Pearson's r of the squares of
        # value p and value p + 32 over 2**19 pairs: |r| < z(1e-6) / sqrt(m).
        noise = self.draw(dtype, (64,), (1 << 19) // 32)
        first, second = (noise[:, :32].double() ** 2).ravel().numpy(), (noise[:, 32:].double() ** 2).ravel().numpy()
        assert abs(np.corrcoef(first, second)[0, 1]) < stats.norm.ppf(1 - 1e-6 / 2) / np.sqrt(first.size)
        # Neighbouring copies and inputs do not share values.
        assert not torch.equal(noise[0], noise[1])
        assert not torch.equal(self.draw(dtype, (64,), 1, input_id=1)[0], noise[0])
        # Identifiers are 64 bits (the estimator's are hashes): the top bit is part of the key.
        assert not torch.equal(self.draw(dtype, (64,), 1, input_id=1 << 63)[0], noise[0])

    @pytest.mark.parametrize("dtype, shape", [(torch.float32, (1, 8, 8)), (torch.float32, (7,)),
                                              (torch.float64, (3, 2)), (torch.float16, (5,))])
    def test_any_split_of_the_copies_gives_the_same_noise(self, dtype, shape):
        # Copy j reads words j * W .. (j + 1) * W - 1 of its input's stream, whatever else is drawn with it.
        source = _NoiseSource(stage_key(0, (7,)), shape, dtype, torch.device("cpu"))
        whole = torch.empty((301,) + shape, dtype=dtype)
        source.fill_segments(whole, [(5, 0, 301)])
        pieces = torch.empty((301 + 40,) + shape, dtype=dtype)
        source.fill_segments(pieces, [(5, 0, 3), (9, 0, 40), (5, 3, 150), (5, 150, 301)])
        assert torch.equal(torch.cat([pieces[:3], pieces[43:]]), whole)
        one = torch.empty((1,) + shape, dtype=dtype)
        source.fill_segments(one, [(5, 217, 218)])
        assert torch.equal(one[0], whole[217])

    @pytest.mark.parametrize("rows_per_pass", [1, 3, 40])
    def test_passes_of_any_length_give_the_same_noise(self, monkeypatch, rows_per_pass):
        # The transform runs in passes of whole copies; a pass may hold pieces of several inputs (gathered) or
        # part of one (drawn directly): the noise of every copy is the same either way.
        segments = [(5, 0, 3), (9, 0, 40), (5, 3, 150), (2, 7, 8), (5, 150, 301)]
        shape = (3, 4)
        source = _NoiseSource(stage_key(0, (7,)), shape, torch.float32, torch.device("cpu"))
        expected = torch.empty((342,) + shape)
        source.fill_segments(expected, segments)
        monkeypatch.setattr(engine_module, "_PAIRS_PER_PASS", rows_per_pass * 6)
        passes = torch.empty((342,) + shape)
        source.fill_segments(passes, segments)
        assert torch.equal(passes, expected)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_the_noise_does_not_depend_on_torch_s_default_dtype(self, dtype):
        # The transform's integer to float steps compute in the noise's own dtype: a user's
        # torch.set_default_dtype(torch.float64) must not move a value (and so a certificate) by one bit.
        default, draws = torch.get_default_dtype(), []
        try:
            for default_dtype in (torch.float32, torch.float64):
                torch.set_default_dtype(default_dtype)
                draws.append(self.draw(dtype, (3, 4), 500))
        finally:
            torch.set_default_dtype(default)
        assert torch.equal(*draws)

    def test_no_copies_give_no_noise(self):
        engine = MonteCarloEngine(torch.nn.Flatten(), 3, batch_size=10, root_seed=0)
        assert engine.standard_normal(torch.zeros(2, 3), 0, (1,)).shape == (2, 0, 3)
