"""NoiseLevelExperts: one classifier per noise level, each row routed to the expert of its level.

The closed-form model makes ``G(x) = g(x, sigma(x))`` exact everywhere: on
2-D inputs, each expert is a linear binary classifier (conftest's
``LinearLogits``), whose smoothed classifier at any noise level is itself
(its top-class probability is ``Phi(|w.x + b| / (s ||w||))``), and the
selector over the two levels is linear too, so its smoothed version (at any
``selector_sigma``) picks the level on the positive side of its line. So
``G(x') = expert_k(x')(x')``, ``k(x')`` the side of the selector's line, and
``G`` is constant on a ball exactly when, for each level ``k``, the ball
misses the intersection of two half-planes: where the selector picks ``k``
and where expert ``k`` predicts another class (:func:`g_disagrees_on_ball`,
exact distances, no sampling).

The other tests: certificates do not depend on the other inputs, their
order, chunks or ``n_jobs``; experts given as trained instances are never
changed (weights and buffers); the container routes each row to its
level's expert and refuses what it cannot route. The engine's side (each
row's level passed to the module) is tested in ``test_engine.py``, and
``Pretrained``'s own behaviour in ``test_training_pretrained.py``.
"""

import itertools

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk._certification import levels_worth_sampling
from smoothsk.experts import NoiseLevelExperts
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import CertifiedSigmaSelector
from smoothsk.training import FixedSigmaTraining, Pretrained

from conftest import LinearLogits
from soundness_support import binomial_bound
from training_support import assert_bit_identical, snapshot

LEVELS = (0.25, 1.0)
#: ``(weight, bias)`` of the expert of each level: class 1 where ``weight . x + bias > 0``. Their lines cross
#: each other and the selector's, so G changes class on both kinds of boundary.
EXPERT_LINES = (((1.0, -0.5), 0.3), ((-0.4, 1.0), -0.2))
#: ``(weight, bias)`` of the selector: level ``LEVELS[1]`` where ``weight . x + bias > 0``, else ``LEVELS[0]``.
SELECTOR_LINE = ((0.6, 0.8), 0.1)
#: Experts whose lines are close (they agree on most inputs), where certifying the levels the selector may
#: switch to widens the radii R1 caps.
AGREEING_EXPERT_LINES = (((1.0, -0.5), 0.3), ((0.9, -0.6), 0.25))
SELECTOR_SIGMA = 0.25
#: A large alpha: certificates close to the exact radii, so the soundness check has power.
ALPHA = 0.25


def distance_to_polyhedron(point, normals, offsets):
    """Exact Euclidean distance from ``point`` to ``{x : normals @ x + offsets >= 0}``.

    The nearest point of the polyhedron is the projection of ``point`` onto
    the affine subspace where the constraints active there hold with
    equality (KKT); every subset of constraints is tried, and the nearest
    candidate that satisfies all of them is the projection.

    Parameters
    ----------
    point : array-like of float, shape (d,)
    normals : array-like of float, shape (m, d)
    offsets : array-like of float, shape (m,)

    Returns
    -------
    float
        0 inside the polyhedron, ``inf`` where it is empty.
    """
    point = np.asarray(point, dtype=np.float64)
    normals, offsets = np.asarray(normals, dtype=np.float64), np.asarray(offsets, dtype=np.float64)
    nearest = np.inf
    for size in range(len(normals) + 1):
        for active in map(list, itertools.combinations(range(len(normals)), size)):
            candidate = point
            if active:
                step = np.linalg.lstsq(normals[active], -(normals[active] @ point + offsets[active]), rcond=None)[0]
                candidate = point + step
                if not np.allclose(normals[active] @ candidate + offsets[active], 0.0, atol=1e-9):
                    continue  # parallel hyperplanes that never meet
            if np.all(normals @ candidate + offsets >= -1e-9):
                nearest = min(nearest, float(np.linalg.norm(candidate - point)))
    return nearest


