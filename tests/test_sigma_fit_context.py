"""SigmaFitContext: what a certified sigma function is given to fit, read from the estimator once."""

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier, _stages
from smoothsk.models import FlatMLP
from smoothsk.sigma import SigmaFitContext
from smoothsk.training import DataDependentTraining, PretrainFinetune

from conftest import LinearLogits

SALTS = [value for name, value in vars(_stages).items() if name.endswith("_SALT")]


def fitted(module=FlatMLP, **params):
    X = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    params = {"max_epochs": 0, "random_state": 0, **params}
    return SampleWiseSmoothedClassifier(module, **params).fit(X, (X[:, 0] > 0).astype(int))


class TestSeeds:
    def test_each_purpose_gets_the_estimators_seed(self):
        clf = fitted(random_state=7)
        context = SigmaFitContext.from_estimator(clf)
        assert [context.seed(salt) for salt in SALTS] == [clf._seed(salt) for salt in SALTS]
        assert len({context.seed(salt) for salt in SALTS}) == len(set(SALTS))

    def test_a_random_state_instance_is_drawn_from_in_the_order_of_the_calls(self):
        clf = fitted(random_state=np.random.RandomState(3))
        context = SigmaFitContext.from_estimator(clf)
        state = clf.random_state.get_state()
        drawn = [context.seed(salt) for salt in SALTS]
        clf.random_state.set_state(state)
        assert drawn == [clf._seed(salt) for salt in SALTS]


class TestFromEstimator:
    def test_the_estimators_settings(self):
        clf = fitted(module__hidden=8, optimizer=torch.optim.SGD, lr=0.03, optimizer__momentum=0.5,
                     max_epochs=0, batch_size=-1)
        context = SigmaFitContext.from_estimator(clf)
        assert context.module_class is FlatMLP and context.module_params == {"hidden": 8}
        optimizer = context.optimizer_factory(torch.nn.Linear(2, 1).parameters())
        assert type(optimizer) is torch.optim.SGD
        assert (optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["momentum"]) == (0.03, 0.5)
        assert (context.max_epochs, context.batch_size, context.device) == (0, None, torch.device("cpu"))
        assert SigmaFitContext.from_estimator(fitted(batch_size=16)).batch_size == 16
        engine = context.classifier_engine(root_seed=5)
        assert engine.module is clf.module_ and engine.root_seed == 5

    @pytest.mark.parametrize("params", [{"module": LinearLogits, "module__weight": (1.0, 0.0, 0.0, 0.0)},
                                        {"module": LinearLogits((1.0, 0.0, 0.0, 0.0))},
                                        {"module": FlatMLP(n_classes=2)}],
                             ids=["class without n_classes", "instance", "instance of a class with n_classes"])
    def test_no_module_class_where_the_module_takes_no_n_classes_or_is_an_instance(self, params):
        assert SigmaFitContext.from_estimator(fitted(**params)).module_class is None

    def test_the_schedules_grids_and_the_training_sigmas(self):
        clf = fitted(training=PretrainFinetune(0.2, 0.35, pretrain_epochs=0, finetune_epochs=0))
        context = SigmaFitContext.from_estimator(clf)
        np.testing.assert_allclose(context.levels, [0.2, 0.25, 0.3, 0.35])
        np.testing.assert_allclose(context.assignment_levels, context.levels)
        assert context.train_sigmas is clf.train_sigmas_
        ddrs = SigmaFitContext.from_estimator(fitted(training=DataDependentTraining(warmup_epochs=0)))
        assert ddrs.levels is None and ddrs.assignment_levels is None

    def test_a_loaded_estimator_has_no_schedule_grid(self, tmp_path):
        clf = fitted()
        clf.save(tmp_path / "model.safetensors")
        loaded = SampleWiseSmoothedClassifier.load(tmp_path / "model.safetensors")
        context = SigmaFitContext.from_estimator(loaded)
        assert context.levels is None and context.assignment_levels is None and context.module_class is FlatMLP
