"""The estimator's checks of its inputs, labels, parameters, device and module, and its label encoding."""

import reprlib
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.exceptions import DataConversionWarning
from sklearn.preprocessing import LabelEncoder
from sklearn.utils import check_array
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from . import _params
from ._constraints import HasMethods, Hidden, Interval, Options, StrOptions, validate_parameter_constraints
from ._messages import one_line
from ._modes import evaluating
from ._training_steps import check_iterator_options
from .certificates import ABSTAIN
from .experts import takes_noise_level
from .sigma import BaseCertifiedSigma, CertifiedSigmaSelector, classifier_levels


def check_inputs(estimator, X, reset):
    """Validate inputs; returns a float32 C-contiguous array.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        Named in messages; unless ``reset``, fitted (its ``input_shape_``).
    X : array-like or torch.Tensor, shape (n_inputs, *input_shape) or (n_inputs, n_features)
        Flat inputs of the fitted number of features are reshaped; float
        tensors of any precision (bfloat16 included) are converted to float32.
    reset : bool
        True in a ``fit`` that learns the input shape from ``X``.

    Returns
    -------
    X : ndarray of float32, shape (n_inputs, *input_shape)
    """
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu()
        if X.is_floating_point():  # any precision (bfloat16 has no numpy type): the estimator works in float32
            X = X.to(torch.float32)
        X = X.numpy()
    X = check_array(X, allow_nd=True, dtype=np.float32, ensure_all_finite=True,
                    ensure_min_samples=1, estimator=estimator, input_name="X")
    if reset:
        return np.ascontiguousarray(X)
    return np.ascontiguousarray(X.reshape(check_input_shape(estimator, X.shape)))


def check_input_shape(estimator, shape):
    """The shape inputs of shape ``shape`` take for a fitted estimator (flat inputs reshaped), or a ``ValueError``.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        Fitted (its ``input_shape_``).
    shape : tuple of int
        Shape of all the inputs, ``(n_inputs, *input_shape)`` or ``(n_inputs, n_features)``.

    Returns
    -------
    shape : tuple of int
        ``(n_inputs, *input_shape_)``.
    """
    check_is_fitted(estimator, "input_shape_")
    input_shape, name = estimator.input_shape_, type(estimator).__name__
    if shape == input_shape:
        raise ValueError(
            f"X has shape {shape}, the shape of one input: X needs a leading batch axis, "
            f"shape (n_inputs, {', '.join(map(str, input_shape))}) (e.g. X[None]).")
    n_features = int(np.prod(shape[1:]))
    if n_features != estimator.n_features_in_:
        raise ValueError(
            f"X has {n_features} features, but {name} is expecting "
            f"{estimator.n_features_in_} features as input (inputs of shape {input_shape}).")
    if shape[1:] != input_shape and len(shape) != 2:  # flat inputs of the right size are reshaped
        raise ValueError(
            f"X has inputs of shape {shape[1:]}, but {name} was fitted "
            f"on inputs of shape {input_shape}.")
    return (shape[0],) + tuple(input_shape)


def check_training_data(estimator, X, y, reset):
    """Validate training inputs and labels.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
    X : array-like, shape (n_samples, *input_shape)
    y : array-like, shape (n_samples,) or (n_samples, 1)
        Labels; a column vector is raveled with a ``DataConversionWarning``.
    reset : bool
        As in :func:`check_inputs`.

    Returns
    -------
    X : ndarray of float32, shape (n_samples, *input_shape)
    y : ndarray, shape (n_samples,)
    """
    X = check_inputs(estimator, X, reset)
    if y is None:
        raise ValueError(f"{type(estimator).__name__} requires y to be passed, but the target y is None.")
    y = check_label_vector(y, len(X), "y", stacklevel=5)
    check_classification_targets(y)
    return X, y


