"""CertifiedSigmaSelector and the certified-sigma path of the estimator: certificates about G(x) = g(x, sigma(x)).

The closed-form models of conftest make G exact: the classifier ``SlabLogits``
(class 1 where ``|x0| < 1``) has a smoothed classifier that depends on sigma
(:func:`slab_probability`), and the selector ``LevelSelectorLogits`` picks a
level from ``x1``; with one threshold at 0 its smoothed version (any noise
level) picks level 1 exactly where ``x1 > 0``. Inputs are 2-D, so a certified
ball is a disc, and G on a disc is checked exactly (:func:`g_disagrees_on_disc`).
"""

import functools

import numpy as np
import pytest
import torch
from scipy import optimize, stats
from sklearn.exceptions import NotFittedError

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk._stages import CERTIFIED_SIGMA_STAGE, PREDICT_STAGE
from smoothsk.engine import MonteCarloEngine
from smoothsk.experts import NoiseLevelExperts
from smoothsk.models import FlatMLP
from smoothsk.regions import MemoryAllocator, NoRegions, OnlineBallAllocator, TransductiveLPAllocator
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import BaseSigmaSearch, CertifiedSigmaSelector, GridSigmaSearch, SigmaFitContext, SigmaSearchResult
from smoothsk.training import (
    BaseObjective,
    Consistency,
    DataDependentTraining,
    FixedSigmaTraining,
    GaussianNoise,
    Macer,
    Pretrained,
    PretrainFinetune,
)

from conftest import LevelSelectorLogits, LinearLogits, SlabLogits, slab_probability, untrained_experts
from soundness_support import binomial_bound

LEVELS = (0.25, 2.0)
SELECTOR_SIGMA = 0.25


def slab_half_width(sigma, half_width=1.0):
    """``b`` with ``g(x, sigma) = 1`` exactly where ``|x0| < b`` (0 where the class never wins)."""
    if slab_probability(0.0, sigma, half_width) <= 0.5:
        return 0.0
    return optimize.brentq(lambda b: slab_probability(b, sigma, half_width) - 0.5, 0.0, half_width + 10 * sigma)


def selector_boundary(level_threshold):
    """``x1`` where :func:`exact_selector`'s smoothed selector switches from ``levels[0]`` to ``levels[1]``.

    It picks ``levels[1]`` with probability ``Phi(x1 / SELECTOR_SIGMA)``: the
    argmax (None) where that exceeds 1/2, the rule ``level_threshold = t``
    where it reaches ``t``.
    """
    return 0.0 if level_threshold is None else SELECTOR_SIGMA * stats.norm.ppf(level_threshold)


def g_disagrees_on_disc(centre, radius, label, levels=LEVELS, boundary=0.0):
    """Whether ``G(x') != label`` for some ``x'`` of the open disc ``B(centre, radius)`` (its centre if 0).

    ``sigma(x') = levels[1]`` where ``x1' > boundary``, else ``levels[0]``;
    at level ``s``, ``G(x') = 1`` exactly where ``|x0'| < b(s)``. The disc
    meets the half-plane of a level in an open strip of ``x0'`` of
    half-width ``sqrt(r^2 - d^2)`` (``d``: the distance from the centre to
    the half-plane), where G must be ``label`` throughout.
    """
    x0, x1 = float(centre[0]), float(centre[1]) - boundary
    if radius == 0:
        return (abs(x0) < slab_half_width(levels[int(x1 > 0)])) != (label == 1)
    for level, distance in ((levels[0], max(x1, 0.0)), (levels[1], max(-x1, 0.0))):
        if distance >= radius:
            continue
        half = np.sqrt(radius**2 - distance**2)
        b = slab_half_width(level)
        if label == 1:  # the strip must lie within [-b, b]
            disagrees = x0 - half < -b or x0 + half > b
        else:  # the strip must miss (-b, b)
            disagrees = b > 0 and x0 - half < b and x0 + half > -b
        if disagrees:
            return True
    return False


def slab_classifier(sigma_search, allocator=None, alpha=0.05, n=2000, **params):
    """A fitted estimator around SlabLogits (no training); ``params`` override the defaults."""
    params = {"max_epochs": 0, "training": FixedSigmaTraining(0.25), "sampler": FixedSampler(n=n, n0=100),
              "random_state": 0, "certify_batch_size": 1000, **params}
    clf = SampleWiseSmoothedClassifier(SlabLogits, sigma_search=sigma_search, allocator=allocator, alpha=alpha,
                                       **params)
    return clf.fit(np.zeros((2, 2), dtype=np.float32), [0, 1])


def exact_selector(thresholds=(0.0,), levels=LEVELS, n=2000, level_threshold=None, **params):
    """The selector ``LevelSelectorLogits`` over ``levels``, by the argmax unless ``level_threshold`` is given.

    :func:`g_disagrees_on_disc` needs the level boundary the rule puts it at: :func:`selector_boundary`.
    """
    return CertifiedSigmaSelector(levels=levels, selector=LevelSelectorLogits(thresholds, axis=1),
                                  fit_selector=False, selector_sigma=SELECTOR_SIGMA, n=n, n0=100,
                                  level_threshold=level_threshold, **params)


def disc_inputs(n_inputs, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(-2, 2, n_inputs), rng.uniform(-1, 1, n_inputs)]).astype(np.float32)


