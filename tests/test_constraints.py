"""Parameter validation: scikit-learn's constraints, with booleans kept out of numbers."""

from numbers import Integral

import numpy as np
import pytest
from sklearn.utils._param_validation import Hidden
from test_persistence_untrusted import forge, read_file

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._constraints import Interval, InvalidParameterError, StrOptions, validate_parameter_constraints
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler, SequentialSampler
from smoothsk.sigma import CertifiedSigmaSelector, GridSigmaSearch, MultiStartFGSS
from smoothsk.training import FixedSigmaTraining


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
