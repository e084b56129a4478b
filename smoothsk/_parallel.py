"""Certification split by chunks of inputs over joblib workers.

When the allocator is stateless (:attr:`BaseAllocator.stateless`) and the
sigma search chooses each input's sigma from that input alone
(``per_input``, true of every search but ``MultiStartFGSS(per_input=False)``),
each input's certificate depends only on the input, the model, the
parameters and the root seed: its noise streams are keyed by a hash of its
values (see :mod:`smoothsk.engine`), never by its place in the call.
Certifying chunks of the inputs in separate workers, search and sampling
together, therefore gives exactly the certificates of one pass
(:func:`can_split`). A stateful allocator or a search that learns one sigma
for the whole set keeps its one pass. Workers run wherever
the active joblib back-end puts them: threads by default, or the processes
of a ``dask.distributed`` or ray cluster under ``joblib.parallel_config``.

Workers that are threads of this process share its torch CPU threads
(:func:`sharing_threads`), here and in the engine's split of one call's
batches: each worker runs its forward passes on its share, not on all of
them, so ``n_jobs`` workers never run ``n_jobs`` times the cores' threads.
"""

import os

import numpy as np
import torch
from joblib import Parallel, delayed, effective_n_jobs

from .certificates import Certificates

#: Chunks per worker: a little slack so that a slow chunk does not idle the others.
_CHUNKS_PER_WORKER = 2


def can_split(components):
    """Whether certifying chunks of the inputs separately gives the certificates of one pass.

    Parameters
    ----------
    components : Components
        The estimator's validated components.

    Returns
    -------
    bool
        True when the allocator is stateless and the sigma search is
        ``per_input``; False when a certificate depends on the other inputs
        of the pass: the regions of a stateful allocator, or one sigma learned
        for the whole set.
    """
    return bool(components.allocator.stateless and components.sigma_search.per_input)


def n_chunks(n_inputs, n_jobs):
    """Number of chunks to split ``n_inputs`` inputs into for ``n_jobs`` workers.

    Parameters
    ----------
    n_inputs : int
    n_jobs : int or None
        The estimator's ``n_jobs`` (resolved by the active joblib back-end).

    Returns
    -------
    int
        1 when there is nothing to split (one input, or ``n_jobs`` None or 1).
    """
    if n_jobs in (None, 1) or n_inputs < 2:
        return 1
    return max(1, min(n_inputs, _CHUNKS_PER_WORKER * effective_n_jobs(n_jobs)))


def sharing_threads(function, n_workers):
    """``function`` wrapped to run as one of ``n_workers`` concurrent joblib workers on its share of torch's threads.

    In a thread of this process (joblib's threading back-end, the default
    here), the call runs its forward passes on
    ``max(1, torch.get_num_threads() // n_workers)`` intra-op threads, the
    count of the process at wrapping: torch's count is per thread, so the
    other workers and the caller keep theirs. In another process (a dask,
    ray or loky worker) the call runs as it is, with that process's threads.

    Parameters
    ----------
    function : callable
        Picklable (for process back-ends).
    n_workers : int
        Workers that run at the same time.

    Returns
    -------
    callable
        Takes and returns what ``function`` does.
    """
    return _ThreadShare(function, os.getpid(), torch.get_num_threads(), n_workers)


class _ThreadShare:
    """``function`` on its share of the torch threads when called in process ``pid``: see :func:`sharing_threads`."""

    def __init__(self, function, pid, threads, n_workers):
        self.function, self.pid, self.threads, self.n_workers = function, pid, threads, n_workers

    def __call__(self, *args, **kwargs):
        if os.getpid() != self.pid:
            return self.function(*args, **kwargs)
        # A thread's first torch call sets its count from the process-wide one, which the other workers
        # are changing: make that call now, so that the share set next is not overwritten by it.
        torch.get_num_threads()
        torch.set_num_threads(max(1, self.threads // self.n_workers))
        try:
            return self.function(*args, **kwargs)
        finally:
            # set_num_threads also sets the count that threads started later begin with: back to the process's.
            torch.set_num_threads(self.threads)


def certify_in_parallel(certify_chunk, X, n_jobs, progress=None):
    """Certify the inputs ``X`` in chunks over joblib workers.

    Parameters
    ----------
    certify_chunk : callable
        ``certify_chunk(X_chunk) -> Certificates`` certifies the inputs
        ``X_chunk`` (consecutive rows of ``X``) with no parallelism of its
        own. It is sent to the workers with its chunk, so it must pickle for
        process back-ends.
    X : ndarray of float32, shape (n_inputs, *input_shape)
        The inputs to certify.
    n_jobs : int
        joblib workers (threads unless a back-end such as dask or ray is active).
    progress : tqdm progress bar or None
        Advanced by the noisy samples of each chunk as it finishes.

    Returns
    -------
    Certificates
        Certificates of the inputs, in order.
    """
    bounds = np.linspace(0, len(X), n_chunks(len(X), n_jobs) + 1).round().astype(int)
    certify_chunk = sharing_threads(certify_chunk, min(effective_n_jobs(n_jobs), len(bounds) - 1))
    parts = []
    results = Parallel(n_jobs=n_jobs, prefer="threads", return_as="generator")(
        delayed(certify_chunk)(X[begin:end])
        for begin, end in zip(bounds[:-1], bounds[1:], strict=True) if end > begin)
    for part in results:
        parts.append(part)
        if progress is not None:
            progress.update(int(np.sum(part.n_samples)))
    return Certificates.concatenate(parts)
