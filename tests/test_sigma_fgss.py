"""MultiStartFGSS: Insta-RS's multi-start fast grid search (smoothsk.sigma._fgss)."""

import copy

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk._stages import SEARCH_STAGE
from smoothsk.sigma import GridSigmaSearch, MultiStartFGSS

from conftest import SEARCH_WEIGHT, LinearLogits, StageSpy, linear_engine


class CurveEngine:
    """A stand-in engine whose soft classifier has a prescribed radius curve per input.

    ``curves[i, l - 1]`` is the approximate radius ``sigma * PhiInv(p)`` that
    input ``i`` has at level ``l``; ``mean_softmax`` returns ``(p, (1 - p) / 2,
    (1 - p) / 2)``, whose top probability is ``p`` while ``p >= 1/3`` (radii
    down to ``sigma * PhiInv(1/3) = -0.43 sigma``). Every call is logged as
    (global rows, sigmas).
    """

    def __init__(self, curves, sigma0):
        self.curves = np.asarray(curves, dtype=np.float64)
        self.sigma0 = sigma0
        self.positions = None
        self.calls = []

    def restricted(self, rows):
        engine = copy.copy(self)
        engine.positions = np.asarray(rows) if self.positions is None else self.positions[rows]
        return engine

    def mean_softmax(self, X, sigma, n_samples, stage):
        rows = np.arange(len(X)) if self.positions is None else self.positions
        sigma = np.asarray(sigma, dtype=np.float64)
        self.calls.append((rows.copy(), sigma.copy()))
        level = np.rint((sigma / self.sigma0) ** 2).astype(int)
        p = stats.norm.cdf(self.curves[rows, level - 1] / sigma)
        return np.stack([p, (1 - p) / 2, (1 - p) / 2], axis=1)


def bump(levels, centre, height, width=2.0):
    return height * np.exp(-0.5 * ((levels - centre) / width) ** 2)


LEVELS = np.arange(1, 17)


