"""The selector's training targets: which levels earn a place (useful_levels), and samples left without a target."""

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning

from smoothsk.sigma._selector_training import useful_levels
from smoothsk.training import Macer, SmoothAdv

from conftest import untrained_experts


class TestUsefulLevels:
    def test_a_level_that_certifies_what_a_kept_one_does_stays_out(self):
        # Levels 0 and 1 certify the same radii to within 1%; level 2 serves other samples.
        radius = np.array([[1.00, 1.00, 0.0, 0.0],
                           [1.01, 0.99, 0.0, 0.0],
                           [0.00, 0.00, 1.0, 1.0]])
        np.testing.assert_array_equal(useful_levels(radius, 0.02), [0, 2])

    def test_the_first_kept_level_is_the_best_fixed_one(self):
        radius = np.array([[0.5, 0.5, 0.5], [0.9, 0.1, 0.9], [0.0, 2.0, 0.0]])
        assert useful_levels(radius, 10.0).tolist() == [2]  # total 2.0 against 1.9 and 1.5

    def test_levels_are_added_by_their_rise_while_it_is_large_enough(self):
        radius = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.05]])
        # Totals so far: 1.0, then 1.5 (+50%), then 1.55 (+3.3%).
        assert useful_levels(radius, 0.02).tolist() == [0, 1, 2]
        assert useful_levels(radius, 0.04).tolist() == [0, 1]
        assert useful_levels(radius, 0.6).tolist() == [0]

    def test_zero_gain_keeps_every_level_that_raises_the_total(self):
        radius = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 2.0]])
        assert useful_levels(radius, 0.0).tolist() == [0, 2]  # level 1 raises nothing


def _deep_linear_selector(lr):
    """:func:`untrained_experts` (seeded), a deep linear selector: at lr 1 and momentum 0.9 its training diverges."""
    torch.manual_seed(0)
    clf, X, y = untrained_experts(selector_epochs=10, lr=lr, optimizer__momentum=0.9)
    clf.sigma_search.set_params(
        selector=torch.nn.Sequential(torch.nn.Linear(5, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 3)))
    return clf, X, y


class TestDivergence:
    def test_a_diverged_training_restarts_from_its_initial_weights_at_a_quarter_of_the_rate(self):
        restarted, X, y = _deep_linear_selector(lr=1.0)
        with pytest.warns(ConvergenceWarning, match=r"^The selector's training loss is not finite in epoch \d+ at "
                                                    r"lr 1\.0: it restarts from its initial weights at lr 0\.25\.$"):
            restarted.fit(X, y)
        direct = _deep_linear_selector(lr=0.25)[0].fit(X, y)
        for name, weight in direct.sigma_search_.selector_module_.state_dict().items():
            torch.testing.assert_close(restarted.sigma_search_.selector_module_.state_dict()[name], weight,
                                       rtol=0, atol=0)

    def test_a_diverging_selector_training_stops_with_a_clear_error(self):
        clf, X, y = untrained_experts(selector_epochs=3, lr=1e30)
        with (pytest.raises(FloatingPointError, match=r"^The selector's training loss is not finite in epoch \d "
                                                      r"\(objective Consistency\) at every rate tried, .* Lower the "
                                                      r"estimator's lr"),
              pytest.warns(ConvergenceWarning, match="restarts from its initial weights")):
            clf.fit(X, y)


def test_max_epochs_none_is_refused_before_the_selectors_targets_are_scored(monkeypatch):
    # Scoring the targets certifies every training input at every level: the costly part of the selector's fit.
    def scored(*args, **kwargs):
        raise AssertionError("the targets were scored before the refusal")

    monkeypatch.setattr("smoothsk.sigma._selector.training_targets", scored)
    clf, X, y = untrained_experts(selector_epochs=None)
    clf.set_params(max_epochs=None)
    with pytest.raises(ValueError, match=r"^max_epochs=None: the selector trains for the estimator's max_epochs"):
        clf.fit(X, y)


class TestEpochDependentObjectives:
    @pytest.mark.parametrize("objective", [Macer(num_noise=2, deferred_epochs=1),
                                           SmoothAdv(steps=1, num_noise=2, warmup_epochs=2)],
                             ids=["Macer deferred", "SmoothAdv warm-up"])
    def test_the_selector_trains_with_an_objective_that_reads_the_epoch(self, objective):
        clf, X, y = untrained_experts(selector_epochs=2)
        clf.sigma_search.set_params(selector_objective=objective)
        assert clf.fit(X, y).sigma_search_.selector_module_ is not None