def check_label_vector(y, n_inputs, name, stacklevel=3, unit="label"):
    """One label (or value) per input: a column vector raveled with a warning, any other shape refused.

    Parameters
    ----------
    y : array-like, shape (n_inputs,) or (n_inputs, 1)
    n_inputs : int or None
        The number of inputs ``y`` must label; None: any.
    name : str
        What ``y`` is called in the messages.
    stacklevel : int, default=3
        Of the warning (3: the caller's caller).
    unit : str, default="label"
        What one entry is called in the messages.

    Returns
    -------
    y : ndarray, shape (n_inputs,)
    """
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        warnings.warn(f"A column-vector {name} was passed when a 1d array was expected; it is raveled "
                      "to shape (n_samples,).", DataConversionWarning, stacklevel=stacklevel)
        y = y.ravel()
    if y.ndim != 1:
        raise ValueError(f"{name} must be one {unit} per input (shape (n,)), got shape {y.shape}.")
    if n_inputs is not None and len(y) != n_inputs:
        raise ValueError(f"X and {name} have inconsistent numbers of samples: X has {n_inputs} inputs "
                         f"but {name} has {len(y)} {unit}s; expected one {unit} per input.")
    return y


def check_classes(classes, source):
    """The sorted distinct labels of ``classes``, refused unless they can be a classifier's classes.

    Parameters
    ----------
    classes : array-like, shape (n_labels,)
        Labels, in any order, possibly repeated.
    source : str
        Where they come from (``"y"``, ``"classes"``), for the messages.

    Returns
    -------
    classes : ndarray, shape (n_classes,)
        Sorted distinct labels.

    Raises
    ------
    ValueError
        With fewer than 2 distinct labels, or with the label ``ABSTAIN``.
    """
    classes = LabelEncoder().fit(np.asarray(classes)).classes_
    if len(classes) < 2:
        raise ValueError(f"Classification needs at least 2 classes in {source}; got {len(classes)} "
                         f"class: {classes.tolist()}.")
    if np.any(classes.astype(object) == ABSTAIN):
        raise ValueError(f"{source} contains the label {ABSTAIN}, which is ABSTAIN, the label predict returns "
                         "where the smoothed classifier abstains; relabel that class.")
    return classes


def encode_labels(y, classes=None, source="classes_"):
    """Class indices of labels ``y``; with ``classes=None`` learns the classes from ``y`` first.

    Parameters
    ----------
    y : ndarray, shape (n_samples,)
    classes : ndarray, shape (n_classes,), optional
        Sorted known or declared classes (``check_classes``); ``y`` must
        hold no other label.
    source : str, default="classes_"
        What ``classes`` is called in the message for an unknown label.

    Returns
    -------
    indices : ndarray of int, shape (n_samples,)
        Position of each label in ``classes``.
    classes : ndarray, shape (n_classes,)
        The given or learnt classes.
    """
    if classes is None:
        classes = check_classes(y, "y")
    unknown = np.setdiff1d(np.unique(y), classes)
    if len(unknown):
        raise ValueError(f"y contains labels {unknown.tolist()} not among {source} {classes.tolist()}.")
    return np.searchsorted(classes, y), classes


def decode_labels(prediction, classes):
    """Labels for class indices, ``ABSTAIN`` kept.

    Parameters
    ----------
    prediction : ndarray of int, shape (n_inputs,)
        Class indices, or ``ABSTAIN``.
    classes : ndarray, shape (n_classes,)

    Returns
    -------
    labels : ndarray, shape (n_inputs,)
        ``classes[prediction]``, ``ABSTAIN`` where abstained: signed integers for
        integer classes (unsigned ones widened, since -1 cast to an unsigned
        type would be one of its values, possibly a class), else object dtype.
    """
    labels = classes[np.maximum(prediction, 0)]
    if labels.dtype.kind == "u":
        # uint8/16/32 widen to a signed type holding them all; uint64 has none (float64 would round).
        signed = np.promote_types(labels.dtype, np.int8)
        labels = labels.astype(signed if signed.kind == "i" else object)
    if labels.dtype.kind == "i":
        return np.where(prediction == ABSTAIN, ABSTAIN, labels)
    labels = labels.astype(object)
    labels[prediction == ABSTAIN] = ABSTAIN
    return labels


def correct_predictions(prediction, y_true):
    """Where a prediction is its true label; ``ABSTAIN`` never is, even against a label -1.

    Parameters
    ----------
    prediction, y_true : ndarray, shape (n_inputs,)
        Compared as objects: ``ABSTAIN`` next to string labels is neither a
        match nor a "mix of label types" error.

    Returns
    -------
    correct : ndarray of bool, shape (n_inputs,)
    """
    prediction = prediction.astype(object)
    return (prediction == y_true.astype(object)) & (prediction != ABSTAIN)


