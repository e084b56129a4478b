"""scikit-learn's estimator checks (the imbalanced-learn pattern)."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler

EXPECTED_FAILED_CHECKS = {
    "check_no_attributes_set_in_init":
        "skorch's NeuralNet.__init__ sets history_, initialized_ and virtual_params_.",
    "check_classifiers_classes":
        "the label -1 is ABSTAIN, so y containing -1 is refused with a ValueError.",
    "check_classifiers_train":
        "predict abstains (-1) where PREDICT's binomial test fails, so it differs from argmax(predict_proba).",
}


@parametrize_with_checks(
    [SampleWiseSmoothedClassifier(FlatMLP, module__hidden=16, sampler=FixedSampler(n=100, n0=10),
                                  max_epochs=5, lr=0.1, random_state=0)],
    expected_failed_checks=lambda estimator: EXPECTED_FAILED_CHECKS,
)
def test_sklearn_compatible(estimator, check):
    check(estimator)
