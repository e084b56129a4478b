"""SampleWiseSmoothedClassifier: soundness against closed form, the used-by flows, the guarantee it names.

Its input, label, parameter and module checks are in ``test_validation.py``,
nested ``set_params`` in ``test_params.py``.
"""

import copy

import joblib
import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.base import clone
from sklearn.exceptions import DataConversionWarning, NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from skorch.callbacks import Callback

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier, certify
from smoothsk.certificates import fixed_sigma_guarantee
from smoothsk.experts import NoiseLevelExperts
from smoothsk.metrics import acr_scorer, average_certified_radius, certification_scorers
from smoothsk.models import DigitsCNN, FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import CertifiedSigmaSelector, FixedSigma, GridSigmaSearch
from smoothsk.training import FixedSigmaTraining, GaussianNoise, PretrainFinetune

from conftest import LevelSelectorLogits, LinearLogits, SlabLogits, tiny_digits_classifier
from training_support import assert_bit_identical, digits_net, snapshot, training_digits

#: Error probability of each statistical check below (a binomial or chi-square quantile).
CHECK_LEVEL = 1e-6


def binomial_bound(n_trials, p):
    """Count exceeded with probability <= CHECK_LEVEL by n_trials independent events of probability <= p."""
    return stats.binom.ppf(1 - CHECK_LEVEL, n_trials, p)


def points_at_distance(weight, bias, distance, rng):
    """float32 points whose signed distance to the hyperplane ``w . x + b = 0`` is ``distance``."""
    weight = np.asarray(weight)
    unit = weight / np.linalg.norm(weight)
    anchor = rng.normal(size=(len(distance), len(weight)))
    anchor -= ((anchor @ weight + bias) / np.linalg.norm(weight))[:, None] * unit
    return (anchor + distance[:, None] * unit).astype(np.float32)





class TestClosedFormSoundness:
    """Linear binary model: the smoothed classifier is the model itself, the true radius |z| / ||w||."""

    WEIGHT = (1.0, -2.0, 0.5)
    BIAS = 0.3

    @pytest.mark.parametrize("sigma", [0.25, 1.0, 4.0])
    def test_certificates_hold_except_with_probability_alpha(self, make_linear_classifier, sigma):
        alpha, n_points = 0.05, 300
        clf = make_linear_classifier(self.WEIGHT, self.BIAS, sigma=sigma, n=400, n0=40, alpha=alpha)
        rng = np.random.default_rng(0)
        distance = sigma * rng.uniform(0.1, 2.5, n_points) * rng.choice([-1, 1], n_points)
        X = points_at_distance(self.WEIGHT, self.BIAS, distance, rng)
        z = X.astype(np.float64) @ np.array(self.WEIGHT) + self.BIAS
        true_class, true_radius = (z > 0).astype(int), np.abs(z) / np.linalg.norm(self.WEIGHT)
        prediction, radius = clf.certify(X)
        certified = prediction != ABSTAIN
        # Each input independently fails (wrong class, or radius beyond the
        # truth) with probability <= alpha.
        failures = certified & ((prediction != true_class) | (radius > true_radius))
        assert failures.sum() <= binomial_bound(n_points, alpha)
        # Not vacuous: most inputs get a radius of the right order.
        assert certified.mean() > 0.8
        assert np.median(radius[certified] / true_radius[certified]) > 0.5

    def test_predict_abstains_on_the_boundary_except_with_probability_alpha(self, make_linear_classifier):
        alpha, n_points = 0.05, 300
        clf = make_linear_classifier((1.0, -1.0), 0.0, sigma=0.5, n=1000, alpha=alpha)
        # (a, a) lies exactly on w . x = 0, in float32 as well.
        a = np.linspace(-2, 2, n_points, dtype=np.float32)
        predicted = clf.predict(np.stack([a, a], axis=1)) != ABSTAIN
        assert predicted.sum() <= binomial_bound(n_points, alpha)
        # Not vacuous: at distance 1 (2 sigma) from the boundary PREDICT answers correctly.
        rng = np.random.default_rng(1)
        side = rng.choice([-1.0, 1.0], n_points)
        X = points_at_distance((1.0, -1.0), 0.0, side, rng)
        np.testing.assert_array_equal(clf.predict(X), (side > 0).astype(int))

    def test_predict_proba_is_the_gaussian_probability(self, make_linear_classifier):
        # P(class 1) = Phi(z / (sigma ||w||)); each frequency of 1000 samples is
        # checked with a two-sided binomial quantile at level CHECK_LEVEL.
        clf = make_linear_classifier((3.0, 4.0), -1.0, sigma=0.5, n=1000)
        X = points_at_distance((3.0, 4.0), -1.0, np.linspace(-1, 1, 21), np.random.default_rng(2))
        p = stats.norm.cdf((X.astype(np.float64) @ [3.0, 4.0] - 1.0) / (0.5 * 5.0))
        proba = clf.predict_proba(X)
        np.testing.assert_allclose(proba.sum(axis=1), 1.0)
        low = stats.binom.ppf(CHECK_LEVEL / 2, 1000, p) / 1000
        high = stats.binom.ppf(1 - CHECK_LEVEL / 2, 1000, p) / 1000
        assert np.all((proba[:, 1] >= low) & (proba[:, 1] <= high))


