"""Tests of smoothsk.sampling._spending: every strategy splits alpha over looks fixed by the selection."""

import numpy as np
import pytest

from smoothsk.sampling._confidence_sequences import UnionBound, look_sizes
from smoothsk.sampling._spending import SPENDING, EqualSpending, PlanSpending, PriorSpending
from smoothsk.sampling._stopping import StoppingRule

ALPHA, N_MAX = 0.001, 100_000
# Every strategy, in rule (b) and, where it has one, in rule (a) at radius 0.3.
STRATEGIES = [(name, None) for name in SPENDING] + [(name, 0.3) for name in SPENDING if not SPENDING[name].decline_only]


def _strategy(kind, n0, radius=None, first=500):
    """A strategy of class ``kind`` for SequentialSampler's defaults (n_max 1e5, decline 0.05, growth 1.5)."""
    return kind(StoppingRule(N_MAX, 0.05, "absolute", radius), n0, look_sizes(first, 1.5, N_MAX), UnionBound)


def _selections(n0):
    """Every selection count 0..n0 (shape (n0 + 1,)), even counts at sigma 0.25, odd ones at 0.5."""
    selected = np.arange(n0 + 1)
    return selected, np.where(selected % 2 == 0, 0.25, 0.5)


class TestEveryStrategy:
    @pytest.mark.parametrize("name, radius", STRATEGIES)
    @pytest.mark.parametrize("n0", [30, 100])
    def test_schedule_is_a_split_of_alpha_over_sorted_looks(self, name, radius, n0):
        # The union argument: per input, sorted looks in 1..n_max whose levels are >= 0 and sum to alpha.
        selected, sigma = _selections(n0)
        schedule = _strategy(SPENDING[name], n0, radius).schedule(selected, sigma, ALPHA)
        assert schedule.looks.shape == schedule.look_alpha.shape and len(schedule.looks) == n0 + 1
        assert np.all(np.diff(schedule.looks, axis=1) >= 0)
        assert np.all((schedule.looks >= 1) & (schedule.looks <= N_MAX))
        assert np.all(schedule.look_alpha >= 0)
        np.testing.assert_allclose(schedule.look_alpha.sum(axis=1), ALPHA, rtol=1e-12)
        np.testing.assert_array_equal(schedule.never_failing_share, np.where(selected == n0, 0.75, 0.0))

    @pytest.mark.parametrize("name, radius", STRATEGIES)
    def test_each_input_schedule_depends_on_its_own_selection_and_sigma_only(self, name, radius):
        # Fixed given the selection: the other inputs of the call (and their order) change nothing.
        selected, sigma = _selections(100)
        strategy = _strategy(SPENDING[name], 100, radius)
        whole = strategy.schedule(selected, sigma, ALPHA)
        order = np.random.default_rng(0).permutation(len(selected))[:40]
        part = strategy.schedule(selected[order], sigma[order], ALPHA)
        np.testing.assert_array_equal(part.looks, whole.looks[order])
        np.testing.assert_array_equal(part.look_alpha, whole.look_alpha[order])

    @pytest.mark.parametrize("name", ["equal", "predicted", "prior"])
    def test_a_never_failing_selection_puts_three_quarters_of_alpha_on_one_look(self, name):
        selected, sigma = _selections(100)
        schedule = _strategy(SPENDING[name], 100).schedule(selected, sigma, ALPHA)
        assert schedule.look_alpha[-1].max() >= 0.75 * ALPHA  # the last row: selected == n0


class TestEqualSpending:
    def test_the_look_at_n_max_holds_all_of_alpha_when_it_is_the_only_look(self):
        # first = n_max: one geometric look. A selection that failed has no never-failing look,
        # so that look must keep all of alpha (it once got level 0 and every such input abstained).
        schedule = _strategy(EqualSpending, 100, first=N_MAX).schedule(np.array([90, 100]), np.full(2, 0.5), ALPHA)
        np.testing.assert_array_equal(schedule.looks[0], [N_MAX, N_MAX])
        np.testing.assert_allclose(schedule.look_alpha[0], [ALPHA, 0.0])
        assert schedule.looks[1, 0] < N_MAX
        np.testing.assert_allclose(schedule.look_alpha[1], [0.75 * ALPHA, 0.25 * ALPHA])


class TestPriorSpending:
    @pytest.mark.parametrize("n0", [30, 100])
    def test_equal_sizes_are_merged_and_alpha_follows_the_selection(self, n0):
        # One nonzero level per distinct size (equal sizes merged, not counted twice).
        selected, sigma = _selections(n0)
        schedule = _strategy(PriorSpending, n0).schedule(selected, sigma, ALPHA)
        np.testing.assert_array_equal(schedule.looks[:, -1], N_MAX)
        repeated = np.concatenate([np.zeros((len(selected), 1), dtype=bool), np.diff(schedule.looks, axis=1) == 0],
                                  axis=1)
        assert np.all(schedule.look_alpha[repeated] == 0)
        # At the same sigma (even counts: 0.25), a more confident selection, which needs more samples
        # to show its larger radius, spends alpha on later looks.
        spent_at = np.sum(schedule.look_alpha * np.log(schedule.looks), axis=1) / ALPHA  # alpha-weighted mean log size
        assert spent_at[n0 - 2] > spent_at[n0 - 2 - 2 * (n0 // 10)] + 0.5


class TestPlanSpending:
    @pytest.mark.parametrize("n0", [30, 100])
    def test_one_look_holding_alpha_or_the_prior_schedule(self, n0):
        # Per input, either one size holding all of alpha (a planned input) or the prior's schedule,
        # chosen from the selection count and sigma alone.
        selected, sigma = _selections(n0)
        plan = _strategy(PlanSpending, n0).schedule(selected, sigma, ALPHA)
        prior = _strategy(PriorSpending, n0).schedule(selected, sigma, ALPHA)
        planned = np.all(plan.looks == plan.looks[:, :1], axis=1)
        np.testing.assert_array_equal(plan.look_alpha[planned, 0], ALPHA)
        np.testing.assert_array_equal(plan.looks[~planned], prior.looks[~planned])
        np.testing.assert_array_equal(plan.look_alpha[~planned], prior.look_alpha[~planned])
        # Planned: interior selections, never a never-failing one or one near 1/2 (whose posterior
        # reaches frequencies that ask no radius); their one look grows with the selection count.
        never_failed = selected == n0
        assert planned[n0 // 2 + n0 // 5:n0 - n0 // 10].any()
        assert not planned[never_failed].any() and not planned[:n0 // 2 + 1].any()
        for parity in (0, 1):
            sizes = plan.looks[planned & (selected % 2 == parity), 0]
            assert np.all(np.diff(sizes) >= 0) and len(sizes) > 1
