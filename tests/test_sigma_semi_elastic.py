"""SemiElasticSigma and its radius for G(x) = g(x, sigma(x)) (Súkeník et al., ICML 2022)."""

import copy
import functools
import math

import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats
from sklearn.base import clone

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk.models import FlatMLP
from smoothsk.regions import OnlineBallAllocator
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import SemiElasticSigma, semi_elastic_radius
from smoothsk.sigma._semi_elastic import SIGMA_RANGE
from smoothsk.statistics import certified_radius
from smoothsk.training import FixedSigmaTraining

from conftest import SlabLogits, slab_probability

#: Bisection precision of semi_elastic_radius (its default rtol), relative to Cohen's radius.
RTOL = 1e-5


# ------------------------------------------------------------------------------------------------
# An independent computation of the worst case: Neyman-Pearson on the log-likelihood ratio itself,
# by numerical integration (no noncentral chi-square, no completed square).

def _phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _probability_below(offset, linear, quadratic, threshold, n_features):
    """P(offset + linear e + quadratic (e^2 + W) <= threshold), e ~ N(0, 1), W ~ chi2(n_features - 1)."""

    def given_w(w):
        rest = threshold - offset - quadratic * w  # linear e + quadratic e^2 <= rest
        if quadratic == 0:
            return _phi(rest / linear)
        disc = linear * linear + 4 * quadratic * rest
        if disc < 0:
            return 0.0 if quadratic > 0 else 1.0
        roots = sorted([(-linear - math.sqrt(disc)) / (2 * quadratic), (-linear + math.sqrt(disc)) / (2 * quadratic)])
        between = _phi(roots[1]) - _phi(roots[0])
        return between if quadratic > 0 else 1.0 - between

    if n_features == 1:
        return given_w(0.0)
    low, high, density = _chi2(n_features - 1)
    return integrate.quad(lambda w: given_w(w) * density(w), low, high, epsabs=1e-12, limit=200)[0]


@functools.cache
def _chi2(dof):
    """The chi2(dof) range holding all but 2e-15 of its mass, and its density in plain floats (scipy's frozen
    ``pdf`` costs tens of microseconds a call, and quad calls it thousands of times per probability)."""
    chi2 = stats.chi2(dof)
    log_norm = math.lgamma(dof / 2) + dof / 2 * math.log(2)

    def density(w):
        return math.exp((dof / 2 - 1) * math.log(w) - w / 2 - log_norm)

    return chi2.ppf(1e-15), chi2.isf(1e-15), density


def worst_case_by_quadrature(p, distance, ratio, n_features):
    """min P1(A) over P0(A) = p for P0 = N(0, I), P1 = N(distance e1, ratio^2 I).

    The likelihood ratio p1 / p0 is increasing in
    ``Q(w) = 2 distance w1 + (ratio^2 - 1) ||w||^2``, so the worst set is
    ``{Q <= tau}`` with ``P0(Q <= tau) = p`` (Neyman-Pearson). Under P0,
    ``Q = 2 u e1 + delta (e1^2 + W)``; under P1 (``w = u e1 + q e``),
    ``Q = u^2 (1 + q^2) + 2 u q^3 e1 + delta q^2 (e1^2 + W)``.
    """
    u, q = float(distance), float(ratio)
    delta = q * q - 1
    reach = 50 * (u + abs(delta) * (n_features + 10)) + 50
    tau = optimize.brentq(lambda t: _probability_below(0.0, 2 * u, delta, t, n_features) - p,
                          -reach, reach, xtol=1e-14, rtol=1e-14)
    return _probability_below(u * u * (1 + q * q), 2 * u * q ** 3, delta * q * q, tau, n_features)


class TestWorstCaseQuadrature:
    def test_equal_sigmas_is_cohens_theorem(self):
        # The reference computation itself, on the one case known in closed form.
        for p, u in ((0.9, 0.7), (0.99, 1.5)):
            assert worst_case_by_quadrature(p, u, 1.0, 5) == pytest.approx(_phi(stats.norm.ppf(p) - u), abs=1e-9)


# ------------------------------------------------------------------------------------------------