class TestNoiseSpace:
    """Noise is added in the module's input space in training and certification alike (ART's bug)."""

    class Normalised(torch.nn.Module):
        """Normalises internally, ``(x - 5) / 10``, then a linear layer; records what it receives."""

        def __init__(self, n_classes=2):
            super().__init__()
            self.linear = torch.nn.Linear(4, n_classes)
            self.received = []

        def forward(self, x):
            self.received.append(x.detach().clone())
            return self.linear((x - 5.0) / 10.0)

    @staticmethod
    def assert_noise_has_sigma(noise, sigma):
        # sum(noise^2) / sigma^2 ~ chi2(m) exactly; two-sided check at CHECK_LEVEL.
        statistic = float((noise.astype(np.float64) ** 2).sum()) / sigma ** 2
        m = noise.size
        assert stats.chi2.ppf(CHECK_LEVEL / 2, m) < statistic < stats.chi2.ppf(1 - CHECK_LEVEL / 2, m)

    def test_training_and_certification_add_the_same_noise_to_raw_inputs(self):
        rng = np.random.default_rng(0)
        X = (5.0 + 3.0 * rng.normal(size=(200, 4))).astype(np.float32)
        y = (X[:, 0] > 5.0).astype(int)
        sigma = 0.5
        clf = SampleWiseSmoothedClassifier(
            self.Normalised, training=FixedSigmaTraining(sigma), sampler=FixedSampler(n=50, n0=10),
            max_epochs=1, batch_size=200, iterator_train__shuffle=False, random_state=0).fit(X, y)
        probe, training_batch = clf.module_.received  # fit's one-input check, then the epoch's batch
        np.testing.assert_array_equal(probe.numpy(), X[:1])
        self.assert_noise_has_sigma(training_batch.numpy() - X, sigma)
        clf.module_.received.clear()
        clf.certify(X[:20])
        received = torch.cat(clf.module_.received).numpy()
        clean = np.concatenate([np.repeat(X[:20], 10, axis=0), np.repeat(X[:20], 50, axis=0)])
        self.assert_noise_has_sigma(received - clean, sigma)


