"""The inputs of ``certify``, ``predict``, ``predict_proba`` and ``score``: an array, or a source read by chunks.

An array-like (ndarray, tensor, list) is checked and converted to one float32
array at once, as :func:`~smoothsk._validation.check_inputs` always did. Two
kinds of source are *streamed* instead, read :data:`CHUNK_BYTES` of float32
inputs at a time, so the host memory a call takes does not grow with their
number:

- a memory-mapped array (``np.load(path, mmap_mode="r")``, any
  ``np.memmap``): its rows are copied chunk by chunk (the pages the mapping
  has read are the operating system's file cache, which it reclaims); or an
  ``.npy`` file the command line opened (:class:`~smoothsk._npz.NpyFile`),
  whose rows are read from the file chunk by chunk;
- a map-style Dataset: a ``torch.utils.data.Dataset``, or any object with
  ``__len__`` and ``__getitem__`` that is not an array-like, whose item ``i``
  is an input (an array or tensor of floats) or a pair ``(input, label)``.
  The labels are ignored by ``certify`` and ``predict``; ``score`` and the
  scorers of :mod:`smoothsk.metrics` read them (:func:`dataset_labels`)
  where no ``y`` is given.

A streamed source is read once in full and checked before any sampling
(:func:`inputs_of`): every item of a Dataset an input or a pair as the
first one is, inputs of one shape and of floats (integers are refused: scale
8-bit images to floats yourself); every input finite in float32 and of the
fitted input shape. Each input is converted to float32 as an array would be
(a memory-mapped array of integers too). It is read again to certify
(and, with ``checkpoint=``, once more for the run's fingerprint), so a
Dataset must return the same item for the same index every time (no random
augmentation).

Certificates do not depend on the chunks: the engine keys each input's
noise by a hash of its values (:meth:`Smoothing.engine
<smoothsk._certification.Smoothing.engine>`), so an input gets the same
noise, and the same certificate, in any chunk, as with ``n_jobs``
(:mod:`smoothsk._parallel`). A call whose certificates depend on all its
inputs together (a stateful allocator, which allocates regions over the
call's inputs in one pass with noise keyed by the call; a sigma search that
learns one sigma for the whole set) cannot be split: it reads its inputs in
one piece (``whole`` in :func:`inputs_of`). A memory-mapped array is then
read whole, as the array it is (joblib hands large arrays to its workers
memory-mapped, so a scorer in ``GridSearchCV(n_jobs=...)`` certifies one); a
Dataset is refused (:func:`refuse_dataset`), unless ``certify``'s
``checkpoint=`` makes each chunk of ``checkpoint_every`` inputs a call of its
own, read in one piece, in order.
"""

import hashlib
import numbers
from collections.abc import Mapping

import numpy as np
import torch
from scipy import sparse
from torch.utils.data import Dataset, IterableDataset

from ._npz import NpyFile
from ._validation import check_input_shape, check_inputs

__all__ = ["CHUNK_BYTES", "Inputs", "dataset_labels", "inputs_of", "is_dataset", "is_streamed", "refuse_dataset",
           "values_digest"]

#: Bytes of float32 inputs a streamed source reads at a time (at least one input): 32 MiB, e.g. 55 inputs of
#: 3x224x224 or 131,072 digits of 8x8. The engine's own memory is bounded by ``certify_batch_size``.
CHUNK_BYTES = 32 << 20

#: What an item's label may be: a scalar, as ``y`` holds.
_LABEL_TYPES = (numbers.Integral, str, np.integer, np.str_, np.bool_)


def is_dataset(X):
    """Whether ``X`` is read as a map-style Dataset (see the module docstring).

    Parameters
    ----------
    X : object

    Returns
    -------
    bool
    """
    if isinstance(X, Dataset):
        return True
    array_like = (isinstance(X, (list, tuple, str, bytes, Mapping, np.ndarray, torch.Tensor))
                  or hasattr(X, "__array__") or sparse.issparse(X))
    return not array_like and hasattr(X, "__len__") and hasattr(X, "__getitem__")