def g_disagrees_on_ball(centre, radius, label, expert_lines=EXPERT_LINES):
    """Whether ``G(x') != label`` for some ``x'`` of the open ball ``B(centre, radius)`` (its centre if 0).

    For each level ``k``: the half-plane where the selector picks ``k``,
    intersected with the half-plane where expert ``k`` predicts the other
    class, must stay at distance ``>= radius`` from ``centre``.

    Parameters
    ----------
    centre : array-like of float, shape (2,)
    radius : float
    label : int
        The certified class, 0 or 1.
    expert_lines : tuple
        ``(weight, bias)`` of each level's expert.

    Returns
    -------
    bool
    """
    selector_weight, selector_bias = np.asarray(SELECTOR_LINE[0]), SELECTOR_LINE[1]
    for level_index, (weight, bias) in enumerate(expert_lines):
        picks = 1.0 if level_index == 1 else -1.0  # the selector picks level 1 on the positive side
        other_class = -1.0 if label == 1 else 1.0  # the side where expert k predicts the other class
        distance = distance_to_polyhedron(centre, [picks * selector_weight, other_class * np.asarray(weight)],
                                          [picks * selector_bias, other_class * bias])
        if distance < radius or distance == 0.0:
            return True
    return False


def exact_g(X):
    """``G`` of the closed-form model at each row of ``X`` (shape (n, 2)): its expert's class.

    Returns
    -------
    ndarray of int64, shape (n,)
    """
    X = np.asarray(X, dtype=np.float64)
    level_index = (X @ np.asarray(SELECTOR_LINE[0]) + SELECTOR_LINE[1] > 0).astype(np.int64)
    z = np.stack([X @ np.asarray(weight) + bias for weight, bias in EXPERT_LINES], axis=1)
    return (z[np.arange(len(X)), level_index] > 0).astype(np.int64)


def closed_form_classifier(n=300, reachable=False, expert_lines=EXPERT_LINES, reachable_n=None, **params):
    """A fitted estimator around the closed-form experts and selector (no training).

    Parameters
    ----------
    n : int
        Estimation samples of the classifier's and of the selector's certificates.
    reachable : bool
        The selector's ``certify_reachable_levels``.
    expert_lines : tuple
        ``(weight, bias)`` of each level's expert.
    reachable_n : int or None
        The selector's ``reachable_n``.
    **params
        Override the estimator's defaults (e.g. ``certify_batch_size``, ``n_jobs``).

    Returns
    -------
    SampleWiseSmoothedClassifier
    """
    experts = NoiseLevelExperts(LEVELS, [LinearLogits(weight, bias) for weight, bias in expert_lines])
    selector = CertifiedSigmaSelector(selector=LinearLogits(*SELECTOR_LINE), fit_selector=False,
                                      selector_sigma=SELECTOR_SIGMA, n=n, n0=50, certify_reachable_levels=reachable,
                                      reachable_n=reachable_n, level_threshold=None)  # exact_g: the argmax
    params = {"training": Pretrained(), "sigma_search": selector, "sampler": FixedSampler(n=n, n0=50),
              "alpha": ALPHA, "max_epochs": 0, "random_state": 0, "certify_batch_size": 4000, **params}
    clf = SampleWiseSmoothedClassifier(experts, **params)
    return clf.fit(np.zeros((2, 2), dtype=np.float32), [0, 1])


def inputs_near_the_selector_line(n_inputs, seed=0):
    """Inputs within 0.6 of the selector's line, spread 4 along it.

    Returns
    -------
    ndarray of float32, shape (n_inputs, 2)
    """
    rng = np.random.default_rng(seed)
    weight = np.asarray(SELECTOR_LINE[0])
    normal = weight / np.linalg.norm(weight)
    on_line = -SELECTOR_LINE[1] / np.linalg.norm(weight) * normal
    along = np.array([-normal[1], normal[0]])
    X = on_line + np.outer(rng.uniform(-0.6, 0.6, n_inputs), normal) + np.outer(rng.uniform(-2, 2, n_inputs), along)
    return X.astype(np.float32)


