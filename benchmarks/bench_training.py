"""Training schedules compared: fixed sigma (Cohen, SmoothAdv, MACER) against sample-wise sigma.

Every row trains the same MLP for the same total number of epochs on a fixed
train/test split and certifies the test split. Fixed-sigma rows certify at
their training sigma (Cohen et al.); sample-wise rows (PFAT, Insta-RS Train
settings 1-3, DDRS) certify each input at the sigma found by their
schedule's test-time search (``default_sigma_search``: PFAT's grid,
Insta-RS's multi-start FGSS, DDRS's gradient ascent), with ``NoRegions``,
i.e. Insta-RS's per-input (asymmetric) guarantee. Columns: certified
accuracy at each radius, ACR, training time, the part of it spent assigning
training sigmas, and certification time. The methods and their settings are
``smoothsk._presets.TRAINING_BENCHMARK_PRESETS``. Targets:

(i)   digits: best sample-wise ACR >= best fixed-sigma ACR;
(ii)  synthetic heterogeneous-margin task: best sample-wise ACR >= 1.3 x best fixed;
(iii) Insta-RS Train's sigma-assignment time <= 0.2 x PFAT's grid assignment time.

Run ``python benchmarks/bench_training.py [--quick] [--data digits|synthetic|both]``.
Times are wall-clock seconds on this machine; compare them as ratios.
"""

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._presets import BENCHMARK_LR, TRAINING_BENCHMARK_PRESETS
from smoothsk.datasets import load_digits_images, make_heterogeneous_margins
from smoothsk.metrics import average_certified_radius, certified_accuracy_curve
from smoothsk.models import FlatMLP
from smoothsk.sampling import FixedSampler
from smoothsk.training import FixedSigmaTraining

from _common import RADII, quick_parser, table_header, table_row, timed

RADII = RADII[RADII <= 1.5]
#: Monte Carlo samples of PFAT's assignment and of the test-time searches in ``--quick`` mode.
QUICK_SEARCH_N = 100


def datasets(quick, which):
    """Fixed splits: name -> (X_train, X_test, y_train, y_test)."""
    out = {}
    if which in ("digits", "both"):
        X, y = load_digits_images()
        out["digits"] = train_test_split(X, y, test_size=300 if quick else 500, stratify=y, random_state=0)
    if which in ("synthetic", "both"):
        X, y = make_heterogeneous_margins(n_samples=1200 if quick else 2000, random_state=0)
        out["synthetic"] = train_test_split(X, y, test_size=240 if quick else 500, stratify=y, random_state=0)
    return out


def rows(epochs, quick):
    """(name, kind, estimator parameters) of each method for ``epochs`` total epochs.

    ``quick`` lowers the Monte Carlo sample sizes of PFAT's assignment and of the
    test-time searches to :data:`QUICK_SEARCH_N`.
    """
    for preset in TRAINING_BENCHMARK_PRESETS.values():
        params = preset.build(epochs, QUICK_SEARCH_N if quick else None)
        kind = "fixed" if isinstance(params["training"], FixedSigmaTraining) else "sample-wise"
        yield preset.name, kind, params


def run_row(data, params, epochs, n):
    """Train with ``params`` (training, sigma_search, lr) and certify the test split; the row's figures."""
    X_train, X_test, y_train, y_test = data
    net = SampleWiseSmoothedClassifier(
        FlatMLP, module__hidden=256, sampler=FixedSampler(n=n, n0=50), max_epochs=epochs,
        optimizer=torch.optim.SGD, optimizer__momentum=0.9, batch_size=64, random_state=0, **params)
    train_time, _ = timed(net.fit, X_train, y_train)
    sigma_time = sum(row.get("sigma_time", 0.0) for row in net.history)
    certify_time, (prediction, radius, details) = timed(net.certify, X_test, return_details=True)
    return {
        "curve": certified_accuracy_curve(y_test, prediction, radius, RADII),
        "acr": average_certified_radius(y_test, prediction, radius),
        "train": train_time, "sigma": sigma_time, "certify": certify_time,
        "test_sigma": np.percentile(details.sigma, [10, 50, 90]),
    }


def main():
    parser = quick_parser(__doc__, "fewer samples, epochs and test inputs")
    parser.add_argument("--data", choices=("digits", "synthetic", "both"), default="both")
    args = parser.parse_args()
    torch.set_num_threads(1)
    epochs = 16 if args.quick else 30
    n = 300 if args.quick else 1000
    print(f"# Training schedules, {epochs} epochs each, certified with n = {n}, n0 = 50, alpha = 0.001")
    if args.quick:
        print(f"(--quick: PFAT's assignment and the test-time searches use {QUICK_SEARCH_N} samples, "
              "not the papers' 500-1000)")
    print()
    # Warm up torch (first-call overheads) outside the timed rows.
    warm = datasets(True, "digits")["digits"]
    run_row((warm[0][:100], warm[1][:10], warm[2][:100], warm[3][:10]),
            {"training": FixedSigmaTraining(), "lr": BENCHMARK_LR}, 1, 10)
    summary = {}
    for name, data in datasets(args.quick, args.data).items():
        print(f"## {name}: {len(data[0])} training / {len(data[1])} test inputs of shape {data[0].shape[1:]}\n")
        header = ["method"] + [f"{r:.2f}" for r in RADII] + ["ACR", "train s", "assign s", "certify s",
                                                              "test sigma p10/p50/p90"]
        table_header(header)
        results = {}
        for label, kind, params in rows(epochs, args.quick):
            result = run_row(data, params, epochs, n)
            results[label] = (kind, result)
            cells = [label] + [f"{a:.3f}" for a in result["curve"]] + [
                f"**{result['acr']:.3f}**" if kind == "sample-wise" else f"{result['acr']:.3f}",
                f"{result['train']:.1f}", f"{result['sigma']:.2f}", f"{result['certify']:.1f}",
                "/".join(f"{s:.2f}" for s in result["test_sigma"])]
            table_row(cells)
        summary[name] = results
        print()
    print("## Targets\n")
    for name, results in summary.items():
        best = {kind: max(((r["acr"], label) for label, (k, r) in results.items() if k == kind))
                for kind in ("fixed", "sample-wise")}
        ratio = best["sample-wise"][0] / best["fixed"][0]
        need = 1.3 if name == "synthetic" else 1.0
        print(f"- {name}: best sample-wise ACR {best['sample-wise'][0]:.3f} ({best['sample-wise'][1]}) vs best "
              f"fixed {best['fixed'][0]:.3f} ({best['fixed'][1]}): ratio {ratio:.2f} "
              f"(target >= {need}: {'met' if ratio >= need else 'NOT met'})")
        pfat = results["PFAT [0.12, 1.0]"][1]["sigma"]
        insta = max(results[f"Insta-RS Train setting {s}"][1]["sigma"] for s in (1, 2, 3))
        print(f"- {name}: Insta-RS Train sigma-assignment time {insta:.2f} s vs PFAT grid assignment "
              f"{pfat:.2f} s: ratio {insta / pfat:.3f} (target <= 0.2: {'met' if insta <= 0.2 * pfat else 'NOT met'})")


if __name__ == "__main__":
    main()