class TestUsedByFlows:
    def test_fit_certify_script(self, fitted_digits_cnn, digits_split):
        _, _, X_test, y_test = digits_split
        clf = fitted_digits_cnn
        prediction, radius, details = clf.certify(X_test, return_details=True)
        assert prediction.shape == radius.shape == (len(X_test),)
        assert set(prediction) <= set(clf.classes_) | {ABSTAIN}
        np.testing.assert_array_equal(radius[prediction == ABSTAIN], 0.0)
        assert np.all(radius >= 0)
        np.testing.assert_array_equal(details.sigma, 0.25)
        np.testing.assert_array_equal(details.n_samples, 220)
        np.testing.assert_array_equal(details.search_steps, 0)
        np.testing.assert_array_equal(details.region, -1)
        certified = details.prediction != ABSTAIN
        np.testing.assert_array_equal(clf.classes_[details.prediction[certified]], prediction[certified])
        np.testing.assert_allclose(radius[certified], 0.25 * stats.norm.ppf(details.p_lower[certified]))
        assert np.all(details.p_lower[certified] >= 0.5)
        assert average_certified_radius(y_test, prediction, radius) > 0.1
        assert np.mean(prediction == y_test) > 0.7
        assert clf.score(X_test, y_test) == np.mean(clf.predict(X_test) == y_test)

    def test_predict_proba(self, fitted_digits_cnn, digits_split):
        _, _, X_test, y_test = digits_split
        proba = fitted_digits_cnn.predict_proba(X_test[:20])
        assert proba.shape == (20, 10)
        np.testing.assert_allclose(proba.sum(axis=1), 1.0)
        np.testing.assert_allclose(proba * 200, np.round(proba * 200), atol=1e-9)  # frequencies of n = 200
        assert np.mean(proba.argmax(axis=1) == y_test[:20]) > 0.7

    def test_repeated_calls_are_reproducible(self, fitted_digits_cnn, digits_split):
        X_test = digits_split[2][:30]
        first, second = fitted_digits_cnn.certify(X_test), fitted_digits_cnn.certify(X_test)
        np.testing.assert_array_equal(first[0], second[0])
        np.testing.assert_array_equal(first[1], second[1])
        np.testing.assert_array_equal(fitted_digits_cnn.predict(X_test), fitted_digits_cnn.predict(X_test))

    @pytest.mark.parametrize("chunking", ["jobs and batch size", "checkpoint chunks"])
    def test_certificates_do_not_depend_on_chunking_jobs_or_batch_size(self, fitted_digits_cnn, digits_split,
                                                                       chunking, tmp_path, monkeypatch):
        X_test = digits_split[2][:30]
        reference = fitted_digits_cnn.certify(X_test, return_details=True)[2]
        other = clone(fitted_digits_cnn)
        other.__dict__.update({k: v for k, v in fitted_digits_cnn.__dict__.items() if k.endswith("_")})
        if chunking == "jobs and batch size":
            details = other.set_params(n_jobs=2, certify_batch_size=77).certify(X_test, return_details=True)[2]
        else:
            sampled, certify = [], FixedSampler.certify
            monkeypatch.setattr(FixedSampler, "certify", lambda self, engine, X, *args: (
                sampled.append(len(X)) or certify(self, engine, X, *args)))
            details = other.certify(X_test, return_details=True, checkpoint=tmp_path / "run.ckpt",
                                    checkpoint_every=7)[2]
            assert sampled == [7, 7, 7, 7, 2]  # five chunks, each certified on its own
        for field in ("prediction", "p_lower", "radius", "n_samples"):
            np.testing.assert_array_equal(getattr(details, field), getattr(reference, field))

    def test_out_of_memory_halves_the_batch_with_the_same_certificates(self, make_linear_classifier, monkeypatch):
        clf = make_linear_classifier((1.0, -2.0), 0.1, n=300, n0=30, certify_batch_size=500)
        X = np.random.default_rng(0).normal(size=(7, 2)).astype(np.float32)
        reference = clf.certify(X, return_details=True)[2]
        module_class, forward = type(clf.module_), type(clf.module_).forward

        def out_of_memory_above_100(module, x):
            if len(x) > 100:
                raise torch.OutOfMemoryError(f"test: {len(x)} copies do not fit")
            return forward(module, x)

        monkeypatch.setattr(module_class, "forward", out_of_memory_above_100)
        with pytest.warns(RuntimeWarning, match="Out of memory"):
            details = clf.certify(X, return_details=True)[2]
        np.testing.assert_array_equal(details.prediction, reference.prediction)
        np.testing.assert_array_equal(details.p_lower, reference.p_lower)
        np.testing.assert_array_equal(details.radius, reference.radius)

    def test_grid_search_over_nested_params(self, digits):
        X, y = digits[0][:240], digits[1][:240]
        grid = [
            {"sampler__n": [30], "sigma_search__sigma": [0.25], "module__width": [3],
             "optimizer__momentum": [0.9], "training__sigma": [0.25]},
            {"sampler__n": [50], "sigma_search__sigma": [0.5], "module__width": [5],
             "optimizer__momentum": [0.5], "training__sigma": [0.5]},
        ]
        search = GridSearchCV(tiny_digits_classifier(), grid, scoring=acr_scorer, cv=2).fit(X, y)
        assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
        best = search.best_estimator_
        params = search.best_params_
        assert best.module_.layers[0].out_channels == params["module__width"]
        assert best.optimizer_.param_groups[0]["momentum"] == params["optimizer__momentum"]
        np.testing.assert_array_equal(best.train_sigmas_, params["training__sigma"])
        details = best.certify(X[:5], return_details=True)[2]
        np.testing.assert_array_equal(details.sigma, params["sigma_search__sigma"])
        np.testing.assert_array_equal(details.n_samples, params["sampler__n"] + 10)

    def test_certification_scorers_certify_once_per_estimator_and_split(self, digits):
        X, y = digits[0][:200], digits[1][:200]
        calls = []

        class Counting(SampleWiseSmoothedClassifier):
            def certify(self, X, *args, **kwargs):
                calls.append(len(X))
                return super().certify(X, *args, **kwargs)

        scorers = certification_scorers([0.25, 0.5])
        search = GridSearchCV(Counting(DigitsCNN, **{k: v for k, v in tiny_digits_classifier().get_params(
            deep=False).items() if k != "module"}), {"sampler__n": [20, 30]}, scoring=scorers, refit="acr",
            cv=2, return_train_score=True).fit(X, y)
        # 2 candidates x 2 folds x (test + train) = 8 (estimator, X) pairs, 3 scorers each.
        assert len(calls) == 8
        assert set(search.cv_results_) >= {"mean_test_acr", "mean_test_certified_accuracy_at_0.25"}

    def test_joblib_round_trip(self, fitted_digits_cnn, digits_split, tmp_path):
        X_test = digits_split[2][:30]
        joblib.dump(fitted_digits_cnn, tmp_path / "clf.joblib")
        loaded = joblib.load(tmp_path / "clf.joblib")
        expected = fitted_digits_cnn.certify(X_test, return_details=True)
        got = loaded.certify(X_test, return_details=True)
        for before, after in zip(expected[:2], got[:2], strict=True):
            np.testing.assert_array_equal(after, before)
        np.testing.assert_array_equal(got[2].p_lower, expected[2].p_lower)
        np.testing.assert_array_equal(loaded.predict(X_test), fitted_digits_cnn.predict(X_test))
        np.testing.assert_array_equal(loaded.train_sigmas_, fitted_digits_cnn.train_sigmas_)
        np.testing.assert_array_equal(loaded.classes_, fitted_digits_cnn.classes_)
        # skorch's own inference keeps working after loading.
        torch.testing.assert_close(loaded.forward(X_test), fitted_digits_cnn.forward(X_test))

    def test_clone_is_unfitted_with_the_same_params(self, fitted_digits_cnn, digits_split):
        cloned = clone(fitted_digits_cnn)
        assert not hasattr(cloned, "module_") and not hasattr(cloned, "classes_")
        assert cloned.get_params()["sampler__n"] == 200
        assert cloned.sampler is not fitted_digits_cnn.sampler
        with pytest.raises(NotFittedError, match="SampleWiseSmoothedClassifier instance is not fitted"):
            cloned.certify(digits_split[2][:2])

    def test_string_labels(self, digits):
        X, y = digits
        keep = np.isin(y, [1, 2, 3])
        names = np.array(["zero", "one", "two", "three"])[y[keep]]
        clf = tiny_digits_classifier(max_epochs=3, sampler=FixedSampler(n=8, n0=4)).fit(X[keep][:200], names[:200])
        assert clf.classes_.tolist() == ["one", "three", "two"]
        assert clf.module_.layers[-1].out_features == 3
        prediction = clf.predict(X[keep][200:260])
        certified, radius = clf.certify(X[keep][200:260])
        # 8 samples never pass PREDICT's test at alpha = 0.001 (8 to 0 has p-value 0.0078).
        assert set(prediction) == {ABSTAIN} and set(certified) == {ABSTAIN}
        assert clf.score(X[keep][200:260], names[200:260]) == 0.0
        clf.set_params(sampler__n=200)
        prediction = clf.predict(X[keep][200:260])
        assert {"one", "two", "three"} & set(prediction) and set(prediction) <= {"one", "two", "three", ABSTAIN}
        expected = np.mean([p == t for p, t in zip(prediction, names[200:260], strict=True)])
        assert clf.score(X[keep][200:260], names[200:260]) == pytest.approx(expected)

    @pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
    def test_unsigned_labels_keep_abstain_apart_from_every_class(self, dtype):
        # The largest value of the type is a class: -1 cast to the label type would read as that class.
        classes = np.array([0, np.iinfo(dtype).max], dtype=dtype)
        clf = SampleWiseSmoothedClassifier(LinearLogits, module__weight=[1.0], max_epochs=0, random_state=0,
                                           training=FixedSigmaTraining(0.5), sigma_search=FixedSigma(0.5),
                                           sampler=FixedSampler(n=200, n0=20)).fit(np.zeros((2, 1), "float32"),
                                                                                   classes)
        # x = 0 is on the boundary: pA = 1/2, so both abstain except with probability alpha; x = 3 is class 1.
        X = np.array([[0.0], [3.0]], dtype=np.float32)
        certified, _ = clf.certify(X)
        for labels in (clf.predict(X), certified):
            assert labels[0] == ABSTAIN and labels[1] == classes[1]
            assert labels[1] != ABSTAIN

    def test_score_counts_an_abstention_wrong_even_against_the_label_abstain(self, make_linear_classifier):
        clf = make_linear_classifier([1.0], n=200, n0=20)
        # x = 0 is on the boundary (abstains except with probability alpha), x = 3 is class 1.
        assert clf.score(np.array([[0.0], [3.0]], dtype=np.float32), [ABSTAIN, 1]) == 0.5

    def test_same_random_state_same_results(self, digits):
        X, y = digits[0][:150], digits[1][:150]

        def fit(seed):
            return tiny_digits_classifier(random_state=seed, module=DropoutCNN).fit(X, y)

        first, second, other = fit(0), fit(0), fit(1)
        for name, tensor in first.module_.state_dict().items():
            torch.testing.assert_close(second.module_.state_dict()[name], tensor, rtol=0, atol=0)
        assert not torch.equal(other.module_.layers[0].weight, first.module_.layers[0].weight)
        np.testing.assert_array_equal(first.certify(X[:20])[1], second.certify(X[:20])[1])
        # Refitting the same estimator repeats the fit.
        np.testing.assert_array_equal(first.fit(X, y).certify(X[:20])[1], second.certify(X[:20])[1])

    def test_fit_leaves_the_global_torch_generator_alone(self, digits):
        state = torch.get_rng_state()
        tiny_digits_classifier(module=DropoutCNN).fit(digits[0][:64], digits[1][:64])
        assert torch.equal(torch.get_rng_state(), state)

    def test_certificate_does_not_depend_on_the_other_inputs_or_their_order(self, make_linear_classifier):
        # Noise is keyed by each input's values: a subset, a permutation or a
        # duplicate gets exactly the certificate the input gets in the full call.
        clf = make_linear_classifier((1.0, -1.0), 0.05, n=300, n0=20, random_state=3)
        X = np.random.default_rng(0).normal(size=(12, 2)).astype(np.float32)
        _, radius, details = clf.certify(X, return_details=True)
        order = np.random.default_rng(1).permutation(12)
        np.testing.assert_array_equal(clf.certify(X[order])[1], radius[order])
        np.testing.assert_array_equal(clf.certify(X[[5]])[1], radius[[5]])
        _, twice, again = clf.certify(X[[4, 4]], return_details=True)
        assert twice[0] == twice[1] == radius[4] and again.p_lower[0] == details.p_lower[4]

    def test_iterator_train_drop_last_is_honoured(self, digits):
        # 65 inputs at batch_size=32: the last batch holds one input, which BatchNorm refuses in training.
        X, y = digits
        module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16),
                                     torch.nn.ReLU(), torch.nn.Linear(16, 10))
        clf = SampleWiseSmoothedClassifier(module, max_epochs=1, batch_size=32, train_split=None, random_state=0,
                                           iterator_train__drop_last=True)
        clf.fit(X[:65], y[:65])
        assert clf.history[-1, "batches", -1, "train_batch_size"] == 32 and len(clf.history[-1, "batches"]) == 2

    def test_skorch_forward_gives_base_logits(self, make_linear_classifier):
        clf = make_linear_classifier((1.0, 2.0), 0.5)
        X = np.array([[1.0, 1.0], [-1.0, -1.0]], dtype=np.float32)
        torch.testing.assert_close(clf.forward(X), torch.tensor([[-3.5, 3.5], [2.5, -2.5]]))

    def test_partial_fit_continues_training(self, digits):
        X, y = digits[0][:100], digits[1][:100]
        clf = tiny_digits_classifier(max_epochs=1).fit(X, y)
        module = clf.module_
        clf.partial_fit(X, y)
        assert clf.module_ is module and len(clf.history) == 2

    def test_partial_fit_after_a_module_rebuild_trains_the_new_module_from_the_start(self):
        # The old module's epochs and training sigmas are not the new module's: partial_fit
        # runs its whole schedule, as a fresh fit with the same parameters does.
        X, y = training_digits()
        schedule = PretrainFinetune(pretrain_epochs=2, finetune_epochs=1, objective=GaussianNoise(),
                                    assignment=GridSigmaSearch(0.12, 0.5, 0.05, n=50))
        clf = digits_net(X[:100], y[:100], training=schedule).set_params(module__hidden=16)
        assert len(clf.history) == 0 and not hasattr(clf, "train_sigmas_")
        clf.partial_fit(X[:100], y[:100])
        fresh = clone(clf).fit(X[:100], y[:100])
        assert list(clf.history[:, "training_stage"]) == ["pretrain"] * 2 + ["finetune"]
        np.testing.assert_array_equal(clf.train_sigmas_, fresh.train_sigmas_)
        for name, weight in fresh.module_.state_dict().items():
            torch.testing.assert_close(clf.module_.state_dict()[name], weight, rtol=0, atol=0)

    @pytest.mark.parametrize("refit", ["fit", "partial_fit"])
    def test_epochs_in_fit_params_refused_before_training(self, digits, refit):
        # The schedule sets the epochs of every stage itself.
        X, y = digits[0][:40], digits[1][:40]
        clf = tiny_digits_classifier(max_epochs=1).fit(X, y)
        module, history = clf.module_, len(clf.history)
        with pytest.raises(TypeError, match=r"fit_params.*'epochs'.*max_epochs"):
            getattr(clf, refit)(X, y, epochs=2)
        assert clf.module_ is module and len(clf.history) == history

    @pytest.mark.parametrize("hook, error", [("on_epoch_end", RuntimeError), ("on_train_begin", RuntimeError),
                                             ("on_train_begin", KeyboardInterrupt)])
    def test_a_refit_failing_in_training_leaves_the_fitted_estimator_as_it_was(self, digits, hook, error):
        X, y = digits[0][:40], digits[1][:40]
        clf = tiny_digits_classifier(max_epochs=1).fit(X, y)
        module, weights, history = clf.module_, copy.deepcopy(clf.module_.state_dict()), list(clf.history)

        def fail(callback, net, **kwargs):
            raise error("a failing callback")

        Fails = type("Fails", (Callback,), {hook: fail})

        with pytest.raises(error, match="a failing callback"):  # Ctrl-C too, outside the epochs' loop
            clf.set_params(callbacks=[Fails()]).fit(X, y)
        assert clf.module_ is module and list(clf.history) == history
        for name, weight in weights.items():
            torch.testing.assert_close(clf.module_.state_dict()[name], weight, rtol=0, atol=0)

    def test_partial_fit_learns_the_declared_classes_on_its_first_call(self, digits):
        # scikit-learn's convention: the first partial_fit names every class,
        # including those its first batch lacks; later batches may hold them.
        X, y = digits[0][:200], digits[1][:200]
        first = np.isin(y, [0, 1])
        clf = tiny_digits_classifier(max_epochs=1).partial_fit(X[first], y[first], classes=np.arange(10))
        np.testing.assert_array_equal(clf.classes_, np.arange(10))
        assert clf.module_(torch.from_numpy(X[:1])).shape == (1, 10)
        clf.partial_fit(X[~first], y[~first])
        assert len(clf.history) == 2

    @pytest.mark.parametrize("classes, message", [
        ([0, 1], r"y contains labels \[2, 3\] not among classes \[0, 1\]"),
        ([3], r"at least 2 classes.*got 1"),
        ([-1, 0, 1, 2, 3], r"the label -1, which is ABSTAIN"),
    ])
    def test_partial_fit_refuses_bad_declared_classes_before_training(self, digits, classes, message):
        X, y = digits[0][:40], digits[1][:40] % 4
        clf = tiny_digits_classifier(max_epochs=1)
        with pytest.raises(ValueError, match=message):
            clf.partial_fit(X, y, classes=classes)
        assert not hasattr(clf, "classes_")

    def test_partial_fit_refuses_other_classes_than_its_first_call(self, digits):
        X, y = digits[0][:60], digits[1][:60] % 3
        clf = tiny_digits_classifier(max_epochs=1).partial_fit(X, y, classes=[0, 1, 2])
        history = len(clf.history)
        clf.partial_fit(X, y, classes=[2, 1, 0])  # the same classes, in any order
        with pytest.raises(ValueError, match=r"classes=\[0, 1, 2, 3\] differ from classes_ \[0, 1, 2\]"):
            clf.partial_fit(X, y, classes=[0, 1, 2, 3])
        assert len(clf.history) == history + 1

    def test_reset_regions(self, make_linear_classifier):
        clf = make_linear_classifier((1.0,))
        clf.regions_.append(np.zeros((1, 1)), [1.0], [0.5], [1], [0.9])
        assert len(clf.reset_regions().regions_) == 0

    def test_column_vector_y_warns(self, make_linear_classifier):
        clf = make_linear_classifier((1.0,))
        with pytest.warns(DataConversionWarning):
            clf.fit(np.zeros((2, 1), dtype=np.float32), np.array([[0], [1]]))


