"""Certified-robustness metrics and scorers."""

import numpy as np
import pytest
import torch
from sklearn.exceptions import DataConversionWarning
from torch.utils.data import TensorDataset

from smoothsk import ABSTAIN, certify, metrics
from smoothsk.metrics import (
    acr_scorer,
    average_certified_radius,
    certification_scorers,
    certified_accuracy,
    certified_accuracy_curve,
    make_certified_accuracy_scorer,
)
from smoothsk.regions import OnlineBallAllocator

Y = np.array([0, 1, 2, 1, 0])
PREDICTION = np.array([0, 1, 1, ABSTAIN, 0])
RADIUS = np.array([0.5, 1.5, 2.0, 0.0, 0.25])


class StubEstimator:
    """``certify`` returns fixed arrays and counts its calls."""

    def __init__(self, prediction=PREDICTION, radius=RADIUS):
        self.result = (prediction, radius)
        self.calls = 0

    def certify(self, X, return_details=False):
        self.calls += 1
        return self.result


class TestMetrics:
    def test_average_certified_radius(self):
        # Correct: inputs 0, 1, 4 with radii 0.5, 1.5, 0.25; wrong or abstained count 0.
        assert average_certified_radius(Y, PREDICTION, RADIUS) == pytest.approx(2.25 / 5)

    def test_certified_accuracy(self):
        assert certified_accuracy(Y, PREDICTION, RADIUS, 0.0) == pytest.approx(3 / 5)
        assert certified_accuracy(Y, PREDICTION, RADIUS, 0.5) == pytest.approx(2 / 5)
        assert certified_accuracy(Y, PREDICTION, RADIUS, 1.5) == pytest.approx(1 / 5)
        assert certified_accuracy(Y, PREDICTION, RADIUS, 1.6) == 0.0

    def test_curve_is_the_accuracy_at_each_radius(self):
        radii = [0.0, 0.25, 0.3, 1.5, 3.0]
        np.testing.assert_allclose(certified_accuracy_curve(Y, PREDICTION, RADIUS, radii),
                                   [certified_accuracy(Y, PREDICTION, RADIUS, r) for r in radii])

    def test_abstain_never_matches_even_a_label_of_the_same_value(self):
        # A wrong or abstained input counts 0 whatever its radius.
        assert certified_accuracy([1, 2], [ABSTAIN, 1], [5.0, 5.0], 0.0) == 0.0

    def test_an_abstention_is_wrong_even_against_a_true_label_equal_to_abstain(self):
        assert certified_accuracy([ABSTAIN, 1], [ABSTAIN, 1], [0.0, 0.3], 0.0) == 0.5
        assert average_certified_radius([ABSTAIN, 1], [ABSTAIN, 1], [0.0, 0.3]) == pytest.approx(0.15)

    def test_an_infinite_radius_counts_as_infinite(self):
        # p_lower = 1 (all n samples for the class at alpha -> 1, or a constant model) gives radius inf.
        assert average_certified_radius([0, 1], [0, 0], [np.inf, np.inf]) == np.inf
        assert certified_accuracy([0, 1], [0, 0], [np.inf, np.inf], 1e300) == 0.5

    def test_a_column_vector_of_true_labels_is_raveled_with_a_warning(self):
        with pytest.warns(DataConversionWarning, match="column-vector y_true"):
            assert average_certified_radius(np.asarray(Y)[:, None], PREDICTION, RADIUS) == pytest.approx(2.25 / 5)
        with pytest.raises(ValueError, match=r"y_true must be one label per input \(shape \(n,\)\), got shape"):
            certified_accuracy(np.stack([Y, Y], axis=1), PREDICTION, RADIUS, 0.0)

    @pytest.mark.parametrize("call, message", [
        pytest.param(lambda: certified_accuracy(Y, PREDICTION, RADIUS, "0.5x"), r"r must be finite and >= 0",
                     id="accuracy-r-text"),
        pytest.param(lambda: certified_accuracy(Y, PREDICTION, RADIUS, None), r"r must be finite and >= 0",
                     id="accuracy-r-none"),
        pytest.param(lambda: make_certified_accuracy_scorer(-1.0), r"r must be finite and >= 0; got -1.0",
                     id="scorer-negative"),
        pytest.param(lambda: make_certified_accuracy_scorer(float("nan")), r"r must be finite and >= 0",
                     id="scorer-nan"),
        pytest.param(lambda: certified_accuracy_curve(Y, PREDICTION, RADIUS, 0.5), r"radii must be a 1-d array",
                     id="curve-scalar"),
        pytest.param(lambda: average_certified_radius([0, 1], [0, 1], [np.nan, 1.0]),
                     r"radius must be >= 0 for every input \(0 where abstained\); got nan at index 0",
                     id="radius-nan"),
        pytest.param(lambda: average_certified_radius([0], [0], [-1.0]), r"radius must be >= 0", id="radius-negative"),
        pytest.param(lambda: average_certified_radius([], [], []), "the metrics need at least one input", id="empty"),
    ])
    def test_bad_arguments_are_refused_naming_them(self, call, message):
        with pytest.raises(ValueError, match=message):
            call()

    def test_string_labels_with_abstentions(self):
        y = np.array(["cat", "dog", "dog"])
        prediction = np.array(["cat", ABSTAIN, "dog"], dtype=object)
        assert average_certified_radius(y, prediction, [1.0, 0.0, 0.5]) == pytest.approx(0.5)

    def test_length_mismatch(self):
        with pytest.raises(ValueError, match="same length; got 3, 2 and 2"):
            average_certified_radius([0, 1, 2], [0, 1], [0.1, 0.2])


