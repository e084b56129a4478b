"""Data sets: the bundled digits, and loaders for standard files in a local folder."""

import contextlib
import gzip
import io
import math
import os
import zlib
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.utils import Bunch, check_random_state

from ._messages import one_line
from ._regular_file import open_regular_file
from .statistics import first_offender

__all__ = ["load_digits_images", "make_heterogeneous_margins", "load_mnist", "load_mnist_protocol", "load_cifar10"]


def load_digits_images():
    """scikit-learn's bundled 8x8 digits as float32 images in [0, 1].

    Returns
    -------
    X : ndarray of float32, shape (1797, 1, 8, 8)
        Pixel intensities divided by 16.
    y : ndarray of int64, shape (1797,)
        Digit labels 0-9.

    Examples
    --------
    >>> X, y = load_digits_images()
    >>> X.shape, X.dtype.name, float(X.max()), y.shape
    ((1797, 1, 8, 8), 'float32', 1.0, (1797,))
    """
    digits = load_digits()
    X = (digits.images / 16.0).astype(np.float32)[:, None]
    return X, digits.target.astype(np.int64)


def make_heterogeneous_margins(n_samples=2400, n_features=256, spacings=(1.0, 2.0, 4.0),
                               classes_per_group=(6, 4, 2), group_distance=8.0, spread=0.15,
                               random_state=0):
    """A Gaussian mixture whose classes are separated by very different margins.

    The classes come in groups. Within group ``g`` the class means form a
    regular simplex with pairwise distance ``spacings[g]``; the groups lie
    ``group_distance * sqrt(2)`` apart (mean of class ``k`` in group ``g``:
    ``group_distance * u_g + spacings[g] / sqrt(2) * v_k`` for orthonormal
    directions ``u_g``, ``v_k`` in a random orientation). Every input is its
    class mean plus isotropic Gaussian noise of standard deviation ``spread``
    in all ``n_features`` dimensions.

    A smoothed classifier's radius at an input is then limited by the
    spacing of its group: the classes of a tight group need a small sigma
    (under large noise the prediction spreads over the group's classes and
    certification fails), those of a wide group reach large radii only with
    a large sigma. With the defaults, the ideal (nearest-mean) classifier
    certified with 500 Monte Carlo samples at ``alpha = 0.001`` has its best
    average radius near sigma 0.2, 0.4 and 1.0 in the three groups, and the
    best sigma per input in [0.12, 1.0] gives about 1.5 times the average
    certified radius of the best single sigma. No global noise level fits all inputs: the task
    on which sample-wise randomized smoothing should pay off.

    Parameters
    ----------
    n_samples : int, default=2400
        Number of inputs, spread as evenly as possible over the classes
        (class ``k`` gets the inputs ``i`` with ``i % n_classes == k``).
    n_features : int, default=256
        Input dimension, at least ``len(spacings) + sum(classes_per_group)``.
    spacings : sequence of float, default=(1.0, 2.0, 4.0)
        Distance between the class means within each group.
    classes_per_group : sequence of int, default=(6, 4, 2)
        Classes in each group (at least 1 each).
    group_distance : float, default=8.0
        Distance of every group's centre from the origin.
    spread : float, default=0.15
        Standard deviation of the inputs around their class mean, per dimension.
    random_state : int, RandomState instance or None, default=0
        Seeds the orientation and the inputs: the same seed gives the same data.

    Returns
    -------
    X : ndarray of float32, shape (n_samples, n_features)
        Inputs.
    y : ndarray of int64, shape (n_samples,)
        Class labels ``0 .. sum(classes_per_group) - 1``, numbered group by group.

    Examples
    --------
    >>> X, y = make_heterogeneous_margins(n_samples=24, random_state=0)
    >>> X.shape, X.dtype.name, np.bincount(y).tolist()
    ((24, 256), 'float32', [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    """
    spacings = np.asarray(spacings, dtype=np.float64)
    classes_per_group = np.asarray(classes_per_group, dtype=np.int64)
    if spacings.shape != classes_per_group.shape or spacings.ndim != 1 or np.any(classes_per_group < 1):
        raise ValueError("spacings and classes_per_group must be sequences of the same length, "
                         "with at least one class per group.")
    n_groups, n_classes = len(spacings), int(classes_per_group.sum())
    if n_features < n_groups + n_classes:
        raise ValueError(f"n_features must be at least {n_groups + n_classes} (one direction per group "
                         f"and per class); got {n_features}.")
    rng = check_random_state(random_state)
    # Orthonormal directions in a random orientation: u_g for the groups, v_k for the classes.
    directions, _ = np.linalg.qr(rng.standard_normal((n_features, n_groups + n_classes)))
    group = np.repeat(np.arange(n_groups), classes_per_group)
    means = (group_distance * directions[:, group].T
             + (spacings[group] / np.sqrt(2.0))[:, None] * directions[:, n_groups:].T)
    y = np.arange(n_samples) % n_classes
    X = means[y] + spread * rng.standard_normal((n_samples, n_features))
    return X.astype(np.float32), y.astype(np.int64)


