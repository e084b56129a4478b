"""Tests of smoothsk.sampling._confidence_sequences: anytime coverage, the never-failing size, the looks."""

import numpy as np
import pytest
from scipy import stats

from smoothsk.sampling._confidence_sequences import (
    BettingBound,
    UnionBound,
    betting_lower,
    look_sizes,
)
from smoothsk.sampling._spending import Schedule
from smoothsk.statistics import clopper_pearson_lower

ERROR_PROBABILITY = 1e-6


def _sequence(kind, n_streams, looks, alpha):
    """``kind`` for ``n_streams`` inputs: union levels split equally over ``looks``, betting weights equal."""
    look_alpha = np.full((n_streams, len(looks)), alpha / len(looks))
    schedule = Schedule(np.repeat(looks[None, :], n_streams, axis=0), look_alpha, np.zeros(n_streams))
    return kind.from_schedule(schedule, looks[-1], alpha)


class TestAnytimeCoverage:
    # Each stream's bound, recomputed at every look, must stay below p at all looks at once with
    # probability >= 1 - alpha: count the streams where some look's bound exceeds p.
    P_TRUE, ALPHA, N_STREAMS = 0.9, 0.05, 2000

    @pytest.mark.parametrize("kind", [UnionBound, BettingBound])
    def test_some_look_exceeds_p_with_probability_at_most_alpha(self, kind):
        looks = look_sizes(100, 1.2, 20_000)
        sequence = _sequence(kind, self.N_STREAMS, looks, self.ALPHA)
        rows = np.arange(self.N_STREAMS)
        rng = np.random.default_rng(5)
        successes = np.cumsum(rng.binomial(np.diff(looks, prepend=0)[None, :].repeat(self.N_STREAMS, 0), self.P_TRUE),
                              axis=1).astype(np.float64)
        exceeded = np.zeros(self.N_STREAMS, dtype=bool)
        for look, size in enumerate(looks):
            trials = np.full(self.N_STREAMS, float(size))
            exceeded |= sequence.lower(rows, look, successes[:, look], trials) > self.P_TRUE
        assert exceeded.sum() <= stats.binom.isf(ERROR_PROBABILITY, self.N_STREAMS, self.ALPHA)
        # The upper end holds as well (it only decides when to stop, at its own alpha).
        upper = sequence.upper(rows, len(looks) - 1, successes[:, -1], np.full(self.N_STREAMS, float(looks[-1])))
        assert np.sum(upper < self.P_TRUE) <= stats.binom.isf(ERROR_PROBABILITY, self.N_STREAMS, self.ALPHA)


class TestOnesNeeded:
    NEEDED = np.array([0.6, 0.9, 0.99, 0.999])
    SHARE, ALPHA = 0.75, 0.001

    def test_union_the_clopper_pearson_bound_of_that_many_ones_just_reaches_the_bound(self):
        size = UnionBound.ones_needed(self.NEEDED, self.SHARE, self.ALPHA)
        assert np.all(clopper_pearson_lower(size, size, self.SHARE * self.ALPHA) >= self.NEEDED)
        assert np.all(clopper_pearson_lower(size - 1, size - 1, self.SHARE * self.ALPHA) < self.NEEDED)

    def test_betting_the_bet_one_alone_just_reaches_the_bound(self):
        size = BettingBound.ones_needed(self.NEEDED, self.SHARE, self.ALPHA)
        log_weights = np.full((len(size), 1), np.log(self.SHARE))  # the bet lambda = 1 with its share alone
        for ones, reaches in ((size, True), (size - 1, False)):
            lower = betting_lower(ones, ones, self.ALPHA, log_weights, np.ones(1))
            # The bisection returns a rejected mean: within 2 ** -50 of the bound.
            assert np.all((lower >= self.NEEDED - 1e-12) == reaches)


class TestLowerAt:
    @pytest.mark.parametrize("kind", [UnionBound, BettingBound])
    def test_a_grid_of_frequencies_gives_the_bounds_of_those_counts(self, kind):
        looks = look_sizes(100, 2.0, 1600)
        sequence = _sequence(kind, 3, looks, 0.01)
        rows, trials = np.array([0, 2]), np.array([400.0, 800.0])
        p = np.array([[0.5, 0.75, 1.0], [0.25, 0.9, 0.95]])
        grid = sequence.lower_at(rows, 2, p, trials)
        for j in range(p.shape[1]):
            np.testing.assert_array_equal(grid[:, j], sequence.lower(rows, 2, p[:, j] * trials, trials))


def test_look_sizes_add_at_least_one_sample_and_end_at_n_max():
    sizes = look_sizes(1, 1.01, 50)
    np.testing.assert_array_equal(sizes, np.arange(1, 51))
    np.testing.assert_array_equal(look_sizes(500, 1.5, 400), [400])
