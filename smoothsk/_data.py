"""The estimator's tensor data pipeline: indexed training tensors, slicing batches and input identifiers."""

import hashlib

import numpy as np
import torch
from torch.utils.data import Dataset, Subset


def input_ids(X):
    """64-bit identifier of each input: a BLAKE2b hash of its float32 values.

    Parameters
    ----------
    X : ndarray of float32, shape (n_inputs, *input_shape)

    Returns
    -------
    ids : ndarray of uint64, shape (n_inputs,)
        Equal for equal inputs; distinct inputs collide with probability 2**-64.
    """
    rows = np.ascontiguousarray(X).reshape(len(X), -1)
    return np.array([int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
                     for row in rows], dtype=np.uint64)


class IndexedTensorDataset(Dataset):
    """Training tensors whose items are ``(x, y, position)`` (``y`` may be None).

    Parameters
    ----------
    X : torch.Tensor, shape (n_samples, *input_shape)
    y : torch.Tensor of int64, shape (n_samples,), or None
        Class indices.
    """

    def __init__(self, X, y):
        self.X = X
        self.y = y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        return self.X[i], self.y[i], i


class TensorBatches:
    """Mini-batches by slicing tensors (faster than skorch's item-by-item access).

    Each batch is ``(X[index], y[index], index)``, ``index`` the positions of
    its samples in the dataset (the training schedule's per-sample sigmas are
    looked up by them), or ``(X[index], None)`` for a dataset without labels.

    Parameters
    ----------
    dataset : IndexedTensorDataset or torch Subset of one
    batch_size : int
        Samples per batch; -1 means one batch of every sample.
    shuffle : bool
    generator : torch.Generator or None
        Source of the shuffling permutation.
    drop_last : bool, default=False
        Leave out the last batch if it is short (as ``DataLoader``'s option:
        BatchNorm refuses a training batch of one sample).
    """

    #: The ``iterator_train__*`` / ``iterator_valid__*`` options the batches take (``DataLoader``'s names).
    OPTIONS = ("batch_size", "shuffle", "drop_last")

    def __init__(self, dataset, batch_size, shuffle, generator, drop_last=False):
        if isinstance(dataset, Subset):
            self.positions = torch.as_tensor(np.asarray(dataset.indices), dtype=torch.int64)
            dataset = dataset.dataset
        else:
            self.positions = torch.arange(len(dataset))
        self.dataset = dataset
        self.batch_size = len(self.positions) if batch_size == -1 else batch_size
        self.shuffle = shuffle
        self.generator = generator
        self.drop_last = drop_last

    def __len__(self):
        if self.drop_last:
            return len(self.positions) // self.batch_size
        return -(-len(self.positions) // self.batch_size)

    def __iter__(self):
        positions = self.positions
        if self.shuffle:
            positions = positions[torch.randperm(len(positions), generator=self.generator)]
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            index = positions[start:start + self.batch_size]
            if self.dataset.y is None:  # skorch's forward/infer on inputs alone
                yield self.dataset.X[index], None
            else:
                yield self.dataset.X[index], self.dataset.y[index], index