#: The most a gzipped IDX file may inflate to, as a multiple of its size: MNIST's files inflate about 5x; a
#: larger ratio is a decompression bomb, refused before it is inflated.
MAX_GZIP_RATIO = 256


@contextlib.contextmanager
def _opened(path):
    """The regular file at ``path`` opened for reading (inflated if its name ends in ``.gz``), and its size.

    The size is the opened file's, in bytes (compressed), so that the
    readers' checks hold for the bytes they read whatever the path names
    meanwhile. A file that cannot be read whole (not a regular file, a
    truncated or corrupt gzip stream, an I/O error) is a ``ValueError``
    naming it.
    """
    try:
        with open_regular_file(path) as file:
            size = os.fstat(file.fileno()).st_size
            if path.suffix != ".gz":
                yield file, size
            else:
                with gzip.GzipFile(fileobj=file) as inflated:
                    yield inflated, size
    except (EOFError, OSError, zlib.error) as error:
        why = getattr(error, "strerror", None) or " ".join(str(error).split()) or type(error).__name__
        raise ValueError(f"{path}: cannot be read ({why}).") from error


def _read_idx(path, n_dims):
    """Read an IDX file (MNIST's format) of ``n_dims`` dimensions, gzipped or not, into an ndarray.

    The header's dimension count and sizes are checked against ``n_dims`` and
    against the file's size (a gzipped file: at most :data:`MAX_GZIP_RATIO`
    times it) before the data is read; then exactly the declared bytes must follow.
    """
    gzipped = path.suffix == ".gz"
    with _opened(path) as (f, size):
        head = f.read(4)
        if head[:3] != b"\x00\x00\x08" or len(head) < 4:
            raise ValueError(f"{path} is not an unsigned-byte IDX file (bad magic number {head.hex()}).")
        if head[3] != n_dims:
            raise ValueError(f"{path} has {head[3]} dimensions; expected {n_dims}.")
        sizes = f.read(4 * n_dims)
        if len(sizes) < 4 * n_dims:
            raise ValueError(f"{path} ends inside its header ({4 + len(sizes)} bytes; {n_dims} dimensions need "
                             f"{4 + 4 * n_dims}).")
        shape = tuple(int.from_bytes(sizes[4 * i:4 * i + 4], "big") for i in range(n_dims))
        declared, header = math.prod(shape), 4 + 4 * n_dims
        described = f"{path} declares {'x'.join(map(str, shape))} ({declared} bytes)"
        if gzipped and declared > MAX_GZIP_RATIO * size:
            raise ValueError(f"{described}, over {MAX_GZIP_RATIO} times the gzipped file's size: refused before "
                             "inflating it (a decompression bomb?).")
        if not gzipped and declared != size - header:
            raise ValueError(f"{described} but {size - header} follow its header.")
        data = f.read(declared + 1)
    if len(data) != declared:
        raise ValueError(f"{described} but {'more' if len(data) > declared else len(data)} follow its header.")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _find(folder, names):
    for name in names:
        for candidate in (folder / name, folder / (name + ".gz")):
            if candidate.exists():
                return candidate
    raise FileNotFoundError(f"None of {names} (optionally .gz) found in {folder}.")


