"""What every interchangeable component (sigma search, sampler, allocator, schedule) shares."""

from sklearn.base import BaseEstimator, clone

from ._constraints import validate_parameter_constraints


def set_nested_params(owner, names, nested, default):
    """Set nested ``name__parameter`` entries, those of each name on a clone of ``default(name)``.

    How the estimator (for its components) and a component (for a
    sub-component left at None) put a default in place and change it: the
    objects passed by the user are never changed.

    Parameters
    ----------
    owner : object
        Gets each changed clone as its attribute ``name``.
    names : sequence of str
        The component parameters, in the order they are set (a default may
        depend on one set before it).
    nested : dict of str to object
        ``name__parameter`` entries of names in ``names``.
    default : callable
        ``default(name)``: the component the entries of ``name`` are set on
        (after cloning).
    """
    for name in names:
        sub = {key.split("__", 1)[1]: value for key, value in nested.items() if key.split("__", 1)[0] == name}
        if sub:
            setattr(owner, name, clone(default(name)).set_params(**sub))


class Component(BaseEstimator):
    """A small scikit-learn-style object: parameters in ``__init__``, checked on use.

    Subclasses declare ``_parameter_constraints`` (scikit-learn's format) and
    call :meth:`validate` before any expensive work; ``__init__`` stores
    parameters unchanged, as scikit-learn requires for ``clone``.
    """

    _parameter_constraints: dict = {}

    def validate(self):
        """Raise ``ValueError`` naming the parameter if a parameter is invalid.

        Parameters that are components themselves are validated too.

        Returns
        -------
        self
        """
        params = self.get_params(deep=False)
        validate_parameter_constraints(self._parameter_constraints, params, caller_name=type(self).__name__)
        for value in params.values():
            if isinstance(value, Component):  # e.g. a schedule's objective
                value.validate()
        self._check_consistency()
        return self

    def _check_consistency(self):
        """Hook for checks that involve several parameters."""

    def set_params(self, **params):
        """Set parameters, nested parameters of sub-components included (``objective__epsilon``).

        A nested parameter of a sub-component left at None is set on a
        clone of the default that None stands for, as the estimator does
        for its own components. That default is built from this
        component's parameters as they are now, and then kept: a later
        change of them (e.g. PFAT's ``sigma_max`` after
        ``assignment__n``) does not rebuild it. Set such parameters in the
        same call or before.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Naming the nested parameter, if its sub-component is None and
            has no default.
        """
        super().set_params(**{key: value for key, value in params.items() if "__" not in key})
        names = [name for name, value in self.get_params(deep=False).items() if value is None]
        at_default = {key: value for key, value in params.items()
                      if "__" in key and key.split("__", 1)[0] in names}

        def default(name):
            value = self._default_component(name)
            if value is None:
                key = next(key for key in at_default if key.startswith(f"{name}__"))
                raise ValueError(f"{key}: {type(self).__name__}'s {name} is None, and what None stands for is "
                                 f"not a component made here whose parameters could be set; set {name} first.")
            return value

        set_nested_params(self, names, at_default, default)
        return super().set_params(**{key: value for key, value in params.items()
                                     if "__" in key and key not in at_default})

    def _default_component(self, name):
        """The component that parameter ``name`` left at None stands for (its documented default), or None."""
        return None

    def _component(self, name):
        """Parameter ``name``, or for None the default component it stands for (:meth:`_default_component`)."""
        value = getattr(self, name)
        return self._default_component(name) if value is None else value