def is_streamed(X):
    """Whether ``X`` is read by chunks: a memory-mapped array, an ``.npy`` file or a map-style Dataset.

    Parameters
    ----------
    X : object

    Returns
    -------
    bool
    """
    return _is_file_of_rows(X) or is_dataset(X)


def _is_file_of_rows(X):
    """Whether ``X`` is an array whose rows are read from its file: a memory-mapped array or an ``.npy`` file."""
    return isinstance(X, (np.memmap, NpyFile))


def _kind_of_file(X, definite):
    """What an array read from its file is, for messages: with "the" (``definite``) or "a"/"an"."""
    if isinstance(X, NpyFile):
        return "the .npy file" if definite else "an .npy file"
    return "the memory-mapped array" if definite else "a memory-mapped array"


def inputs_of(estimator, X, whole=False):
    """The inputs ``X`` of a call to a fitted estimator, checked in full before any sampling.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        Fitted (its ``input_shape_``).
    X : array-like, torch.Tensor, np.memmap, NpyFile or Dataset
        ``(n_inputs, *input_shape)`` (or flat ``(n_inputs, n_features)``),
        or a Dataset of ``n_inputs`` items.
    whole : bool, default=False
        Whether the call reads its inputs in one piece: a memory-mapped
        array or an ``.npy`` file is then read as an array (a Dataset must have been refused,
        :func:`refuse_dataset`).

    Returns
    -------
    Inputs

    Raises
    ------
    ValueError
        One line naming ``X`` (and the item, for a Dataset): see the module docstring.
    """
    if not is_streamed(X) or (whole and not is_dataset(X)):
        return Inputs(check_inputs(estimator, X, reset=False))
    inputs = Inputs(_Stream(X), estimator)
    for begin, end in inputs.chunks(0, inputs.n_inputs):  # every check before any sampling
        inputs.read(begin, end)
    return inputs


def _bounds(start, stop, size):
    """``(begin, end)`` of the consecutive chunks of at most ``size`` rows from ``start`` to ``stop``."""
    return [(begin, min(begin + size, stop)) for begin in range(start, stop, size)]


def refuse_dataset(X, why, checkpoint_helps):
    """Refuse a Dataset where the call needs all its inputs in one piece, before anything is read.

    Parameters
    ----------
    X : object
        The call's inputs.
    why : str
        What needs them together, for the message.
    checkpoint_helps : bool
        Whether ``checkpoint=`` is a way out (``certify``'s chunks are then calls of their own).

    Raises
    ------
    ValueError
        If ``X`` is a Dataset (:func:`is_dataset`).
    """
    if is_dataset(X):
        raise ValueError(
            f"X is a Dataset, read by chunks, but {why}: results of chunks would differ from those of one pass. "
            "Pass the inputs as one array (np.stack, or a memory-mapped .npy)" + (
                ", or certify with checkpoint= (each chunk of checkpoint_every inputs is then a call of its own, in "
                "order)." if checkpoint_helps else "."))


