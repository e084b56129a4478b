"""The estimator's component parameters: their defaults and nested ``set_params`` routing (``sampler__n``)."""

from dataclasses import dataclass

from ._components import set_nested_params
from .regions import NoRegions
from .sampling import FixedSampler
from .training import FixedSigmaTraining

#: The parameters that hold interchangeable components, in the order they act.
COMPONENTS = ("training", "sigma_search", "sampler", "allocator")


@dataclass(frozen=True)
class Components:
    """The components an estimator uses, its parameters or their defaults (see :func:`component`).

    The sigma search is the one the training schedule lets the estimator
    run (``BaseTrainingSchedule.sigma_search_for``): the parameter as given,
    except where training limits the levels it may choose.

    Attributes
    ----------
    training : BaseTrainingSchedule
    sigma_search : BaseSigmaSearch
    sampler : BaseSampler
    allocator : RegionAllocator
    """

    training: object
    sigma_search: object
    sampler: object
    allocator: object

    @classmethod
    def of(cls, estimator):
        """The components ``estimator`` uses now (resolved at each call: ``set_params`` may change them).

        Parameters
        ----------
        estimator : SampleWiseSmoothedClassifier

        Returns
        -------
        Components
        """
        components = {name: component(estimator, name) for name in COMPONENTS}
        components["sigma_search"] = components["training"].sigma_search_for(estimator, components["sigma_search"])
        return cls(**components)


def component(estimator, name):
    """The component in use for ``name``: the parameter, or the default that None stands for.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
    name : {"training", "sigma_search", "sampler", "allocator"}

    Returns
    -------
    Component
        The parameter; for None a new default instance (the sigma search
        is the training schedule's default).
    """
    value = getattr(estimator, name)
    if value is not None:
        return value
    if name == "training":
        return FixedSigmaTraining()
    if name == "sigma_search":
        return component(estimator, "training").default_sigma_search()
    if name == "sampler":
        return FixedSampler()
    return NoRegions()


def check_callbacks(callbacks):
    """Refuse a ``callbacks`` value skorch would fail on later, after changing the estimator.

    Parameters
    ----------
    callbacks : object
        The value passed to ``set_params(callbacks=...)``.

    Raises
    ------
    TypeError
        Unless it is None, ``'disable'`` or a list or tuple.
    """
    if not (callbacks is None or isinstance(callbacks, (list, tuple)) or
            (isinstance(callbacks, str) and callbacks == "disable")):
        raise TypeError(f"callbacks must be a list of callbacks or (name, callback) pairs, "
                        f"'disable' or None; got {callbacks!r}.")


def split_nested(params):
    """Split ``set_params`` arguments into the estimator's own and the components' nested ones.

    Parameters
    ----------
    params : dict of str to object

    Returns
    -------
    own : dict of str to object
        Parameters skorch's ``set_params`` handles (its own prefixes included).
    nested : dict of str to object
        ``component__parameter`` entries of a name in :data:`COMPONENTS`.
    """
    nested = {key: val for key, val in params.items() if "__" in key and key.split("__", 1)[0] in COMPONENTS}
    own = {key: val for key, val in params.items() if key not in nested}
    return own, nested


def set_component_params(estimator, nested):
    """Set nested component parameters, each on a clone of the component (or of its default).

    The component objects the user passed are never changed; a component
    left at None first gets its default, so ``set_params(sampler__n=1000)``
    works on a default-constructed estimator.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
    nested : dict of str to object
        ``component__parameter`` entries (see :func:`split_nested`).
    """
    set_nested_params(estimator, COMPONENTS, nested, lambda name: component(estimator, name))
