"""Certified-robustness metrics and scikit-learn scorers."""

import hashlib
import pickle
from types import SimpleNamespace

import numpy as np
import torch

from ._inputs import dataset_labels, is_streamed, values_digest
from ._validation import check_label_vector, correct_predictions
from .pipeline import _split, certify
from .statistics import first_offender

__all__ = [
    "average_certified_radius",
    "certified_accuracy",
    "certified_accuracy_curve",
    "acr_scorer",
    "make_certified_accuracy_scorer",
    "certification_scorers",
]


def _correct_radius(y_true, prediction, radius):
    """Radius where the certified prediction is correct, NaN where it is wrong or ``ABSTAIN``.

    NaN compares false with every threshold, ``-inf`` included.
    """
    y_true = check_label_vector(y_true, None, "y_true", stacklevel=4)
    prediction = check_label_vector(prediction, None, "prediction", stacklevel=4)
    radius = check_label_vector(radius, None, "radius", stacklevel=4, unit="radius").astype(np.float64)
    if not (len(y_true) == len(prediction) == len(radius)):
        raise ValueError(f"y_true, prediction and radius must have the same length; got "
                         f"{len(y_true)}, {len(prediction)} and {len(radius)}.")
    if len(radius) == 0:
        raise ValueError("y_true, prediction and radius are empty; the metrics need at least one input.")
    if not np.all(radius >= 0):
        raise ValueError(f"radius must be >= 0 for every input (0 where abstained); got "
                         f"{first_offender(radius, ~(radius >= 0))}.")
    return np.where(correct_predictions(prediction, y_true), radius, np.nan)


def average_certified_radius(y_true, prediction, radius):
    """Average certified radius (ACR): mean of the radius where correct, else 0.

    Parameters
    ----------
    y_true : array-like, shape (n_inputs,)
        True labels.
    prediction : array-like, shape (n_inputs,)
        Certified labels (``ABSTAIN`` counts as wrong).
    radius : array-like of float, shape (n_inputs,)
        Certified radii, >= 0 (``inf`` allowed).

    Returns
    -------
    float

    Examples
    --------
    >>> average_certified_radius([0, 1, 1], [0, 1, 0], [0.5, 1.0, 2.0])
    0.5
    """
    correct_radius = _correct_radius(y_true, prediction, radius)
    return float(np.mean(np.where(np.isnan(correct_radius), 0.0, correct_radius)))


def certified_accuracy(y_true, prediction, radius, r):
    """Fraction of inputs predicted correctly with a certified radius of at least ``r``.

    Parameters
    ----------
    y_true, prediction, radius : array-like, shape (n_inputs,)
        As in :func:`average_certified_radius`.
    r : float
        Radius threshold, finite and >= 0.

    Returns
    -------
    float

    Examples
    --------
    >>> certified_accuracy([0, 1, 1], [0, 1, 0], [0.5, 1.0, 2.0], 0.75)
    0.3333333333333333
    """
    return float(np.mean(_correct_radius(y_true, prediction, radius) >= _threshold(r, "r")))


def certified_accuracy_curve(y_true, prediction, radius, radii):
    """Certified accuracy at each radius of ``radii``.

    Parameters
    ----------
    y_true, prediction, radius : array-like, shape (n_inputs,)
    radii : array-like of float, shape (n_radii,)
        Radius thresholds, each finite and >= 0.

    Returns
    -------
    ndarray of float, shape (n_radii,)
    """
    correct_radius = _correct_radius(y_true, prediction, radius)
    if np.ndim(radii) != 1:
        raise ValueError(f"radii must be a 1-d array of radius thresholds; got shape {np.shape(radii)}.")
    radii = np.array([_threshold(r, "radii") for r in radii])
    return (correct_radius[None, :] >= radii[:, None]).mean(axis=1)


def _threshold(r, name):
    """A radius threshold as a float, refused unless a finite number >= 0."""
    try:
        value = float(r)
    except (TypeError, ValueError):
        value = np.nan
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0; got {r!r}.")
    return value


def _true_labels(X, y):
    """``y``, or where it is None the labels of a Dataset ``X`` of ``(input, label)`` pairs."""
    if y is None:
        y = dataset_labels(X)
        if y is None:
            raise ValueError("The scorer needs the true labels y, unless X is a Dataset of (input, label) pairs.")
    return y


def acr_scorer(estimator, X, y=None):
    """Scorer ``(estimator, X, y) -> ACR`` for ``GridSearchCV(scoring=acr_scorer)``.

    ``estimator`` is a smoothed classifier or a Pipeline ending in one; radii
    are in the space of ``X`` (see :func:`smoothsk.certify`). ``X`` may be a
    Dataset of ``(input, label)`` pairs, whose labels are used where ``y`` is None.
    """
    prediction, radius = certify(estimator, X)
    return average_certified_radius(_true_labels(X, y), prediction, radius)


