"""The ``smoothsk`` command line.

``smoothsk demo`` runs the main job on the bundled digits; ``smoothsk fit`` and
``smoothsk certify`` train and certify on your own data (``.npz``; ``certify``
also reads an ``.npy`` of inputs and a folder of images, by chunks)
without writing Python.
"""

import argparse
import csv
import math
import os
import sys
import time

import numpy as np
import torch
from sklearn.base import clone

from . import ABSTAIN, SampleWiseSmoothedClassifier
from ._atomic import atomic_file, resolved, unwritable_reason
from ._checkpoint import check_path
from ._demo import FULL, QUICK, run_demo
from ._image_folder import ImageFolder
from ._messages import quoted
from ._model_file import MIN_KEY_BYTES, read_safetensors
from ._module_state import load_module_state
from ._npz import NpyFile, NpzArchive
from ._params import Components
from ._presets import MODULES, PRESETS, TRAINING_SETTINGS, fixed_sigma_preset, preset_params
from ._regular_file import open_regular_file
from ._validation import check_device_available, correct_predictions
from .allocator import keep_freed_memory
from .metrics import average_certified_radius, certified_accuracy_curve
from .models import CifarResNet, Normalize, Normalized
from .sampling import FixedSampler

#: ``smoothsk certify --out -``: the CSV goes to standard output (and the command's messages to standard error).
STDOUT = "-"

#: The radii (in the units of X) at which ``smoothsk certify`` reports certified accuracy when the data have labels.
SUMMARY_RADII = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)


def run_demo_command(args):
    """``smoothsk demo``: the comparison table, its notes and pictures (:func:`smoothsk._demo.run_demo`)."""
    run_demo(args)
    return 0


class InputFileError(ValueError):
    """A file given on the command line is not what the command needs (the message names it)."""

    @classmethod
    def unreadable(cls, name, error):
        """The error for a file named ``name`` that the ``OSError`` ``error`` kept from being read."""
        return cls(f"{name}: cannot read it ({error.strerror or error}).")


def read_npz(path, require_y):
    """Read and check the arrays ``X`` and ``y`` of an ``.npz`` file, which may be hostile.

    The file is read by :class:`smoothsk._npz.NpzArchive`: each array's
    sizes are checked in the zip directory and its ``.npy`` header before
    any of it is read or allocated (no zip bombs, no headers declaring more
    than the file holds, no pickles).

    Parameters
    ----------
    path : str
        A file written by ``np.savez`` / ``np.savez_compressed``.
    require_y : bool
        Whether the labels ``y`` must be present (``fit``) or are optional
        (``certify``).

    Returns
    -------
    X : ndarray of float32, shape (n_inputs, *input_shape)
        The inputs.
    y : ndarray of shape (n_inputs,), or None
        Integer, boolean or string labels; None when absent and not required.

    Raises
    ------
    InputFileError
        Naming ``path`` and what is wrong: not a readable ``.npz`` archive,
        an array it refuses to read (see :mod:`smoothsk._npz`), ``X`` or
        ``y`` missing, of the wrong dtype or shape, inputs that are not
        finite as float32, or lengths that differ.
    """
    try:
        archive = NpzArchive(path)
    except OSError as exc:  # no file to read (missing, a FIFO, empty): no archive to write
        raise InputFileError.unreadable(path, exc) from exc
    except ValueError as exc:
        message = f"{path}: not a readable .npz file ({exc}); write it with np.savez(path, X=X, y=y)."
        raise InputFileError(message) from exc
    with archive:
        arrays = {}
        for name in ("X", "y"):
            if name not in archive.names:
                if name == "X" or require_y:
                    raise InputFileError(f"{path}: no array {name!r} (the file has {quoted(archive.names)}); "
                                         f"write it with np.savez(path, X=X, y=y).")
                continue
            try:
                arrays[name] = archive.read(name)
            except ValueError as exc:
                raise InputFileError(f"{path}: {exc}.") from exc
    X, y = arrays["X"], arrays.get("y")
    if X.dtype.kind != "f":
        raise InputFileError(f"{path}: X must be a float array of inputs; got dtype {X.dtype} "
                             f"(convert it, e.g. X.astype('float32') / 255 for 8-bit images).")
    if X.ndim < 2 or len(X) == 0:
        raise InputFileError(f"{path}: X must have shape (n_inputs, *input_shape) with n_inputs >= 1; "
                             f"got shape {X.shape}.")
    with np.errstate(over="ignore"):  # values beyond float32's range become infinite, and are refused
        X = X.astype(np.float32, copy=False)
    if not np.all(np.isfinite(X)):
        raise InputFileError(f"{path}: X holds NaN or infinite values as float32, the precision smoothsk computes "
                             f"in (finite values must lie within +-3.4e38).")
    if y is not None:
        if y.ndim != 1 or y.dtype.kind not in "biuU":
            raise InputFileError(f"{path}: y must be a 1-d array of integer, boolean or string labels; got dtype "
                                 f"{y.dtype} and shape {y.shape}.")
        if len(y) != len(X):
            raise InputFileError(f"{path}: X has {len(X)} inputs but y has {len(y)} labels.")
    return X, y