class DropoutCNN(DigitsCNN):
    """DigitsCNN with dropout: training uses torch's global generator."""

    def __init__(self, n_classes=10, width=16):
        super().__init__(n_classes, width)
        self.layers.insert(len(self.layers) - 1, torch.nn.Dropout(0.5))


class TestGuarantee:
    """``details.guarantee`` names the classifier the certificates are about."""

    def test_fixed_sigma_certifies_the_classifier_predict_queries(self, make_linear_classifier):
        clf = make_linear_classifier([1.0, -1.0], sigma=0.5, n=50, n0=10)
        _, _, details = clf.certify(np.array([[1.0, 0.0]], dtype=np.float32), return_details=True)
        assert details.guarantee == "g at the fixed sigma 0.5 (the classifier predict queries), stateless"

    def test_own_sigma_search_is_not_about_the_sample_wise_classifier(self, make_linear_classifier):
        clf = make_linear_classifier([1.0, -1.0], n=50, n0=10, sigma_search=GridSigmaSearch(0.2, 0.5, step=0.1, n=20))
        _, _, details = clf.certify(np.array([[1.0, 0.0]], dtype=np.float32), return_details=True)
        assert "not G" in details.guarantee


class TestFittedSigmaFunctionLifetime:
    """``sigma_search_`` certifies the weights it was fitted for: every fit and module rebuild drops it."""

    @staticmethod
    def selector():
        return CertifiedSigmaSelector(levels=(0.25, 1.0), selector=LevelSelectorLogits(), fit_selector=False,
                                      n=100, n0=20)

    def slab_classifier(self):
        return SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=self.selector(),
                                            sampler=FixedSampler(n=100, n0=20), random_state=0).fit(
            np.zeros((2, 2), dtype=np.float32), [0, 1])

    def test_a_refit_of_another_dimension_does_not_revive_the_old_selector(self):
        # The reviewer's case: the selector fitted for a 2-feature model, set again on a refitted 3-feature one.
        rng = np.random.default_rng(0)
        selector = CertifiedSigmaSelector(levels=(0.25, 1.0), n=50, n0=10, selector_epochs=1)
        clf = SampleWiseSmoothedClassifier(FlatMLP, module__hidden=8, max_epochs=1, sigma_search=selector,
                                           sampler=FixedSampler(n=50, n0=10), random_state=0)
        X2, X3 = rng.normal(size=(20, 2)).astype(np.float32), rng.normal(size=(20, 3)).astype(np.float32)
        clf.fit(X2, (X2[:, 0] > 0).astype(int))
        clf.set_params(sigma_search=FixedSigma(0.25)).fit(X3, (X3[:, 0] > 0).astype(int))
        clf.set_params(sigma_search=selector)
        with pytest.raises(NotFittedError, match="call fit again"):
            clf.certify(X3[:2])
        with pytest.raises(NotFittedError, match="call fit again"):
            clf.predict(X3[:2])

    @pytest.mark.parametrize("refit", ["fit", "partial_fit"])
    def test_a_refit_of_the_same_dimension_does_not_revive_the_old_selector(self, refit):
        clf = self.slab_classifier()
        selector = clf.sigma_search
        clf.set_params(sigma_search=FixedSigma(0.25))
        getattr(clf, refit)(np.zeros((2, 2), dtype=np.float32), [0, 1])
        clf.set_params(sigma_search=selector)
        with pytest.raises(NotFittedError, match="call fit again"):
            clf.certify(np.array([[0.0, -2.0]], dtype=np.float32))

    def test_a_module_rebuild_drops_the_fitted_selector(self):
        clf = self.slab_classifier()
        clf.set_params(module__half_width=2.0)  # skorch builds a new module_
        with pytest.raises(NotFittedError, match="call fit again"):
            clf.certify(np.array([[0.0, -2.0]], dtype=np.float32))

    def test_a_refused_refit_keeps_the_fitted_selector(self):
        clf = self.slab_classifier()
        fitted = clf.sigma_search_
        with pytest.raises(ValueError, match="logits of shape"):  # SlabLogits has two classes
            clf.fit(np.zeros((3, 2), dtype=np.float32), [0, 1, 2])
        assert clf.sigma_search_ is fitted

    @pytest.mark.parametrize("refit", ["fit", "partial_fit"])
    def test_a_failing_sigma_function_fit_leaves_none_for_other_weights(self, refit):
        clf = self.slab_classifier()
        before = clf.sigma_search_
        class FailingSelector(CertifiedSigmaSelector):
            def _fit_sigma(self, context, X, y):
                raise ValueError("fit_sigma failed after training")

        failing = FailingSelector(levels=(0.25, 0.5, 1.0), selector_epochs=0, n=100, n0=20)
        with pytest.raises(ValueError, match="fit_sigma failed after training"):
            getattr(clf.set_params(sigma_search=failing), refit)(np.zeros((2, 2), dtype=np.float32), [0, 1])
        if refit == "fit":  # a failed refit is undone: the old model and its fitted selector are back
            assert clf.sigma_search_ is before
            return
        assert not hasattr(clf, "sigma_search_")  # partial_fit trained in place: nothing fitted for its weights
        with pytest.raises(NotFittedError, match="call fit again"):
            clf.set_params(sigma_search=self.selector()).certify(np.array([[0.0, -2.0]], dtype=np.float32))