class TestMultiStartFGSS:
    def test_certified_score_follows_the_grid_on_the_linear_model(self, linear_data):
        # The certified radius of the linear model peaks at a sigma that grows
        # with the distance to the boundary: the hard-vote FGSS gives far inputs
        # larger sigmas, and its choice is within a few levels of the grid's.
        X, _, distance = linear_data
        engine = linear_engine()
        fgss = MultiStartFGSS(sigma0=0.25, max_level=16, score="certified").search(engine, torch.from_numpy(X))
        near, far = distance < 0.5, distance > 2.0
        assert np.median(fgss.sigma[far]) > np.median(fgss.sigma[near])
        grid = GridSigmaSearch(0.25, 1.0, 0.05).search(engine, torch.from_numpy(X))
        assert fgss.steps.mean() < 16 and np.median(np.abs(fgss.sigma - grid.sigma)[far]) < 0.2

    def test_reaches_the_grid_argmax_in_fewer_evaluations(self):
        curves = np.stack([
            bump(LEVELS, 4, 1.0) + bump(LEVELS, 13, 0.8),  # global max at 4, local at 13
            bump(LEVELS, 4, 0.6) + bump(LEVELS, 12, 1.0),  # local max at 4, global at 12
            0.1 * LEVELS,                                  # increasing: max at the top level
        ])
        engine = CurveEngine(curves, sigma0=0.25)
        result = MultiStartFGSS().search(engine, torch.zeros((3, 1)))
        np.testing.assert_allclose(result.sigma, 0.25 * np.sqrt(curves.argmax(axis=1) + 1))
        # Input 0: up from 1 stops after evaluating 5, down from 16 after 12: 10 levels; a grid pays 16.
        assert result.steps[0] == 10 and result.steps[1] < 16
        assert result.steps[2] == 16  # monotone: the ascent covers all levels, the descent is memoised

    def test_vectorised_and_memoised(self):
        rng = np.random.default_rng(1)
        curves = rng.uniform(0.05, 1.0, size=(50, 16))  # positive radii with many local maxima
        engine = CurveEngine(curves, sigma0=0.25)
        result = MultiStartFGSS().search(engine, torch.zeros((50, 1)))
        evaluated = [(row, sigma) for rows, sigmas in engine.calls for row, sigma in zip(rows, sigmas, strict=True)]
        assert len(evaluated) == len(set(evaluated)) == result.steps.sum()  # each level once per input
        assert all(len(np.unique(sigmas)) == 1 for _, sigmas in engine.calls)
        assert len(engine.calls) <= 2 * 16  # one call per move, not per input
        # Each end level is where its direction first turns down; the better of the two wins.
        for i in range(50):
            level = int(round((result.sigma[i] / 0.25) ** 2))
            up = np.flatnonzero(np.diff(curves[i]) < 0)
            up_end = up[0] + 1 if len(up) else 16
            down = np.flatnonzero(np.diff(curves[i][::-1]) < 0)
            down_end = 16 - down[0] if len(down) else 1
            assert level in (up_end, down_end)
            assert curves[i, level - 1] == pytest.approx(max(curves[i, up_end - 1], curves[i, down_end - 1]))

    def test_each_level_has_its_own_noise(self, linear_data):
        engine = StageSpy(LinearLogits(SEARCH_WEIGHT).eval(), 2, 1000)
        engine.stages = []
        result = MultiStartFGSS(n=50).search(engine, torch.from_numpy(linear_data[0][:30]))
        levels = np.rint((result.sigma / 0.25) ** 2).astype(int)
        assert {(SEARCH_STAGE, int(level)) for level in levels} <= set(engine.stages)
        assert all(stage[0] == SEARCH_STAGE and 1 <= stage[1] <= 16 for stage in engine.stages)

    def test_single_start_stops_at_first_decrease(self):
        curves = np.stack([bump(LEVELS, 6, 1.0), np.where(LEVELS <= 8, 0.0, bump(LEVELS, 12, 0.5))])
        result = MultiStartFGSS(starts=((1, 1),)).search(CurveEngine(curves, 0.25), torch.zeros((2, 1)))
        # Up to the peak and one level past it; a plateau (p = 1/2, radius 0) is crossed: Alg. 1 moves on ties.
        assert result.steps.tolist() == [7, 13]
        np.testing.assert_allclose(result.sigma, 0.25 * np.sqrt([6, 12]))

    def test_one_sigma_for_the_set_maximises_the_approximate_acr(self):
        # Three inputs misclassified near level 10 (negative radii) would pull an
        # unclipped mean to level 3; Eq. 5 counts them as 0, so level 10 wins.
        curves = np.stack([bump(LEVELS, 3, 1.0), bump(LEVELS, 10, 1.2), *[-bump(LEVELS, 10, 0.1, 3)] * 3])
        result = MultiStartFGSS(per_input=False).search(CurveEngine(curves, 0.25), torch.zeros((5, 1)))
        best = np.maximum(curves, 0).mean(axis=0).argmax() + 1  # Alg. 3 / Eq. 5
        assert best == 10 and curves.mean(axis=0).argmax() + 1 == 3
        assert len(np.unique(result.sigma)) == 1
        np.testing.assert_allclose(result.sigma[0], 0.25 * np.sqrt(best))
        assert len(np.unique(result.steps)) == 1

    def test_labels_score_the_label_probability(self, linear_data):
        X, y, distance = linear_data
        X_t, far = torch.from_numpy(X), distance > 2.0
        search = MultiStartFGSS(n=100)
        # A far input scored for the wrong class has a falling negative radius: smallest level.
        wrong = search.search(linear_engine(), X_t, 1 - y)
        np.testing.assert_allclose(wrong.sigma[far], 0.25)
        # For the label of a confidently classified input, the label is the top class: same search.
        right = search.search(linear_engine(), X_t, y)
        confident = distance > 1.0
        np.testing.assert_array_equal(right.sigma[confident], search.search(linear_engine(), X_t).sigma[confident])

    @pytest.mark.parametrize("params, match", [
        ({"max_level": 0}, "max_level"),
        ({"starts": ((0, 1),)}, "start"),
        ({"starts": ((1, 0),)}, "start"),
        ({"starts": ((17, -1),)}, "start"),
        ({"starts": ((1,), (2, 1))}, "starts"),
        ({"starts": ()}, "starts"),
        ({"sigma0": -1.0}, "sigma0"),
        ({"per_input": "yes"}, "per_input"),
    ])
    def test_invalid_parameters(self, params, match):
        with pytest.raises(ValueError, match=match):
            MultiStartFGSS(**params).search(linear_engine(), torch.zeros((2, 4)))