def read_npy(path):
    """The inputs ``X`` of an ``.npy`` file, which may be hostile, read by chunks when certified.

    The header is checked when the file is opened (:class:`smoothsk._npz.NpyFile`):
    nothing is allocated for the data, which is read from the file as it is certified.

    Parameters
    ----------
    path : str

    Returns
    -------
    X : NpyFile, shape (n_inputs, *input_shape)
        Of floats.

    Raises
    ------
    InputFileError
        Naming ``path``: a file it cannot read, an ``.npy`` header it
        refuses, or ``X`` not floats of shape (n_inputs, *input_shape).
    """
    try:
        X = NpyFile(path)
    except OSError as exc:  # gone, or swapped, since its magic was read
        raise InputFileError.unreadable(path, exc) from exc
    except ValueError as exc:
        raise InputFileError(f"{path}: not a readable .npy file ({exc}); write it with np.save(path, X).") from exc
    if X.dtype.kind != "f" or X.ndim < 2:
        raise InputFileError(f"{path}: X must be a float array of shape (n_inputs, *input_shape); got dtype {X.dtype} "
                             f"and shape {X.shape} (convert it, e.g. X.astype('float32') / 255 for 8-bit images).")
    return X


def read_certify_data(path, input_shape):
    """The inputs and labels ``smoothsk certify`` reads from ``path``: an ``.npz``, an ``.npy`` or a folder of images.

    Parameters
    ----------
    path : str
        A folder of class folders of PNG or JPEG images
        (:class:`smoothsk._image_folder.ImageFolder`, labels from the
        folders' names), an ``.npy`` file (by its content: inputs only,
        read by rows, :func:`read_npy`), or else an ``.npz`` file (arrays
        ``X`` and optionally ``y``, :func:`read_npz`).
    input_shape : tuple of int or None
        The model's input shape: an image must have its size. None for a
        network that takes the data's (``--module flat-mlp``), which reads
        no folder of images.

    Returns
    -------
    X : ndarray, NpyFile or ImageFolder
        The inputs; the last two are read by chunks when certified.
    y : ndarray, shape (n_inputs,), or None
        The labels, where the data has them.

    Raises
    ------
    InputFileError
        Naming the file or folder and what is wrong; an image is checked
        when it is read, before any sampling (a ``ValueError`` naming it).
    """
    if os.path.isdir(path):
        if input_shape is None:
            raise InputFileError(f"{path}: a folder of images is read at the network's image size, which --module "
                                 "flat-mlp does not fix; pass the inputs as an .npz or .npy array.")
        try:
            images = ImageFolder(path, input_shape)
        except ValueError as exc:
            raise InputFileError(str(exc)) from exc
        return images, images.labels
    try:
        with open_regular_file(path) as file:
            magic = file.read(6)
    except OSError as exc:
        raise InputFileError.unreadable(path, exc) from exc
    if magic == b"\x93NUMPY":
        return read_npy(path), None
    return read_npz(path, require_y=False)


def check_output(path, option="--out", stream_hint=""):
    """Refuse an output file path that cannot be written, before any expensive work.

    Outputs are written to a temporary file in their folder, then renamed
    over ``path``, so the folder must exist and be writable.

    Parameters
    ----------
    path : str
        The file the command will write.
    option : str, default="--out"
        The option that gave ``path``, for the message.
    stream_hint : str, default=""
        Appended to the advice (``" (or - for standard output)"`` where the
        option takes ``-``).

    Raises
    ------
    InputFileError
        Naming the option and the path: a directory, or a folder that does
        not exist or is not writable.
    """
    reason = unwritable_reason(path)
    if reason is not None:
        raise InputFileError(f"{option} {path}: cannot write it: {reason}; give the path of a file in a "
                             f"writable folder{stream_hint}.")


def check_distinct(files, may_coincide=()):
    """Refuse two of a command's files that are one file, before any work (writing one would destroy the other).

    Parameters
    ----------
    files : list of (str, str or None)
        ``(role, path)``: the option (``"--out"``) or argument (``"the
        model"``) and its path; None where not given.
    may_coincide : tuple of (str, str), default=()
        Pairs of roles that may name one file (``--save-model`` over the model).

    Raises
    ------
    InputFileError
        Naming both roles; or naming the role of a path that is a loop of links.
    """
    seen = {}
    for role, path in files:
        if path is None:
            continue
        try:
            where = resolved(path)
        except OSError as error:  # a loop of links
            raise InputFileError(f"{role} {path}: {error.strerror}; give another path.") from error
        first = seen.setdefault(where, role)
        if first != role and (first, role) not in may_coincide:
            raise InputFileError(f"{role} {path}: the same file as {first}; give another path.")