class TestSemiElasticRadius:
    P = np.array([0.3, 0.5, 0.500001, 0.6, 0.9, 0.99, 0.999999])
    SIGMA = np.array([0.12, 0.5, 2.0])

    @pytest.mark.parametrize("n_features", [1, 2, 64, 3072])
    def test_r_zero_is_cohens_radius(self, n_features):
        p, sigma = np.meshgrid(self.P, self.SIGMA)
        np.testing.assert_allclose(semi_elastic_radius(sigma, p, 0.0, n_features), certified_radius(sigma, p),
                                   rtol=4 * np.finfo(float).eps, atol=0)

    @pytest.mark.parametrize("n_features", [1, 64, 784])
    def test_non_increasing_in_r_and_below_cohen(self, n_features):
        p, sigma = np.meshgrid(self.P, self.SIGMA)
        cohen = certified_radius(sigma, p)
        radii = np.stack([semi_elastic_radius(sigma, p, r, n_features) for r in (0.0, 1e-6, 0.01, 0.1, 0.5, 2.0)])
        # Each radius is the certified end of a bisection bracket narrower than RTOL * cohen. At p = 1/2 + 1e-6
        # (radii ~1e-6 sigma) the rounding of scipy's quantiles decides and the radius is only conservative.
        steady = p > 0.5 + 1e-4
        assert np.all(np.diff(radii, axis=0)[:, steady] <= RTOL * cohen[steady])
        assert np.all(radii <= cohen)
        assert np.all(radii[:, p <= 0.5] == 0) and np.all(radii[:, p > 0.5] > 0)
        assert np.all(radii[-1][p > 0.5] < radii[0][p > 0.5])  # r = 2 costs radius in every dimension

    def test_shrinks_with_the_dimension(self):
        # Súkeník et al.'s curse of dimensionality: the same r costs more radius in higher dimension.
        radii = [float(semi_elastic_radius(0.5, 0.99, 0.05, d)) for d in (1, 16, 256, 4096)]
        assert radii[0] >= radii[1] >= radii[2] >= radii[3]
        assert radii[3] < 0.5 * radii[0]

    def test_shape_and_broadcasting(self):
        assert semi_elastic_radius(np.full((2, 3), 0.5), 0.9, 0.1, 4).shape == (2, 3)
        assert semi_elastic_radius(0.5, 0.9, 0.1, 4).shape == ()

    def test_p_one_certifies(self):
        # p_lower = 1 (an exact probability, not a Clopper-Pearson bound) must not collapse the bracket to 0.
        assert 0 < semi_elastic_radius(0.5, 1.0, 0.1, 4) < np.inf

    @pytest.mark.parametrize("p, sigma, r, n_features", [
        (0.9, 0.5, 0.4, 1), (0.99, 0.25, 1.0, 1), (0.999, 1.0, 0.3, 3),
        (0.95, 0.5, 0.05, 64), (0.8, 2.0, 0.02, 64), (0.9999, 0.25, 0.5, 3),
    ])
    def test_radius_against_quadrature(self, p, sigma, r, n_features):
        # Independent check of the certificate against the exact worst case over the whole ball (interior
        # distances and interior sigma ratios included). The radius is a proven lower bound, not tight, so
        # nothing is asserted beyond it.
        radius = float(semi_elastic_radius(sigma, p, r, n_features))
        u, elasticity = radius / sigma, r * sigma
        assert u > 0
        for distance in (0.25 * u, 0.5 * u, u * (1 - 1e-9)):
            for log_ratio in np.linspace(-elasticity * distance, elasticity * distance, 5):
                assert worst_case_by_quadrature(p, distance, math.exp(log_ratio), n_features) > 0.5


# ------------------------------------------------------------------------------------------------

def _fitted_sigma(X_train, **params):
    return SemiElasticSigma(**params).fit_sigma(None, X_train, None)


