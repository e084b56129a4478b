"""scikit-learn's estimator checks with every component, and what the estimator may do to its components.

The component lists at the top hold one cheap instance of every public
component class, per kind. A new component class goes into its kind's list:
``test_every_component_class_is_listed`` fails until it is there, and from
then on it gets the ``clone`` round trip, the no-mutation test and
scikit-learn's checks.
"""

import copy
import importlib
import pkgutil

import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import _get_check_estimator_ids, estimator_checks_generator

import smoothsk
from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._components import Component
from smoothsk.models import FlatMLP
from smoothsk.regions import MemoryAllocator, NoRegions, OnlineBallAllocator, TransductiveLPAllocator
from smoothsk.sampling import FixedSampler, InputSpecificSampler, SequentialSampler
from smoothsk.sigma import (
    CertifiedSigmaSelector,
    FixedSigma,
    GradientSigmaSearch,
    GridSigmaSearch,
    MultiStartFGSS,
    SemiElasticSigma,
)
from smoothsk.training import (
    Consistency,
    DataDependentTraining,
    FixedSigmaTraining,
    GaussianNoise,
    InstaRSTrain,
    Macer,
    Pretrained,
    PretrainFinetune,
    SmoothAdv,
)

# ------------------------------------------------- components, one list per kind (cheap settings)

SCHEDULES = [
    FixedSigmaTraining(0.25),
    PretrainFinetune(pretrain_epochs=2, finetune_epochs=1, objective=GaussianNoise(),
                     assignment=GridSigmaSearch(0.12, 0.5, step=0.2, n=10)),
    InstaRSTrain(max_level=2, update_every=1, num_noise=2, stage1_epochs=2, stage2_epochs=1,
                 stage1_objective=GaussianNoise(), stage2_objective=Macer(num_noise=2)),
    DataDependentTraining(lr=0.01, warmup_epochs=1, objective=SmoothAdv(steps=1, num_noise=1)),
]
SIGMA_SEARCHES = [
    FixedSigma(0.25),
    GridSigmaSearch(0.12, 0.5, step=0.2, n=10),
    MultiStartFGSS(max_level=3, n=10),
    MultiStartFGSS(max_level=3, n=10, per_input=False),
    GradientSigmaSearch(steps=2, lr=0.01),
    CertifiedSigmaSelector(levels=(0.12, 0.25, 0.5), n=20, n0=5, selector_epochs=1),
    SemiElasticSigma(0.25, r=0.05, k=3),
]
SAMPLERS = [
    FixedSampler(n=100, n0=10),
    InputSpecificSampler(n_max=100, n0_fraction=0.1),
    SequentialSampler(n_max=200, first=50, n0=10),
]
ALLOCATORS = [
    NoRegions(),
    OnlineBallAllocator(),
    TransductiveLPAllocator(),
    MemoryAllocator(),
]
OBJECTIVES = [
    GaussianNoise(),
    SmoothAdv(steps=1, num_noise=1),
    Macer(num_noise=2),
    Consistency(lbd=5.0, base=SmoothAdv(epsilon=0.5, steps=1, num_noise=2)),
]
#: Components checked on their own only: ``Pretrained`` needs a trained module instance, which the estimator checks'
#: fresh fits do not give (its estimator is tested in test_training_pretrained.py).
ON_THEIR_OWN = [Pretrained(sigma=0.5)]
COMPONENTS = SCHEDULES + SIGMA_SEARCHES + SAMPLERS + ALLOCATORS + OBJECTIVES + ON_THEIR_OWN

#: The estimator parameter each kind is passed as (objectives go inside schedules).
PARAMETER = {id(component): name for name, kind in [
    ("training", SCHEDULES), ("sigma_search", SIGMA_SEARCHES), ("sampler", SAMPLERS), ("allocator", ALLOCATORS)]
    for component in kind}


def smoothed(**components):
    """The estimator of the checks: a tiny MLP, few epochs, few Monte Carlo samples.

    ``components`` replace the defaults one at a time. A schedule comes with
    ``FixedSigma``: the checks then train with the schedule, and predict does
    not pay for the schedule's default test-time search (a variant of its own).
    """
    params = {"sampler": FixedSampler(n=100, n0=10), **components}
    if "training" in components and "sigma_search" not in components:
        params["sigma_search"] = FixedSigma(0.25)
    return SampleWiseSmoothedClassifier(FlatMLP, module__hidden=8, max_epochs=3, lr=0.1, random_state=0, **params)


def component_id(component):
    """A short test id: the kind's parameter (if any), the class and the position in COMPONENTS."""
    kind = PARAMETER.get(id(component), "training" if isinstance(component, Pretrained) else "objective")
    return f"{kind}-{type(component).__name__}-{next(i for i, c in enumerate(COMPONENTS) if c is component)}"


#: The estimator's defaults in ``smoothed()``: a variant with one of these would repeat the default variant.
DEFAULTS = {"training": FixedSigmaTraining(), "sigma_search": FixedSigma(), "sampler": FixedSampler(n=100, n0=10),
            "allocator": NoRegions()}

