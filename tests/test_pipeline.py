"""Certification through scikit-learn Pipelines, with radii in the pipeline's input space."""

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.datasets import load_wine
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import MinMaxScaler, PolynomialFeatures, StandardScaler
from torch.utils.data import TensorDataset

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier, certify
from smoothsk.metrics import acr_scorer, certification_scorers, make_certified_accuracy_scorer
from smoothsk.models import FlatMLP
from smoothsk.pipeline import lipschitz_constant
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import CertifiedSigmaSelector
from smoothsk.training import FixedSigmaTraining

from conftest import LevelSelectorLogits, SlabLogits

#: Error probability of each statistical check below (a binomial quantile).
CHECK_LEVEL = 1e-6


def count_forward_calls(clf):
    """A list that grows by one per forward pass of ``clf.module_``."""
    calls = []
    clf.module_.register_forward_pre_hook(lambda module, args: calls.append(len(args[0])))
    return calls


@pytest.fixture(scope="module")
def wine():
    """scikit-learn's wine data: X float32 (178, 13) in raw units of very different scales, y (178,)."""
    X, y = load_wine(return_X_y=True)
    return X.astype(np.float32), y


def wine_pipeline():
    """A scaler in front of a small smoothed MLP, with cheap certification settings."""
    return make_pipeline(StandardScaler(), SampleWiseSmoothedClassifier(
        FlatMLP, module__hidden=16, sampler=FixedSampler(n=100, n0=10), max_epochs=20, lr=0.1, random_state=0))


