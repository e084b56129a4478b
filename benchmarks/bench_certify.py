"""Certification throughput: ``certify`` against the forward-pass limit and a per-input loop.

Ways to spend the same noisy samples on the same model and inputs, in one
process. The model is ``DigitsCNN`` on the 8x8 digits (default), a CNN of two
convolutions (``--model two-layer``), ``LeNet`` on 1x28x28 inputs (``--model
lenet``) or ``CifarResNet`` on 3x32x32 inputs (``--model cifar-resnet``, 64
copies per batch); the last two certify their untrained weights as they are
(``Pretrained``) on uniform random images, as only time is measured.

- ``certify``: ``SampleWiseSmoothedClassifier.certify`` (validation, sigma,
  packed and seeded Monte Carlo engine, Clopper-Pearson bounds), in the
  layout its ``certify_memory_format="auto"`` picks;
- ``raw limit (contiguous)`` and ``(channels_last)``: the model's forward
  passes alone, over batches of a preallocated buffer of noisy inputs (no
  noise drawn, nothing counted), with the module and the batches in that layout;
- ``forward on normal_ (contiguous)`` and ``(channels_last)``: the same forward
  passes, each batch's noise drawn by ``normal_`` into a reused buffer, with
  the module and the batches in that layout. With ``--n-jobs`` above 1 (certify
  then runs that many workers, each on its share of the threads) they also run
  as that many lanes of threads, each with its share of the threads and of the
  batches. The target's "forward-pass limit" is the one of them fastest by
  its median time over the repeats, so it cannot be met against a slow layout
  or a slow split of the cores; it is that one method in every repeat, not the
  fastest in each repeat (the least of several noisy times, biased low: the
  luckiest run of whichever method, not the fastest method);
- ``per-input loop``: Cohen et al.'s reference CERTIFY written plainly, in
  the contiguous layout as their code runs: per input, n0 selection then n
  estimation samples in batches of at most ``batch_size`` copies of that
  input, noise from ``torch.randn_like``; in inference mode, as certify
  runs (their ``no_grad`` would make ``TiledMaxPool2d`` take torch's slower
  pooling kernel, a handicap that is not the loop's).

Last, the noise alone: certify's keyed CPU source (Philox words and the
Box-Muller transform) against ``normal_``, per copy: on the CPU the gap
between certify and the forward-pass limit is mostly this difference.

Targets (CPU): (i) n = 20,000 per input: certify >= 0.95x the forward-pass
limit; (ii) n = 200 per input over 500 inputs: certify >= 1.0x the per-input
loop; (iii) n = 10,000 per input over 8 inputs: certify >= 1.0x the per-input
loop (1.4x for ``lenet``).

Run ``python benchmarks/bench_certify.py [--model lenet] [--threads 2]``
(``--quick`` for a smoke run; ``--torch-pooling`` runs the model with
``nn.MaxPool2d`` in place of its ``TiledMaxPool2d``, the same values by
torch's slower pooling kernel, to measure what that layer saves). On Linux,
glibc's malloc returns the model's activation buffers to the kernel after each
forward pass at default settings, and page faults then cost every method up to
half its time, differently at each batch size (see docs/scaling.md); the rows
are comparable within one run either way, and ``--keep-freed-memory``
(:func:`smoothsk.allocator.keep_freed_memory`, as the ``smoothsk`` command
runs) removes the effect for every method.
"""

import copy
import threading
import time

import numpy as np
import torch
from scipy import stats

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.allocator import keep_freed_memory
from smoothsk.datasets import load_digits_images
from smoothsk.engine import _NoiseSource, stage_key
from smoothsk.models import CifarResNet, DigitsCNN, LeNet, TiledMaxPool2d
from smoothsk.sampling import FixedSampler
from smoothsk.training import FixedSigmaTraining, Pretrained

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


#: Model name: (module class, input shape or None for the digits, copies per forward pass by default,
#: inputs in regime (i), target of regime (iii)).
MODELS = {"digits-cnn": (DigitsCNN, None, 1000, 4, 1.0), "two-layer": (TwoLayerCNN, None, 1000, 4, 1.0),
          "lenet": (LeNet, (1, 28, 28), 1000, 4, 1.4), "cifar-resnet": (CifarResNet, (3, 32, 32), 64, 1, 1.0)}
LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def sample_noise(module, x, num, batch_size, n_classes):
    """Class counts of ``num`` noisy copies of one input, in batches of one input's copies."""
    counts = np.zeros(n_classes, dtype=np.int64)
    remaining = num
    # Inference mode where Cohen et al.'s code has no_grad: certify's, in which TiledMaxPool2d runs faster.
    with torch.inference_mode():
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


def in_layout(module, X, layout):
    """A copy of ``module`` and the inputs ``X`` (ndarray) as a tensor, both in ``layout``."""
    X = torch.from_numpy(X)
    if X.dim() != 4:
        return module, X
    return copy.deepcopy(module).to(memory_format=layout), X.contiguous(memory_format=layout)


