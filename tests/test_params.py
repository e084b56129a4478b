"""Component defaults and nested ``set_params`` routing (smoothsk._params)."""

import pytest

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._components import Component
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import CertifiedSigmaSelector, GridSigmaSearch
from smoothsk.training import (
    Consistency,
    DataDependentTraining,
    GaussianNoise,
    InstaRSTrain,
    PretrainFinetune,
    SmoothAdv,
)


class TestSetParams:
    def test_set_params_on_default_components(self):
        clf = SampleWiseSmoothedClassifier(DigitsCNN).set_params(
            sampler__n=123, training__sigma=0.5, sigma_search__sigma=0.75)
        assert clf.sampler.n == 123 and clf.training.sigma == 0.5 and clf.sigma_search.sigma == 0.75
        assert clf.get_params()["sampler__n"] == 123

    def test_nested_parameters_go_to_a_clone_never_to_the_passed_component(self):
        sampler = FixedSampler(n=10, n0=5)
        clf = SampleWiseSmoothedClassifier(DigitsCNN, sampler=sampler).set_params(sampler__n=20, lr=0.5)
        assert (sampler.n, sampler.n0) == (10, 5)
        assert (clf.sampler.n, clf.sampler.n0, clf.lr) == (20, 5, 0.5)

    def test_skorch_prefixes_are_not_taken_for_components(self):
        clf = SampleWiseSmoothedClassifier(DigitsCNN).set_params(module__width=3, optimizer__momentum=0.5)
        assert clf.sampler is None and clf.training is None
        assert clf.get_params()["module__width"] == 3 and clf.get_params()["optimizer__momentum"] == 0.5

    def test_bad_callbacks_are_refused_before_changing_anything(self):
        clf = SampleWiseSmoothedClassifier(DigitsCNN)
        with pytest.raises(TypeError, match="callbacks must be a list"):
            clf.set_params(callbacks=3.0)
        assert clf.callbacks is None


class Holder(Component):
    """A component with a sub-component parameter that has no default."""

    def __init__(self, inner=None):
        self.inner = inner


class TestNestedDefaults:
    """A nested parameter of a sub-component left at None sets it on the documented default."""

    @pytest.mark.parametrize("training, key, value, expected", [
        (None, "objective__num_noise", 2, GaussianNoise(num_noise=2)),
        (DataDependentTraining(), "objective__num_noise", 3, GaussianNoise(num_noise=3)),
        (PretrainFinetune(), "objective__epsilon", 0.5, SmoothAdv(epsilon=0.5, steps=2, num_noise=4)),
        (PretrainFinetune(0.2, 0.4), "assignment__n", 100, GridSigmaSearch(0.2, 0.4, step=0.05, n=100)),
        (InstaRSTrain(), "stage2_objective__steps", 3, SmoothAdv(epsilon="adaptive", steps=3)),
    ])
    def test_a_schedules_default_sub_component_takes_nested_parameters(self, training, key, value, expected):
        clf = SampleWiseSmoothedClassifier(DigitsCNN, training=training).set_params(**{f"training__{key}": value})
        name = key.split("__")[0]
        got = getattr(clf.training, name)
        assert type(got) is type(expected) and got.get_params() == expected.get_params()
        assert training is None or getattr(training, name) is None  # the passed schedule is untouched
        assert clf.get_params()[f"training__{key}"] == value

    def test_the_selectors_default_objective_takes_nested_parameters(self):
        search = CertifiedSigmaSelector().set_params(selector_objective__lbd=2.0)
        assert isinstance(search.selector_objective, Consistency) and search.selector_objective.lbd == 2.0

    def test_a_sub_component_without_a_default_is_named(self):
        with pytest.raises(ValueError, match=r"inner__value: Holder's inner is None"):
            Holder().set_params(inner__value=1)
