"""Certification through scikit-learn Pipelines, with radii in the pipeline's input space."""

import dataclasses
import math

from sklearn.pipeline import Pipeline

from ._inputs import is_dataset
from ._lipschitz import lipschitz_constant

__all__ = ["certify", "lipschitz_constant"]


def _split(estimator):
    """Preprocessing Pipelines (outermost first) and the final estimator of nested Pipelines."""
    preprocessing = []
    while isinstance(estimator, Pipeline):
        if len(estimator.steps) > 1:
            preprocessing.append(estimator[:-1])
        estimator = estimator.steps[-1][1]
    return preprocessing, estimator


def certify(estimator, X, return_details=False, **kwargs):
    """Certified prediction and L2 radius per input, of a smoothed classifier or a Pipeline ending in one.

    For a :class:`~smoothsk.SampleWiseSmoothedClassifier` this is its
    ``certify``. For a fitted Pipeline whose last step is one (possibly the
    last step of a nested Pipeline), ``X`` goes through the preceding steps
    and the last step certifies; its radius R, measured in the classifier's
    input space, is divided by the L2 Lipschitz constant L of the
    preprocessing (the product over its steps) to give a radius in the
    pipeline's input space, the units of ``X``.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier or Pipeline
        Fitted. The steps before the classifier must have a known Lipschitz
        constant (see :func:`smoothsk.pipeline.lipschitz_constant`).
    X : array-like, shape (n_inputs, ...)
        Inputs in the estimator's input space (for a Pipeline, its raw inputs).
    return_details : bool, default=False
        Also return the per-input :class:`~smoothsk.Certificates`.
    **kwargs
        Passed on to the classifier's ``certify`` (e.g. ``checkpoint``).

    Returns
    -------
    prediction : ndarray, shape (n_inputs,)
        Certified labels, ``ABSTAIN`` (-1) where abstained.
    radius : ndarray of float, shape (n_inputs,)
        Certified L2 radius in the space of ``X`` (R / L for a Pipeline), 0
        where abstained.
    details : Certificates
        Only with ``return_details``. For a Pipeline, ``details.radius`` is
        the returned radius, ``radius_cap`` is the classifier's divided by L
        (in the units of ``radius``), ``radius_space`` is ``"pipeline
        input"`` and ``lipschitz_constant`` is L; ``sigma`` and ``p_lower``
        stay those of the classifier's input space.

    Raises
    ------
    ValueError
        If a preprocessing step has no known Lipschitz constant: raised
        before any transform or sampling.
    TypeError
        If the (last step of the) estimator cannot certify, or ``X`` is a
        Dataset given to a Pipeline (its steps transform arrays).

    Notes
    -----
    The Pipeline classifies x as G(T(x)), T the preprocessing and G the
    classifier the last step's certificate is about (its allocator says
    which). That certificate states, with probability at least 1 - alpha,
    that G predicts the class on the ball of radius R around T(x). Every x'
    with ||x' - x|| <= R / L has ||T(x') - T(x)|| <= L ||x' - x|| <= R, so
    x' -> G(T(x')) predicts the class on the ball of radius R / L around x:
    the same event, the same probability. L is a property of the fitted
    preprocessing, fixed before any noise is drawn, so no alpha is spent on it.
    Rounding in ``transform`` and the cast to float32 are not accounted for,
    as for inputs given to the classifier directly.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import PolynomialFeatures
    >>> from smoothsk import SampleWiseSmoothedClassifier
    >>> from smoothsk.models import FlatMLP
    >>> pipe = make_pipeline(PolynomialFeatures(), SampleWiseSmoothedClassifier(FlatMLP))
    >>> certify(pipe, np.zeros((1, 2)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Cannot certify through the step 'polynomialfeatures' (PolynomialFeatures): ...
    """
    preprocessing, final = _split(estimator)
    # Before any work: refuse unknown steps, and estimators that cannot certify.
    lipschitz = math.prod(lipschitz_constant(steps) for steps in preprocessing)
    if not callable(getattr(final, "certify", None)):
        what = "estimator" if final is estimator else "the last step of the Pipeline estimator"
        raise TypeError(f"{what} must be a SampleWiseSmoothedClassifier (an estimator with a certify "
                        f"method); got {final!r}.")
    if final is estimator:
        return estimator.certify(X, return_details=return_details, **kwargs)
    if is_dataset(X):
        raise TypeError("X is a Dataset, but the steps of a Pipeline transform arrays: pass an array, or the "
                        "transformed inputs to its last step (a Dataset is read by chunks there).")
    for steps in preprocessing:
        X = steps.transform(X)
    prediction, radius, details = final.certify(X, return_details=True, **kwargs)
    # R1, the cap of a certified sigma function, is a radius too: the same argument moves it to the input space.
    details = dataclasses.replace(details, radius=radius / lipschitz, radius_cap=details.radius_cap / lipschitz,
                                  radius_space="pipeline input", lipschitz_constant=lipschitz)
    if return_details:
        return prediction, details.radius, details
    return prediction, details.radius