#: scikit-learn constraints of the estimator's own parameters (its components validate theirs), skorch's training
#: loop's numbers included (skorch checks none of them; ``batch_size=-1`` is its whole training set).
ESTIMATOR_CONSTRAINTS = {
    "training": [HasMethods(["run", "batch_sigma"]), None],
    "sigma_search": [HasMethods(["search"]), None],
    "sampler": [HasMethods(["certify"]), None],
    "allocator": [HasMethods(["allocate"]), None],
    "alpha": [Interval(Real, 0, 1, closed="neither")],
    "certify_batch_size": [Interval(Integral, 1, None, closed="left")],
    "certify_autocast": [StrOptions({"bfloat16", "float16"}), None],
    "certify_memory_format": [StrOptions({"auto", "channels_last", "contiguous"})],
    "n_jobs": [Integral, None],
    "random_state": ["random_state"],
    "lr": [Interval(Real, 0, None, closed="left")],
    "max_epochs": [Interval(Integral, 0, None, closed="left"), None],
    "batch_size": [Interval(Integral, 1, None, closed="left"), Hidden(Options(Integral, {-1}))],
    "verbose": [Interval(Integral, 0, None, closed="left"), "boolean"],
    "warm_start": ["boolean"],
}


def smoothing_components(estimator):
    """Check the estimator's own parameters and return the smoothing components in use, each validated.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier

    Returns
    -------
    Components
        For each name in :data:`smoothsk._params.COMPONENTS`, the parameter or its default.

    Raises
    ------
    ValueError
        Naming the parameter; or if a certified sigma function is combined
        with an allocator that does not compose with it.
    """
    values = {key: getattr(estimator, key) for key in ESTIMATOR_CONSTRAINTS}
    validate_parameter_constraints(ESTIMATOR_CONSTRAINTS, values,
                                   caller_name=type(estimator).__name__)
    components = _params.Components.of(estimator)
    for name in _params.COMPONENTS:
        getattr(components, name).validate()
    if (isinstance(components.sigma_search, BaseCertifiedSigma)
            and not getattr(components.allocator, "composes_with_certified_sigma", False)):
        raise ValueError(
            f"allocator={components.allocator!r} does not compose with the certified sigma function "
            f"sigma_search={type(components.sigma_search).__name__}(...): its certificates are not "
            "about g(., sigma(x)) at x. Use allocator=NoRegions() (or None), whose certificates the "
            "sigma function's certificate turns into certificates of G(x) = g(x, sigma(x)).")
    return components


def check_device_available(device):
    """Raise ``ValueError`` if ``device`` names a device this machine does not have.

    Parameters
    ----------
    device : str, torch.device or None
        The estimator's ``device``; None (skorch: leave tensors where they are) passes.
    """
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={device!r} is not a torch device (e.g. 'cpu', 'cuda', "
                         f"'cuda:1').") from error
    available = ["cpu"]
    if torch.cuda.is_available():
        available += [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        available.append("mps")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but CUDA is not available on this machine (torch "
                         f"{torch.__version__}, built with CUDA {torch.version.cuda}); available "
                         f"devices: {available}.")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}, but this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s); available devices: {available}.")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}, but MPS is not available on this machine; available "
                         f"devices: {available}.")


def check_module_output(module, X, n_classes, device):
    """One forward pass on ``X[:1]``: the module must accept it and return logits (1, n_classes).

    The module runs in eval mode (batch norm refuses a batch of one in
    training mode) and is left in the mode it was in.

    Parameters
    ----------
    module : torch.nn.Module
    X : ndarray of float32, shape (n_samples, *input_shape)
    n_classes : int
    device : str, torch.device or None
    """
    try:
        logits = _logits_of_one(module, torch.from_numpy(X[:1]).to(device))
    except Exception as error:
        raise ValueError(
            f"The module {type(module).__name__} rejected one input of shape {(1,) + X.shape[1:]} "
            f"(X has shape {X.shape}): give X the input shape the module expects "
            f"({type(error).__name__}: {error}).") from error
    expected = (1, n_classes)
    found = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    if found != expected:
        raise ValueError(
            f"The module {type(module).__name__} must return logits of shape {expected} for one input "
            f"({expected[1]} classes in y), found {found}: its number of outputs must equal the "
            f"number of classes (module__n_classes, or a module class taking n_classes).")


