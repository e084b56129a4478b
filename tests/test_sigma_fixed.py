"""FixedSigma: one test-time noise level for every input."""

import numpy as np
import pytest
import torch

from smoothsk._constraints import InvalidParameterError
from smoothsk.sigma import FixedSigma, SigmaSearchResult


class NoEngine:
    """An engine that must not be used."""

    def __getattr__(self, name):
        raise AssertionError(f"FixedSigma used the engine ({name})")


class TestFixedSigma:
    def test_same_sigma_no_steps(self):
        result = FixedSigma(0.5).search(NoEngine(), torch.zeros(4, 1, 2, 2))
        assert isinstance(result, SigmaSearchResult)
        assert result.sigma.dtype == np.float64 and result.steps.dtype == np.int64
        np.testing.assert_array_equal(result.sigma, [0.5] * 4)
        np.testing.assert_array_equal(result.steps, [0] * 4)

    def test_labels_are_ignored(self):
        result = FixedSigma(0.25).search(NoEngine(), torch.zeros(2, 3), y=np.array([0, 1]))
        np.testing.assert_array_equal(result.sigma, [0.25, 0.25])

    def test_no_inputs(self):
        assert FixedSigma().search(NoEngine(), torch.zeros(0, 3)).sigma.shape == (0,)

    @pytest.mark.parametrize("sigma", [0, -0.1, "big", None])
    def test_invalid_sigma(self, sigma):
        with pytest.raises(InvalidParameterError, match="'sigma' parameter of FixedSigma"):
            FixedSigma(sigma).search(NoEngine(), torch.zeros(1, 1))

    def test_default_and_changed_sigma_reach_the_search(self):
        X = torch.zeros(3, 2)
        np.testing.assert_array_equal(FixedSigma().search(NoEngine(), X).sigma, 0.25)
        search = FixedSigma(0.5)
        np.testing.assert_array_equal(search.search(NoEngine(), X).sigma, 0.5)
        # a search keeps nothing from an earlier call: the new sigma is used at once
        np.testing.assert_array_equal(search.set_params(sigma=1.0).search(NoEngine(), X).sigma, 1.0)