@pytest.fixture(scope="module")
def closed_form_certificates():
    """Certificates of 300 inputs near the selector's line: ``(X, prediction, radius, details)``."""
    X = inputs_near_the_selector_line(300)
    prediction, radius, details = closed_form_classifier().certify(X, return_details=True)
    return X, prediction, radius, details


@pytest.fixture(scope="module", params=[("crossing experts", None), ("agreeing experts", None),
                                        ("crossing experts", 60), ("agreeing experts", 60),
                                        ("agreeing experts", 20_000)],
                ids=lambda param: f"{param[0]}, reachable_n={param[1]}")
def reachable_certificates(request):
    """Certificates with the levels the selector may switch to certified too, and without, on 300 inputs.

    The other levels' certificates take the sampler's n (300), or ``reachable_n`` copies, at most 300.

    Returns
    -------
    tuple
        ``(expert_lines, reachable_n, X, prediction, radius, details, plain_prediction, plain_radius,
        plain_details)``.
    """
    experts, reachable_n = request.param
    expert_lines = EXPERT_LINES if experts == "crossing experts" else AGREEING_EXPERT_LINES
    X = inputs_near_the_selector_line(300)
    reachable = closed_form_classifier(reachable=True, expert_lines=expert_lines,
                                       reachable_n=reachable_n).certify(X, return_details=True)
    plain = closed_form_classifier(expert_lines=expert_lines).certify(X, return_details=True)
    return (expert_lines, reachable_n, X, *reachable, *plain)


class TestExactCheck:
    def test_distance_to_polyhedron_is_the_numerical_projection(self):
        rng = np.random.default_rng(0)
        for dimension in (2, 3):
            for _ in range(20):
                point = rng.normal(size=dimension)
                normals, offsets = rng.normal(size=(2, dimension)), rng.normal(size=2)
                numerical = optimize.minimize(
                    lambda x, point=point: np.sum((x - point) ** 2), point, method="trust-constr",
                    jac=lambda x, point=point: 2 * (x - point), hess=lambda x: 2 * np.eye(len(x)),
                    constraints=optimize.LinearConstraint(normals, -offsets, np.inf),
                    options={"gtol": 1e-10, "xtol": 1e-12})
                assert numerical.success and numerical.constr_violation == 0
                # The numerical optimum is feasible, from inside: at least as far, and close.
                exact, numerical = distance_to_polyhedron(point, normals, offsets), np.linalg.norm(numerical.x - point)
                assert exact <= numerical + 1e-12
                assert exact == pytest.approx(numerical, abs=1e-3)

    def test_distance_is_zero_inside_and_infinite_for_an_empty_intersection(self):
        assert distance_to_polyhedron([0.0, 0.0], [[1.0, 0.0], [0.0, 1.0]], [1.0, 1.0]) == 0.0
        assert distance_to_polyhedron([0.0, 0.0], [[1.0, 0.0], [-1.0, 0.0]], [-1.0, -1.0]) == np.inf