def _logits_of_one(module, probe):
    """The module's output for the one input ``probe`` (shape (1, *input_shape)), in eval mode, without gradients.

    The module is left in the mode it was in; a module of experts runs every
    expert (the input at each of its levels) and answers with the first.
    """
    with evaluating(module), torch.no_grad():
        if takes_noise_level(module):  # every expert, one input at each of its levels
            return module(probe.expand(len(module.levels), *probe.shape[1:]),
                          torch.tensor(module.levels, device=probe.device))[:1]
        return module(probe)


def check_prefit(estimator, input_shape, classes):
    """Every check of ``from_module`` before its bookkeeping: a trained module, an input shape, its classes.

    The components are validated and a certified sigma function, which needs
    data to be fitted, is refused first; then the module runs once on a zero
    input of ``input_shape`` (in eval mode, without gradients, on the device
    of its weights: no weight or buffer changes) and its logit width is
    compared with ``classes``.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        Unfitted, with ``training=Pretrained(...)`` and the trained module instance as ``module``.
    input_shape : tuple of int
        Shape of one input.
    classes : array-like, shape (n_classes,), or None
        The label of each logit, in order; None means ``range(n_outputs)``.

    Returns
    -------
    probe : ndarray of float32, shape (1, *input_shape)
        The zero input.
    classes : ndarray, shape (n_classes,)

    Raises
    ------
    ValueError
        One line naming the argument: a parameter, a certified sigma function,
        a module that is not an instance, an ``input_shape`` that is not one or
        that the module rejects, a module that does not return logits of one
        row, ``classes`` that are not as many as the logits, not distinct or
        not in ascending order.
    """
    components = smoothing_components(estimator)
    if isinstance(components.sigma_search, BaseCertifiedSigma):
        raise ValueError(
            f"sigma_search={type(components.sigma_search).__name__}(...) is a certified sigma function, which is "
            "fitted on data, and from_module has none: fit it with SampleWiseSmoothedClassifier(module, "
            "training=Pretrained(sigma), sigma_search=...).fit(X, y), which trains no weight either.")
    check_device_available(estimator.device)
    module = estimator.module
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"from_module certifies a trained network as it is: module must be a torch.nn.Module "
                         f"instance, not {module!r}.")
    if (not isinstance(input_shape, (tuple, list)) or not input_shape
            or not all(isinstance(size, Integral) and not isinstance(size, bool) and size >= 1
                       for size in input_shape)):
        raise ValueError(f"input_shape must be the shape of one input, a tuple of positive ints such as (3, 32, 32); "
                         f"got {input_shape!r}.")
    input_shape = tuple(int(size) for size in input_shape)
    weight = next(iter(module.state_dict().values()), None)
    probe = np.zeros((1,) + input_shape, dtype=np.float32)
    try:
        logits = _logits_of_one(module, torch.from_numpy(probe).to(weight.device if weight is not None else "cpu"))
    except Exception as error:
        raise ValueError(f"input_shape={input_shape} does not fit the module {type(module).__name__}: it rejected a "
                         f"zero input of shape {probe.shape} ({type(error).__name__}: "
                         f"{one_line(error)}).") from error
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or len(logits) != 1:
        found = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"The module {type(module).__name__} must return logits of shape (1, n_classes) for one "
                         f"input of input_shape={input_shape}, found {found}.")
    n_outputs = logits.shape[1]
    if n_outputs < 2:
        raise ValueError(f"The module {type(module).__name__} returns {n_outputs} logit for an input of "
                         f"input_shape={input_shape}; a classifier needs one logit per class, at least 2.")
    if classes is None:
        return probe, np.arange(n_outputs)
    given = np.asarray(classes)
    if given.ndim != 1:
        raise ValueError(f"classes must be the label of each logit, a 1-d array; got shape {given.shape}.")
    if len(given) != n_outputs:
        raise ValueError(f"classes has {len(given)} labels, but the module {type(module).__name__} returns "
                         f"{n_outputs} logits for an input of input_shape={input_shape}: give one label per logit.")
    if not np.array_equal(np.unique(given), given):
        raise ValueError(f"classes must be distinct and in ascending order (logit i is classes_[i], sorted as "
                         f"scikit-learn sorts classes_); got {reprlib.repr(given.tolist())}: relabel them, or "
                         "reorder the module's logits.")
    return probe, check_classes(given, "classes")


