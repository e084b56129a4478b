"""Certification on a dask.distributed cluster: 2 worker processes against 1, identical certificates.

``certify`` with ``n_jobs=-1`` under ``joblib.parallel_config(backend="dask")``
splits the inputs into chunks certified by the cluster's workers (each one
process with one thread, torch limited to one thread). The job is
certify-bound: ``DigitsCNN`` (untrained: the time does not depend on the
weights) on digits-shaped inputs at n = 4,000 each.

Target: 2 workers >= 1.6x one worker, identical certificates.
Needs at least 2 free CPU cores to be meaningful.

Run ``python benchmarks/bench_cluster.py`` (``--quick`` for a smoke run;
``--keep-freed-memory`` runs :func:`smoothsk.allocator.keep_freed_memory` on
every running worker; glibc's ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` in the environment, which the workers inherit, are
what removed the page faults both workers contend for in our measurements,
see docs/scaling.md).
"""

import joblib
import numpy as np
from _common import quick_parser, timed
from distributed import Client, LocalCluster

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.allocator import keep_freed_memory
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining


def limit_torch_threads():
    import torch

    torch.set_num_threads(1)


def certify_on_cluster(clf, X, n_workers, keep_memory):
    """(seconds, certificates) of ``clf.certify(X)`` on a local cluster of ``n_workers`` processes."""
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(limit_torch_threads)
        if keep_memory:
            client.run(keep_freed_memory)
        with joblib.parallel_config(backend="dask"):
            clf.certify(X[:n_workers * 2])  # warm-up: imports and the first forward passes on every worker
            seconds, (_, _, details) = timed(clf.certify, X, return_details=True)
            return seconds, details


def main():
    parser = quick_parser(__doc__, "few inputs (a smoke run)")
    parser.add_argument("--keep-freed-memory", action="store_true", help="keep_freed_memory() on every worker")
    args = parser.parse_args()
    n, n_inputs = (500, 8) if args.quick else (4000, 40)
    rng = np.random.default_rng(0)
    X = rng.random((n_inputs + 10, 1, 8, 8), dtype=np.float32)
    clf = SampleWiseSmoothedClassifier(
        DigitsCNN, training=FixedSigmaTraining(0.25), sigma_search=FixedSigma(0.25),
        sampler=FixedSampler(n=n, n0=100), certify_batch_size=256, n_jobs=-1, max_epochs=0, random_state=0)
    clf.fit(X[:10], np.arange(10))
    X = X[10:]
    one, reference = certify_on_cluster(clf, X, 1, args.keep_freed_memory)
    two, details = certify_on_cluster(clf, X, 2, args.keep_freed_memory)
    identical = all(np.array_equal(getattr(details, field), getattr(reference, field))
                    for field in ("prediction", "radius", "p_lower", "n_samples"))
    print(f"{n_inputs} inputs at n = {n:,}, keep_freed_memory {args.keep_freed_memory}: "
          f"1 worker {one:.2f} s, 2 workers {two:.2f} s, "
          f"speed-up {one / two:.2f}x (target >= 1.6x); identical certificates: {identical}")


if __name__ == "__main__":
    main()