class TestCertify:
    """``smoothsk.certify`` on a linear closed-form classifier behind a scaler."""

    # Scaled-space classifier z = w . u + b, u = (x - mean_) / scale_, on inputs
    # whose features spread by 100 and 0.01.
    WEIGHT = (0.3, 1.0)
    BIAS = 0.2
    SIGMA = 0.5

    @pytest.fixture
    def pipeline(self, make_linear_classifier):
        rng = np.random.default_rng(3)
        scaler = StandardScaler().fit(np.array([500.0, -3.0]) + np.array([100.0, 0.01]) * rng.normal(size=(500, 2)))
        clf = make_linear_classifier(self.WEIGHT, self.BIAS, sigma=self.SIGMA, n=400, n0=40, alpha=0.05)
        return Pipeline([("scale", scaler), ("linear", clf)])

    def input_space_hyperplane(self, scaler):
        """(v, c) with w . T(x) + b = v . x + c: the hyperplane pulled back to the input space."""
        v = np.asarray(self.WEIGHT) / scaler.scale_
        return v, self.BIAS - v @ scaler.mean_

    def test_radii_are_sound_and_not_vacuous_in_input_space(self, pipeline):
        v, c = self.input_space_hyperplane(pipeline["scale"])
        rng = np.random.default_rng(4)
        n_points, alpha = 300, 0.05
        # Signed distances to the boundary 0.1 to 2.5 sigma in the model's space, as input-space distances.
        model_distance = self.SIGMA * rng.uniform(0.1, 2.5, n_points) * rng.choice([-1, 1], n_points)
        distance = model_distance * np.linalg.norm(self.WEIGHT) / np.linalg.norm(v)
        anchor = np.array([500.0, -3.0]) + np.array([100.0, 0.01]) * rng.normal(size=(n_points, 2))
        anchor -= ((anchor @ v + c) / (v @ v))[:, None] * v
        X = (anchor + distance[:, None] * v / np.linalg.norm(v)).astype(np.float32)
        z = X.astype(np.float64) @ v + c
        true_class, true_radius = (z > 0).astype(int), np.abs(z) / np.linalg.norm(v)

        prediction, radius, details = certify(pipeline, X, return_details=True)
        certified = prediction != ABSTAIN
        # Each input independently fails (wrong class, or radius beyond the
        # input-space distance to the boundary) with probability <= alpha.
        bound = stats.binom.ppf(1 - CHECK_LEVEL, n_points, alpha)
        failures = certified & ((prediction != true_class) | (radius > true_radius))
        assert failures.sum() <= bound
        # Not vacuous: the features' spreads differ 10^4-fold, but the boundary's
        # normal lies along the narrow feature, so R / L keeps ~96% of the truth
        # and Cohen's bound at n=400, alpha=0.05 most of the rest.
        assert certified.mean() > 0.8
        assert np.median(radius[certified] / true_radius[certified]) > 0.5
        # The model-space radius, read as if in input units, breaks the bound: this test can fail.
        assert (certified & (details.radius * details.lipschitz_constant > true_radius)).sum() > bound

    def test_details_say_where_the_radius_lives(self, pipeline):
        X = np.array([[500.0, -3.0], [450.0, -2.99]], dtype=np.float32)
        prediction, radius, details = certify(pipeline, X, return_details=True)
        assert (details.radius_space, details.lipschitz_constant) == ("pipeline input",
                                                                       lipschitz_constant(pipeline["scale"]))
        np.testing.assert_array_equal(details.radius, radius)
        # Same certificates as the last step on transformed inputs, radius divided by L.
        direct_prediction, direct_radius, direct = pipeline[-1].certify(pipeline[:-1].transform(X), return_details=True)
        np.testing.assert_array_equal(prediction, direct_prediction)
        np.testing.assert_allclose(radius * details.lipschitz_constant, direct_radius, rtol=1e-12)
        np.testing.assert_array_equal(details.sigma, direct.sigma)
        assert (direct.radius_space, direct.lipschitz_constant) == ("model input", 1.0)

    def test_the_radius_cap_is_in_the_radius_space(self):
        # With a certified sigma function the radius is capped by R1, the
        # radius on which sigma(.) is certified constant: both must be read in
        # the same units. A scaler shrinking distances 10-fold (L ~ 0.1) makes
        # model-input units and pipeline-input units differ 10-fold.
        rng = np.random.default_rng(0)
        X_train = (10 * rng.normal(size=(200, 2))).astype(np.float32)
        selector = CertifiedSigmaSelector(levels=(0.25, 2.0), selector=LevelSelectorLogits((0.0,), axis=1),
                                          fit_selector=False, selector_sigma=0.25, n=1000, n0=50, level_threshold=None)
        clf = SampleWiseSmoothedClassifier(SlabLogits, sigma_search=selector, alpha=0.05, max_epochs=0,
                                           training=FixedSigmaTraining(0.25), sampler=FixedSampler(n=1000, n0=50),
                                           random_state=0)
        pipeline = make_pipeline(StandardScaler(), clf).fit(X_train, (np.abs(X_train[:, 0]) < 10).astype(int))
        X = np.array([[0.0, 3.0], [1.0, 5.0], [0.5, -4.0]], dtype=np.float32)
        prediction, radius, details = certify(pipeline, X, return_details=True)
        assert (prediction != ABSTAIN).all()
        direct = clf.certify(pipeline[:-1].transform(X), return_details=True)[2]
        np.testing.assert_allclose(details.radius_cap * details.lipschitz_constant, direct.radius_cap, rtol=1e-12)
        assert (radius <= details.radius_cap).all()

    def test_the_estimator_itself_certifies_as_its_method(self, pipeline):
        X = np.array([[0.5, -0.2], [-1.0, 2.0]], dtype=np.float32)
        clf = pipeline[-1]
        np.testing.assert_array_equal(certify(clf, X)[1], clf.certify(X)[1])
        assert certify(clf, X, return_details=True)[2].radius_space == "model input"

    def test_nested_pipelines_and_passthrough(self, pipeline, make_linear_classifier):
        X = np.array([[500.0, -3.0], [450.0, -2.99]], dtype=np.float32)
        outer = Pipeline([("minmax", MinMaxScaler().fit([[0.0, -10.0], [1000.0, 10.0]])), ("skip", "passthrough"),
                          ("inner", pipeline)])
        prediction, radius, details = certify(outer, X, return_details=True)
        assert details.lipschitz_constant == pytest.approx(
            lipschitz_constant(outer["minmax"]) * lipschitz_constant(pipeline["scale"]), rel=1e-12)
        direct = pipeline[-1].certify(pipeline[:-1].transform(outer["minmax"].transform(X)))[1]
        np.testing.assert_allclose(radius * details.lipschitz_constant, direct, rtol=1e-12)
        # A Pipeline of the classifier alone: pipeline input space, L = 1.
        assert certify(Pipeline([("clf", pipeline[-1])]), X, return_details=True)[2].radius_space == "pipeline input"

    def test_predict_is_unchanged(self, pipeline):
        X = np.array([[500.0, -3.0], [450.0, -2.9], [520.0, -3.1]], dtype=np.float32)
        np.testing.assert_array_equal(pipeline.predict(X), pipeline[-1].predict(pipeline["scale"].transform(X)))

    def test_unknown_step_is_refused_before_any_sampling(self, make_linear_classifier):
        X = np.array([[1.0, 2.0], [0.5, -1.0]], dtype=np.float32)
        poly = PolynomialFeatures(degree=2).fit(X)  # 6 features: 1, x1, x2, x1^2, x1 x2, x2^2
        clf = make_linear_classifier((0.0, 1.0, -1.0, 0.5, 0.0, 0.0))
        pipe = Pipeline([("scale", StandardScaler().fit(X)), ("poly", poly), ("linear", clf)])
        calls = count_forward_calls(clf)
        for scorer in (certify, acr_scorer):
            with pytest.raises(ValueError, match=r"step 'poly' \(PolynomialFeatures\): smoothsk knows no Lipschitz"):
                scorer(pipe, X, [0, 1])
        assert calls == []

    def test_a_dataset_is_refused_before_any_transform(self, pipeline):
        dataset = TensorDataset(torch.zeros(3, 2))
        with pytest.raises(TypeError, match="X is a Dataset, but the steps of a Pipeline transform arrays"):
            certify(pipeline, dataset)
        certify(pipeline[-1], dataset)  # the classifier itself reads it

    def test_a_last_step_that_cannot_certify(self):
        X, y = np.array([[0.0, 1.0], [1.0, 0.0]]), [0, 1]
        with pytest.raises(TypeError, match="last step of the Pipeline estimator must be a SampleWiseSmoothed"):
            certify(make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X)
        with pytest.raises(TypeError, match="estimator must be a SampleWiseSmoothedClassifier"):
            certify(LogisticRegression().fit(X, y), X)