class TestSemiElasticSigmaFunction:
    def test_semi_elastic_on_random_pairs(self):
        rng = np.random.default_rng(0)
        X_train = rng.normal(size=(60, 3, 2, 2))
        r = 0.7
        function = _fitted_sigma(X_train, base_sigma=0.3, r=r, k=5)
        near = X_train[rng.integers(60, size=200)] + 1e-6 * rng.normal(size=(200, 3, 2, 2))
        first = np.concatenate([rng.normal(size=(200, 3, 2, 2)), near, X_train[:50],
                                100 * rng.normal(size=(200, 3, 2, 2))])
        second = np.concatenate([rng.normal(size=(200, 3, 2, 2)), near + 1e-4 * rng.normal(size=near.shape),
                                 X_train[:50] + 1e-3, -100 * rng.normal(size=(200, 3, 2, 2))])
        sigma_first, sigma_second = function.sigma(first), function.sigma(second)
        gap = np.abs(np.log(sigma_first) - np.log(sigma_second))
        lipschitz = r * np.linalg.norm((first - second).reshape(len(first), -1), axis=1)
        # float64 rounding of distances that reach ~500 (12 coordinates): a few ulps of r * distance.
        rounding = 64 * np.finfo(float).eps * (1 + r * 500)
        assert np.all(gap <= lipschitz + rounding)
        # The bound is not trivially slack: sigma does vary (where neither sigma is at the top of its range).
        unclipped = np.maximum(sigma_first, sigma_second) < SIGMA_RANGE[1] / 2
        assert 0 < unclipped.sum() < len(first)
        assert gap[unclipped].max() > 0.1 * lipschitz[unclipped].max()

    def test_formula_and_learned_offset(self):
        rng = np.random.default_rng(1)
        X_train, X = rng.normal(size=(40, 5)), rng.normal(size=(7, 5))
        function = _fitted_sigma(X_train, base_sigma=0.5, r=0.2, k=3)
        between = np.linalg.norm(X_train[:, None] - X_train[None], axis=2)
        np.fill_diagonal(between, np.inf)  # other training inputs only
        assert function.offset_ == pytest.approx(np.sort(between, axis=1)[:, :3].mean(), rel=1e-12)
        to_train = np.sort(np.linalg.norm(X[:, None] - X_train[None], axis=2), axis=1)[:, :3].mean(axis=1)
        np.testing.assert_allclose(function.sigma(X), 0.5 * np.exp(0.2 * (to_train - function.offset_)), rtol=1e-12)

    def test_given_offset_is_used(self):
        X_train = np.random.default_rng(2).normal(size=(10, 2))
        function = _fitted_sigma(X_train, base_sigma=0.5, r=1.0, k=1, offset=0.0)
        np.testing.assert_allclose(function.sigma(X_train), 0.5)  # each training input is its own neighbour

    def test_deterministic_certificate_of_sigma(self):
        X_train = np.random.default_rng(3).normal(size=(10, 4))
        result = _fitted_sigma(X_train, k=2).certify_sigma(None, X_train[:4], 0.01)
        np.testing.assert_array_equal(result.radius_cap, np.inf)
        np.testing.assert_array_equal(result.n_samples, 0)
        assert not result.abstain.any() and SemiElasticSigma().alpha_share == 0

    @pytest.mark.parametrize("params, name", [({"r": -0.1}, "r"), ({"k": 0}, "k"), ({"base_sigma": 0.0}, "base_sigma")])
    def test_bad_parameters_name_themselves(self, params, name):
        with pytest.raises(ValueError, match=f"'{name}' parameter"):
            SemiElasticSigma(**params).fit_sigma(None, np.zeros((5, 2)), None)

    def test_too_few_training_inputs(self):
        with pytest.raises(ValueError, match="k=5"):
            SemiElasticSigma(k=5).fit_sigma(None, np.zeros((5, 2)), None)  # 4 others per input


# ------------------------------------------------------------------------------------------------
# Soundness for G on a closed-form model whose smoothed classifier depends on sigma.

ALPHA = 0.01


@pytest.fixture(scope="module")
def slab_certificates():
    """Certificates of G on 200 inputs in 2-D: the slab |x0| < 1, sigma growing away from the line x0 = 0.

    Training inputs lie on that line, so sigma grows towards the slab's edges, where the smoothed slab is
    narrower: the classifier at x's own sigma overstates G's radius there.
    """
    X_train = np.stack([np.zeros(30), np.linspace(-4, 4, 30)], axis=1).astype(np.float32)
    clf = SampleWiseSmoothedClassifier(
        SlabLogits, module__half_width=1.0, max_epochs=0, training=FixedSigmaTraining(0.5),
        sigma_search=SemiElasticSigma(base_sigma=0.5, r=1.0, k=3), sampler=FixedSampler(n=2000, n0=100),
        alpha=ALPHA, random_state=0, certify_batch_size=2000)
    clf.fit(X_train, np.arange(30) % 2)
    X = np.random.default_rng(0).uniform(-2.5, 2.5, size=(200, 2)).astype(np.float32)
    prediction, radius, details = clf.certify(X, return_details=True)
    return clf, X, prediction, radius, details


