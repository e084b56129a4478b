"""Parameter validation: scikit-learn's constraints, with booleans kept out of numbers."""

from numbers import Integral

import numpy as np
import pytest
import torch
from sklearn.utils._param_validation import Hidden
from test_persistence_untrusted import forge, read_file

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._constraints import Interval, InvalidParameterError, StrOptions, validate_parameter_constraints
from smoothsk.experts import NoiseLevelExperts
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler, SequentialSampler
from smoothsk.sigma import CertifiedSigmaSelector, GridSigmaSearch, MultiStartFGSS
from smoothsk.training import FixedSigmaTraining, PretrainFinetune


@pytest.mark.parametrize("component, name", [
    (FixedSampler(n=True), "n"),
    (FixedSampler(n0=True), "n0"),
    (FixedSigmaTraining(sigma=True), "sigma"),
    (GridSigmaSearch(step=True), "step"),
    (SequentialSampler(n_max=True), "n_max"),
])
def test_a_bool_is_not_a_number(component, name):
    # bool is an int in Python: without the rule, n=True ran as n=1 and sigma=True as sigma 1.0.
    value = component.get_params()[name]
    with pytest.raises(InvalidParameterError) as refusal:
        component.validate()
    message = str(refusal.value)
    assert message.startswith(f"The '{name}' parameter of {type(component).__name__} must be ") and "\n" not in message
    assert message.endswith(f"Got {value!r} instead."), message


def test_a_boolean_parameter_still_takes_a_bool():
    MultiStartFGSS(per_input=False).validate()
    CertifiedSigmaSelector(certify_reachable_levels=False).validate()


def test_the_estimators_own_numbers_refuse_a_bool():
    X, y = np.random.default_rng(0).random((20, 4), dtype=np.float32), np.arange(20) % 2
    clf = SampleWiseSmoothedClassifier(FlatMLP, max_epochs=0, certify_batch_size=True)
    with pytest.raises(InvalidParameterError, match="'certify_batch_size' parameter"):
        clf.fit(X, y)


