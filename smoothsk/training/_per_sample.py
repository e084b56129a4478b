"""What the schedules with a noise level per training sample share.

The per-sample noise levels live in ``net.train_sigmas_`` (float64, one per
row of the last fit call's training set) and ``net.train_keys_`` says whose
they are: the key of a row (:func:`sample_keys`) hashes its input's values
and its label together with the schedule's class and the parameters that define its
sigmas (``_sigma_params``). A later fit call keeps the sigma of every
sample whose key it meets again, in whatever row (the ``k``-th repeat of a
sample takes the ``k``-th one's sigma); any other sample, and every sample
under another schedule or other sigma parameters, starts at the schedule's
initial sigma.

A row's key is written only once the schedule has set that sample's sigma
(:meth:`PerSampleSchedule._settle`: PFAT once its assignment searched it,
DDRS at once and Insta-RS at the first epoch that trains with it, their
initial sigma being theirs); until then
it is :data:`UNSET`, and a later fit call treats the sample as new. So a
call that fails or is interrupted before setting a sigma (a search
stopped by Ctrl-C or out of memory) leaves no placeholder that the next
call would keep as if set.

A model saved before keys existed (a file with ``train_sigmas_`` but no
``train_keys_``) is resumed as it was then: when its history is not empty
and the training set has as many rows as ``train_sigmas_``, every row keeps
the sigma of its position (the file cannot say whose it is), and the keys
written from then on make the sigmas follow the samples.
"""

import numpy as np
import torch

from .._codec import encode
from .._data import input_ids
from .._digest import value_digest
from ..engine import MonteCarloEngine
from ._base import BaseTrainingSchedule

#: Key of a row whose sigma the schedule has not set yet (no sample's key: see ``_carry``).
UNSET = np.uint64(0)


def training_engine(net):
    """A :class:`~smoothsk.engine.MonteCarloEngine` on the net's module, for training-time sigmas.

    The root seed is drawn from ``net.noise_generator_``, so training stays
    reproducible under ``random_state``. Use it with the module in eval mode
    (:func:`smoothsk._modes.evaluating`).

    Returns
    -------
    MonteCarloEngine
    """
    generator = net.noise_generator_
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return MonteCarloEngine(net.module_, len(net.classes_), net.certify_batch_size, net.device,
                            net.n_jobs, root_seed=seed)


def sample_keys(schedule, X, y):
    """Key of each training sample's sigma under ``schedule`` (see the module docstring).

    A sample is its input and its label: PFAT's assignment and Insta-RS's
    level updates choose sigma with the label, so one input under two labels
    is two samples. The key is the input's hash (:func:`~smoothsk._data.input_ids`)
    xor a digest of the label and the schedule's settings: two rows of one
    input differ by their labels' digests, two rows of other inputs collide
    with probability 2**-64.

    Parameters
    ----------
    schedule : BaseTrainingSchedule
        Its class and the values of its ``_sigma_params`` enter every key.
    X : torch.Tensor, shape (n, *input_shape)
        Training inputs (float32).
    y : torch.Tensor of int64, shape (n,)
        Their class indices.

    Returns
    -------
    keys : ndarray of uint64, shape (n,)
    """
    settings = (type(schedule).__module__, type(schedule).__qualname__,
                {name: _saved_form(getattr(schedule, name), name) for name in schedule._sigma_params})
    labels, position = np.unique(y.cpu().numpy(), return_inverse=True)
    label_keys = np.array([int(value_digest((settings, int(label)))[:16], 16) for label in labels], dtype=np.uint64)
    return input_ids(X.cpu().numpy()) ^ label_keys[position.reshape(-1)]


def _saved_form(value, name):
    """``value`` as a saved file holds it (a numpy number as a Python one, a component as its parameters).

    So a schedule's keys are the same before and after a save and load;
    a value no file can hold is taken as it is. Classes are named by module
    and qualified name (:func:`_qualified_name`), the same on both sides.
    """
    try:
        return encode(value, name, {}, _qualified_name)
    except ValueError:
        return value


def _qualified_name(cls, where):
    """``module.qualname`` of ``cls``: its name in a key (``where``, the parameter, goes unused)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _occurrence(keys):
    """How many earlier entries of ``keys`` equal each one (int64 ndarray)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys)) - np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
    return rank


def matched_rows(old_keys, keys):
    """For each of ``keys``, the row of ``old_keys`` holding its ``k``-th repeat as the ``k``-th (-1: none).

    Returns
    -------
    rows : ndarray of int64, shape (len(keys),)
    """
    pairs = np.column_stack([np.concatenate([old_keys, keys]),
                             np.concatenate([_occurrence(old_keys), _occurrence(keys)]).astype(np.uint64)])
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    row_of = np.full(len(unique), -1, dtype=np.int64)
    row_of[inverse[:len(old_keys)]] = np.arange(len(old_keys))
    return row_of[inverse[len(old_keys):]]


class PerSampleSchedule(BaseTrainingSchedule):
    """Base of the schedules with per-sample sigmas stored in ``net.train_sigmas_``."""

    def batch_sigma(self, net, X, y, index):
        sigma = net.train_sigmas_[index.cpu().numpy()]
        return torch.as_tensor(sigma, dtype=X.dtype, device=X.device)

    def _carry(self, net, X, y, initial):
        """Set ``net.train_sigmas_`` and ``net.train_keys_`` for the training set ``X``, ``y``.

        A sample whose key the previous fit call of this training had keeps
        its sigma and its key (every row keeps its own, by position, after
        loading a file saved before keys existed: see the module docstring);
        the others (all of them on a fresh fit) start at ``initial`` with
        the key :data:`UNSET` until :meth:`_settle`.

        Returns
        -------
        known : ndarray of bool, shape (len(X),)
            The samples that kept their sigma.
        """
        keys = sample_keys(self, X, y)
        sigmas = np.full(len(X), float(initial))
        known = np.zeros(len(X), dtype=bool)
        old_sigmas, old_keys = getattr(net, "train_sigmas_", None), getattr(net, "train_keys_", None)
        resumable = len(net.history) and old_sigmas is not None
        if resumable and old_keys is None and len(old_sigmas) == len(X):
            known[:] = True  # saved before keys existed: by position (see the module docstring)
            sigmas[:] = old_sigmas
        elif resumable and old_keys is not None and len(old_keys) == len(old_sigmas):
            rows = matched_rows(old_keys, keys)
            known = (rows >= 0) & (keys != UNSET)  # a key equal to UNSET (chance 2**-64) is never known
            sigmas[known] = old_sigmas[rows[known]]
        self.keys_ = keys
        net.train_sigmas_, net.train_keys_ = sigmas, np.where(known, keys, UNSET)
        return known

    def _settle(self, net, rows=slice(None)):
        """Record that the schedule set the sigmas of ``rows`` (a mask or slice): later fit calls keep them."""
        net.train_keys_[rows] = self.keys_[rows]


def uniform_sigmas(net, n_samples, low, high):
    """``n_samples`` draws of U(low, high) from the net's training generator (float64 ndarray)."""
    generator = net.noise_generator_
    draws = torch.rand(n_samples, generator=generator, device=generator.device, dtype=torch.float64)
    return low + (high - low) * draws.cpu().numpy()