def load_mnist(folder, train=True):
    """MNIST from its IDX files in a local folder (nothing is downloaded).

    Parameters
    ----------
    folder : str or Path
        Folder holding ``train-images-idx3-ubyte`` etc. (gzipped or not;
        ``train-images.idx3-ubyte`` spellings are accepted).
    train : bool, default=True
        The 60,000 training images, else the 10,000 test images.

    Returns
    -------
    X : ndarray of float32, shape (n, 1, 28, 28)
        Intensities in [0, 1].
    y : ndarray of int64, shape (n,)

    Raises
    ------
    FileNotFoundError
        If the images or the labels file is missing.
    ValueError
        Naming the file: not an unsigned-byte IDX file with 3 (images) or 1
        (labels) dimensions whose sizes, as its header declares them, add up
        to the bytes that follow the header; a damaged gzip stream; images
        that are not 28x28, none, labels outside 0-9, or not one label per
        image.
    """
    folder = Path(folder)
    prefix = "train" if train else "t10k"
    images_path = _find(folder, [f"{prefix}-images-idx3-ubyte", f"{prefix}-images.idx3-ubyte"])
    labels_path = _find(folder, [f"{prefix}-labels-idx1-ubyte", f"{prefix}-labels.idx1-ubyte"])
    images, labels = _read_idx(images_path, 3), _read_idx(labels_path, 1)
    if images.shape[1:] != (28, 28):
        raise ValueError(f"{images_path} holds images of {images.shape[1]}x{images.shape[2]} pixels; MNIST's are "
                         "28x28.")
    if len(images) == 0:
        raise ValueError(f"{images_path} holds no image.")
    if len(labels) != len(images):
        raise ValueError(f"{len(images)} images in {images_path} but {len(labels)} labels in {labels_path}.")
    if labels.max() > 9:
        raise ValueError(f"{labels_path} holds labels outside 0-9.")
    return (images.astype(np.float32) / 255.0)[:, None], labels.astype(np.int64)


#: Pixels per MNIST image, and columns per row of the 5,000-image CSV (the pixels, then the label).
_MNIST_PIXELS = 28 * 28
#: The protocol's certify images: every 20th test image (the papers' choice).
MNIST_CERTIFY_EVERY = 20


def _read_mnist_csv(path):
    """Images (uint8, shape (n, 28, 28)) and labels (uint8) of a CSV of rows ``pixel_0, ..., pixel_783, label``.

    Read as gzipped text, within :data:`MAX_GZIP_RATIO` times the file's size,
    and checked before use: 785 columns of integers 0-255, labels 0-9.
    """
    with _opened(path) as (f, size):
        limit = size * (MAX_GZIP_RATIO if path.suffix == ".gz" else 1)
        text = f.read(limit + 1)
    if len(text) > limit:
        raise ValueError(f"{path} inflates to over {MAX_GZIP_RATIO} times its size: refused (a decompression bomb?).")
    try:  # decoded while it is parsed, into uint8: no str copy of the text, no list of its lines
        table = np.loadtxt(io.TextIOWrapper(io.BytesIO(text), encoding="ascii"), delimiter=",", dtype=np.uint8,
                           ndmin=2)
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is not a CSV of integers in 0-255: {one_line(error)}") from None
    if table.shape[1] != _MNIST_PIXELS + 1 or len(table) == 0:
        raise ValueError(f"{path} has rows of {table.shape[1]} columns; expected {_MNIST_PIXELS + 1} (the 784 "
                         "pixels, then the label).")
    pixels, labels = table[:, :-1], table[:, -1]
    if labels.max() > 9:
        raise ValueError(f"{path} holds labels outside 0-9.")
    return pixels.reshape(-1, 28, 28), labels