@pytest.mark.parametrize("params, name", [
    ({"lr": True}, "lr"),
    ({"lr": -0.1}, "lr"),
    ({"lr": float("nan")}, "lr"),
    ({"max_epochs": True}, "max_epochs"),
    ({"max_epochs": -1}, "max_epochs"),
    ({"max_epochs": 2.5}, "max_epochs"),
    ({"batch_size": False}, "batch_size"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": "64"}, "batch_size"),
    ({"verbose": -1}, "verbose"),
    ({"warm_start": 1}, "warm_start"),
])
def test_the_training_loops_numbers_are_checked_before_training(params, name):
    # skorch's own parameters: lr=True trained at 1.0, max_epochs=-1 or batch_size=0 failed deep in skorch.
    X, y = np.random.default_rng(0).random((20, 4), dtype=np.float32), np.arange(20) % 2
    clf = SampleWiseSmoothedClassifier(FlatMLP, **{"max_epochs": 1, **params})
    with pytest.raises(InvalidParameterError) as refusal:
        clf.fit(X, y)
    message = str(refusal.value)
    assert message.startswith(f"The '{name}' parameter of SampleWiseSmoothedClassifier must be "), message
    assert not hasattr(clf, "module_"), "refused before anything was built"


def test_the_training_loops_documented_values_are_accepted():
    X, y = np.random.default_rng(0).random((20, 4), dtype=np.float32), np.arange(20) % 2
    clf = SampleWiseSmoothedClassifier(FlatMLP, module__hidden=4, max_epochs=1, batch_size=-1, lr=0.0, verbose=False,
                                       warm_start=True)
    clf.fit(X, y)


@pytest.mark.parametrize("component, name", [
    (CertifiedSigmaSelector(levels=[True, 0.5]), "levels"),
    (CertifiedSigmaSelector(levels=np.array([0.25, True], dtype=object)), "levels"),
    (MultiStartFGSS(starts=[(True, 1)]), "starts"),
    (MultiStartFGSS(starts=[(1, 1), (4, np.True_)]), "starts"),
    (CertifiedSigmaSelector(levels=[torch.tensor(True), 0.5]), "levels"),
    (CertifiedSigmaSelector(levels=np.array([[True, False]] * 3)), "levels"),
])
def test_a_bool_inside_an_array_is_not_a_number(component, name):
    # np.asarray([True, 0.5]) is [1.0, 0.5]: without the rule, levels=[True, 0.5] ran at sigma 1.0.
    with pytest.raises((InvalidParameterError, ValueError), match=f"'?{name}'?"):
        component.validate()


def test_a_bool_inside_an_array_is_refused_in_one_line():
    with pytest.raises(InvalidParameterError) as refusal:
        CertifiedSigmaSelector(levels=np.array([[True, False]] * 3)).validate()
    assert "\n" not in str(refusal.value)


def test_nested_or_self_referential_arrays_end_in_a_value_error():
    deep, looped = [0.5], [0.5]
    for _ in range(5000):
        deep = [deep]
    looped.extend([looped, looped, looped])
    for levels in (deep, looped):
        with pytest.raises(ValueError, match="levels"):
            CertifiedSigmaSelector(levels=levels).validate()


@pytest.mark.parametrize("levels", [[True, 0.5], [torch.tensor(True), 0.5], torch.tensor([True, False])])
def test_experts_levels_refuse_a_bool(levels):
    with pytest.raises(ValueError, match="levels") as refusal:
        NoiseLevelExperts(levels, [FlatMLP(hidden=4), FlatMLP(hidden=4)])
    assert "\n" not in str(refusal.value)


def test_max_epochs_none_serves_schedules_that_do_not_use_it_and_is_refused_by_those_that_do():
    # max_epochs=None was accepted before the training numbers were validated: PretrainFinetune sets its own.
    X, y = np.random.default_rng(0).random((20, 4), dtype=np.float32), np.arange(20) % 2
    schedule = PretrainFinetune(pretrain_epochs=1, finetune_epochs=1)
    SampleWiseSmoothedClassifier(FlatMLP, module__hidden=4, max_epochs=None, training=schedule,
                                 sampler=FixedSampler(n=20, n0=10)).fit(X, y)
    with pytest.raises(ValueError, match=r"^max_epochs=None: FixedSigmaTraining trains for the estimator's "):
        SampleWiseSmoothedClassifier(FlatMLP, module__hidden=4, max_epochs=None).fit(X, y)


@pytest.mark.parametrize("name, value", [("lr", True), ("max_epochs", True), ("batch_size", 0)])
def test_a_model_file_with_a_bad_training_number_is_refused_in_one_line(tmp_path, name, value):
    X, y = np.random.default_rng(0).random((20, 4), dtype=np.float32), np.arange(20) % 2
    saved = tmp_path / "model.safetensors"
    SampleWiseSmoothedClassifier(FlatMLP, module__hidden=4, max_epochs=0).fit(X, y).save(saved)
    document, tensors = read_file(saved)
    document["params"][name] = value
    path = forge(tmp_path / "forged.safetensors", document, tensors)
    with pytest.raises(ValueError) as refusal:
        SampleWiseSmoothedClassifier.load(path)
    message = str(refusal.value)
    assert "\n" not in message and "forged.safetensors" in message and f"'{name}' parameter" in message, message


def test_a_model_file_whose_number_is_a_bool_is_refused_in_one_line(tmp_path):
    X, y = np.random.default_rng(0).random((20, 4), dtype=np.float32), np.arange(20) % 2
    saved = tmp_path / "model.safetensors"
    SampleWiseSmoothedClassifier(FlatMLP, module__hidden=4, max_epochs=0).fit(X, y).save(saved)
    document, tensors = read_file(saved)
    document["params"]["sampler"] = {"class": "smoothsk.sampling.FixedSampler", "params": {"n": True, "n0": 10}}
    path = forge(tmp_path / "bool.safetensors", document, tensors)
    with pytest.raises(ValueError) as refusal:
        SampleWiseSmoothedClassifier.load(path)
    message = str(refusal.value)
    assert "\n" not in message and "bool.safetensors" in message and "'n' parameter" in message, message


def test_the_message_names_what_scikit_learn_would_name():
    # A hidden constraint (a deprecated value, say) is left out of the message, as scikit-learn leaves it out.
    constraints = {"n": [Interval(Integral, 1, None, closed="left"), Hidden(StrOptions({"deprecated"}))]}
    with pytest.raises(InvalidParameterError, match=r"^The 'n' parameter of Caller must be an int in the range "
                                                    r"\[1, inf\)\. Got True instead\.$"):
        validate_parameter_constraints(constraints, {"n": True}, caller_name="Caller")
