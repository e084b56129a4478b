"""What a checkpoint costs: ``certify(X, checkpoint=...)`` against the plain call, in one process.

A checkpointed run fingerprints its inputs, parameters and weights, certifies
in chunks of ``checkpoint_every`` inputs and writes the file after each chunk
(atomically: a temporary file, then a rename); with a stateful allocator it
also certifies each chunk against a copy of the region store and records the
store in the file. Two configurations on the digits with ``DigitsCNN``:

- a fixed sigma (``NoRegions``): the fingerprint and the writes;
- PFAT's grid search with ``OnlineBallAllocator``: the store's copies and
  records on top.

Each repeat times the plain call and the checkpointed call back to back, in
process CPU time (a new file each time), the plain one first at even repeats
and second at odd ones; the verdict is the median over repeats of
(checkpointed time / plain time - 1). The table also counts the model's forward
passes and noisy samples in each call: what a stateful run's chunking costs in
partly filled batches, free of timing noise. With ``NoRegions`` the certificates must be identical; with
a stateful allocator each chunk is a call of its own, which draws fresh noise
for the store's next queries, so they are those of certifying the chunks one
call after another (``tests/test_checkpoint.py`` checks that), not those of
one call.

Target: overhead <= 3% of certify time.

Run ``python benchmarks/bench_checkpoint.py`` (``--quick`` for a smoke run).
"""

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.allocator import keep_freed_memory
from smoothsk.datasets import load_digits_images
from smoothsk.models import DigitsCNN
from smoothsk.regions import NoRegions, OnlineBallAllocator
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma, GridSigmaSearch
from smoothsk.training import FixedSigmaTraining

from _common import quick_parser, table_header, table_row, timed

#: Inputs per checkpointed chunk (a write after each).
CHECKPOINT_EVERY = 100
TARGET = 0.03


def configurations(n):
    """Name -> estimator parameters of each configuration, at ``n`` certification samples per input."""
    return {
        "fixed sigma, NoRegions": {"sigma_search": FixedSigma(0.25), "allocator": NoRegions()},
        "grid search, OnlineBallAllocator (stateful)": {"sigma_search": GridSigmaSearch(0.25, 1.0, 0.25, n=100),
                                                        "allocator": OnlineBallAllocator()},
    }


def run(clf, X, repeats, folder):
    """Seconds of the plain and checkpointed calls per repeat, their forward passes, and whether they certified alike.

    The two calls alternate which goes first (the plain one at even repeats),
    so that a first-call or warm-cache effect falls on both alike.

    Returns
    -------
    plain, checkpointed : ndarray of float, shape (repeats,)
        CPU seconds of each call.
    passes : dict of str to tuple of int
        ``"plain"`` and ``"checkpointed"``: (forward passes, noisy samples)
        of the last call of each (the same at every repeat).
    identical : bool
    """
    passes = {}
    counts = [0, 0]

    def count(module, inputs):
        counts[0] += 1
        counts[1] += len(inputs[0])

    hook = clf.module_.register_forward_pre_hook(count)
    plain, checkpointed, identical = [], [], True
    try:
        for repeat in range(repeats):
            calls = [("plain", {}), ("checkpointed", {"checkpoint": Path(folder) / f"run{repeat}.ckpt",
                                                      "checkpoint_every": CHECKPOINT_EVERY})]
            details = {}
            for name, options in calls if repeat % 2 == 0 else calls[::-1]:
                clf.reset_regions()
                counts[:] = [0, 0]
                seconds, (_, _, details[name]) = timed(clf.certify, X, return_details=True, clock=time.process_time,
                                                       **options)
                passes[name] = tuple(counts)
                (plain if name == "plain" else checkpointed).append(seconds)
            identical &= all(np.array_equal(getattr(details["checkpointed"], field), getattr(details["plain"], field))
                             for field in ("prediction", "radius", "sigma", "n_samples"))
    finally:
        hook.remove()
    return np.array(plain), np.array(checkpointed), passes, identical


def main():
    args = quick_parser(__doc__, "fewer inputs and samples, two repeats (a smoke run)").parse_args()
    torch.set_num_threads(1)
    # As the smoothsk command does: at glibc's defaults, page faults move each call's time by up to a third.
    keep_freed_memory()
    n_inputs, n, repeats = (100, 200, 2) if args.quick else (400, 1000, 5)
    X, y = load_digits_images()
    print(f"{n_inputs} digits, n = {n:,}, n0 = 100, checkpoint_every = {CHECKPOINT_EVERY}, one torch thread, "
          f"{repeats} back-to-back repeats\n")
    table_header(["configuration", "plain (s)", "checkpointed (s)", "overhead (median)", "range",
                  "forward passes (samples) plain / checkpointed", "identical certificates", f"<= {TARGET:.0%}"])
    for name, params in configurations(n).items():
        clf = SampleWiseSmoothedClassifier(DigitsCNN, training=FixedSigmaTraining(0.25), sampler=FixedSampler(n=n),
                                           max_epochs=2, lr=0.05, optimizer__momentum=0.9, random_state=0,
                                           **params).fit(X[:1000], y[:1000])
        clf.certify(X[1000:1004])  # warm-up
        with tempfile.TemporaryDirectory() as folder:
            plain, checkpointed, passes, identical = run(clf, X[1000:1000 + n_inputs], repeats, folder)
        identical = str(identical) if params["allocator"].stateless else "n/a (stateful)"
        overhead = checkpointed / plain - 1
        median = float(np.median(overhead))
        table_row([name, f"{np.median(plain):.2f}", f"{np.median(checkpointed):.2f}", f"{median:+.1%}",
                   f"{overhead.min():+.1%} to {overhead.max():+.1%}",
                   " / ".join(f"{passes[call][0]:,} ({passes[call][1]:,})" for call in ("plain", "checkpointed")),
                   identical,
                   "met" if median <= TARGET else "NOT met"])


if __name__ == "__main__":
    main()