def load_mnist_protocol(folder):
    """Real MNIST split by the benchmark protocol: training, validation and certify images.

    The protocol (``shared/data/mnist/README.md``) fixes the splits so that
    figures compare across runs; index ``i`` is the position in the official
    test set:

    - **certify** (500): the test images with ``i % 20 == 0``, the papers'
      "every 20th test image";
    - with the official training files in ``folder`` (``train-images-idx3-ubyte``
      etc.): **train** is their 60,000 images, **validation** the 9,500 other
      test images;
    - otherwise, with ``mnist_5k.csv.gz`` (5,000 images of the official
      training split): **train** (10,000) is those 5,000, then the test images
      with odd ``i``; **validation** (4,500) the test images with even ``i``
      not certified.

    Tune on the validation images, never on the certify images.

    Parameters
    ----------
    folder : str or Path
        Folder with ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``
        (gzipped or not), and the official training files or ``mnist_5k.csv.gz``.

    Returns
    -------
    sklearn.utils.Bunch
        ``X_train``, ``X_validation``, ``X_certify``: float32 arrays of shape
        (n, 1, 28, 28), intensities in [0, 1]; ``y_train``, ``y_validation``,
        ``y_certify``: int64 labels of shape (n,); ``certify_index``: int64
        positions of the certify images in the official test set, shape
        (500,); ``protocol``: ``"official"`` or ``"5k"``, which training set
        was found. Images are in the files' order: with the 5,000-image CSV,
        which is sorted by class, the first training images are all zeros
        (take a strided subset, ``X_train[::k]``, for a small balanced one).

    Raises
    ------
    FileNotFoundError
        If the test files are missing, or neither the training files nor
        ``mnist_5k.csv.gz`` are there.
    ValueError
        If a file is malformed (see :func:`load_mnist`), naming it.

    Examples
    --------
    >>> from pathlib import Path
    >>> folder = Path("../shared/data/mnist")
    >>> if folder.exists():
    ...     splits = load_mnist_protocol(folder)
    ...     print(splits.protocol, len(splits.X_train), len(splits.X_validation), len(splits.X_certify))
    ... else:
    ...     print("5k 10000 4500 500")
    5k 10000 4500 500
    """
    folder = Path(folder)
    X_test, y_test = load_mnist(folder, train=False)
    index = np.arange(len(X_test))
    certify = index % MNIST_CERTIFY_EVERY == 0
    if any((folder / name).exists() for name in ("train-images-idx3-ubyte", "train-images-idx3-ubyte.gz",
                                                  "train-images.idx3-ubyte", "train-images.idx3-ubyte.gz")):
        X_train, y_train = load_mnist(folder, train=True)
        validation, protocol = ~certify, "official"
    else:
        csv = folder / "mnist_5k.csv.gz"
        if not csv.exists():
            raise FileNotFoundError(f"{folder} holds neither MNIST's training files (train-images-idx3-ubyte, ...) "
                                    "nor mnist_5k.csv.gz.")
        images, labels = _read_mnist_csv(csv)
        odd = index % 2 == 1
        # Filled in place: the CSV's images become floats once, not once more for a concatenation.
        X_train = np.empty((len(images) + np.count_nonzero(odd), 1, 28, 28), dtype=np.float32)
        np.divide(images[:, None], np.float32(255.0), out=X_train[:len(images)])
        X_train[len(images):] = X_test[odd]
        y_train = np.concatenate([labels.astype(np.int64), y_test[odd]])
        validation, protocol = ~odd & ~certify, "5k"
    return Bunch(X_train=X_train, y_train=y_train, X_validation=X_test[validation],
                 y_validation=y_test[validation], X_certify=X_test[certify], y_certify=y_test[certify],
                 certify_index=index[certify], protocol=protocol)


#: Bytes of one record of CIFAR-10's binary version: the label, then the red, green and blue 32x32 planes.
_CIFAR_RECORD = 1 + 3 * 32 * 32
#: Records in each batch file of the published data set, the most a file may hold.
_CIFAR_BATCH = 10_000
_CIFAR_BINARY = ("CIFAR-10's binary version (the cifar-10-batches-bin folder of cifar-10-binary.tar.gz, "
                 "'CIFAR-10 binary version (suitable for C programs)' on https://www.cs.toronto.edu/~kriz/cifar.html)")


