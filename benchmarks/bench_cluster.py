"""Certification on a dask.distributed cluster: 2 worker processes against 1, identical certificates.

``certify`` with ``n_jobs=-1`` under ``joblib.parallel_config(backend="dask")``
splits the inputs into chunks certified by the cluster's workers (each one
process with one thread, torch limited to one thread). The job is
certify-bound: ``DigitsCNN`` (untrained: the time does not depend on the
weights) on digits-shaped inputs at n = 4,000 each.

Target: 2 workers >= 1.6x one worker, identical certificates.
Needs at least 2 free CPU cores to be meaningful.

Run ``python benchmarks/bench_cluster.py`` (``--quick`` for a smoke run;
``--keep-freed-memory`` starts the workers with glibc's thresholds of
:func:`smoothsk.allocator.keep_freed_memory` in their environment, through
dask's ``distributed.nanny.pre-spawn-environ``: by default dask's nanny starts
its workers with ``MALLOC_TRIM_THRESHOLD_=65536``, so the page faults both
workers contend for in the kernel are worse there than at glibc's defaults,
and ``keep_freed_memory`` in a worker leaves that setting alone).
"""

import dask
import joblib
import numpy as np
from distributed import Client, LocalCluster

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.allocator import MMAP_THRESHOLDS, TRIM_THRESHOLD
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining

from _common import quick_parser, timed


def limit_torch_threads():
    import torch

    torch.set_num_threads(1)


def certify_on_cluster(clf, X, n_workers, keep_memory):
    """(best seconds of three calls, certificates) of ``clf.certify(X)`` on a cluster of ``n_workers`` processes."""
    environment = {"MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLDS[0]}
    settings = {f"distributed.nanny.pre-spawn-environ.{name}": value for name, value in environment.items()}
    with dask.config.set(settings if keep_memory else {}), \
            LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(limit_torch_threads)
        with joblib.parallel_config(backend="dask"):
            clf.certify(X[:n_workers * 2])  # warm-up: imports and the first forward passes on every worker
            # Best of three calls: a single call's time moved by up to a third between runs.
            runs = [timed(clf.certify, X, return_details=True) for _ in range(3)]
            return min(seconds for seconds, _ in runs), runs[0][1][2]


def main():
    parser = quick_parser(__doc__, "few inputs (a smoke run)")
    parser.add_argument("--keep-freed-memory", action="store_true", help="start workers with its thresholds")
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
