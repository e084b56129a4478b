"""Data sets: the bundled digits, and loaders for standard files in a local folder."""

import gzip
import pickle
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

__all__ = ["load_digits_images", "load_mnist", "load_cifar10"]


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


def _read_idx(path):
    """Read an IDX file (MNIST's format), gzipped or not, into an ndarray."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (bad magic number {data[:4].hex()}).")
    n_dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(n_dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * n_dims).reshape(shape)


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
    """
    folder = Path(folder)
    prefix = "train" if train else "t10k"
    images = _read_idx(_find(folder, [f"{prefix}-images-idx3-ubyte", f"{prefix}-images.idx3-ubyte"]))
    labels = _read_idx(_find(folder, [f"{prefix}-labels-idx1-ubyte", f"{prefix}-labels.idx1-ubyte"]))
    return (images.astype(np.float32) / 255.0)[:, None], labels.astype(np.int64)


def load_cifar10(folder, train=True):
    """CIFAR-10 from its python batches in a local folder (nothing is downloaded).

    Parameters
    ----------
    folder : str or Path
        The ``cifar-10-batches-py`` folder (``data_batch_1`` .. ``data_batch_5``,
        ``test_batch``).
    train : bool, default=True
        The 50,000 training images, else the 10,000 test images.

    Returns
    -------
    X : ndarray of float32, shape (n, 3, 32, 32)
        Intensities in [0, 1].
    y : ndarray of int64, shape (n,)
    """
    folder = Path(folder)
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    images, labels = [], []
    for name in names:
        path = folder / name
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: expected the cifar-10-batches-py folder.")
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8))
        labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
    X = np.concatenate(images).reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return X, np.concatenate(labels)