#: The largest key file read (a key is a few dozen bytes).
MAX_KEY_FILE_BYTES = 1 << 16


def read_key(path):
    """The key in the file ``path`` (``--key-file``): its bytes, less a trailing line break; None without a path.

    Parameters
    ----------
    path : str or None

    Returns
    -------
    bytes or None

    Raises
    ------
    InputFileError
        Naming the file: unreadable, over :data:`MAX_KEY_FILE_BYTES`, or
        shorter than :data:`smoothsk._model_file.MIN_KEY_BYTES` bytes.
    """
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            key = file.read(MAX_KEY_FILE_BYTES + 1).rstrip(b"\r\n")
    except OSError as exc:
        raise InputFileError.unreadable(f"--key-file {path}", exc) from exc
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_FILE_BYTES:
        raise InputFileError(f"--key-file {path}: a key must be {MIN_KEY_BYTES} to {MAX_KEY_FILE_BYTES} bytes; the "
                             f"file holds {len(key)} (make one with: python -c \"import secrets; "
                             f"print(secrets.token_hex(32))\" > {path}).")
    return key


def parse_normalize(text):
    """The statistics of ``--normalize MEAN,..:STD,..``, checked as :class:`~smoothsk.models.Normalize` checks them.

    Parameters
    ----------
    text : str or None
        Comma-separated per-channel means, a colon, comma-separated
        per-channel standard deviations (one of each for all channels).

    Returns
    -------
    (tuple of float, tuple of float) or None
        ``(mean, std)``; None without ``text``.

    Raises
    ------
    ValueError
        One line naming ``--normalize``: not of that form, or statistics
        that ``Normalize`` refuses.
    """
    if text is None:
        return None
    means, colon, stds = text.partition(":")
    try:
        if not colon:
            raise ValueError(text)
        mean, std = (tuple(float(value) for value in part.split(",")) for part in (means, stds))
    except ValueError:
        raise ValueError(f"--normalize {text}: give MEAN,...:STD,..., the per-channel means and standard deviations "
                         "of the inputs in the units of X (e.g. 0.4914,0.4822,0.4465:0.2470,0.2435,0.2616 for "
                         "CIFAR-10 images in [0, 1]; one of each for all channels).") from None
    try:
        Normalize(mean, std)
    except ValueError as exc:
        raise ValueError(f"--normalize {text}: {str(exc).removeprefix('Normalize: ')}") from exc
    return mean, std


def check_channels(text, statistics, input_shape, what):
    """Refuse ``--normalize`` statistics for another number of channels than the inputs' (dimension 1 of a batch).

    Parameters
    ----------
    text : str
        The option's value, for the message.
    statistics : (tuple of float, tuple of float)
    input_shape : tuple of int
        The shape of one input.
    what : str
        Where the shape comes from, for the message: ``"the inputs of DATA have shape"``.
    """
    channels = len(statistics[0])
    if channels != 1 and (len(input_shape) == 0 or input_shape[0] != channels):
        raise ValueError(f"--normalize {text}: {channels} channel values, but {what} {tuple(input_shape)} (the "
                         "channels are its first dimension); give one value per channel, or one for all.")


def check_training_options(args):
    """The estimator settings of ``smoothsk fit``'s options, checked before any file is read.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    name : str
        The method, for the message (the preset's name).
    params : dict
        Keyword arguments of ``SampleWiseSmoothedClassifier``: the module
        (:class:`~smoothsk.models.Normalized` around the architecture with
        ``--normalize``), the preset's components (Cohen's at ``--sigma``),
        ``max_epochs``, and the training settings with ``--lr`` and
        ``--batch-size`` in place of the preset's.

    Raises
    ------
    ValueError
        One line naming the option: ``--sigma`` not finite and > 0, or
        given with a ``--preset``; ``--lr`` not finite and > 0;
        ``--batch-size`` below 1; a bad ``--normalize``, or one given to an
        architecture that normalises its inputs itself.
    """
    if args.sigma is not None:
        if not (math.isfinite(args.sigma) and args.sigma > 0):
            raise ValueError(f"--sigma {args.sigma}: the training noise level must be a finite number > 0.")
        if args.preset is not None:
            raise ValueError(f"--sigma {args.sigma}: trains one fixed noise level (Cohen et al.), and --preset "
                             f"{args.preset} sets its own; give one of them.")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"--lr {args.lr}: the learning rate must be a finite number > 0.")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size}: the training batch size must be >= 1.")
    statistics = parse_normalize(args.normalize)
    net = MODULES[args.module]
    if statistics is not None and issubclass(net, CifarResNet):
        raise ValueError(f"--normalize {args.normalize}: {args.module} normalizes its inputs itself (CIFAR-10's "
                         "channel statistics, inputs in [0, 1]); leave --normalize out.")
    preset = fixed_sigma_preset(args.sigma) if args.sigma is not None else PRESETS[args.preset or DEFAULT_PRESET]
    params = preset_params(preset, args.epochs)
    params.update({name: value for name, value in (("lr", args.lr), ("batch_size", args.batch_size))
                   if value is not None})
    if statistics is None:
        params["module"] = net
    else:
        params.update(module=Normalized, module__net=net, module__mean=statistics[0], module__std=statistics[1])
    return preset.name, params