class ExactOwnSigma(BaseSigmaSearch):
    """The sigma function of :func:`exact_selector` without its certificate: ``levels[x1 > 0]``."""

    def _search(self, engine, X, y):
        sigma = np.where(X[:, 1].numpy() > 0, LEVELS[1], LEVELS[0])
        return SigmaSearchResult(sigma, np.zeros(len(X), dtype=np.int64))


class TwoLogits(torch.nn.Module):
    """A selector class without ``n_classes``: always two logits."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.linear(x)


class SevenInputs(torch.nn.Module):
    """A selector for inputs of 7 features (the tests' inputs have 2)."""

    def __init__(self, n_classes=3):
        super().__init__()
        self.linear = torch.nn.Linear(7, n_classes)

    def forward(self, x):
        return self.linear(x)


class BandWithoutOutput(torch.nn.Module):
    """``LevelSelectorLogits((0.0,), axis=1)`` with NaN logits where ``0 <= x1 < width`` (undefined on a band)."""

    def __init__(self, width):
        super().__init__()
        self.width = float(width)
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        x1 = x.flatten(1)[:, 1]
        logits = torch.stack([x1 < 0, x1 >= self.width], dim=1).float()
        return logits.masked_fill(((x1 >= 0) & (x1 < self.width))[:, None], float("nan"))


class TestSoundnessForG:
    @pytest.mark.parametrize("level_threshold", [None, 0.3])
    @pytest.mark.parametrize("reachable", [True, False])
    def test_certificates_of_g_hold_on_their_discs(self, reachable, level_threshold):
        alpha = 0.05
        X = disc_inputs(300)
        selector = exact_selector(certify_reachable_levels=reachable, level_threshold=level_threshold)
        prediction, radius, details = slab_classifier(selector).certify(X, return_details=True)
        assert details.guarantee.startswith("G (sample-wise classifier)")
        certified = np.flatnonzero(prediction != ABSTAIN)
        assert len(certified) > 250 and (radius[certified] > 0).mean() > 0.8  # the test has something to check
        boundary = selector_boundary(level_threshold)
        failures = sum(g_disagrees_on_disc(X[i], radius[i], prediction[i], boundary=boundary) for i in certified)
        assert failures <= binomial_bound(len(certified), alpha)
        if not reachable:  # the plain certificate: R1 caps every radius
            assert np.all(radius <= details.radius_cap)

    @pytest.mark.parametrize("level_threshold", [None, 0.3])
    def test_a_copy_without_selector_output_votes_for_the_smallest_level(self, level_threshold):
        # Where its logits are NaN the selector votes for the smallest level, in predict as in certify, so
        # BandWithoutOutput(w) is LevelSelectorLogits((w,)): G is known exactly. (Counted as no vote, the
        # levels' probabilities would not sum to one, and predict would take levels[1] inside the band where the
        # certificates' bounds say it does not.)
        alpha, width = 0.05, 0.5
        rng = np.random.default_rng(2)
        # Inside the band, where the two levels' G differ (|x0| < 1) and where the levels' probabilities among
        # the copies with an output would put the selector's boundary elsewhere (below 0.45).
        X = np.column_stack([rng.uniform(-0.9, 0.9, 300), rng.uniform(0.1, 0.45, 300)]).astype(np.float32)
        selector = CertifiedSigmaSelector(levels=LEVELS, selector=BandWithoutOutput(width), fit_selector=False,
                                          selector_sigma=SELECTOR_SIGMA, n=2000, n0=100,
                                          level_threshold=level_threshold)
        clf = slab_classifier(selector)
        boundary = width + selector_boundary(level_threshold)
        prediction = clf.predict(X)
        answered = np.flatnonzero(prediction != ABSTAIN)
        assert len(answered) > 200
        wrong = sum(g_disagrees_on_disc(X[i], 0.0, prediction[i], boundary=boundary) for i in answered)
        assert wrong <= binomial_bound(len(answered), alpha)
        prediction, radius = clf.certify(X)
        certified = np.flatnonzero(prediction != ABSTAIN)
        assert len(certified) > 200 and (radius[certified] > 0).mean() > 0.8
        failures = sum(g_disagrees_on_disc(X[i], radius[i], prediction[i], boundary=boundary) for i in certified)
        assert failures <= binomial_bound(len(certified), alpha)

    def test_the_argmax_boundary_fails_for_a_threshold_rule(self):
        # The check has power against the rule it assumes: the threshold rule's certificates, checked as if the
        # selector switched where the argmax does, fail (inputs with 0 < x1 < its true boundary's offset).
        alpha = 0.05
        X = disc_inputs(300)
        prediction, radius = slab_classifier(exact_selector(level_threshold=0.05)).certify(X)
        certified = np.flatnonzero(prediction != ABSTAIN)
        failures = sum(g_disagrees_on_disc(X[i], radius[i], prediction[i]) for i in certified)
        assert failures > binomial_bound(len(certified), alpha)

    def test_own_sigma_certificates_fail_for_g(self):
        # Today's NoRegions at each input's own (exact) sigma: sound for g(., sigma(x)), not for G.
        alpha = 0.05
        X = disc_inputs(300)
        prediction, radius = slab_classifier(ExactOwnSigma(), NoRegions()).certify(X)
        certified = np.flatnonzero(prediction != ABSTAIN)
        failures = sum(g_disagrees_on_disc(X[i], radius[i], prediction[i]) for i in certified)
        assert failures > binomial_bound(len(certified), alpha)

    @pytest.mark.parametrize("level_threshold", [None, 0.3])
    def test_predict_is_g_except_with_probability_alpha(self, level_threshold):
        alpha = 0.05
        X = disc_inputs(300, seed=1)
        prediction = slab_classifier(exact_selector(level_threshold=level_threshold)).predict(X)
        answered = np.flatnonzero(prediction != ABSTAIN)
        assert len(answered) > 250
        boundary = selector_boundary(level_threshold)
        wrong = sum(g_disagrees_on_disc(X[i], 0.0, prediction[i], boundary=boundary) for i in answered)
        assert wrong <= binomial_bound(len(answered), alpha)


class TestAlphaSplit:
    # The plain certificate, min(R1, R2); the reachable levels' split is tested in tests/test_experts.py.
    def test_selector_and_classifier_sample_on_distinct_stages_at_split_alpha(self, monkeypatch):
        calls = []
        original = MonteCarloEngine.class_counts

        def recording(engine, X, sigma, n_samples, stage):
            # The test's own module, inside whatever the library wraps it in.
            module = next(part for part in engine.module.modules() if type(part) in (LevelSelectorLogits, SlabLogits))
            calls.append((type(module).__name__, tuple(stage)))
            return original(engine, X, sigma, n_samples, stage)

        monkeypatch.setattr(MonteCarloEngine, "class_counts", recording)
        alphas = {}

        class RecordingSampler(FixedSampler):
            def _certify(self, engine, X, sigma, alpha, stage):
                alphas["classifier"] = alpha
                return super()._certify(engine, X, sigma, alpha, stage)

        class RecordingSelector(CertifiedSigmaSelector):
            def _certify_sigma(self, engine, X, alpha):
                alphas["selector"] = alpha
                return super()._certify_sigma(engine, X, alpha)

        selector = RecordingSelector(levels=LEVELS, selector=LevelSelectorLogits((0.0,), axis=1),
                                     fit_selector=False, n=200, alpha_share=0.3, certify_reachable_levels=False)
        clf = slab_classifier(selector, sampler=RecordingSampler(n=200, n0=20), alpha=0.01)
        X = disc_inputs(20)
        calls.clear()
        clf.certify(X)
        certify_calls = set(calls)
        calls.clear()
        clf.predict(X)
        predict_calls = set(calls)
        assert certify_calls == {("LevelSelectorLogits", (CERTIFIED_SIGMA_STAGE, 0)),
                                 ("LevelSelectorLogits", (CERTIFIED_SIGMA_STAGE, 1)),
                                 ("SlabLogits", (1, 0)), ("SlabLogits", (1, 1))}
        assert predict_calls == {("LevelSelectorLogits", (CERTIFIED_SIGMA_STAGE, 2)), ("SlabLogits", PREDICT_STAGE)}
        stages = [{stage for module, stage in calls_ if module == name}
                  for calls_ in (certify_calls | predict_calls,) for name in ("LevelSelectorLogits", "SlabLogits")]
        assert not stages[0] & stages[1]
        assert alphas == {"selector": pytest.approx(0.3 * 0.01), "classifier": pytest.approx(0.7 * 0.01)}

    def test_details_report_the_selector_radius_and_samples(self):
        prediction, radius, details = slab_classifier(exact_selector(n=500, certify_reachable_levels=False)).certify(
            disc_inputs(30), return_details=True)
        assert set(details.sigma) <= set(LEVELS)
        np.testing.assert_array_equal(details.sigma_samples, 600)
        assert np.all(details.n_samples[prediction != ABSTAIN] == 2100)
        # Inputs far from x1 = 0 get a selector radius of at least 0.25 (their x1 distance is >= 0.3 there).
        far = np.abs(disc_inputs(30)[:, 1]) > 0.6
        assert np.all(details.radius_cap[far] > 0.25)
        assert np.all(radius <= details.radius_cap)

    @pytest.mark.parametrize("reachable", [False, True])
    def test_an_input_the_selector_cannot_place_between_disagreeing_levels_abstains(self, reachable):
        # On the selector's boundary either level may be G's; level 0.25 predicts the slab's class 1 there,
        # level 2.0 class 0. The plain certificate abstains without sampling the classifier; with the
        # reachable levels both are certified, disagree, and the certificate abstains.
        X = np.array([[0.0, 0.0], [0.0, 0.9]], dtype=np.float32)  # on the selector's boundary, and far from it
        selector = exact_selector(certify_reachable_levels=reachable)
        prediction, radius, details = slab_classifier(selector).certify(X, return_details=True)
        assert prediction[0] == ABSTAIN and radius[0] == 0 and (details.n_samples[0] > 0) == reachable
        assert prediction[1] == 0 and radius[1] > 0  # at level 2.0 the slab's class never wins


class TestStateless:
    @pytest.mark.parametrize("level_threshold", [None, 0.3])
    def test_certificates_do_not_depend_on_order_subsets_chunks_or_jobs(self, tmp_path, level_threshold):
        X = disc_inputs(40, seed=2)
        clf = slab_classifier(exact_selector(thresholds=(-0.3, 0.3), levels=(0.25, 0.5, 1.0), n=300,
                                             level_threshold=level_threshold), n=300)
        reference = clf.certify(X, return_details=True)
        reversed_ = clf.certify(X[::-1], return_details=True)
        subset = clf.certify(X[5:17], return_details=True)
        chunked = clf.certify(X, return_details=True, checkpoint=tmp_path / "ckpt", checkpoint_every=7)
        parallel = clf.set_params(n_jobs=2).certify(X, return_details=True)
        for name in ("prediction", "radius", "sigma", "p_lower", "radius_cap", "sigma_samples"):
            expected = getattr(reference[2], name)
            np.testing.assert_array_equal(getattr(reversed_[2], name), expected[::-1])
            np.testing.assert_array_equal(getattr(subset[2], name), expected[5:17])
            np.testing.assert_array_equal(getattr(chunked[2], name), expected)
            np.testing.assert_array_equal(getattr(parallel[2], name), expected)
        assert len(clf.regions_) == 0


class TestFit:
    def test_fit_trains_the_selector_on_a_clone(self):
        selector = FlatMLP(n_classes=3, hidden=16)
        with torch.no_grad():
            selector(torch.zeros(1, 2))
        before = {key: value.clone() for key, value in selector.state_dict().items()}
        search = CertifiedSigmaSelector(levels=(0.25, 0.5, 2.0), selector=selector, n=200, selector_epochs=30,
                                        min_level_gain=None, selector_sigma=0.25)
        rng = np.random.default_rng(0)
        X = np.column_stack([rng.uniform(-2, 2, 400), rng.uniform(-1, 1, 400)]).astype(np.float32)
        y = (np.abs(X[:, 0]) < 1).astype(int)
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=search, random_state=0, lr=0.05,
                                           batch_size=64, certify_batch_size=1000).fit(X, y)
        # The user's objects are untouched; the fitted clone holds the state.
        assert clf.sigma_search is search and not hasattr(search, "levels_")
        assert all(torch.equal(before[key], value) for key, value in selector.state_dict().items())
        fitted = clf.sigma_search_
        assert fitted.selector_module_ is not selector and fitted.train_levels_.shape == (400,)
        # The targets use more than one level, and the trained selector learned them.
        assert len(np.unique(fitted.train_levels_)) > 1
        with torch.no_grad():
            learned = fitted.selector_module_(torch.from_numpy(X)).argmax(dim=1).numpy()
        targeted = fitted.train_levels_ >= 0  # -1: no level classifies the sample correctly
        majority = np.bincount(fitted.train_levels_[targeted]).max() / targeted.sum()
        assert (learned == fitted.train_levels_)[targeted].mean() > majority

    @pytest.mark.parametrize(("selector_sigma", "expert"), [(None, 2), (0.3, 0), (0.6, 1)])
    def test_the_selector_starts_from_the_expert_nearest_its_noise(self, selector_sigma, expert):
        # Levels 0.25, 0.5, 1.0. The default noise is the largest level: its expert.
        clf, X, y = untrained_experts(selector_epochs=0)
        clf.set_params(sigma_search__selector_sigma=selector_sigma).fit(X, y)
        selector = clf.sigma_search_.selector_module_.layers
        source = clf.module_.experts[expert].layers
        # The hidden layer is the expert's; the output layer, K = 3 logits against the expert's 2, its own.
        assert torch.equal(selector[1].weight, source[1].weight) and torch.equal(selector[1].bias, source[1].bias)
        assert selector[3].weight.shape == (3, 64)
        assert selector[1].weight.data_ptr() != source[1].weight.data_ptr()  # a copy: training leaves the expert

    def test_the_selector_starts_from_a_single_classifier(self):
        rng = np.random.default_rng(0)
        X = rng.normal(size=(60, 5)).astype(np.float32)
        y = (X[:, 0] > 0).astype(np.int64)
        clf = SampleWiseSmoothedClassifier(
            FlatMLP, training=PretrainFinetune(0.25, 1.0, pretrain_epochs=1, finetune_epochs=1), max_epochs=2,
            sigma_search=CertifiedSigmaSelector(n=100, n0=10, selector_epochs=0), sampler=FixedSampler(n=100, n0=10),
            random_state=0).fit(X, y)
        assert torch.equal(clf.sigma_search_.selector_module_.layers[1].weight, clf.module_.layers[1].weight)

    def test_without_init_from_classifier_the_selector_starts_from_its_own_seed(self):
        clf, X, y = untrained_experts(selector_epochs=0)
        clf.set_params(sigma_search__init_from_classifier=False).fit(X, y)
        weight = clf.sigma_search_.selector_module_.layers[1].weight
        assert not any(torch.equal(weight, expert.layers[1].weight) for expert in clf.module_.experts)

    def test_a_given_selector_instance_keeps_its_own_weights(self):
        clf, X, y = untrained_experts(selector_epochs=0)
        selector = FlatMLP(n_classes=3)
        selector(torch.zeros(1, 5))
        clf.set_params(sigma_search__selector=selector).fit(X, y)
        assert torch.equal(clf.sigma_search_.selector_module_.layers[1].weight, selector.layers[1].weight)

    def test_fit_reads_only_its_context(self):
        # A context made by hand, without an estimator, trains the selector the estimator's fit trains.
        X = disc_inputs(60)
        y = (np.abs(X[:, 0]) < 1).astype(int)
        search = CertifiedSigmaSelector(levels=(0.25, 0.5, 2.0), n=50, selector_epochs=2)
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=search, lr=0.05, batch_size=16,
                                           certify_batch_size=1000, random_state=0).fit(X, y)
        context = SigmaFitContext(
            classifier=SlabLogits(), n_classes=2, certify_batch_size=1000, n_jobs=None, levels=None,
            assignment_levels=None, train_sigmas=None, module_class=None, module_params={},
            optimizer_factory=functools.partial(torch.optim.SGD, lr=0.05), max_epochs=0, batch_size=16,
            device=torch.device("cpu"), random_state=0, certify_samples=FixedSampler().prediction_sample_size)
        fitted = search.fit_sigma(context, torch.from_numpy(X), torch.as_tensor(y))
        np.testing.assert_array_equal(fitted.train_levels_, clf.sigma_search_.train_levels_)
        for key, value in clf.sigma_search_.selector_module_.state_dict().items():
            assert torch.equal(fitted.selector_module_.state_dict()[key], value), key

    def test_targets_score_levels_at_the_certification_budget(self):
        # The slab's centre (|x0| < 0.1, half width 1): at sigma 0.25 the class probability is 1 - 6e-5, at 0.6
        # it is 0.90. Certified with n = 100,000 (alpha 0.001), sigma 0.25 reaches 0.25 * PhiInv(~0.9999) = 0.89
        # and sigma 0.6 0.6 * PhiInv(~0.90) = 0.78: the small level serves these inputs. 500 samples alone cap
        # sigma 0.25 at 0.25 * PhiInv(0.001 ** (1 / 500)) = 0.55, below sigma 0.6's 0.68: scored at 500
        # samples, every target would be the large level.
        rng = np.random.default_rng(0)
        centre = np.column_stack([rng.uniform(-0.1, 0.1, 200), rng.uniform(-1, 1, 200)])
        outside = np.column_stack([rng.uniform(2.5, 3, 20), rng.uniform(-1, 1, 20)])  # class 0 at both levels
        X = np.concatenate([centre, outside]).astype(np.float32)
        search = CertifiedSigmaSelector(levels=(0.25, 0.6), n=100, selector_epochs=0, min_level_gain=None,
                                        target_neighbors=1)
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=search, random_state=0,
                                           sampler=FixedSampler(n=100_000), certify_batch_size=1000)
        targets = clf.fit(X, np.repeat([1, 0], [200, 20])).sigma_search_.train_levels_
        assert np.mean(targets[:200] == 0) > 0.9

    def test_target_neighbors_make_nearby_targets_agree(self):
        # Slab inputs: which of the levels certifies the largest radius varies from input to input (its
        # distance to the slab's edges) and, near the edges, with the Monte Carlo noise of the assignment.
        rng = np.random.default_rng(0)
        X = np.column_stack([rng.uniform(-2, 2, 400), rng.uniform(-1, 1, 400)]).astype(np.float32)
        y = (np.abs(X[:, 0]) < 1).astype(int)

        def targets(k):
            search = CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), n=100, selector_epochs=0, target_neighbors=k)
            return SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=search, random_state=0,
                                                certify_batch_size=1000).fit(X, y).sigma_search_.train_levels_

        def agreement(levels):
            """Fraction of inputs whose target is the most common target of their 10 nearest inputs (-1: none)."""
            nearest = np.argsort(((X[:, None] - X[None]) ** 2).sum(axis=2), axis=1)[:, :10]
            common = np.array([np.bincount(row + 1).argmax() - 1 for row in levels[nearest]])
            return (levels == common).mean()

        own = targets(None)
        assert len(np.unique(own)) > 1
        # One neighbour is the input itself: its own best level.
        np.testing.assert_array_equal(targets(1), own)
        # More neighbours: targets agree more with those of nearby inputs; all of them: one level for all.
        assert agreement(targets(25)) > agreement(own)
        assert len(np.unique(targets(len(X))[own >= 0])) == 1

    @staticmethod
    def fit_selector_on_the_slab(**params):
        """The fitted selector of a slab classifier trained on 400 inputs, and the inputs."""
        rng = np.random.default_rng(0)
        X = np.column_stack([rng.uniform(-2, 2, 400), rng.uniform(-1, 1, 400)]).astype(np.float32)
        y = (np.abs(X[:, 0]) < 1).astype(int)
        search = CertifiedSigmaSelector(levels=(0.25, 0.5, 2.0), selector=FlatMLP, n=200, selector_epochs=20,
                                        **{"min_level_gain": None, "selector_sigma": 0.25, **params})
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=search, random_state=0,
                                           lr=0.05, batch_size=64, certify_batch_size=1000).fit(X, y)
        return clf.sigma_search_, X

    def test_selector_sigma_none_is_the_largest_level(self):
        # levels (0.25, 0.5, 2.0): None must train and certify exactly as selector_sigma=2.0 does.
        default, X = self.fit_selector_on_the_slab(selector_sigma=None)
        explicit, _ = self.fit_selector_on_the_slab(selector_sigma=2.0)
        engine = MonteCarloEngine(SlabLogits(), 2, 1000, root_seed=0)
        X = torch.from_numpy(X[:50])
        a, b = default.certify_sigma(engine, X, 0.01), explicit.certify_sigma(engine, X, 0.01)
        np.testing.assert_array_equal(a.radius_cap, b.radius_cap)
        np.testing.assert_array_equal(a.sigma, b.sigma)
        assert np.max(a.radius_cap) > 1.0  # beyond what the old default noise (0.25) could certify at n = 200

    def test_selector_objective_consistency_is_the_default_training(self):
        default, _ = self.fit_selector_on_the_slab()
        consistency, _ = self.fit_selector_on_the_slab(selector_objective=Consistency(lbd=5.0, eta=0.5))
        gaussian, _ = self.fit_selector_on_the_slab(selector_objective=GaussianNoise(num_noise=1))
        np.testing.assert_array_equal(consistency.train_levels_, default.train_levels_)
        for key, value in default.selector_module_.state_dict().items():
            assert torch.equal(consistency.selector_module_.state_dict()[key], value), key
        assert any(not torch.equal(gaussian.selector_module_.state_dict()[key], value)
                   for key, value in default.selector_module_.state_dict().items())

    def test_selector_objective_trains_the_selector(self):
        class FirstLevel(BaseObjective):
            """Cross-entropy towards level 0 whatever the target; records what it is given."""

            def loss(self, net, X, y, sigma):
                self.calls_ = [*getattr(self, "calls_", []), (X.shape[1], y.clone(), sigma.clone())]
                logits = net.module_(X + sigma[:, None] * torch.randn(X.shape, generator=net.noise_generator_))
                return net.criterion_(logits, torch.zeros_like(y)), logits

        objective = FirstLevel()
        fitted, X = self.fit_selector_on_the_slab(selector_objective=objective, selector_sigma=0.3)
        assert len(np.unique(fitted.train_levels_)) > 1
        # Every training step went through the objective: the estimator's clone of it, at the selector's noise,
        # with the target levels as labels (20 epochs of batches of 64 samples that have a target).
        calls = fitted.selector_objective.calls_
        assert not hasattr(objective, "calls_")
        assert all(width == 2 and torch.all(sigma == 0.3) for width, _, sigma in calls)
        targeted = fitted.train_levels_[fitted.train_levels_ >= 0]  # -1: no level classifies the sample
        assert len(calls) == 20 * -(-len(targeted) // 64)
        assert sorted(torch.cat([y for _, y, _ in calls[:len(calls) // 20]]).tolist()) == sorted(targeted.tolist())
        with torch.no_grad():
            learned = fitted.selector_module_(torch.from_numpy(X)).argmax(dim=1).numpy()
        assert np.all(learned == 0)

    def test_macer_objective_learns_the_targets(self):
        fitted, X = self.fit_selector_on_the_slab(selector_objective=Macer(num_noise=4, lbd=1.0))
        with torch.no_grad():
            learned = fitted.selector_module_(torch.from_numpy(X)).argmax(dim=1).numpy()
        targeted = fitted.train_levels_ >= 0  # -1: no level classifies the sample correctly
        majority = np.bincount(fitted.train_levels_[targeted]).max() / targeted.sum()
        assert (learned == fitted.train_levels_)[targeted].mean() > majority

    def test_default_selector_is_the_classifier_class_with_k_outputs(self):
        search = CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), n=100, selector_epochs=1)
        X = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
        y = (X[:, 0] > 0).astype(int)
        clf = SampleWiseSmoothedClassifier(FlatMLP, module__hidden=8, max_epochs=1, sigma_search=search,
                                           random_state=0).fit(X, y)
        module = clf.sigma_search_.selector_module_
        assert isinstance(module, FlatMLP) and module(torch.zeros(2, 4)).shape == (2, 3)

    def test_levels_none_reuses_the_pfat_assignment(self):
        training = PretrainFinetune(sigma_min=0.25, sigma_max=0.5, pretrain_epochs=0, finetune_epochs=0)
        X = disc_inputs(50)
        clf = SampleWiseSmoothedClassifier(
            SlabLogits, training=training, sigma_search=CertifiedSigmaSelector(n=100, selector_epochs=1,
                                                                              min_level_gain=None,
                                                                              target_neighbors=None),
            random_state=0).fit(X, (np.abs(X[:, 0]) < 1).astype(int))
        fitted = clf.sigma_search_
        np.testing.assert_allclose(fitted.levels_, [0.25, 0.3, 0.35, 0.4, 0.45, 0.5])
        np.testing.assert_allclose(fitted.levels_[fitted.train_levels_], clf.train_sigmas_)

    def test_one_level_needs_no_selector(self):
        clf = slab_classifier(CertifiedSigmaSelector(levels=(0.5,)))
        prediction, radius, details = clf.certify(np.array([[0.0, 0.0]], dtype=np.float32), return_details=True)
        assert details.radius_cap[0] == np.inf and details.sigma_samples[0] == 0 and radius[0] > 0

    def test_one_level_leaves_a_lazy_selector_uninitialised_and_certifies(self):
        # With one level the selector is never probed: certify compares its uninitialised layer with the fitted one.
        selector = FlatMLP(n_classes=1, hidden=4)
        clf = slab_classifier(CertifiedSigmaSelector(levels=(0.5,), selector=selector, n=100), n=100)
        prediction, _ = clf.certify(np.array([[0.0, 0.0]], dtype=np.float32))
        assert prediction[0] == 1
        assert isinstance(selector.layers[1].weight, torch.nn.parameter.UninitializedParameter)

    def test_sample_sizes_change_without_refit_but_the_selector_noise_does_not(self):
        clf = slab_classifier(exact_selector(n=200))
        X = disc_inputs(5)
        clf.set_params(sigma_search__n=300)
        assert clf.certify(X, return_details=True)[2].sigma_samples[0] == 400
        clf.set_params(sigma_search__selector_sigma=0.5)
        with pytest.raises(NotFittedError, match="changed since fit"):
            clf.certify(X)


class TestValidation:
    @pytest.mark.parametrize("params, message", [
        ({"levels": (0.25, -1.0)}, "levels must be"),
        ({"levels": (0.25, 0.25)}, "levels must be"),
        ({"levels": [[0.25, 0.5]]}, "levels must be"),
        ({"selector": "mlp"}, "selector"),
        ({"selector": np.mean}, "selector must be a torch.nn.Module"),
        ({"fit_selector": False}, "fit_selector=False uses a given selector"),
        ({"alpha_share": 1.0}, "alpha_share"),
        ({"n": 0}, "'n' parameter"),
        ({"selector_sigma": 0.0}, "selector_sigma"),
        ({"target_neighbors": 0}, "'target_neighbors' parameter"),
        ({"selector_objective": "macer"}, "'selector_objective' parameter"),
        ({"selector_objective": Macer(num_noise=0)}, "'num_noise' parameter"),
    ])
    def test_bad_parameters_are_refused_before_training(self, params, message):
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0,
                                           sigma_search=CertifiedSigmaSelector(**{"levels": LEVELS, **params}))
        with pytest.raises(ValueError, match=message):
            clf.fit(disc_inputs(4), [0, 1, 0, 1])
        assert not hasattr(clf, "module_")

    @pytest.mark.parametrize("allocator", [OnlineBallAllocator(), TransductiveLPAllocator(), MemoryAllocator()])
    def test_region_allocators_are_refused(self, allocator):
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=exact_selector(),
                                           allocator=allocator)
        with pytest.raises(ValueError, match="does not compose with the certified sigma function"):
            clf.fit(disc_inputs(4), [0, 1, 0, 1])
        assert not hasattr(clf, "module_")

    def test_levels_none_needs_a_classifier_grid(self):
        clf = SampleWiseSmoothedClassifier(SlabLogits, training=DataDependentTraining(warmup_epochs=0),
                                           max_epochs=0, sigma_search=CertifiedSigmaSelector())
        with pytest.raises(ValueError, match="levels=None takes the classifier's grid"):
            clf.fit(disc_inputs(4), [0, 1, 0, 1])
        assert not hasattr(clf, "module_")

    def test_probing_a_selector_class_leaves_the_global_generator_alone(self):
        class NoisyThreeLevels(torch.nn.Module):  # its forward draws from torch's global generator
            def __init__(self, n_classes=3):
                super().__init__()
                self.linear = torch.nn.Linear(2, n_classes)

            def forward(self, x):
                return self.linear(x + torch.rand_like(x))

        torch.manual_seed(0)
        expected = torch.rand(1)
        torch.manual_seed(0)
        selector = CertifiedSigmaSelector(selector=NoisyThreeLevels, levels=(0.25, 0.5, 1.0))
        selector.check_before_fit(np.array([0.5]), torch.zeros((4, 2)))
        assert torch.rand(1) == expected

    @pytest.mark.parametrize("selector, error, message", [
        (TwoLogits, ValueError, r"selector \(TwoLogits\) returns outputs of shape \(1, 2\).*shape \(1, 3\)"),
        (SevenInputs, ValueError, r"selector \(SevenInputs\) fails on an input of shape \(1, 2\)"),
        (SevenInputs(), ValueError, r"selector \(SevenInputs\) fails on an input of shape \(1, 2\)"),
        (torch.nn.Linear, TypeError, r"selector=Linear cannot be built as Linear\(\)"),
    ])
    def test_a_selector_that_cannot_work_is_refused_before_training(self, selector, error, message):
        search = CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), selector=selector)
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=search)
        with pytest.raises(error, match=message):
            clf.fit(disc_inputs(4), [0, 1, 0, 1])
        assert not hasattr(clf, "module_")

    def test_levels_none_checks_the_selector_against_the_levels_fit_uses(self):
        # PFAT's assignment grid, not its test-time search's (step 0.05), is the grid fit uses.
        def classifier(thresholds):
            training = PretrainFinetune(0.25, 1.0, pretrain_epochs=0, finetune_epochs=0,
                                        assignment=GridSigmaSearch(0.25, 1.0, 0.25, n=50))
            search = CertifiedSigmaSelector(selector=LevelSelectorLogits(thresholds), fit_selector=False, n=100)
            return SampleWiseSmoothedClassifier(SlabLogits, training=training, sigma_search=search, random_state=0)

        X, y = disc_inputs(20), [0, 1] * 10
        fitted = classifier((-0.5, 0.0, 0.5)).fit(X, y)
        np.testing.assert_allclose(fitted.sigma_search_.levels_, [0.25, 0.5, 0.75, 1.0])
        refused = classifier(np.linspace(-0.9, 0.9, 15))
        with pytest.raises(ValueError, match=r"one logit per level: shape \(1, 4\)"):
            refused.fit(X, y)
        assert not hasattr(refused, "module_")

    def test_levels_none_checks_the_selector_against_the_experts_levels_before_fit(self):
        experts = NoiseLevelExperts((0.25, 0.5, 1.0), [LinearLogits() for _ in range(3)])
        search = CertifiedSigmaSelector(selector=LevelSelectorLogits((0.0,)), fit_selector=False, n=100)
        refused = SampleWiseSmoothedClassifier(experts, training=Pretrained(), sigma_search=search, random_state=0)
        with pytest.raises(ValueError, match=r"one logit per level: shape \(1, 3\)"):
            refused.fit(disc_inputs(20), [0, 1] * 10)
        assert not hasattr(refused, "module_")

    def test_selector_with_the_wrong_number_of_outputs(self):
        search = CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), selector=LevelSelectorLogits((0.0,), axis=1),
                                        fit_selector=False)
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=search)
        with pytest.raises(ValueError, match=r"one logit per level: shape \(1, 3\)"):
            clf.fit(disc_inputs(4), [0, 1, 0, 1])

    def test_set_after_fit_needs_a_refit(self):
        clf = slab_classifier(None)
        clf.set_params(sigma_search=exact_selector())
        with pytest.raises(NotFittedError, match="call fit again"):
            clf.predict(disc_inputs(2))