class TestSoundnessForG:
    def test_certificates_of_g_hold_on_their_balls(self, closed_form_certificates):
        X, prediction, radius, details = closed_form_certificates
        assert details.guarantee.startswith("G (sample-wise classifier)")
        certified = np.flatnonzero(prediction != ABSTAIN)
        # Something to check: most inputs certified, at both levels, by both experts.
        assert len(certified) > 0.8 * len(X)
        assert set(details.sigma[certified]) == set(LEVELS)
        assert np.all(radius[certified] > 0)
        failures = sum(g_disagrees_on_ball(X[i], radius[i], prediction[i]) for i in certified)
        assert failures <= binomial_bound(len(certified), ALPHA)

    def test_own_sigma_radii_fail_for_g(self, closed_form_certificates):
        # R2 alone (the classifier's radius at the chosen level, sigma * PhiInv(p_lower), without the
        # selector's R1): its balls cross the selector's line into the other expert's class.
        X, prediction, radius, details = closed_form_certificates
        certified = np.flatnonzero(prediction != ABSTAIN)
        own_sigma_radius = details.sigma * stats.norm.ppf(details.p_lower)
        assert np.mean(own_sigma_radius[certified] > radius[certified]) > 0.5  # R1 caps most radii
        failures = sum(g_disagrees_on_ball(X[i], own_sigma_radius[i], prediction[i]) for i in certified)
        assert failures > binomial_bound(len(certified), ALPHA)

    def test_certificates_with_reachable_levels_hold_on_their_balls(self, reachable_certificates):
        expert_lines, _, X, prediction, radius, _, _, _, _ = reachable_certificates
        certified = np.flatnonzero(prediction != ABSTAIN)
        assert len(certified) > 0.8 * len(X)
        failures = sum(g_disagrees_on_ball(X[i], radius[i], prediction[i], expert_lines) for i in certified)
        assert failures <= binomial_bound(len(certified), ALPHA)

    def test_reachable_levels_widen_the_radii_the_selector_caps_where_the_experts_agree(self,
                                                                                        reachable_certificates):
        # Near the selector's line R1 caps most radii; where the other level's expert certifies the same class,
        # the radius becomes the smaller of the two experts' radii. The chosen level's alpha is split, so a
        # radius that no other level widens is a little smaller.
        (expert_lines, reachable_n, _, prediction, radius, details, plain_prediction, plain,
         plain_details) = reachable_certificates
        both = (plain_prediction != ABSTAIN) & (prediction != ABSTAIN)
        widened = radius[both] > plain[both] + 0.05
        assert np.all(details.n_samples[both][widened] > plain_details.n_samples[both][widened])
        # The other levels' copies come in whole certificates of reachable_n, at most the sampler's n = 300 (None:
        # 300), with no selection copies: the class is the chosen level's.
        extra = details.n_samples[both] - plain_details.n_samples[both]
        assert set(np.unique(extra[widened])) <= {min(reachable_n or 300, 300)}
        if expert_lines is AGREEING_EXPERT_LINES:
            assert widened.mean() > 0.3
            assert radius[both].mean() > 1.2 * plain[both].mean()

    def test_predict_is_g_except_with_probability_alpha(self):
        X = inputs_near_the_selector_line(300, seed=1)
        prediction = closed_form_classifier().predict(X)
        answered = np.flatnonzero(prediction != ABSTAIN)
        assert len(answered) > 0.8 * len(X)
        wrong = np.sum(prediction[answered] != exact_g(X[answered]))
        assert wrong <= binomial_bound(len(answered), ALPHA)


class OrderedLevelLogits(torch.nn.Module):
    """Logits ``(a - x_0, 0, x_0 - b)`` over three levels: level 0 left of ``a``, level 2 right of ``b``, 1 between.

    Smoothed with noise ``s`` (``x_0`` then varies by ``N(0, s^2)``), its
    level probabilities are ``P_0 = Phi((a - x_0) / s)``, ``P_2 = Phi((x_0
    - b) / s)`` and ``P_1 = 1 - P_0 - P_2`` (:func:`smoothed_level_probabilities`):
    the smoothed selector's choice depends on ``x_0`` alone and is known exactly.
    """

    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        x0 = x.flatten(1)[:, 0].double()
        return torch.stack([self.a - x0, torch.zeros_like(x0), x0 - self.b], dim=1).float()


def smoothed_level_probabilities(x0, a, b, s):
    """``(P_0, P_1, P_2)`` of :class:`OrderedLevelLogits` smoothed with noise ``s`` at first coordinate ``x0``."""
    low, high = stats.norm.cdf((a - x0) / s), stats.norm.cdf((x0 - b) / s)
    return low, 1.0 - low - high, high


