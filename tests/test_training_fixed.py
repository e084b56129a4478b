"""FixedSigmaTraining: one noise level, one stage of ``max_epochs`` per fit call."""

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._constraints import InvalidParameterError
from smoothsk._params import Components
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining, GaussianNoise


class TestFixedSigmaTraining:
    def test_batch_sigma_is_constant_on_the_batch_device_and_dtype(self):
        X = torch.zeros(5, 3, dtype=torch.float64)
        sigma = FixedSigmaTraining(0.5).batch_sigma(None, X, torch.zeros(5), torch.arange(5))
        assert sigma.dtype == torch.float64 and sigma.device == X.device
        assert sigma.tolist() == [0.5] * 5

    def test_run_trains_max_epochs_and_records_sigmas(self):
        X = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)
        y = (X[:, 0] > 0).astype(int)
        clf = SampleWiseSmoothedClassifier(FlatMLP, training=FixedSigmaTraining(0.3), max_epochs=3,
                                           sampler=FixedSampler(n=10, n0=5), random_state=0).fit(X, y)
        assert len(clf.history) == 3
        np.testing.assert_array_equal(clf.train_sigmas_, np.full(40, 0.3))

    def test_every_fit_call_trains_max_epochs_in_the_fixed_stage(self):
        X = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)
        y = (X[:, 0] > 0).astype(int)
        clf = SampleWiseSmoothedClassifier(FlatMLP, training=FixedSigmaTraining(0.3), max_epochs=2,
                                           sampler=FixedSampler(n=10, n0=5), random_state=0).fit(X, y)
        clf.set_params(max_epochs=3).partial_fit(X, y)
        assert list(clf.history[:, "training_stage"]) == ["fixed"] * 5

    def test_default_test_time_search_matches_the_training_sigma(self):
        assert FixedSigmaTraining(0.75).default_sigma_search().get_params() == FixedSigma(0.75).get_params()
        clf = SampleWiseSmoothedClassifier(FlatMLP, training=FixedSigmaTraining(0.75))
        assert Components.of(clf).sigma_search.sigma == 0.75

    def test_objective_of_the_run(self):
        X = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
        y = (X[:, 0] > 0).astype(int)
        for objective, expected in [(None, GaussianNoise()), (GaussianNoise(num_noise=3), GaussianNoise(num_noise=3))]:
            schedule = FixedSigmaTraining(objective=objective)
            clf = SampleWiseSmoothedClassifier(FlatMLP, training=schedule, max_epochs=1, random_state=0).fit(X, y)
            assert clf.training_ is not schedule and clf.training is schedule
            assert clf.training_.objective_.get_params() == expected.get_params()
            assert not hasattr(schedule, "objective_")

    @pytest.mark.parametrize("params, name", [({"sigma": 0}, "sigma"), ({"objective": "ce"}, "objective")])
    def test_invalid_parameters(self, params, name):
        with pytest.raises(InvalidParameterError, match=f"'{name}' parameter of FixedSigmaTraining"):
            FixedSigmaTraining(**params).validate()