#: ``smoothsk fit``'s method without ``--preset`` or ``--sigma``.
DEFAULT_PRESET = "cohen-0.25"


def run_fit(args):
    """``smoothsk fit``: train on an ``.npz`` and write a safe model file (authenticated with ``--key-file``)."""
    name, params = check_training_options(args)
    check_distinct([("the data", args.data), ("--out", args.out), ("--key-file", args.key_file)])
    check_output(args.out)
    key = read_key(args.key_file)
    X, y = read_npz(args.data, require_y=True)
    if args.normalize is not None:
        check_channels(args.normalize, (params["module__mean"], params["module__std"]), X.shape[1:],
                       f"the inputs of {args.data} have shape")
    clf = SampleWiseSmoothedClassifier(
        **params, sampler=FixedSampler(n=args.n, n0=args.n0), alpha=args.alpha, device=args.device,
        random_state=args.random_state, verbose=int(args.verbose))
    normalized = "" if args.normalize is None else f" behind --normalize {args.normalize}"
    print(f"{args.data}: training {args.module}{normalized} as {name} on {len(X)} inputs of shape {X.shape[1:]} "
          f"for {args.epochs} epochs")
    clf.fit(X, y)
    clf.save(args.out, key=key)
    print(f"model saved to {args.out}")
    return 0


def write_certificates(path, columns, rows):
    """Write the certificates' CSV atomically (:func:`smoothsk._atomic.atomic_file`), or stream it to stdout.

    Parameters
    ----------
    path : str
        The CSV to write, never left half-written; :data:`STDOUT` (``-``)
        streams it to standard output instead, row by row (a failure there
        leaves the rows written so far).
    columns : list of str
        The header.
    rows : iterable of list
        One row per input.
    """
    def write(file):
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(rows)

    if path == STDOUT:
        write(sys.stdout)
        sys.stdout.flush()  # any failure to write shows before the checkpoint is removed
        return
    with atomic_file(path, "w", newline="") as file:
        write(file)


def parse_classes(text):
    """The labels of ``--classes C1,C2,...`` (integers, distinct, ascending), or None.

    Raises
    ------
    ValueError
        One line naming ``--classes``.
    """
    if text is None:
        return None
    try:
        classes = np.array([int(item) for item in text.split(",")], dtype=np.int64)
    except ValueError:
        raise ValueError(f"--classes {text}: give the class labels as integers separated by commas, one per "
                         "logit of the network, in the order of its logits.") from None
    if len(classes) < 2 or np.any(np.diff(classes) <= 0):
        raise ValueError(f"--classes {text}: give at least two distinct labels in ascending order.")
    return classes


def model_from_weights(args, X):
    """A fitted estimator around ``--module``'s network with the weights of the file ``args.model``, as they are.

    The file is a plain safetensors file of the network's ``state_dict``
    (trained elsewhere, saved with ``safetensors.torch.save_file``): its names,
    shapes and dtypes are checked against the network before any value is
    copied, and safetensors checks every offset against the file's size.
    The estimator is :meth:`SampleWiseSmoothedClassifier.from_module` at
    ``--sigma`` (certificates of ``g`` at that sigma) with ``--classes``, or
    ``range(n_logits)``, and ``random_state=0``.

    Parameters
    ----------
    args : argparse.Namespace
    X : ndarray, NpyFile or ImageFolder
        The data: its input shape is the network's (a flat MLP takes it).

    Returns
    -------
    SampleWiseSmoothedClassifier

    Raises
    ------
    InputFileError
        Naming the weights file: not safetensors, or weights of another network.
    """
    classes = parse_classes(args.classes)
    input_shape = tuple(X.shape[1:])
    expected = MODULES[args.module].input_shape or input_shape  # a flat MLP takes the data's
    if input_shape != expected:
        raise InputFileError(f"{args.data}: inputs of shape {input_shape}, but --module {args.module} takes inputs "
                             f"of shape {expected}.")
    network = MODULES[args.module](**({} if classes is None else {"n_classes": len(classes)}))
    with torch.no_grad():  # a lazy layer (flat-mlp) takes its size from one input before the weights are checked
        network.eval()(torch.zeros((1,) + input_shape))
    try:
        _, weights = read_safetensors(args.model, f"a safetensors file of --module {args.module}'s weights")
        load_module_state(network, weights, args.model, f"--module {args.module}")
    except ValueError as exc:
        message = str(exc)
        raise InputFileError(message if str(args.model) in message else f"{args.model}: {message}") from exc
    # A fixed seed: the same command gives the same certificates.
    return SampleWiseSmoothedClassifier.from_module(network, input_shape=input_shape,
                                                    sigma=0.25 if args.sigma is None else args.sigma, classes=classes,
                                                    random_state=0)