def _cifar_folder(folder):
    """The folder to read: ``folder/cifar-10-batches-bin`` where that exists, else ``folder`` itself."""
    nested = folder / "cifar-10-batches-bin"
    return nested if nested.is_dir() else folder


def _holds_python_version(folder):
    """Whether ``folder`` holds CIFAR-10's python version (batches without ``.bin``) or its folder."""
    return any((folder / name).exists() for name in ("cifar-10-batches-py", "batches.meta", "data_batch_1",
                                                     "test_batch"))


def _read_cifar_batch(path):
    """Labels (uint8) and pixels (uint8, shape (n, 3, 32, 32)) of one batch file of the binary version.

    The file's size is checked before anything is read: a positive whole
    number of records (an empty file is refused on opening), at most a
    published batch's 10,000.
    """
    with _opened(path) as (f, size):
        if size % _CIFAR_RECORD or size > _CIFAR_BATCH * _CIFAR_RECORD:
            raise ValueError(f"{path} holds {size} bytes; expected 1 to {_CIFAR_BATCH:,} records of {_CIFAR_RECORD:,} "
                             "bytes (a label byte, then 3,072 pixel bytes) of CIFAR-10's binary version.")
        records = np.frombuffer(f.read(size), dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
    labels = records[:, 0]
    if labels.max() > 9:
        raise ValueError(f"{path}: label {first_offender(labels, labels > 9)}; CIFAR-10's labels are 0 to 9.")
    return labels, records[:, 1:].reshape(-1, 3, 32, 32)


def load_cifar10(folder, train=True):
    """CIFAR-10 from the files of its binary version in a local folder (nothing is downloaded).

    Parameters
    ----------
    folder : str or Path
        The ``cifar-10-batches-bin`` folder (``data_batch_1.bin`` ..
        ``data_batch_5.bin``, ``test_batch.bin``), or the folder holding it
        (where ``cifar-10-binary.tar.gz`` was extracted).
    train : bool, default=True
        The 50,000 training images (the five data batches in order), else
        the 10,000 test images.

    Returns
    -------
    X : ndarray of float32, shape (n, 3, 32, 32)
        Intensities in [0, 1], channels red, green, blue.
    y : ndarray of int64, shape (n,)
        Labels 0-9.

    Raises
    ------
    FileNotFoundError
        If a batch file is missing; when the folder holds the python version
        instead, the message says so and where the binary version comes from.
    ValueError
        If a batch file is not 1 to 10,000 whole records of 3,073 bytes, or
        holds a label above 9.

    Notes
    -----
    Only the binary version ("CIFAR-10 binary version (suitable for C
    programs)", ``cifar-10-binary.tar.gz`` on
    https://www.cs.toronto.edu/~kriz/cifar.html) is read. Each of its files is
    a sequence of records: one label byte, then 3,072 pixel bytes (the red,
    green and blue 32x32 planes, row-major). The python version
    (``cifar-10-batches-py``) is refused: its batches are pickles of numpy
    arrays, and an unpickler that rebuilds numpy arrays is not safe on a
    hostile file, however restricted (a numpy dtype with forged flags makes
    numpy read the file's bytes as memory addresses and crash the process).
    A batch file is checked from its size before it is
    read: it must hold a whole number of records, from 1 to the published
    10,000, so that a subset of a batch is accepted. A ``folder`` holding a
    ``cifar-10-batches-bin`` folder is read from that folder.
    """
    folder = _cifar_folder(Path(folder))
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    images, labels = [], []
    for name in names:
        path = folder / name
        if not path.exists():
            if _holds_python_version(folder):
                raise FileNotFoundError(f"{path} not found: {folder} holds CIFAR-10's python version, whose batches "
                                        f"are pickles, which smoothsk never loads; use {_CIFAR_BINARY} instead.")
            raise FileNotFoundError(f"{path} not found: expected {_CIFAR_BINARY}, or the folder holding it.")
        batch_labels, batch_images = _read_cifar_batch(path)
        images.append(batch_images)
        labels.append(batch_labels)
    X = np.concatenate(images).astype(np.float32) / 255.0
    return X, np.concatenate(labels).astype(np.int64)