def values_digest(X):
    """SHA-256 of the values of a streamed source, read by chunks: its inputs in float32 (and a Dataset's labels).

    Parameters
    ----------
    X : np.memmap, NpyFile or Dataset

    Returns
    -------
    str
        Equal for sources of equal shapes, values in float32 and labels.
    """
    stream, digest = _Stream(X), hashlib.sha256()
    for begin, end in _bounds(0, len(stream), stream.chunk_size):
        rows, labels = stream.rows(begin, end)
        rows = np.ascontiguousarray(rows)
        digest.update(f"{rows.shape}{labels!r}".encode())
        digest.update(rows.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def dataset_labels(X):
    """The labels of a Dataset of ``(input, label)`` pairs, or None where ``X`` is not one.

    Parameters
    ----------
    X : object
        Anything ``certify`` takes.

    Returns
    -------
    labels : ndarray, shape (n_inputs,), or None
        None where ``X`` is not a Dataset, or its items are inputs alone.

    Raises
    ------
    ValueError
        Naming the item: a label that is not a scalar (an int, a bool or a
        string), or items of which some are pairs and some are not.
    """
    if not is_dataset(X):
        return None
    stream = _Stream(X)
    labels = [stream.rows(begin, end)[1] for begin, end in _bounds(0, len(stream), stream.chunk_size)]
    return None if labels[0] is None else np.asarray([label for chunk in labels for label in chunk])


class Inputs:
    """The checked inputs of one call, read by rows: a float32 array, or a stream read a chunk at a time.

    Parameters
    ----------
    source : ndarray of float32 or _Stream
        An array checked by :func:`~smoothsk._validation.check_inputs`, or a stream.
    estimator : SampleWiseSmoothedClassifier, optional
        Fitted; for a stream, whose rows are checked as they are read.

    Attributes
    ----------
    n_inputs : int
    input_shape : tuple of int
        Shape of one input (``input_shape_``).
    streamed : bool
        Whether the inputs are read by chunks of :attr:`chunk_size`.
    chunk_size : int
        Inputs read at a time: all of them for an array.
    """

    def __init__(self, source, estimator=None):
        self._source, self._estimator = source, estimator
        self.streamed = isinstance(source, _Stream)
        if self.streamed:
            self.n_inputs, self.input_shape = len(source), tuple(estimator.input_shape_)
            check_input_shape(estimator, source.shape)
            self.chunk_size = source.chunk_size
        else:
            self.n_inputs, self.input_shape = len(source), source.shape[1:]
            self.chunk_size = max(1, self.n_inputs)

    def __len__(self):
        return self.n_inputs

    def chunks(self, start, stop):
        """The rows ``start`` to ``stop`` in consecutive chunks of at most :attr:`chunk_size`.

        Parameters
        ----------
        start, stop : int
            ``0 <= start < stop <= n_inputs``.

        Returns
        -------
        list of (int, int)
            ``(begin, end)`` of each chunk, in order; one for an array.
        """
        return _bounds(start, stop, self.chunk_size)

    def read(self, start, stop):
        """The inputs of rows ``start`` to ``stop``, checked: float32, C-contiguous, finite, of the fitted shape.

        Parameters
        ----------
        start, stop : int
            ``0 <= start < stop <= n_inputs``; for a stream, at most a few
            chunks apart (it reads them all into memory).

        Returns
        -------
        X : ndarray of float32, shape (stop - start, *input_shape)
            For an array, a view of it, or a copy where it is read-only (torch
            warns of tensors over read-only memory).
        """
        if not self.streamed:
            X = self._source[start:stop]
            return X if X.flags.writeable else X.copy()
        X = self._source.rows(start, stop)[0].reshape((stop - start,) + self.input_shape)
        finite = np.isfinite(X.reshape(len(X), -1)).all(axis=1)
        if not finite.all():
            index = start + int(np.argmin(finite))
            raise ValueError(f"{self._source.where(index)} holds NaN or infinite values as float32, the precision "
                             "smoothsk computes in.")
        return X


class _Stream:
    """The rows of a memory-mapped array, an ``.npy`` file or a Dataset in float32, each Dataset item checked.

    See the module docstring.

    Parameters
    ----------
    X : np.memmap, NpyFile or Dataset
        Called ``X`` in the messages, as the estimator's argument is.

    Attributes
    ----------
    shape : tuple of int
        ``(n_inputs, *shape of one input)``, for a Dataset read from its first item.
    chunk_size : int
        Inputs of :data:`CHUNK_BYTES` in float32 (at least one).
    """

    def __init__(self, X):
        self._X = X
        if _is_file_of_rows(X):
            if X.ndim < 2 or len(X) == 0 or X.dtype.kind not in "biuf":
                raise ValueError(f"X is {_kind_of_file(X, definite=False)} of shape {X.shape} and dtype {X.dtype}; "
                                 "it must hold real numbers, inputs of shape (n_inputs, *input_shape) with "
                                 "n_inputs >= 1.")
            self.shape = X.shape
        else:
            self.shape = self._dataset_shape()
        self.chunk_size = max(1, CHUNK_BYTES // (4 * max(1, int(np.prod(self.shape[1:])))))

    def _dataset_shape(self):
        """(n_inputs, *shape) of a Dataset from its first item, whose label (or none) the other items must match."""
        X = self._X
        if isinstance(X, IterableDataset):
            raise ValueError("X is an IterableDataset; certify and predict read map-style Datasets (items by "
                             "index, with __len__): wrap it, or pass the inputs as an array.")
        if len(X) == 0:
            raise ValueError("X is an empty Dataset; certify and predict need at least one input.")
        first, self._first_label = self.item(0, first=True)
        return (len(X),) + first.shape

    def __len__(self):
        return len(self._X)

    def rows(self, start, stop):
        """The inputs of rows ``start`` to ``stop`` (``start < stop``) in float32, and their labels.

        Values beyond float32's range become infinite (the caller refuses them).

        Returns
        -------
        X : ndarray of float32, shape (stop - start, *shape[1:])
            A copy of the memory-mapped rows, the rows read from the
            ``.npy`` file, or the Dataset's items, each written into it as
            it is read.
        labels : list or None
            The Dataset's labels of the rows; None without labels.
        """
        with np.errstate(over="ignore"):
            if isinstance(self._X, NpyFile):
                return self._X.rows(start, stop).astype(np.float32, copy=False), None
            if isinstance(self._X, np.memmap):
                return np.array(self._X[start:stop], dtype=np.float32), None
            X, labels = np.empty((stop - start,) + self.shape[1:], dtype=np.float32), []
            for row, index in enumerate(range(start, stop)):
                X[row], label = self.item(index)
                labels.append(label)
        return X, None if self._first_label is None else labels

    def where(self, index):
        """Input ``index``, named for a message (with the file of a memory-mapped array or an ``.npy`` file)."""
        if _is_file_of_rows(self._X):
            filename = getattr(self._X, "filename", None)
            return f"X[{index}] (row {index} of {_kind_of_file(self._X, definite=True)} X" + (
                f", file {filename})" if filename else ")")
        return f"X[{index}] (item {index} of the Dataset X)"

    def item(self, index, first=False):
        """Item ``index`` of a Dataset as ``(input, label)``, checked against the first item.

        Parameters
        ----------
        index : int
        first : bool, default=False
            Whether this is the first item read (what the others are checked against).

        Returns
        -------
        x : ndarray of float
            The input, a tensor of a precision numpy lacks (bfloat16) converted to float32.
        label : scalar or None
            None where the items are inputs alone.
        """
        where = self.where(index)
        item = self._X[index]
        if isinstance(item, (tuple, list)) and len(item) in (1, 2):
            x, label = item[0], (item[1] if len(item) == 2 else None)
        elif isinstance(item, (tuple, list, dict)):
            raise ValueError(f"{where} is a {type(item).__name__} of {len(item)}; each item must be an input or a "
                             "pair (input, label).")
        else:
            x, label = item, None
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            x = (x.to(torch.float32) if x.dtype == torch.bfloat16 else x).numpy()
        if not isinstance(x, np.ndarray):
            raise ValueError(f"{where} holds a {type(x).__name__}, not an input: each item must be an array or "
                             "tensor of floats, or a pair (input, label) (give an image Dataset a transform to float "
                             "tensors, such as torchvision's ToTensor()).")
        if x.dtype.kind != "f":
            raise ValueError(f"{where} holds {x.dtype} values, not floats: convert the inputs to floats in the model's "
                             "input space (e.g. x.float() / 255 for 8-bit images).")
        if isinstance(label, (torch.Tensor, np.ndarray)) and label.ndim == 0:
            label = label.item()
        if label is not None and not isinstance(label, _LABEL_TYPES):
            raise ValueError(f"{where} has the label {label!r}; a label must be an int, a bool or a string.")
        if not first and (x.shape != self.shape[1:] or (label is None) != (self._first_label is None)):
            raise ValueError(f"{where} is {self._describe(x.shape, label)}, but item 0 is "
                             f"{self._describe(self.shape[1:], self._first_label)}: every item of X "
                             "must be alike.")
        return x, label

    @staticmethod
    def _describe(shape, label):
        """An input's shape, and whether a label comes with it."""
        return f"an input of shape {shape}" + ("" if label is None else " with a label")