def load_model(path, key=None):
    """``SampleWiseSmoothedClassifier.load(path, key=key)``, its errors naming the file."""
    try:
        return SampleWiseSmoothedClassifier.load(path, key=key)
    except (OSError, ValueError) as exc:
        message = str(exc)
        raise InputFileError(message if str(path) in message else f"{path}: {message}") from exc


def sampler_with_sizes(clf, args):
    """A copy of the model's sampler with the ``--n`` / ``--n0`` given set; its other parameters are kept.

    Raises
    ------
    ValueError
        Naming the sampler's class and the option, where the sampler has no
        parameter of that name (``InputSpecificSampler`` and
        ``SequentialSampler`` have ``n_max``, not ``n``).
    """
    sampler = clone(Components.of(clf).sampler)
    given = {name: value for name, value in (("n", args.n), ("n0", args.n0)) if value is not None}
    parameters = sampler.get_params(deep=False)
    for name in given:
        if name not in parameters:
            raise ValueError(f"--{name}: the model {args.model} certifies with a {type(sampler).__name__}, which has "
                             f"no parameter {name!r} (its parameters: {', '.join(parameters)}); leave --{name} out "
                             f"to use the model's sampler as saved.")
    return sampler.set_params(**given)


def normalize_loaded(clf, args, statistics):
    """Put ``Normalize(*statistics)`` in front of the loaded model's module (``--normalize``), checked first.

    The module becomes :class:`~smoothsk.models.Normalized` around the
    loaded one (its weights unchanged), as ``module`` and ``module_``, so
    ``--save-model`` writes it as a model file that loads without a module
    argument.

    Parameters
    ----------
    clf : SampleWiseSmoothedClassifier
        Loaded from ``args.model``; changed in place.
    args : argparse.Namespace
    statistics : (tuple of float, tuple of float)
        From :func:`parse_normalize`.

    Raises
    ------
    ValueError
        One line naming ``--normalize``: a module that normalizes its inputs
        already, statistics for another number of channels, a module that
        takes the noise level, or (with ``--save-model``) module parameters
        the normalized module's file could not record.
    """
    text = args.normalize
    if isinstance(clf.module_, (Normalized, CifarResNet)):
        raise ValueError(f"--normalize {text}: the model {args.model} already normalizes its inputs (its module is "
                         f"a {type(clf.module_).__name__}); leave --normalize out.")
    check_channels(text, statistics, clf.input_shape_, f"the model {args.model} takes inputs of shape")
    own = sorted(clf.get_params_for("module"))
    if args.save_model is not None and own:
        raise ValueError(f"--normalize {text}: with --save-model, the normalized module is saved as its network's "
                         f"class, which cannot carry the model's module__ parameters ({', '.join(own)}); certify "
                         "without --save-model, or normalize in Python (smoothsk.models.Normalized).")
    try:
        wrapped = Normalized(clf.module_, *statistics)
    except ValueError as exc:
        raise ValueError(f"--normalize {text}: {str(exc).removeprefix('Normalized: ')}") from exc
    clf.module = clf.module_ = wrapped