class TestThreeLevels:
    """Three levels where the selector hesitates between the upper two and the lowest one's expert is always wrong.

    Experts 1 and 2 predict class 1 everywhere, expert 0 class 0: ``G(x')
    = 1`` exactly where the smoothed selector does not pick level 0, i.e.
    for ``x'_0 > t01``, where ``P_0 = P_1``. A certificate of class 1 at
    ``x`` holds exactly when its radius is at most ``x_0 - t01``.
    """

    A, B, S = 0.0, 1.0, 0.5

    def certificates(self):
        t01 = optimize.brentq(lambda t: np.subtract(*smoothed_level_probabilities(t, self.A, self.B, self.S)[:2]),
                              self.A - 3, self.B)
        t12 = optimize.brentq(lambda t: np.subtract(*smoothed_level_probabilities(t, self.A, self.B, self.S)[1:]),
                              self.A, self.B + 3)
        rng = np.random.default_rng(3)
        X = np.stack([rng.uniform(t12 - 0.3, t12 + 0.6, 200), rng.uniform(-2, 2, 200)], axis=1).astype(np.float32)
        experts = NoiseLevelExperts((0.25, 0.5, 1.0), [LinearLogits((0.0, 0.0), -1.0), LinearLogits((0.0, 0.0), 1.0),
                                                       LinearLogits((0.0, 0.0), 1.0)])
        selector = CertifiedSigmaSelector(selector=OrderedLevelLogits(self.A, self.B), fit_selector=False,
                                          selector_sigma=self.S, n=1000, n0=50, level_threshold=None)
        clf = SampleWiseSmoothedClassifier(experts, training=Pretrained(), sigma_search=selector,
                                           sampler=FixedSampler(n=1000, n0=50), alpha=ALPHA, max_epochs=0,
                                           random_state=0).fit(np.zeros((2, 2), dtype=np.float32), [0, 1])
        prediction, radius = clf.certify(X)
        return prediction, radius, X[:, 0] - t01

    def test_hesitant_inputs_are_certified_soundly_and_close_to_the_exact_radius(self):
        # Around t12 the selector's top level has probability about 1/2 (no level certified at x itself), yet
        # levels 1 and 2 both certify class 1, so G(x) = 1 whichever the selector takes. Level 0 (about 2% of
        # the votes there) can become the top level only where its probability reaches 1/3, the largest
        # of three probabilities summing to 1, as well as the top level's falling bound.
        prediction, radius, exact = self.certificates()
        assert np.all(prediction == 1)
        failures = np.sum(radius > exact)
        assert failures <= binomial_bound(len(radius), ALPHA)
        assert np.mean(radius / exact) > 0.6


class TestThreeLevelsByThreshold:
    """:class:`TestThreeLevels`'s model, its level chosen by ``level_threshold`` instead of the argmax.

    The selector takes level 0 exactly where fewer than ``t`` of its votes
    reach level 1 or 2: ``P_1 + P_2 < t``, i.e. ``P_0 > 1 - t``, for ``x'_0 <
    t0`` with ``P_0(t0) = 1 - t``. A certificate of class 1 at ``x`` holds
    exactly when its radius is at most ``x_0 - t0``. The inputs straddle
    ``P_2 = t``, where the selector hesitates between levels 1 and 2.
    """

    A, B, S, T = 0.0, 1.0, 0.5, 0.3

    def test_certificates_hold_and_come_close_to_the_exact_radius(self):
        t0 = self.A - self.S * stats.norm.ppf(1.0 - self.T)
        t12 = self.B + self.S * stats.norm.ppf(self.T)
        rng = np.random.default_rng(4)
        X = np.stack([rng.uniform(t12 - 0.3, t12 + 0.6, 200), rng.uniform(-2, 2, 200)], axis=1).astype(np.float32)
        experts = NoiseLevelExperts((0.25, 0.5, 1.0), [LinearLogits((0.0, 0.0), -1.0), LinearLogits((0.0, 0.0), 1.0),
                                                       LinearLogits((0.0, 0.0), 1.0)])
        selector = CertifiedSigmaSelector(selector=OrderedLevelLogits(self.A, self.B), fit_selector=False,
                                          selector_sigma=self.S, n=1000, n0=50, level_threshold=self.T)
        clf = SampleWiseSmoothedClassifier(experts, training=Pretrained(), sigma_search=selector,
                                           sampler=FixedSampler(n=1000, n0=50), alpha=ALPHA, max_epochs=0,
                                           random_state=0).fit(np.zeros((2, 2), dtype=np.float32), [0, 1])
        prediction, radius = clf.certify(X)
        exact = X[:, 0] - t0
        assert np.all(prediction == 1)
        assert np.sum(radius > exact) <= binomial_bound(len(radius), ALPHA)
        assert np.mean(radius / exact) > 0.6