def _count_contradicted(function, X, prediction, radius):
    """Inputs where G(x') = g(x', sigma(x')), exact for the slab, differs from the prediction inside the disc."""
    angles = np.linspace(0, 2 * np.pi, 256, endpoint=False)
    directions = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    fractions = np.concatenate([np.arange(1, 8) / 8, [1 - 2.0 ** -30]])  # the last circle: just inside the open disc
    contradicted = 0
    for x, label, r in zip(X.astype(np.float64), prediction, radius, strict=True):
        if label == ABSTAIN or r <= 0:
            continue
        points = np.concatenate([x[None], (x + (r * fractions)[:, None, None] * directions).reshape(-1, 2)])
        G = (slab_probability(points[:, 0], function.sigma(points)) > 0.5).astype(int)
        contradicted += bool(np.any(G != label))
    return contradicted


class TestSoundnessForG:
    def test_certificates_hold_for_G(self, slab_certificates):
        clf, X, prediction, radius, _details = slab_certificates
        certified = int(((prediction != ABSTAIN) & (radius > 0)).sum())
        assert certified > 150
        # Each certificate fails with probability <= alpha, independently (noise keyed by input): more
        # failures than the binomial (1 - 1e-6) quantile happen with probability below 1e-6.
        bound = stats.binom.ppf(1 - 1e-6, certified, ALPHA)
        assert _count_contradicted(clf.sigma_search_, X, prediction, radius) <= bound

    def test_own_sigma_radius_fails_the_same_check(self, slab_certificates):
        # Cohen's radius at x's own sigma (NoRegions' guarantee) is not a certificate of G: the check has power.
        clf, X, prediction, _radius, details = slab_certificates
        cohen = certified_radius(details.sigma, details.p_lower)
        certified = int(((prediction != ABSTAIN) & (cohen > 0)).sum())
        contradicted = _count_contradicted(clf.sigma_search_, X, prediction, cohen)
        assert contradicted > stats.binom.ppf(1 - 1e-6, certified, ALPHA)

    def test_details(self, slab_certificates):
        clf, X, prediction, radius, details = slab_certificates
        np.testing.assert_allclose(details.sigma, clf.sigma_search_.sigma(X))
        assert details.guarantee == SemiElasticSigma.guarantee
        np.testing.assert_array_equal(details.sigma_samples, 0)
        np.testing.assert_array_equal(details.radius_cap, np.inf)
        np.testing.assert_allclose(radius, np.where(prediction != ABSTAIN, semi_elastic_radius(
            details.sigma, details.p_lower, 1.0, 2), 0.0))

    def test_stateless_in_order(self, slab_certificates):
        clf, X, prediction, radius, _details = slab_certificates
        reversed_prediction, reversed_radius = clf.certify(X[::-1][:50])
        np.testing.assert_array_equal(reversed_prediction, prediction[::-1][:50])
        np.testing.assert_array_equal(reversed_radius, radius[::-1][:50])

    def test_fitted_on_a_clone(self, slab_certificates):
        clf = slab_certificates[0]
        assert not hasattr(clf.sigma_search, "neighbors_") and hasattr(clf.sigma_search_, "neighbors_")
        refit = clone(clf).set_params(sigma_search__r=0.5)
        assert refit.get_params()["sigma_search"].r == 0.5

    def test_r_changes_without_refit(self, slab_certificates):
        clf, X = slab_certificates[0], slab_certificates[1]
        changed = copy.deepcopy(clf).set_params(sigma_search__r=0.0)
        _, radius, details = changed.certify(X[:20], return_details=True)
        np.testing.assert_allclose(details.sigma, 0.5)  # r = 0: FixedSigma(base_sigma)
        np.testing.assert_allclose(radius[radius > 0], certified_radius(details.sigma, details.p_lower)[radius > 0])

    def test_predict_is_G(self, slab_certificates):
        clf, X, _prediction, _radius, details = slab_certificates
        predicted = clf.predict(X)
        G = (slab_probability(X[:, 0].astype(float), details.sigma) > 0.5).astype(int)
        answered = predicted != ABSTAIN
        assert answered.mean() > 0.8
        assert int((predicted[answered] != G[answered]).sum()) <= stats.binom.ppf(1 - 1e-6, int(answered.sum()), ALPHA)

    def test_allocator_that_does_not_compose_is_refused(self):
        clf = SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, sigma_search=SemiElasticSigma(k=1),
                                           allocator=OnlineBallAllocator())
        with pytest.raises(ValueError, match="allocator"):
            clf.fit(np.zeros((4, 2), dtype=np.float32), [0, 1, 0, 1])