def print_summary(y, prediction, radius, seconds, data, file):
    """``smoothsk certify``'s one-screen summary: accuracies, ACR, time (the figures of :mod:`smoothsk.metrics`).

    Parameters
    ----------
    y : ndarray, shape (n_inputs,), or None
        The labels of the data; without them, one line says there are none.
    prediction : ndarray, shape (n_inputs,)
        Certified labels, ``ABSTAIN`` where abstained.
    radius : ndarray of float, shape (n_inputs,)
        Certified radii, in the units of X.
    seconds : float
        Time the certification took in this run.
    data : str
        The data file, for the message.
    file : file object
    """
    if y is None:
        print(f"{data} has no labels y: no summary (add y to the file for one, and for the CSV's columns y and "
              "correct).", file=file)
        return
    curve = certified_accuracy_curve(y, prediction, radius, SUMMARY_RADII)
    abstained = int(np.sum(prediction.astype(object) == ABSTAIN))
    print(f"clean accuracy: {curve[0]:.3f} (certified predictions against y; the {abstained} abstentions of "
          f"{len(y)} inputs count as wrong)", file=file)
    print("certified accuracy at radius " + "  ".join(f"{r:g}: {accuracy:.3f}" for r, accuracy in
                                                      zip(SUMMARY_RADII, curve, strict=True))
          + "  (radii in the units of X)", file=file)
    print(f"average certified radius (ACR): {average_certified_radius(y, prediction, radius):.4f}", file=file)
    print(f"seconds per input: {seconds / len(y):.4g} ({seconds:.1f} s for {len(y)} inputs in this run)", file=file)


def run_certify(args):
    """``smoothsk certify``: certify every input of the data (:func:`read_certify_data`) with a model, write a CSV.

    With ``--save-model``, also write the model as certified: a stateful
    allocator's certificates are about its region classifier, whose regions
    this run extends (without it, a warning says they are not saved). With
    labels, the CSV says which certified predictions are correct and a
    summary is printed (:func:`print_summary`).
    """
    statistics = parse_normalize(args.normalize)
    if args.module is None and (args.sigma is not None or args.classes is not None):
        raise ValueError("--sigma and --classes describe a network given by --module (weights trained elsewhere); "
                         "a smoothsk model file records its own.")
    if args.sigma is not None and not (math.isfinite(args.sigma) and args.sigma > 0):
        raise ValueError(f"--sigma {args.sigma}: give the noise level the network was trained for, a number > 0.")
    parse_classes(args.classes)
    to_stdout = args.out == STDOUT
    report = sys.stderr if to_stdout else sys.stdout  # standard output carries the CSV alone
    # --save-model may replace the model file (saving is atomic); no other two may coincide.
    check_distinct([("the model", args.model), ("the data", args.data), ("--out", None if to_stdout else args.out),
                    ("--save-model", args.save_model), ("--checkpoint", args.checkpoint),
                    ("--key-file", args.key_file)],
                   may_coincide=(("the model", "--save-model"),))
    if not to_stdout:
        check_output(args.out, stream_hint=f" (or {STDOUT} for standard output)")
    if args.save_model is not None:
        check_output(args.save_model, "--save-model")
    checkpoint = None if args.checkpoint is None else check_path(args.checkpoint)  # links resolved, once
    key = read_key(args.key_file)
    if args.module is None:
        clf = load_model(args.model, key)
        X, y = read_certify_data(args.data, clf.input_shape_)
    else:
        X, y = read_certify_data(args.data, MODULES[args.module].input_shape)
        clf = model_from_weights(args, X)
    if statistics is not None:
        normalize_loaded(clf, args, statistics)
    unchanged = {"n_jobs": clf.n_jobs, "verbose": clf.verbose}  # --save-model keeps the model's own
    sampler = sampler_with_sizes(clf, args) if args.n is not None or args.n0 is not None else None
    if tuple(X.shape[1:]) != tuple(clf.input_shape_):
        raise InputFileError(f"{args.data}: inputs of shape {X.shape[1:]}, but the model {args.model} was trained "
                             f"on inputs of shape {tuple(clf.input_shape_)}.")
    settings = {"n_jobs": args.n_jobs, "verbose": int(args.verbose)}
    if args.alpha is not None:
        settings["alpha"] = args.alpha
    if sampler is not None:
        settings["sampler"] = sampler
    if args.device is not None:
        settings["device"] = args.device
    clf.set_params(**settings)
    if args.device is not None:
        check_device_available(args.device)
        clf.module_.to(args.device)
    allocator = Components.of(clf).allocator
    if not allocator.stateless and args.save_model is None:
        print(f"smoothsk certify: warning: the model's allocator {type(allocator).__name__} is stateful: these "
              f"certificates are about its region classifier, which keeps the regions this run allocates, but "
              f"they are not saved ({args.model} is not changed). Pass --save-model PATH to write the model "
              f"with them.", file=sys.stderr)
    # The checkpoint is kept until the CSV is on disk: a failure to write it loses no certificate.
    start = time.perf_counter()
    prediction, radius, details = clf.certify(X, return_details=True, checkpoint=checkpoint, keep_checkpoint=True,
                                              checkpoint_key=key if checkpoint is not None else None)
    seconds = time.perf_counter() - start
    guarantee = details.guarantee
    # With labels: y and whether the certified prediction is y (1 or 0, abstentions 0), as in Cohen et al.'s logs.
    labelled = ["y", "correct"] if y is not None else []
    correct = correct_predictions(prediction, y).astype(int) if y is not None else None
    columns = ["index", "prediction", "radius", "sigma", "n_samples", "guarantee"] + labelled
    write_certificates(args.out, columns, (
        [index, prediction[index], repr(float(radius[index])), repr(float(details.sigma[index])),
         int(details.n_samples[index]), guarantee] + ([y[index], correct[index]] if y is not None else [])
        for index in range(len(X))))
    print(f"{len(X)} certificates ({guarantee}; each holds with probability >= 1 - {clf.alpha}) "
          f"{'written to standard output' if to_stdout else f'saved to {args.out}'}", file=report)
    print_summary(y, prediction, radius, seconds, args.data, report)
    if args.save_model is not None:
        clf.set_params(**unchanged).save(args.save_model, key=key)
        print(f"model and its {len(clf.regions_)} regions saved to {args.save_model}", file=report)
    if checkpoint is not None:  # only now: the results are on disk
        checkpoint.unlink(missing_ok=True)
    return 0