def raw_limit(module, X, n, batch_size):
    """Forward passes over the same number of noisy inputs (tensor X), from a preallocated buffer."""
    total = len(X) * (N0 + n)
    generator = torch.Generator().manual_seed(0)
    clean = X[torch.arange(batch_size) % len(X)]
    noisy = clean + SIGMA * torch.randn(clean.shape, generator=generator)
    with torch.inference_mode():
        for start in range(0, total, batch_size):
            module(noisy[:min(batch_size, total - start)])


def forward_on_normal(module, X, n, batch_size, lanes=1):
    """Forward passes over the same number of noisy inputs (tensor X), each batch's noise drawn by ``normal_``.

    With ``lanes`` above 1, that many threads run a share of the batches
    each, each on its share of torch's threads (the count is per thread).
    """
    total = len(X) * (N0 + n)
    clean = X[torch.arange(batch_size) % len(X)]
    if lanes == 1:
        return normal_batches(module, clean, total)
    threads = max(1, torch.get_num_threads() // lanes)

    def lane(seed):
        torch.set_num_threads(threads)
        normal_batches(module, clean, total // lanes, seed)

    workers = [threading.Thread(target=lane, args=(seed,)) for seed in range(lanes)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def normal_batches(module, clean, total, seed=0):
    """Forward passes over ``total`` noisy copies of the batch ``clean``, each batch's noise drawn by ``normal_``."""
    generator = torch.Generator().manual_seed(seed)
    batch_size = len(clean)
    noise = torch.empty_like(clean)
    with torch.inference_mode():
        for start in range(0, total, batch_size):
            size = min(batch_size, total - start)
            noise[:size].normal_(0.0, SIGMA, generator=generator)
            module(clean[:size] + noise[:size])


def noise_cost(shape, batch_size, repeats, clock):
    """Median seconds per copy of one batch of standard normal noise: certify's keyed CPU source and ``normal_``.

    The keyed source draws the copies of one input far into its stream (as
    at large n), ``normal_`` fills a reused buffer; interleaved.

    Returns
    -------
    dict of str to float
        ``"keyed"`` and ``"normal_"``.
    """
    source = _NoiseSource(stage_key(0, (1,)), shape, torch.float32, torch.device("cpu"))
    out = torch.empty((batch_size,) + shape)
    times = {"keyed": [], "normal_": []}
    for draw in range(repeats):
        first = 20_000 + draw * batch_size
        times["keyed"].append(timed(source.fill_segments, out, [(draw, first, first + batch_size)], clock=clock)[0])
        times["normal_"].append(timed(out.normal_, clock=clock)[0])
    return {name: float(np.median(values)) / batch_size for name, values in times.items()}


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


def with_torch_pooling(module):
    """``module`` with each ``TiledMaxPool2d`` replaced by ``nn.MaxPool2d`` of its kernel size, in place."""
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, TiledMaxPool2d):
                setattr(parent, name, torch.nn.MaxPool2d(child.kernel_size))
    return module


def run_regime(clf, X, n, repeats, clock):
    """Times of each method on inputs X at n estimation samples each ({method: [seconds per repeat]}), and the
    name of the forward method the forward-pass limit is."""
    module, batch_size = clf.module_.eval(), clf.certify_batch_size
    clf.set_params(sampler__n=n, sampler__n0=N0)
    layouts = {name: in_layout(module, X, layout) for name, layout in LAYOUTS.items()}
    splits = {1: ""} if clf.n_jobs in (None, 1) else {1: "", clf.n_jobs: f", {clf.n_jobs} lanes"}
    forward_methods = {
        f"forward on normal_ ({name}{label})": lambda X, name=name, lanes=lanes: forward_on_normal(
            *layouts[name], n, batch_size, lanes) for name in LAYOUTS for lanes, label in splits.items()}
    methods = {
        "certify": lambda X: clf.certify(X),
        **{f"raw limit ({name})": lambda X, name=name: raw_limit(*layouts[name], n, batch_size) for name in LAYOUTS},
        **forward_methods,
        "per-input loop": lambda X: per_input_loop(layouts["contiguous"][0], X, n, batch_size, len(clf.classes_)),
    }
    for method in methods.values():
        method(X[:1])  # warm-up
    times = {name: [] for name in methods}
    for _ in range(repeats):  # interleaved, so that changes of load hit every method alike
        for name, method in methods.items():
            times[name].append(timed(method, X, clock=clock)[0])
    # The forward-pass limit: the layout and split of the cores fastest by median over the repeats, compared
    # repeat by repeat (a minimum over the methods in each repeat would also take each repeat's luckiest noise).
    fastest = min(forward_methods, key=lambda name: np.median(times[name]))
    times["forward-pass limit"] = times[fastest]
    return times, fastest


def main():
    parser = quick_parser(__doc__, "few inputs, one repeat (a smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--n-jobs", type=int, default=1,
                        help="certify's n_jobs (default 1); above 1 the forward passes also run in as many lanes")
    parser.add_argument("--batch-size", type=int, help="certify_batch_size (default 1000; cifar-resnet 64)")
    parser.add_argument("--regimes", default="i,ii,iii", help="regimes to run (default i,ii,iii)")
    parser.add_argument("--model", choices=sorted(MODELS), default="digits-cnn", help="base classifier")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="time the process's CPU time (default; steadier on a shared machine) or wall time")
    parser.add_argument("--keep-freed-memory", action="store_true", help="keep_freed_memory() before anything runs")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (default 7; --quick: 1)")
    parser.add_argument("--torch-pooling", action="store_true",
                        help="run the model with nn.MaxPool2d in place of its TiledMaxPool2d (the same values)")
    args = parser.parse_args()
    kept = keep_freed_memory() if args.keep_freed_memory else False
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    module, shape, batch_size, limit_inputs, loop_target = MODELS[args.model]
    batch_size = args.batch_size or batch_size
    if shape is None:
        X, y = load_digits_images()
        clf = SampleWiseSmoothedClassifier(module, training=FixedSigmaTraining(SIGMA), sampler=FixedSampler(),
                                           max_epochs=2, lr=0.05, optimizer__momentum=0.9, random_state=0,
                                           certify_batch_size=batch_size, n_jobs=args.n_jobs)
        clf.fit(X[:1000], y[:1000])
        X_test = X[1000:]
    else:
        torch.manual_seed(0)
        X_test = np.random.default_rng(0).random((500,) + shape, dtype=np.float32)
        clf = SampleWiseSmoothedClassifier(module().eval(), training=Pretrained(SIGMA), sampler=FixedSampler(),
                                           random_state=0, certify_batch_size=batch_size, n_jobs=args.n_jobs)
        clf.partial_fit(X_test[:1], np.zeros(1, dtype=np.int64), classes=np.arange(10))
    if args.torch_pooling:
        with_torch_pooling(clf.module_)
    regimes = [("(i)", 20_000, 1 if args.quick else limit_inputs, "forward-pass limit", 0.95),
               ("(ii)", 200, 100 if args.quick else 500, "per-input loop", 1.0),
               ("(iii)", 10_000, 2 if args.quick else 8, "per-input loop", loop_target)]
    regimes = [regime for regime in regimes if regime[0].strip("()") in args.regimes.split(",")]
    repeats = 1 if args.quick else args.repeats

    print(f"{args.model}{' (nn.MaxPool2d)' if args.torch_pooling else ''}, torch {torch.__version__}, "
          f"{args.threads} thread(s), n_jobs={args.n_jobs}, "
          f"certify_batch_size={clf.certify_batch_size}, keep_freed_memory {kept}, "
          f"n0={N0}, {args.clock} time, {repeats} interleaved repeat(s)\n")
    table_header(["regime", "inputs", "n per input", "method", "noisy samples", "best seconds", "samples/s",
                  "certify speed-up"])
    verdicts = []
    for label, n, n_inputs, baseline, target in regimes:
        times, fastest = run_regime(clf, X_test[:n_inputs], n, repeats, clock)
        samples = n_inputs * (N0 + n)
        best = {name: min(values) for name, values in times.items()}
        for name, seconds in best.items():
            table_row([label, f"{n_inputs}", f"{n:,}", name, f"{samples:,}", f"{seconds:.2f}",
                       f"{samples / seconds:,.0f}", f"{seconds / best['certify']:.2f}x"])
        # The verdict uses runs taken back to back: the median over repeats of
        # (baseline time / certify time) within one repeat.
        ratios = np.array(times[baseline]) / np.array(times["certify"])
        ratio = float(np.median(ratios))
        named = f"{baseline} ({fastest})" if baseline == "forward-pass limit" else baseline
        verdicts.append(f"- {label} n = {n:,}: certify runs at {ratio:.2f}x the speed of the {named} "
                        f"(median of {repeats} back-to-back ratios, range {ratios.min():.2f}-{ratios.max():.2f}; "
                        f"target >= {target}x): {'met' if ratio >= target else 'NOT met'}")
    print("\n" + "\n".join(verdicts))

    noise = noise_cost(tuple(X_test.shape[1:]), clf.certify_batch_size, 50 * repeats, clock)
    print(f"\nNoise alone, {clf.certify_batch_size} copies per batch (median of {50 * repeats} interleaved draws): "
          f"certify's keyed source {noise['keyed'] * 1e6:.2f} us per copy, normal_ {noise['normal_'] * 1e6:.2f}")

    # What a forward pass costs per sample at the batch sizes the methods run:
    # the per-input loop's batches hold n0 or n copies, certify's are full.
    sizes = sorted({N0, 200, clf.certify_batch_size, 1000})
    print()
    table_header(["forward batch size", "microseconds per sample"])
    for size in sizes:
        cost = forward_cost(clf.module_, tuple(X_test.shape[1:]), size, repeats + 2, clock)
        table_row([f"{size}", f"{cost * 1e6:.1f}"])


if __name__ == "__main__":
    main()
