"""Certification throughput: ``certify`` against the raw forward-pass limit and a per-input loop.

Four ways to spend the same noisy samples on the same model and inputs (the
digits), in one process; the model is ``DigitsCNN`` or, with ``--model
two-layer``, a CNN of two convolutions and a linear read-out:

- ``certify``: ``SampleWiseSmoothedClassifier.certify`` (validation, sigma,
  packed and seeded Monte Carlo engine, Clopper-Pearson bounds);
- ``raw limit``: the model's forward passes alone, over batches of a
  preallocated buffer of noisy inputs (no noise drawn, nothing counted);
- ``forward on normal_``: the same forward passes, each batch's noise drawn
  by ``normal_`` into a reused buffer (the issue's "raw forward-pass limit");
- ``per-input loop``: Cohen et al.'s reference CERTIFY written plainly: per
  input, n0 selection then n estimation samples in batches of at most
  ``batch_size`` copies of that input, noise from ``torch.randn_like``.

Targets (CPU, batches of 1,000 copies): (i) n = 20,000 per input: certify >=
0.95x the forward passes on ``normal_`` noise; (ii) n = 200 per input over 500
inputs and (iii) n = 10,000 per input over 8 inputs: certify >= 1.0x the
per-input loop.

Run ``python benchmarks/bench_certify.py [--model two-layer]`` (``--quick`` for a
smoke run). On Linux, glibc's malloc returns the model's activation buffers to
the kernel after each forward pass at default settings, and page faults then
cost every method up to half its time, differently at each batch size (see
docs/scaling.md); the rows are comparable within one run either way, and
``--keep-freed-memory`` (:func:`smoothsk.allocator.keep_freed_memory`, as the
``smoothsk`` command runs) removes the effect for every method.
"""

import time

import numpy as np
import torch
from scipy import stats

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.allocator import keep_freed_memory
from smoothsk.datasets import load_digits_images
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler
from smoothsk.training import FixedSigmaTraining

from _common import quick_parser, table_header, table_row, timed

SIGMA = 0.25
ALPHA = 0.001
N0 = 100