def build_parser():
    """The argument parser of the ``smoothsk`` command."""
    parser = argparse.ArgumentParser(prog="smoothsk", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)  # the options of every command
    common.add_argument("--debug", action="store_true",
                        help="on an error, show Python's traceback instead of the one-line message")
    demo = commands.add_parser("demo", parents=[common],
                               help="train every method, certify the test split, compare (table, pictures)")
    demo.add_argument("--data", choices=("digits", "synthetic"), default="digits",
                      help="bundled digits, or the 256-dimensional heterogeneous-margin mixture")
    demo.add_argument("--methods", default="all",
                      help=f"comma-separated presets ({', '.join(PRESETS)}; 'cohen' means both) or 'all'")
    demo.add_argument("--quick", action="store_true",
                      help="smaller run: " + ", ".join(f"{key}={value}" for key, value in QUICK.items()))
    demo.add_argument("--epochs", type=int, help=f"training epochs per method (default {FULL['epochs']})")
    demo.add_argument("--search-n", type=int,
                      help=f"samples per noise-level evaluation of the searches (default {FULL['search_n']})")
    demo.add_argument("--n", type=int, help=f"certification samples per input (default {FULL['n']}; "
                                            f"ISS: the most it may draw)")
    demo.add_argument("--n0", type=int, help=f"selection samples per input (default {FULL['n0']})")
    demo.add_argument("--sampler", choices=("fixed", "iss"), default="fixed",
                      help="fixed n per input (Cohen), or input-specific sample sizes (ISS, Chen et al. 2022)")
    demo.add_argument("--alpha", type=float, default=0.001, help="failure probability per certificate")
    demo.add_argument("--test-size", type=float, help=f"test fraction (default {FULL['test_size']})")
    demo.add_argument("--train-size", type=int, help="training inputs (default: all but the test split; "
                                                     f"--quick: {QUICK['train_size']})")
    demo.add_argument("--seed", type=int, default=0, help="random_state of every estimator")
    demo.add_argument("--out", default="smoothsk-demo",
                      help="folder for results.md, results.csv and the pictures (default smoothsk-demo)")
    demo.add_argument("-v", "--verbose", action="store_true", help="print skorch's epoch tables")

    fit = commands.add_parser("fit", parents=[common],
                              help="train a smoothed classifier on an .npz (arrays X, y), save a model file")
    fit.add_argument("data", help=".npz file with float inputs X (n, *input_shape) and labels y (n,)")
    fit.add_argument("--out", required=True, help="model file to write (safetensors; load it with certify)")
    fit.add_argument("--preset", choices=tuple(PRESETS),
                     help=f"method: training schedule and test-time sigma search (default: {DEFAULT_PRESET})")
    fit.add_argument("--sigma", type=float,
                     help="train and certify at this one fixed noise level, in the units of X (Cohen et al.'s "
                          "Gaussian noise augmentation; instead of --preset)")
    fit.add_argument("--lr", type=float, help=f"learning rate of SGD (default {TRAINING_SETTINGS['lr']})")
    fit.add_argument("--batch-size", type=int,
                     help=f"training batch size (default {TRAINING_SETTINGS['batch_size']})")
    fit.add_argument("--normalize", metavar="MEAN,..:STD,..",
                     help="put Normalize(MEAN, STD) in front of the module: noise is added before it, so sigma and "
                          "the radii stay in the units of X (per-channel values, or one of each for all)")
    fit.add_argument("--module", choices=tuple(MODULES), default="flat-mlp",
                     help="reference architecture: digits-cnn (1x8x8), flat-mlp (any shape), lenet (1x28x28), "
                          "cifar-resnet (3x32x32); default flat-mlp")
    fit.add_argument("--epochs", type=int, default=20, help="total training epochs")
    fit.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda, cuda:1, mps)")
    fit.add_argument("--random-state", type=int, default=0, help="seed of training and certification")
    fit.add_argument("--n", type=int, default=10_000, help="certification samples per input saved with the model")
    fit.add_argument("--n0", type=int, default=100, help="selection samples per input saved with the model")
    fit.add_argument("--alpha", type=float, default=0.001, help="failure probability per certificate")
    fit.add_argument("--key-file", help="file holding a secret key (16 bytes or more): the model file is "
                                        "authenticated with HMAC-SHA256 and loads only with the same key")
    fit.add_argument("-v", "--verbose", action="store_true", help="print skorch's epoch table")

    cert = commands.add_parser("certify", parents=[common],
                               help="certify every input of an .npz, .npy or image folder with a model file, write "
                                    "a CSV")
    cert.add_argument("model", help="model file written by 'smoothsk fit' (or SampleWiseSmoothedClassifier.save); "
                                    "with --module, a safetensors file of that network's weights (its state_dict)")
    cert.add_argument("data", help=".npz file with float inputs X (and optionally labels y, copied to the CSV), .npy "
                                   "file of inputs (read by chunks), or folder of PNG/JPEG images in one folder per "
                                   "class (the labels), each the model's size, read as floats in [0, 1]")
    cert.add_argument("--out", required=True, help="CSV to write: index, prediction, radius, sigma, n_samples, "
                                                   "guarantee (and, with labels, y and correct: 1 where the "
                                                   "prediction is y); '-' streams it to standard output (the "
                                                   "command's messages and summary go to standard error)")
    cert.add_argument("--n", type=int, help="certification samples per input: the parameter n of the model's "
                                            "sampler (a FixedSampler's; default: the model's)")
    cert.add_argument("--n0", type=int, help="selection samples per input: the parameter n0 of the model's sampler "
                                             "(default: the model's)")
    cert.add_argument("--alpha", type=float, help="failure probability per certificate (default: the model's)")
    cert.add_argument("--checkpoint", help="file saving finished chunks; rerun the command to resume")
    cert.add_argument("--save-model", help="model file to write after certifying, with the regions a stateful "
                                           "allocator allocated (the classifier its certificates are about); "
                                           "may be the model file itself")
    cert.add_argument("--n-jobs", type=int, help="parallel workers of the Monte Carlo engine")
    cert.add_argument("--device", help="torch device to certify on (default: the model's)")
    cert.add_argument("--key-file", help="file holding the key the model was saved with: required for a model "
                                         "saved with one, refused for one saved without; --save-model uses it "
                                         "too, and --checkpoint (an HMAC-SHA256 under it, checked on resume)")
    cert.add_argument("--normalize", metavar="MEAN,..:STD,..",
                      help="put Normalize(MEAN, STD) in front of the model's module (for a network trained on "
                           "normalised inputs: noise and radii stay in the units of X); --save-model keeps it")
    cert.add_argument("--module", choices=tuple(MODULES),
                      help="certify a network trained elsewhere: the model argument holds this architecture's "
                           "weights (safetensors), smoothed as they are at --sigma")
    cert.add_argument("--sigma", type=float,
                      help="with --module: the noise level the network was trained for (default 0.25)")
    cert.add_argument("--classes", help="with --module: the class labels of its logits, C1,C2,... (default "
                                        "0 .. n_logits - 1)")
    cert.add_argument("-v", "--verbose", action="store_true", help="show a progress bar")
    return parser


def main(argv=None):
    """Entry point of the ``smoothsk`` console script.

    A bad file or setting (a ``ValueError`` or ``OSError``; the readers turn
    whatever a hostile file makes go wrong into one, naming the file) ends
    the command with one line on standard error, ``smoothsk <command>:
    error: ...``, and exit status 2; with ``--debug`` it is raised, with its
    traceback.
    """
    args = build_parser().parse_args(argv)
    run = {"demo": run_demo_command, "fit": run_fit, "certify": run_certify}[args.command]
    try:
        return run(args)
    except (ValueError, OSError) as exc:  # bad files and settings: one line, no traceback (unless --debug)
        if args.debug:
            raise
        message = " ".join(str(exc).split())
        print(f"smoothsk {args.command}: error: {message}", file=sys.stderr)
        return 2


def console_script():
    """The ``smoothsk`` command: :func:`main` in a process that keeps freed memory for the next batch.

    The command owns its process, so it may set the process-wide malloc policy
    of :func:`smoothsk.allocator.keep_freed_memory` (faster CPU forward passes;
    no result changes); :func:`main`, which tests and scripts call, does not.
    """
    keep_freed_memory()
    return main()


if __name__ == "__main__":
    sys.exit(console_script())