def check_levels_served(module, sigma_search, levels):
    """Refuse a sigma search that would sample a module of experts at a level it has no expert for.

    Parameters
    ----------
    module : torch.nn.Module instance or class
        The estimator's ``module``.
    sigma_search : BaseSigmaSearch
    levels : ndarray of float or None
        The classifier's grid (:func:`~smoothsk.sigma.classifier_levels`).

    Raises
    ------
    ValueError
        Before any work, if ``module`` takes the noise level and the search
        chooses among levels outside ``levels`` (or among no grid at all).
    """
    if not (isinstance(module, torch.nn.Module) and takes_noise_level(module)):
        return
    if isinstance(sigma_search, CertifiedSigmaSelector):
        if sigma_search.levels is None:
            return  # the experts' own levels
        searched = np.asarray(sigma_search.levels, dtype=np.float64)
    else:
        searched = sigma_search.noise_levels()
    if searched is None or not np.isin(searched, levels).all():
        raise ValueError(f"sigma_search={sigma_search!r} chooses noise levels "
                         f"{'on a continuum' if searched is None else searched.tolist()}, but the module's experts "
                         f"serve only {levels.tolist()}: use a search over those levels (e.g. "
                         "CertifiedSigmaSelector() or FixedSigma at one of them).")


def check_fit(estimator, X, y, reset, classes, fit_params):
    """Every check of a ``fit``/``partial_fit`` call, before any training; returns what training needs.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
    X : array-like of float, shape (n_samples, *input_shape)
    y : array-like, shape (n_samples,)
    reset : bool
        Whether the call initialises the module (learns ``classes_``).
    classes : array-like or None
        ``partial_fit``'s ``classes`` argument.
    fit_params : dict
        The call's keyword arguments for skorch's ``fit_loop``.

    Returns
    -------
    components : Components
        Validated; a certified sigma function checked against the schedule.
    X : ndarray of float32, shape (n_samples, *input_shape)
    y_index : ndarray of int64, shape (n_samples,)
        Indices into ``classes``.
    classes : ndarray, shape (n_classes,)

    Raises
    ------
    TypeError
        If ``fit_params`` holds ``sample_weight`` or ``epochs``.
    ValueError
        Naming what is refused: a parameter, the device, the data, the labels.
    """
    if "sample_weight" in fit_params:
        raise TypeError(f"{type(estimator).__name__} does not support sample_weight: the training "
                        "loss weighs every sample equally; resample the data instead.")
    if "epochs" in fit_params:
        raise TypeError("fit_params may not hold 'epochs': the training schedule sets the epochs of each "
                        "stage itself; set max_epochs or the schedule's epoch parameters instead.")
    components = smoothing_components(estimator)
    components.training.check_module(estimator.module)
    check_iterator_options(estimator)
    check_device_available(estimator.device)
    X, y = check_training_data(estimator, X, y, reset)
    if classes is not None:
        classes = check_classes(classes, "classes")
        if not reset and not np.array_equal(classes, estimator.classes_):
            raise ValueError(f"classes={classes.tolist()} differ from classes_ {estimator.classes_.tolist()}, "
                             "learnt by the call that initialised the module; fit anew to change them.")
    y_index, classes = encode_labels(y, classes, "classes") if reset else encode_labels(y, estimator.classes_)
    levels = classifier_levels(estimator.module, components.training)
    check_levels_served(estimator.module, components.sigma_search, levels)
    if isinstance(components.sigma_search, BaseCertifiedSigma):
        components.sigma_search.check_before_fit(levels, torch.from_numpy(X))
    return components, X, y_index, classes