class TestScorers:
    def test_acr_scorer(self):
        assert acr_scorer(StubEstimator(), np.zeros((5, 2)), Y) == pytest.approx(0.45)

    def test_certified_accuracy_scorer(self):
        scorer = make_certified_accuracy_scorer(0.5)
        assert scorer(StubEstimator(), np.zeros((5, 2)), Y) == pytest.approx(0.4)
        assert scorer.__name__ == "certified_accuracy_at_0.5"

    def test_certification_scorers_certify_once_per_estimator_and_X(self):
        scorers = certification_scorers([0.0, 0.5])
        assert list(scorers) == ["acr", "certified_accuracy_at_0", "certified_accuracy_at_0.5"]
        estimator, X = StubEstimator(), np.zeros((5, 2))
        scores = [scorer(estimator, X, Y) for scorer in scorers.values()]
        assert estimator.calls == 1
        assert scores == pytest.approx([0.45, 0.6, 0.4])

    def test_radii_whose_names_collide_are_refused(self):
        # Names show 6 significant digits: two radii with one name would leave one scorer.
        with pytest.raises(ValueError, match=r"radii 0.1 and 0.1000001 both give the scorer name "
                                             r"'certified_accuracy_at_0.1'"):
            certification_scorers([0.1, 0.1000001, 0.25])
        assert list(certification_scorers([0.5, 0.5])) == ["acr", "certified_accuracy_at_0.5"]

    @pytest.mark.parametrize("radius", [np.nan, np.inf, -0.1])
    def test_a_radius_that_is_not_finite_and_non_negative_is_refused(self, radius):
        with pytest.raises(ValueError, match=rf"radii must be finite and >= 0; got {radius!r}"):
            certification_scorers([0.25, radius])

    def test_a_new_round_certifies_again(self):
        # Same estimator and X scored twice (e.g. refitted in between): two certifications.
        scorers = certification_scorers([0.5])
        estimator, X = StubEstimator(), np.zeros((5, 2))
        for _ in range(2):
            for scorer in scorers.values():
                scorer(estimator, X, Y)
        assert estimator.calls == 2
        scorers["acr"](estimator, X, Y)
        scorers["acr"](estimator, X, Y)
        assert estimator.calls == 4

    def test_other_estimator_or_X_certifies_again(self):
        scorers = certification_scorers([0.5])
        first, second = StubEstimator(), StubEstimator(PREDICTION, RADIUS * 2)
        X = np.zeros((5, 2))
        scorers["acr"](first, X, Y)
        assert scorers["certified_accuracy_at_0.5"](second, X, Y) == pytest.approx(0.6)
        scorers["acr"](second, X.copy(), Y)
        assert (first.calls, second.calls) == (1, 2)

    @pytest.mark.parametrize("change", ["refit flipping the class", "weights edited", "alpha set"])
    def test_a_change_between_scorers_of_one_round_certifies_again(self, change, make_linear_classifier):
        """Scorers of one dict after a change of the estimator score its new certificates, not the cached ones.

        On main the cache was keyed by identity only: after a refit that flips the class
        ``certified_accuracy_at_0.1`` from the dict gave 1.0, a fresh scorer 0.0.
        """
        X, y = np.array([[2.0, 0.0], [3.0, 0.0]], np.float32), np.array([1, 1])
        clf = make_linear_classifier([1.0, 0.0], n=200, n0=20)
        scorers = certification_scorers([0.1])
        assert scorers["certified_accuracy_at_0.1"](clf, X, y) == 1.0
        if change == "refit flipping the class":
            clf.set_params(module__weight=[-1.0, 0.0]).fit(np.zeros((2, 2), np.float32), [0, 1])
        elif change == "weights edited":
            with torch.no_grad():
                clf.module_.weight.neg_()
        else:
            clf.set_params(alpha=0.4)
        assert scorers["acr"](clf, X, y) == acr_scorer(clf, X, y)
        if change != "alpha set":
            assert scorers["acr"](clf, X, y) == 0.0

    def test_a_dataset_of_pairs_is_scored_by_its_labels(self, make_linear_classifier):
        X = np.random.default_rng(0).normal(size=(30, 2)).astype(np.float32)
        y = np.where(np.arange(30) % 3 == 0, 0, 1)  # not the model's labels everywhere
        pairs = TensorDataset(torch.from_numpy(X), torch.from_numpy(y))
        clf = make_linear_classifier([1.0, -1.0], n=200, n0=20)
        expected = {name: scorer(clf, X, y) for name, scorer in certification_scorers([0.1, 0.3]).items()}
        assert {name: scorer(clf, pairs) for name, scorer in certification_scorers([0.1, 0.3]).items()} == expected
        assert acr_scorer(clf, pairs) == expected["acr"]
        assert make_certified_accuracy_scorer(0.1)(clf, pairs) == expected["certified_accuracy_at_0.1"]

    def test_labels_are_needed_unless_the_dataset_has_them(self):
        with pytest.raises(ValueError, match=r"needs the true labels y, unless X is a Dataset of \(input, label\)"):
            acr_scorer(StubEstimator(), TensorDataset(torch.zeros(5, 2)), None)

    def test_a_dataset_edited_between_scorers_is_certified_again(self):
        scorers = certification_scorers([0.5])
        estimator, X = StubEstimator(), torch.zeros(5, 2)
        dataset = TensorDataset(X, torch.from_numpy(Y))
        scorers["acr"](estimator, dataset)
        scorers["certified_accuracy_at_0.5"](estimator, dataset)
        assert estimator.calls == 1  # one round, nothing changed: shared
        scorers["acr"](estimator, dataset)
        X[0] = 1.0
        scorers["certified_accuracy_at_0.5"](estimator, dataset)
        assert estimator.calls == 3

    def test_regions_grown_between_scorers_certify_again(self, make_linear_classifier, monkeypatch):
        """Another certify call between two scorers changes a stateful store: the next scorer certifies again."""
        calls = []
        monkeypatch.setattr(metrics, "certify", lambda estimator, X: calls.append(X) or certify(estimator, X))
        X, y = np.array([[2.0, 0.0], [3.0, 0.0]], np.float32), np.array([1, 1])
        clf = make_linear_classifier([1.0, 0.0], n=200, n0=20, allocator=OnlineBallAllocator())
        scorers = certification_scorers([0.1, 0.2])
        scorers["acr"](clf, X, y)
        scorers["certified_accuracy_at_0.1"](clf, X, y)
        assert len(calls) == 1  # one round, nothing changed: shared
        clf.certify(np.array([[-5.0, 0.0]], np.float32))
        scorers["certified_accuracy_at_0.2"](clf, X, y)
        assert len(calls) == 2

    def test_inputs_edited_between_scorers_are_certified_again(self):
        scorers = certification_scorers([0.5])
        estimator, X = StubEstimator(), np.zeros((5, 2))
        scorers["acr"](estimator, X, Y)
        X[0] = 1.0
        scorers["certified_accuracy_at_0.5"](estimator, X, Y)
        assert estimator.calls == 2

    def test_an_estimator_that_cannot_be_pickled_is_certified_by_each_scorer(self):
        scorers = certification_scorers([0.0, 0.5])
        estimator, X = StubEstimator(), np.zeros((5, 2))
        estimator.sink = lambda message: None  # as a callback holding a lambda
        scores = [scorer(estimator, X, Y) for scorer in scorers.values()]
        assert scores == pytest.approx([0.45, 0.6, 0.4])
        assert estimator.calls == 3

    def test_duplicate_radii(self):
        scorers = certification_scorers([0.5, 0.5])
        estimator, X = StubEstimator(), np.zeros((5, 2))
        for _ in range(2):
            for scorer in scorers.values():
                scorer(estimator, X, Y)
        assert len(scorers) == 2 and estimator.calls == 2