#: The default estimator, then every non-default component varied once from the defaults.
VARIANTS = [("defaults", smoothed())] + [
    (component_id(c), smoothed(**{PARAMETER[id(c)]: c})) for c in COMPONENTS
    if id(c) in PARAMETER and joblib.hash(c) != joblib.hash(DEFAULTS[PARAMETER[id(c)]])]

EXPECTED_FAILED_CHECKS = {
    "check_no_attributes_set_in_init":
        "skorch's NeuralNet.__init__ sets history_, initialized_ and virtual_params_.",
    "check_classifiers_classes":
        "the label -1 is ABSTAIN, so y containing -1 is refused with a ValueError.",
    "check_classifiers_train":
        "predict abstains (-1) where PREDICT's binomial test fails, so it differs from argmax(predict_proba).",
}


def expected_failed_checks(estimator):
    """The checks ``estimator`` fails by design, each with its reason."""
    expected = dict(EXPECTED_FAILED_CHECKS)
    if isinstance(estimator.sigma_search, MultiStartFGSS) and not estimator.sigma_search.per_input:
        expected["check_methods_subset_invariance"] = (
            "MultiStartFGSS(per_input=False) learns one sigma for all inputs of a call (Insta-RS Alg. 3), "
            "so an input's prediction depends on the other inputs.")
    return expected


def sklearn_checks():
    """``(estimator, check)`` pairs of scikit-learn's checks for every variant, with readable ids.

    Expected failures are strict: a check that starts passing must leave the list.
    """
    for name, estimator in VARIANTS:
        for item in estimator_checks_generator(estimator, legacy=True, mark="xfail", xfail_strict=True,
                                               expected_failed_checks=expected_failed_checks(estimator)):
            values, marks = (item.values, item.marks) if hasattr(item, "marks") else (item, ())
            yield pytest.param(*values, marks=marks, id=f"{name}-{_get_check_estimator_ids(values[1])}")


@pytest.mark.parametrize("estimator, check", sklearn_checks())
def test_sklearn_compatible(estimator, check):
    check(estimator)


# ------------------------------------------------------------------------ component classes

def public_component_classes():
    """Every public, concrete component class of the package (the ``Base*`` classes excluded)."""
    for module in pkgutil.walk_packages(smoothsk.__path__, "smoothsk."):
        importlib.import_module(module.name)
    classes = set()
    for package in (smoothsk.training, smoothsk.sigma, smoothsk.sampling, smoothsk.regions):
        for name in package.__all__:
            obj = getattr(package, name)
            if isinstance(obj, type) and issubclass(obj, Component) and not name.startswith("Base"):
                classes.add(obj)
    return classes


def test_every_component_class_is_listed():
    missing = public_component_classes() - {type(component) for component in COMPONENTS}
    assert not missing, f"add an instance of {sorted(c.__name__ for c in missing)} to the lists of test_common.py"


@pytest.mark.parametrize("component", COMPONENTS, ids=component_id)
def test_clone_and_get_params_round_trip(component):
    params = component.get_params(deep=True)
    cloned = clone(component)
    assert type(cloned) is type(component) and cloned is not component
    assert joblib.hash(cloned.get_params(deep=True)) == joblib.hash(params)
    rebuilt = type(component)(**component.get_params(deep=False))
    assert joblib.hash(rebuilt) == joblib.hash(component)
    # set_params with the component's own (deep) parameters changes nothing.
    assert joblib.hash(clone(component).set_params(**params)) == joblib.hash(component)
    # And the estimator routes nested parameters to it.
    if id(component) in PARAMETER:
        name = PARAMETER[id(component)]
        estimator = SampleWiseSmoothedClassifier(FlatMLP, **{name: component})
        nested = {f"{name}__{key}": value for key, value in params.items()}
        assert joblib.hash({key: estimator.get_params()[key] for key in nested}) == joblib.hash(nested)
        estimator = clone(estimator)
        assert joblib.hash(getattr(estimator, name)) == joblib.hash(component)


# ------------------------------------------------- fit, certify and predict leave components alone

@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 4)).astype(np.float32)
    X[:20, 0] += 3.0
    y = (np.arange(40) < 20).astype(int)
    return X, y


@pytest.mark.parametrize("component", [c for c in COMPONENTS if id(c) in PARAMETER], ids=component_id)
def test_fit_certify_predict_leave_components_unchanged(component, blobs):
    """The components the user passed are parameters: no call writes into them (fitted state lives elsewhere)."""
    X, y = blobs
    estimator = clone(smoothed(**{PARAMETER[id(component)]: component}))
    components = {name: value for name, value in estimator.get_params(deep=False).items()
                  if isinstance(value, Component)}
    before = {name: joblib.hash(copy.deepcopy(value)) for name, value in components.items()}
    estimator.fit(X, y)
    estimator.partial_fit(X, y)
    estimator.set_params(warm_start=True).fit(X, y)
    estimator.certify(X[:6])
    estimator.predict(X[:6])
    estimator.predict_proba(X[:6])
    for name, value in components.items():
        assert getattr(estimator, name) is value
        assert joblib.hash(value) == before[name], f"{name}={value!r} was changed"
