"""Tests of smoothsk.sampling.BaseTwoStageSampler: the certify sequence a subclass gets by giving sample sizes."""

import numpy as np
import pytest
import torch

from smoothsk import ABSTAIN
from smoothsk.sampling import BaseTwoStageSampler
from smoothsk.statistics import clopper_pearson_lower

from sampling_support import ScriptedEngine


class _ListedSizes(BaseTwoStageSampler):
    """Says only its sample sizes: 3 selection samples, then the listed estimation sizes."""

    _parameter_constraints = {}

    def __init__(self, sizes=(0, 50, 500)):
        self.sizes = sizes

    @property
    def prediction_sample_size(self):
        return 500

    def _selection_size(self):
        return 3

    def _estimation_sizes(self, candidate_count, n_selection, sigma, alpha):
        return np.asarray(self.sizes, dtype=np.int64)


class TestBaseTwoStageSampler:
    def test_a_subclass_that_gives_sizes_gets_the_whole_certify_sequence(self):
        # Selection on (*stage, 0) picks the candidate; only the fresh (*stage, 1) counts of that
        # candidate enter the bound; 0 estimation samples abstain.
        engine = ScriptedEngine([[0, 3], [3, 0], [1, 2]], [[0, 0], [50, 0], [5, 495]])
        result = _ListedSizes().certify(engine, torch.zeros(3, 1), np.ones(3), 0.01, stage=(2,))
        assert [call["stage"] for call in engine.calls] == [(2, 0), (2, 1)]
        np.testing.assert_array_equal(engine.calls[1]["n_samples"], [0, 50, 500])
        np.testing.assert_array_equal(result.prediction, [ABSTAIN, 0, 1])
        np.testing.assert_array_equal(result.n_samples, [3, 53, 503])
        # 50 of 50: the bound is alpha ** (1 / 50); 495 of 500 comes from the estimation counts alone.
        assert result.p_lower[1] == pytest.approx(0.01 ** (1 / 50), rel=1e-12)
        assert result.p_lower[2] == clopper_pearson_lower(495, 500, 0.01)