def make_certified_accuracy_scorer(r):
    """Scorer ``(estimator, X, y) -> certified accuracy at radius r``.

    Parameters
    ----------
    r : float
        Radius in the space of the scorer's ``X`` (a Pipeline's raw inputs,
        see :func:`smoothsk.certify`).

    Returns
    -------
    callable
        ``scorer(estimator, X, y=None)``; ``y`` None takes the labels of a
        Dataset ``X`` of ``(input, label)`` pairs.
    """
    r = _threshold(r, "r")

    def scorer(estimator, X, y=None):
        prediction, radius = certify(estimator, X)
        return certified_accuracy(_true_labels(X, y), prediction, radius, r)

    scorer.__name__ = f"certified_accuracy_at_{r:g}"
    return scorer


class _CertifyOnce:
    """One ``certify`` call per (estimator, X) shared by the scorers of one dict.

    The result is kept (with the estimator and X themselves, so identity
    checks cannot be fooled by a recycled ``id``) until every scorer of the
    dict has used it; a scorer asking a second time means a new round
    (e.g. the same estimator refitted), which certifies again. It is kept
    with a digest of the estimator and X as they were after the call
    (:func:`_state_digest`: weights, parameters, regions, fitted sigma
    function, a Pipeline's preprocessing, the values of X: a memory-mapped
    array or a Dataset read by chunks), and reused only
    while that digest holds: an estimator refitted, edited or set other
    parameters, or X edited, between two scorers of one round is certified
    again. An estimator whose state cannot be pickled, so not digested, is
    certified by every scorer.
    """

    def __init__(self, n_scorers):
        self.n_scorers = n_scorers
        self.last = None

    def __call__(self, name, estimator, X):
        last = self.last
        if (last is None or last[0] is not estimator or last[1] is not X or name in last[3]
                or last[4] is None or _state_digest(estimator, X) != last[4]):
            last = (estimator, X, certify(estimator, X), set())
            last += (_state_digest(estimator, X),)  # the state the certify call left
        last[3].add(name)
        self.last = None if len(last[3]) == self.n_scorers else last
        return last[2]


def _state_digest(estimator, X):
    """SHA-256 of X, a Pipeline's preprocessing and the smoothed classifier's attributes; None if not picklable.

    The classifier is digested by its attributes (parameters and fitted
    state), not as an object, so that a subclass defined where pickle
    cannot find it is digested too; tensors by their values
    (:class:`_TensorValuePickler`).
    """
    preprocessing, classifier = _split(estimator)
    digest = hashlib.sha256()
    if is_streamed(X):  # by its values, a chunk at a time (pickling would copy it whole)
        X = values_digest(X)
    try:
        _TensorValuePickler(SimpleNamespace(write=digest.update)).dump((X, preprocessing, vars(classifier)))
    except (pickle.PicklingError, TypeError, AttributeError):
        return None
    return digest.hexdigest()


class _TensorValuePickler(pickle.Pickler):
    """Pickles a tensor as its dtype, shape and bytes (torch's own pickle of equal tensors differs)."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach().cpu().contiguous()
            return torch.Tensor, (str(tensor.dtype), tuple(tensor.shape),
                                  tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        return NotImplemented


def certification_scorers(radii):
    """Scorers for ACR and certified accuracy at each radius, certifying each (estimator, X) once.

    ``GridSearchCV(scoring=certification_scorers([0.25, 0.5]), refit="acr")``
    calls the scorers one after another on the same fitted estimator and
    split; they share one ``certify`` call. A scorer called again on the
    same estimator and X (e.g. after a refit) certifies afresh, and so does
    a scorer called after the estimator or X changed (refitted, weights
    edited, parameters set, another ``certify`` call that grew its
    regions, X edited in place).

    Parameters
    ----------
    radii : iterable of float
        In the space of the scorers' ``X`` (a Pipeline's raw inputs, see
        :func:`smoothsk.certify`).

    Returns
    -------
    dict of str -> callable
        ``"acr"`` and ``"certified_accuracy_at_<r>"`` per distinct radius
        (``<r>`` with 6 significant digits); each ``scorer(estimator, X,
        y=None)``, ``y`` None taking the labels of a Dataset ``X`` of
        ``(input, label)`` pairs.

    Raises
    ------
    ValueError
        If a radius is not finite and >= 0, or two distinct radii get the
        same name.
    """
    thresholds = {}
    for r in radii:
        r = _threshold(r, "radii")
        name = f"certified_accuracy_at_{r:g}"
        if thresholds.get(name, r) != r:
            raise ValueError(f"radii {thresholds[name]!r} and {r!r} both give the scorer name {name!r}; "
                             "pass radii that differ in their first 6 significant digits.")
        thresholds[name] = r
    certify = _CertifyOnce(1 + len(thresholds))

    def acr(estimator, X, y=None):
        prediction, radius = certify("acr", estimator, X)
        return average_certified_radius(_true_labels(X, y), prediction, radius)

    scorers = {"acr": acr}
    for name, r in thresholds.items():
        def at_r(estimator, X, y=None, r=r, name=name):
            prediction, radius = certify(name, estimator, X)
            return certified_accuracy(_true_labels(X, y), prediction, radius, r)
        scorers[name] = at_r
    return scorers