class TestLevelsWorthSampling:
    def test_a_skipped_level_never_changes_a_radius_whatever_its_certificate(self):
        # The widened radius min(R_k, min_j max(R_j, rho_j)) over the other levels, for any outcome 0 <= R_j <=
        # largest_j of their certificates, equals the radius with R_j = 0 at the skipped levels.
        rng = np.random.default_rng(0)
        levels, n_inputs = np.array([0.25, 0.5, 1.0]), 20_000
        sigma = rng.choice(levels, n_inputs)
        own, reach = rng.uniform(0, 4, n_inputs), rng.uniform(0, 4, (n_inputs, 3))
        largest = levels * 3.7
        outcome = rng.uniform(0, 1, (n_inputs, 3)) ** 4 * largest  # radii near 0 and near the largest
        wanted = levels_worth_sampling(own, sigma, levels, reach, largest)
        other = sigma[:, None] != levels

        def widened(level_radius):
            terms = np.where(other, np.maximum(level_radius, reach), np.inf)
            return np.minimum(own, terms.min(axis=1))

        np.testing.assert_array_equal(widened(np.where(wanted, outcome, 0.0)), widened(outcome))
        # And it skips: far fewer certificates than every level reachable within the chosen one's radius.
        assert wanted.sum() < 0.7 * (other & (reach < own[:, None])).sum()


class TestStateless:
    @pytest.mark.parametrize("reachable", [False, True])
    def test_certificates_do_not_depend_on_order_subsets_chunks_or_jobs(self, reachable):
        # A batch of 37 copies (300 per input) often holds two inputs, at different levels: each
        # arrangement below packs other inputs together.
        X = inputs_near_the_selector_line(40, seed=2)
        clf = closed_form_classifier(reachable=reachable, certify_batch_size=37)
        reference = clf.certify(X, return_details=True)[2]
        assert set(reference.sigma[reference.prediction != ABSTAIN]) == set(LEVELS)
        reversed_ = clf.certify(X[::-1], return_details=True)[2]
        subset = clf.certify(X[5:17], return_details=True)[2]
        halves = [clf.certify(half, return_details=True)[2] for half in (X[:20], X[20:])]
        parallel = clf.set_params(n_jobs=2).certify(X, return_details=True)[2]
        for name in ("prediction", "radius", "sigma", "p_lower", "radius_cap", "n_samples"):
            expected = getattr(reference, name)
            np.testing.assert_array_equal(getattr(reversed_, name), expected[::-1], err_msg=name)
            np.testing.assert_array_equal(getattr(subset, name), expected[5:17], err_msg=name)
            np.testing.assert_array_equal(np.concatenate([getattr(half, name) for half in halves]), expected,
                                          err_msg=name)
            np.testing.assert_array_equal(getattr(parallel, name), expected, err_msg=name)


def trained_expert(seed):
    """A small trained-looking expert with parameters and batch-norm buffers (running statistics, counter).

    Returns
    -------
    torch.nn.Module
        2 inputs, 2 logits, in training mode (where a forward pass would update its buffers).
    """
    torch.manual_seed(seed)
    expert = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                 torch.nn.Linear(8, 2))
    with torch.no_grad():
        expert[1].running_mean.normal_()
        expert[1].running_var.uniform_(0.5, 2.0)
        expert[1].num_batches_tracked.fill_(7)
    return expert.train()