def small_cnn(seed):
    """The architecture :func:`train_elsewhere` trains, its weights initialised from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(8 * 64, 10))


def train_elsewhere(X, y, sigma=0.25, epochs=6):
    """A small CNN trained on ``X``, ``y`` in a plain torch loop with Gaussian noise augmentation, outside smoothsk.

    Returns
    -------
    torch.nn.Module
        Logits (n, 10) for inputs (n, 1, 8, 8), in train mode as a user's loop leaves it.
    """
    generator = torch.Generator().manual_seed(0)
    net = small_cnn(seed=0)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    for _ in range(epochs):
        for batch in torch.randperm(len(X), generator=generator).split(64):
            noisy = X[batch] + sigma * torch.randn(X[batch].shape, generator=generator)
            loss = torch.nn.functional.cross_entropy(net(noisy), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net


@pytest.fixture(scope="module")
def trained_elsewhere(digits):
    """A CNN trained on the first 1,200 digits by :func:`train_elsewhere`, and 100 held-out digits (do not train it)."""
    X, y = digits
    return train_elsewhere(X[:1200], y[:1200]), X[1600:1700], y[1600:1700]


class RecordingForward(torch.nn.Module):
    """A linear model on 4 features with 3 logits that counts its forward passes (``calls``)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


class TestFromModule:
    """``from_module``: a module trained elsewhere, certified as it is, without data."""

    @staticmethod
    def certifier(module, **params):
        params = {"input_shape": (1, 8, 8), "sampler": FixedSampler(n=200, n0=20), "random_state": 0, **params}
        return SampleWiseSmoothedClassifier.from_module(module, **params)

    def test_certifies_a_network_trained_in_a_plain_torch_loop_and_leaves_its_weights(self, trained_elsewhere):
        net, X, y = trained_elsewhere
        saved = snapshot(net)
        clf = self.certifier(net)
        assert_bit_identical(net, saved)
        prediction, radius, details = clf.certify(X, return_details=True)
        assert_bit_identical(net, saved)
        assert clf.module_ is net and clf.classes_.tolist() == list(range(10)) and clf.input_shape_ == (1, 8, 8)
        assert len(clf.history) == 0 and not hasattr(clf, "train_sigmas_")
        assert details.guarantee == fixed_sigma_guarantee(0.25)
        correct = prediction == y
        assert correct.mean() > 0.8
        assert (radius[correct] > 0).mean() > 0.9  # most correct inputs certified
        assert clf.score(X, y) > 0.8

    def test_classes_name_the_logits_in_order(self, trained_elsewhere):
        net, X, _ = trained_elsewhere
        by_index = self.certifier(net).predict(X[:10])
        letters = self.certifier(net, classes=list("abcdefghij")).predict(X[:10])
        assert letters.tolist() == [ABSTAIN if i == ABSTAIN else "abcdefghij"[i] for i in by_index]

    def test_the_sigma_is_the_one_certified_at(self, trained_elsewhere):
        net, X, _ = trained_elsewhere
        _, _, details = self.certifier(net, sigma=0.5).certify(X[:3], return_details=True)
        np.testing.assert_array_equal(details.sigma, 0.5)

    @pytest.mark.parametrize("arguments, message", [
        ({"classes": [0, 1, 2]}, r"classes has 3 labels, but the module Sequential returns 10 logits"),
        ({"classes": list(range(9, -1, -1))}, r"classes must be distinct and in ascending order"),
        ({"classes": [0] * 10}, r"classes must be distinct and in ascending order"),
        ({"input_shape": (1, 9, 9)}, r"input_shape=\(1, 9, 9\) does not fit the module Sequential"),
        ({"input_shape": (64,)}, r"input_shape=\(64,\) does not fit the module Sequential"),
        ({"input_shape": (1, 0, 8)}, r"input_shape must be the shape of one input"),
        ({"input_shape": "1x8x8"}, r"input_shape must be the shape of one input"),
    ], ids=["width", "order", "repeated", "shape", "flat", "zero", "string"])
    def test_arguments_that_do_not_fit_the_module_are_refused_in_one_line(self, trained_elsewhere, arguments,
                                                                          message):
        net, _, _ = trained_elsewhere
        saved = snapshot(net)
        with pytest.raises(ValueError, match=message) as error:
            self.certifier(net, **arguments)
        assert "\n" not in str(error.value)
        assert_bit_identical(net, saved)

    def test_a_certified_sigma_function_is_refused_before_the_module_runs(self):
        module = RecordingForward()
        with pytest.raises(ValueError, match=r"CertifiedSigmaSelector\(...\) is a certified sigma function.*"
                                             r"training=Pretrained\(sigma\).*fit\(X, y\)"):
            SampleWiseSmoothedClassifier.from_module(module, input_shape=(4,), sigma_search=CertifiedSigmaSelector())
        assert module.calls == 0

    def test_the_module_runs_once_in_eval_mode_before_the_bookkeeping(self):
        module = RecordingForward().train()
        clf = SampleWiseSmoothedClassifier.from_module(module, input_shape=(4,))
        assert clf.classes_.tolist() == [0, 1, 2] and module.training
        assert module.calls == 2  # the probe, then partial_fit's check of the module's output

    @pytest.mark.parametrize("params, error, message", [
        ({"training": FixedSigmaTraining(0.25)}, TypeError, "from_module takes no training"),
        ({"module__width": 4}, TypeError, "from_module takes no module__width"),
        ({"alpha": 2.0}, ValueError, "'alpha' parameter"),
    ])
    def test_parameters_it_cannot_take_are_refused(self, params, error, message):
        module = RecordingForward()
        with pytest.raises(error, match=message):
            SampleWiseSmoothedClassifier.from_module(module, input_shape=(4,), **params)
        assert module.calls == 0

    def test_a_module_class_is_refused(self):
        with pytest.raises(ValueError, match="module must be a torch.nn.Module instance"):
            SampleWiseSmoothedClassifier.from_module(DigitsCNN, input_shape=(1, 8, 8))

    def test_save_and_load_give_the_same_certificates(self, trained_elsewhere, tmp_path):
        net, X, _ = trained_elsewhere
        clf = self.certifier(net)
        clf.save(tmp_path / "model.safetensors")
        again = SampleWiseSmoothedClassifier.load(tmp_path / "model.safetensors", module=small_cnn(seed=1))
        assert_bit_identical(again.module_, snapshot(net))
        for mine, theirs in zip(clf.certify(X[:20]), again.certify(X[:20]), strict=True):
            np.testing.assert_array_equal(mine, theirs)

    def test_a_module_with_constructor_params_loads_without_module(self, tmp_path):
        experts = [FlatMLP(n_classes=2) for _ in range(2)]
        for expert in experts:
            expert(torch.zeros(1, 5))  # trained elsewhere: its lazy layer has its shape
        clf = SampleWiseSmoothedClassifier.from_module(NoiseLevelExperts((0.25, 0.5), experts), input_shape=(5,),
                                                       sampler=FixedSampler(n=100, n0=10), random_state=0)
        clf.save(tmp_path / "experts.safetensors")
        again = SampleWiseSmoothedClassifier.load(tmp_path / "experts.safetensors")
        X = np.random.default_rng(0).normal(size=(10, 5)).astype(np.float32)
        np.testing.assert_array_equal(again.certify(X)[1], clf.certify(X)[1])

    def test_n_jobs_and_checkpoints_give_the_same_certificates(self, trained_elsewhere, tmp_path):
        net, X, _ = trained_elsewhere
        saved = snapshot(net)
        plain = self.certifier(net).certify(X[:30])
        parallel = self.certifier(net, n_jobs=2).certify(X[:30])
        resumable = self.certifier(net).certify(X[:30], checkpoint=tmp_path / "run.ckpt", checkpoint_every=7)
        for result in (parallel, resumable):
            for mine, theirs in zip(plain, result, strict=True):
                np.testing.assert_array_equal(mine, theirs)
        assert_bit_identical(net, saved)

    def test_it_certifies_in_a_pipeline(self, trained_elsewhere):
        net, X, y = trained_elsewhere
        clf = self.certifier(net)
        pipe = make_pipeline(FunctionTransformer().fit(X[:1].reshape(1, -1)), clf)
        flat = X[:20].reshape(20, -1)
        for mine, theirs in zip(clf.certify(X[:20]), certify(pipe, flat), strict=True):
            np.testing.assert_array_equal(mine, theirs)
        np.testing.assert_array_equal(pipe.predict(flat), clf.predict(X[:20]))
