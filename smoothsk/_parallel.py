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
"""


import numpy as np
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
    parts = []
    results = Parallel(n_jobs=n_jobs, prefer="threads", return_as="generator")(
        delayed(certify_chunk)(X[begin:end])
        for begin, end in zip(bounds[:-1], bounds[1:], strict=True) if end > begin)
    for part in results:
        parts.append(part)
        if progress is not None:
            progress.update(int(np.sum(part.n_samples)))
    return Certificates.concatenate(parts)