def test_given_trained_experts_are_not_modified():
    experts = [trained_expert(seed) for seed in (1, 2)]
    saved = [snapshot(expert) for expert in experts]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    selector = FlatMLP(n_classes=2, hidden=4)
    # Epochs, a learning rate and a selector trained in fit (sampling the experts): none may touch them.
    clf = SampleWiseSmoothedClassifier(
        NoiseLevelExperts(LEVELS, experts), training=Pretrained(), max_epochs=3, lr=0.5,
        sigma_search=CertifiedSigmaSelector(selector=selector, n=100, n0=10, selector_epochs=1),
        sampler=FixedSampler(n=100, n0=10), random_state=0)
    clf.fit(X, y)
    clf.certify(X[:10])
    clf.predict(X[:10])
    clf.predict_proba(X[:10])
    for expert, fitted, state in zip(experts, clf.module_.experts, saved, strict=True):
        assert_bit_identical(expert, state)
        assert_bit_identical(fitted, state)


def test_experts_a_selector_starts_from_are_not_modified():
    # The selector is built like the experts and starts from one's weights: training it must leave them.
    torch.manual_seed(0)
    experts = [FlatMLP(n_classes=2) for _ in range(2)]  # the class with K outputs: the selector shares its layer
    for expert in experts:
        expert(torch.zeros(1, 2))
    saved = [snapshot(expert) for expert in experts]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    clf = SampleWiseSmoothedClassifier(
        NoiseLevelExperts(LEVELS, experts), training=Pretrained(), max_epochs=3, lr=0.5,
        sigma_search=CertifiedSigmaSelector(n=100, n0=10, selector_epochs=3, min_level_gain=None),
        sampler=FixedSampler(n=100, n0=10), random_state=0).fit(X, y)
    assert clf.sigma_search_.selector_module_.layers[1].weight.shape == experts[0].layers[1].weight.shape
    for expert, fitted, state in zip(experts, clf.module_.experts, saved, strict=True):
        assert_bit_identical(expert, state)
        assert_bit_identical(fitted, state)


class LinearExpert(torch.nn.Module):
    """``x @ weight`` with a fixed weight: distinguishable experts whose rows do not depend on the batch."""

    def __init__(self, weight):
        super().__init__()
        self.register_buffer("weight", torch.as_tensor(weight, dtype=torch.float64))

    def forward(self, x):
        return x.double() @ self.weight


class RecordingExpert(LinearExpert):
    """A :class:`LinearExpert` that records the number of rows of each batch it is called with."""

    def __init__(self, weight):
        super().__init__(weight)
        self.batch_sizes = []

    def forward(self, x):
        self.batch_sizes.append(len(x))
        return super().forward(x)