class TestScorers:
    def test_acr_scorer_scores_a_pipeline(self, wine):
        X, y = wine
        scores = cross_val_score(wine_pipeline(), X, y, cv=3, scoring=acr_scorer, error_score="raise")
        assert np.all(np.isfinite(scores)) and np.all(scores > 0)

    def test_certified_accuracy_scorer_scores_a_pipeline(self, wine):
        X, y = wine
        pipe = wine_pipeline().fit(X[::2], y[::2])
        prediction, radius = certify(pipe, X[1::2])
        assert make_certified_accuracy_scorer(0.1)(pipe, X[1::2], y[1::2]) == pytest.approx(
            np.mean((prediction == y[1::2]) & (radius >= 0.1)))

    def test_grid_search_over_a_pipeline(self, wine):
        X, y = wine
        search = GridSearchCV(wine_pipeline(), {"samplewisesmoothedclassifier__module__hidden": [8, 16]},
                              scoring=certification_scorers([0.05, 0.1]), refit="acr", cv=2, error_score="raise")
        search.fit(X, y)
        for name in ("acr", "certified_accuracy_at_0.05", "certified_accuracy_at_0.1"):
            assert np.all(np.isfinite(search.cv_results_[f"mean_test_{name}"]))
        assert np.all(search.cv_results_["mean_test_acr"] > 0)
        assert certify(search.best_estimator_, X[:5], return_details=True)[2].radius_space == "pipeline input"