class TestCheckedBeforeTraining:
    @staticmethod
    def classifier(**params):
        return SampleWiseSmoothedClassifier(SlabLogits, max_epochs=0, training=FixedSigmaTraining(0.5),
                                            sigma_search=SemiElasticSigma(**params), random_state=0)

    @pytest.mark.parametrize("params, available", [({"k": 4}, 3), ({"k": 5, "offset": 0.0}, 4)])
    def test_too_large_k_is_refused_before_training(self, params, available):
        clf = self.classifier(**params)
        with pytest.raises(ValueError, match=f"k={params['k']} nearest training inputs .* use k <= {available}"):
            clf.fit(np.zeros((4, 2), dtype=np.float32), [0, 1, 0, 1])
        assert not hasattr(clf, "module_")

    def test_a_refused_refit_leaves_the_fitted_estimator_as_it_was(self):
        # The reviewer's case: the check came after training, with new weights and the old fit's sigma function.
        X = np.random.default_rng(0).normal(size=(30, 2)).astype(np.float32)
        clf = self.classifier(k=3).set_params(module=FlatMLP, module__hidden=4, max_epochs=1)
        clf.fit(X, (X[:, 0] > 0).astype(int))
        weights = {key: value.clone() for key, value in clf.module_.state_dict().items()}
        fitted, history = clf.sigma_search_, len(clf.history)
        with pytest.raises(ValueError, match="k=3 nearest training inputs"):
            clf.set_params(max_epochs=5).fit(X[:3], [0, 1, 0])
        assert all(torch.equal(weights[key], value) for key, value in clf.module_.state_dict().items())
        assert clf.sigma_search_ is fitted and len(clf.history) == history


class TestFarFromTheTrainingData:
    """exp(r * distance) overflows float64 far from the training inputs (and underflows below a large offset)."""

    X_train = np.random.default_rng(0).normal(size=(30, 2))

    def test_sigma_is_finite_positive_and_still_semi_elastic(self):
        r = 0.05
        function = _fitted_sigma(self.X_train, r=r, k=3)
        far = np.array([[800.0, 0.0], [1000.0, 0.0], [2e4, 0.0], [1e6, 0.0]])
        with np.errstate(all="raise"):
            sigma = function.sigma(far)
        assert np.all(np.isfinite(sigma)) and np.all(sigma > 0)
        # From sigma ~ 0.25 exp(40) to where exp(r * 1000) would pass the range: the log gap still <= r * 200.
        assert 0 < np.log(sigma[1]) - np.log(sigma[0]) <= r * 200.0
        below = _fitted_sigma(self.X_train, r=1.0, k=3, offset=1e5).sigma(self.X_train[:2])  # exp(-1e5)
        assert np.all(np.isfinite(below)) and np.all(below > 0)

    @pytest.mark.filterwarnings("error")
    def test_no_class_without_a_finite_radius(self):
        # The reviewer's case: sigma was inf, and certify returned class 0 with radius NaN.
        clf = SampleWiseSmoothedClassifier(
            SlabLogits, max_epochs=0, training=FixedSigmaTraining(0.25), sigma_search=SemiElasticSigma(k=3, r=0.05),
            sampler=FixedSampler(n=200, n0=20), random_state=0).fit(self.X_train.astype(np.float32), np.arange(30) % 2)
        X = np.array([[0.5, 0.0], [2e4, 0.0]], dtype=np.float32)
        prediction, radius, details = clf.certify(X, return_details=True)
        assert np.all(np.isfinite(details.sigma)) and np.all(details.sigma > 0)
        assert np.all(np.isfinite(radius)) and np.all(radius >= 0)
        np.testing.assert_array_equal(clf.predict(X), prediction)


@pytest.mark.parametrize("args, message", [
    pytest.param((-0.5, 0.9, 0.05, 64), "sigma must be finite and positive", id="sigma-negative"),
    pytest.param((0.5, 1.5, 0.05, 64), r"p_lower must be a probability in \[0, 1\]", id="p-above-one"),
    pytest.param((0.5, 0.9, -0.05, 64), "r must be finite and >= 0", id="r-negative"),
    pytest.param((0.5, 0.9, 0.05, 0), "n_features must be a positive int", id="no-features"),
])
def test_semi_elastic_radius_refuses_bad_arguments_naming_them(args, message):
    # Each used to return a radius: negative, at p = 1, as if r were positive, or 0.
    with pytest.raises(ValueError, match=message):
        semi_elastic_radius(*args)