class TwoLayerCNN(torch.nn.Module):
    """Two convolutions and a linear read-out for the 8x8 digits: (n, 1, 8, 8) -> (n, n_classes) logits."""

    def __init__(self, n_classes=10, width=16):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(1, width, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(width, 2 * width, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(2 * width * 64, n_classes))

    def forward(self, x):
        return self.layers(x)


MODELS = {"digits-cnn": DigitsCNN, "two-layer": TwoLayerCNN}


def sample_noise(module, x, num, batch_size, n_classes):
    """Class counts of ``num`` noisy copies of one input, in batches of one input's copies."""
    counts = np.zeros(n_classes, dtype=np.int64)
    remaining = num
    with torch.no_grad():
        while remaining > 0:
            size = min(batch_size, remaining)
            remaining -= size
            batch = x.repeat((size,) + (1,) * (x.dim() - 1))
            noise = torch.randn_like(batch) * SIGMA
            prediction = module(batch + noise).argmax(dim=1)
            counts += np.bincount(prediction.cpu().numpy(), minlength=n_classes)
    return counts


def per_input_loop(module, X, n, batch_size, n_classes):
    """Cohen et al.'s CERTIFY, one input at a time: (prediction, radius) per input."""
    prediction, radius = np.full(len(X), -1), np.zeros(len(X))
    for i, x in enumerate(torch.from_numpy(X)):
        candidate = sample_noise(module, x[None], N0, batch_size, n_classes).argmax()
        n_candidate = sample_noise(module, x[None], n, batch_size, n_classes)[candidate]
        p_lower = stats.beta.ppf(ALPHA, n_candidate, n - n_candidate + 1) if n_candidate else 0.0
        if p_lower >= 0.5:
            prediction[i], radius[i] = candidate, SIGMA * stats.norm.ppf(p_lower)
    return prediction, radius


def raw_limit(module, X, n, batch_size):
    """Forward passes over the same number of noisy inputs, from a preallocated buffer."""
    total = len(X) * (N0 + n)
    generator = torch.Generator().manual_seed(0)
    clean = torch.from_numpy(X)[torch.arange(batch_size) % len(X)]
    noisy = clean + SIGMA * torch.randn(clean.shape, generator=generator)
    with torch.inference_mode():
        for start in range(0, total, batch_size):
            module(noisy[:min(batch_size, total - start)])


def forward_on_normal(module, X, n, batch_size):
    """Forward passes over the same number of noisy inputs, each batch's noise drawn by ``normal_``."""
    total = len(X) * (N0 + n)
    generator = torch.Generator().manual_seed(0)
    clean = torch.from_numpy(X)[torch.arange(batch_size) % len(X)]
    noise = torch.empty_like(clean)
    with torch.inference_mode():
        for start in range(0, total, batch_size):
            size = min(batch_size, total - start)
            noise[:size].normal_(0.0, SIGMA, generator=generator)
            module(clean[:size] + noise[:size])


def forward_cost(module, shape, batch_size, repeats, clock):
    """Best seconds per sample of one forward pass at ``batch_size`` over ``repeats`` timings."""
    x = torch.randn((batch_size,) + shape)
    best = np.inf
    with torch.inference_mode():
        module(x)
        for _ in range(repeats):
            calls = max(1, 4000 // batch_size)
            start = clock()
            for _ in range(calls):
                module(x)
            best = min(best, (clock() - start) / (calls * batch_size))
    return best


def run_regime(clf, X, n, repeats, clock):
    """Times of each method on inputs X at n estimation samples each: {method: [seconds per repeat]}."""
    module, batch_size = clf.module_.eval(), clf.certify_batch_size
    clf.set_params(sampler__n=n, sampler__n0=N0)
    methods = {
        "certify": lambda X: clf.certify(X),
        "raw limit": lambda X: raw_limit(module, X, n, batch_size),
        "forward on normal_": lambda X: forward_on_normal(module, X, n, batch_size),
        "per-input loop": lambda X: per_input_loop(module, X, n, batch_size, len(clf.classes_)),
    }
    for method in methods.values():
        method(X[:1])  # warm-up
    times = {name: [] for name in methods}
    for _ in range(repeats):  # interleaved, so that changes of load hit every method alike
        for name, method in methods.items():
            times[name].append(timed(method, X, clock=clock)[0])
    return times


def main():
    parser = quick_parser(__doc__, "few inputs, one repeat (a smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--batch-size", type=int, default=1000, help="certify_batch_size (default 1000)")
    parser.add_argument("--model", choices=sorted(MODELS), default="digits-cnn", help="base classifier")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="time the process's CPU time (default; steadier on a shared machine) or wall time")
    parser.add_argument("--keep-freed-memory", action="store_true", help="keep_freed_memory() before anything runs")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (default 7; --quick: 1)")
    args = parser.parse_args()
    kept = keep_freed_memory() if args.keep_freed_memory else False
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    X, y = load_digits_images()
    clf = SampleWiseSmoothedClassifier(MODELS[args.model], training=FixedSigmaTraining(SIGMA), sampler=FixedSampler(),
                                       max_epochs=2, lr=0.05, optimizer__momentum=0.9, random_state=0,
                                       certify_batch_size=args.batch_size)
    clf.fit(X[:1000], y[:1000])
    X_test = X[1000:]
    regimes = [("(i)", 20_000, 2 if args.quick else 4, "forward on normal_", 0.95),
               ("(ii)", 200, 100 if args.quick else 500, "per-input loop", 1.0),
               ("(iii)", 10_000, 2 if args.quick else 8, "per-input loop", 1.0)]
    repeats = 1 if args.quick else args.repeats

    print(f"{args.model}, torch {torch.__version__}, {args.threads} thread(s), "
          f"certify_batch_size={clf.certify_batch_size}, keep_freed_memory {kept}, "
          f"n0={N0}, {args.clock} time, {repeats} interleaved repeat(s)\n")
    table_header(["regime", "inputs", "n per input", "method", "noisy samples", "best seconds", "samples/s",
                  "certify speed-up"])
    verdicts = []
    for label, n, n_inputs, baseline, target in regimes:
        times = run_regime(clf, X_test[:n_inputs], n, repeats, clock)
        samples = n_inputs * (N0 + n)
        best = {name: min(values) for name, values in times.items()}
        for name, seconds in best.items():
            table_row([label, f"{n_inputs}", f"{n:,}", name, f"{samples:,}", f"{seconds:.2f}",
                       f"{samples / seconds:,.0f}", f"{seconds / best['certify']:.2f}x"])
        # The verdict uses runs taken back to back: the median over repeats of
        # (baseline time / certify time) within one repeat.
        ratios = np.array(times[baseline]) / np.array(times["certify"])
        ratio = float(np.median(ratios))
        verdicts.append(f"- {label} n = {n:,}: certify runs at {ratio:.2f}x the speed of the {baseline} "
                        f"(median of {repeats} back-to-back ratios, range {ratios.min():.2f}-{ratios.max():.2f}; "
                        f"target >= {target}x): {'met' if ratio >= target else 'NOT met'}")
    print("\n" + "\n".join(verdicts))

    # What a forward pass costs per sample at the batch sizes the methods run:
    # the per-input loop's batches hold n0 or n copies, certify's are full.
    sizes = sorted({N0, 200, clf.certify_batch_size, 1000})
    print()
    table_header(["forward batch size", "microseconds per sample"])
    for size in sizes:
        cost = forward_cost(clf.module_, tuple(X.shape[1:]), size, repeats + 2, clock)
        table_row([f"{size}", f"{cost * 1e6:.1f}"])


if __name__ == "__main__":
    main()