class TestNoiseLevelExperts:
    LEVELS = (1.0, 0.25, 0.5)  # not sorted: a level is found by its value

    @staticmethod
    def experts():
        rng = np.random.default_rng(0)
        return [RecordingExpert(rng.normal(size=(3, 4))) for _ in range(3)]

    def test_each_row_is_answered_by_the_expert_of_its_level(self):
        experts = self.experts()
        module = NoiseLevelExperts(self.LEVELS, experts)
        x = torch.randn(7, 3)
        level_index = [1, 0, 2, 2, 1, 0, 1]
        sigma = torch.tensor([self.LEVELS[k] for k in level_index], dtype=torch.float32)
        logits = module(x, sigma)
        assert [expert.batch_sizes for expert in experts] == [[2], [3], [2]]  # its own rows, in one batch
        for row, k in enumerate(level_index):
            torch.testing.assert_close(logits[row], experts[k](x[row:row + 1])[0], rtol=0, atol=0)

    @pytest.mark.parametrize("sigma", [0.5, torch.tensor(0.5), torch.full((4,), 0.5)],
                             ids=["float", "0-d tensor", "one level per row"])
    def test_one_level_for_the_batch_is_its_expert(self, sigma):
        experts = self.experts()
        x = torch.randn(4, 3)
        logits = NoiseLevelExperts(self.LEVELS, experts)(x, sigma)
        torch.testing.assert_close(logits, experts[2](x), rtol=0, atol=0)
        assert experts[0].batch_sizes == [] and experts[1].batch_sizes == []

    def test_a_level_without_expert_is_refused_naming_it(self):
        module = NoiseLevelExperts(self.LEVELS, self.experts())
        with pytest.raises(ValueError, match=r"no expert for noise level 0\.75"):
            module(torch.randn(3, 3), torch.tensor([0.25, 0.75, 1.0]))

    def test_calling_without_sigma_is_a_type_error(self):
        with pytest.raises(TypeError, match=r"module\(x, sigma\)"):
            NoiseLevelExperts(self.LEVELS, self.experts())(torch.randn(2, 3))

    # Equal in float32, the precision the engine samples float32 inputs at: both levels would reach the first expert.
    @pytest.mark.parametrize("levels", [(), (0.25, 0.25), (0.25, 0.0), (0.25, -1.0), (0.25, np.inf),
                                        (0.25, np.nan), ((0.25, 0.5),), (0.5, np.nextafter(0.5, 1.0))],
                             ids=["empty", "repeated", "zero", "negative", "infinite", "nan", "2-d", "float32-equal"])
    def test_bad_levels_are_refused(self, levels):
        n_experts = len(levels) if np.ndim(levels) == 1 else 2
        with pytest.raises(ValueError, match="levels must be"):
            NoiseLevelExperts(levels, [LinearExpert(np.eye(2)) for _ in range(n_experts)])

    @pytest.mark.parametrize("n_experts", [1, 3])
    def test_one_expert_per_level(self, n_experts):
        with pytest.raises(ValueError, match=f"2 levels, {n_experts} experts"):
            NoiseLevelExperts((0.25, 0.5), [LinearExpert(np.eye(2)) for _ in range(n_experts)])

    def test_an_expert_that_is_no_module_is_refused_naming_it(self):
        with pytest.raises(TypeError, match=r"experts\[1\]"):
            NoiseLevelExperts((0.25, 0.5), [LinearExpert(np.eye(2)), lambda x: x])

    def test_expert_classes_are_built_with_n_classes(self):
        module = NoiseLevelExperts((0.25, 0.5), [FlatMLP, FlatMLP], n_classes=3)
        assert module(torch.zeros(2, 5), torch.tensor([0.25, 0.5])).shape == (2, 3)
        assert module.experts[0] is not module.experts[1]


class TestLevelsServed:
    """An estimator over experts samples them only at their levels: anything else is refused at fit, first."""

    @staticmethod
    def estimator(**params):
        experts = NoiseLevelExperts(LEVELS, [LinearLogits(weight, bias) for weight, bias in EXPERT_LINES])
        return SampleWiseSmoothedClassifier(experts, random_state=0, **params)

    @pytest.mark.parametrize("params, message", [
        ({"training": Pretrained(), "sigma_search": CertifiedSigmaSelector(levels=(0.25, 0.5))},
         r"chooses noise levels \[0.25, 0.5\], but the module's experts serve only \[0.25, 1.0\]"),
        ({"training": Pretrained(sigma=0.3)}, r"chooses noise levels \[0.3\]"),
        ({"training": FixedSigmaTraining(0.25)}, "FixedSigmaTraining cannot train a module of experts"),
    ])
    def test_a_level_without_expert_is_refused_before_anything_is_built(self, params, message):
        clf = self.estimator(**params)
        with pytest.raises(ValueError, match=message):
            clf.fit(inputs_near_the_selector_line(20), [0, 1] * 10)
        assert not hasattr(clf, "module_")

    def test_fixed_sigma_at_an_expert_level_is_that_experts_smoothed_classifier(self):
        clf = self.estimator(training=Pretrained(sigma=1.0), sampler=FixedSampler(n=200, n0=20)).fit(
            inputs_near_the_selector_line(20), [0, 1] * 10)
        assert np.all(clf.certify(inputs_near_the_selector_line(20), return_details=True)[2].sigma == 1.0)