class TestChangedAfterFit:
    """A selector set after ``fit`` is used only if it is the fitted one by value: its weights, not its repr."""

    X = np.array([[0.0, -2.0], [0.0, 2.0]], dtype=np.float32)

    def test_a_selector_with_other_buffers_needs_a_refit(self):
        # The reviewer's case: the repr of LevelSelectorLogits shows no thresholds (a buffer).
        clf = slab_classifier(exact_selector(thresholds=(0.0,), n=200))
        clf.set_params(sigma_search=exact_selector(thresholds=(5.0,), n=200))
        with pytest.raises(NotFittedError, match=r"\['selector'\] changed since fit"):
            clf.certify(self.X)

    def test_a_selector_with_other_state_outside_its_state_dict_needs_a_refit(self):
        class HiddenThresholds(LevelSelectorLogits):
            """Thresholds in a buffer left out of the state_dict."""

            def __init__(self, thresholds):
                super().__init__(thresholds, axis=1)
                thresholds = self._buffers.pop("thresholds")
                self.register_buffer("thresholds", thresholds, persistent=False)

        def selector(thresholds):
            return CertifiedSigmaSelector(levels=LEVELS, selector=HiddenThresholds(thresholds), fit_selector=False,
                                          selector_sigma=SELECTOR_SIGMA, n=200, n0=100)

        clf = slab_classifier(selector((0.0,)))
        clf.set_params(sigma_search=selector((5.0,)))
        with pytest.raises(NotFittedError, match=r"\['selector'\] changed since fit"):
            clf.certify(self.X)

    def test_a_selector_trained_further_in_place_needs_a_refit(self):
        clf = slab_classifier(exact_selector(n=200))
        with torch.no_grad():
            clf.sigma_search.selector.unused.add_(1.0)
        with pytest.raises(NotFittedError, match=r"\['selector'\] changed since fit"):
            clf.predict(self.X)

    def test_an_equal_selector_is_the_fitted_one(self):
        clf = slab_classifier(exact_selector(n=200))
        expected = clf.certify(self.X, return_details=True)
        clf.set_params(sigma_search=exact_selector(n=200))  # another instance, the same weights
        certified = clf.certify(self.X, return_details=True)
        np.testing.assert_array_equal(certified[2].sigma, expected[2].sigma)
        np.testing.assert_array_equal(certified[1], expected[1])

    def test_a_selector_instance_trained_in_fit_stays_the_users_start(self):
        selector = FlatMLP(n_classes=2, hidden=4)
        with torch.no_grad():
            selector(torch.zeros(1, 2))
        clf = slab_classifier(CertifiedSigmaSelector(levels=LEVELS, selector=selector, n=100, selector_epochs=2),
                              lr=0.5)
        fitted = clf.sigma_search_.selector_module_
        assert any(not torch.equal(value, selector.state_dict()[key]) for key, value in fitted.state_dict().items())
        clf.certify(self.X)  # the parameter still holds the weights fit started from: no refit needed


def test_every_input_abstained_by_the_selector_abstains():
    # On the threshold x1 = 0 the smoothed selector is split evenly between the levels: the plain certificate
    # abstains there without sampling the classifier, so no input reaches it.
    clf = slab_classifier(exact_selector(n=200, certify_reachable_levels=False))
    prediction, radius, details = clf.certify(np.zeros((3, 2), dtype=np.float32), return_details=True)
    np.testing.assert_array_equal(prediction, ABSTAIN)
    np.testing.assert_array_equal(radius, 0.0)
    np.testing.assert_array_equal(details.n_samples, 0)
