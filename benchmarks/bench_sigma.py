"""Per-input test-time noise levels on the digits: grid search, multi-start FGSS, gradient search.

A small CNN is trained with a fresh uniform sigma in [0.12, 1.0] per sample
and epoch (PFAT's pretraining stage, Alg. 1 lines 2-10 / Eq. 4:
``_common.UniformSigmaTraining``), then 300 held-out digits are certified with
each test-time search and with fixed sigmas. Prints a markdown table: ACR,
certified accuracy per radius, average search steps (noise-level evaluations)
per input, and wall time, also as a ratio to the median time of certifying
at one fixed sigma (the search's overhead, certification included).
Two grids and two FGSS settings separate the effect of the search range from
that of the search itself: PFAT's grid covers [0.15, 1.0], Insta-RS's default
levels [0.25, 1.0].

Targets (Insta-RS Table 3 is the anchor): multi-start FGSS within
0.01 ACR of the grid search with at most 0.55x its steps; every per-input
search above the best fixed sigma's ACR.

Usage: ``python benchmarks/bench_sigma.py [--quick]``
"""

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_digits_images
from smoothsk.metrics import average_certified_radius, certified_accuracy_curve
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma, GradientSigmaSearch, GridSigmaSearch, MultiStartFGSS
from smoothsk.training import GaussianNoise

from _common import RADII, UniformSigmaTraining, markdown_table, quick_parser, timed

RADII = RADII[RADII <= 1.0]
GRID = "Grid (PFAT defaults: 0.15:0.05:1.0, 18 points)"
FGSS = "FGSS (sigma0=0.15, T=44: the grid's range)"
FGSS_CERTIFIED = "FGSS, certified score (Insta-RS defaults: sigma0=0.25, T=16)"
GRADIENT = "Gradient (DDRS, lr=1e-3, n=8)"



def certify(clf, search, X, y):
    """Certify with ``search``; return the row's metrics and the wall time."""
    clf.set_params(sigma_search=search)
    seconds, (prediction, radius, details) = timed(clf.certify, X, return_details=True)
    return {
        "acr": average_certified_radius(y, prediction, radius),
        "curve": certified_accuracy_curve(y, prediction, radius, RADII),
        "steps": float(details.search_steps.mean()),
        "sigma": details.sigma,
        "seconds": seconds,
    }


def main():
    args = quick_parser(__doc__, "small smoke run (fewer inputs, epochs, samples)").parse_args()
    n_test, epochs, n_cert = (60, 10, 500) if args.quick else (300, 60, 1000)
    # Fixed sigmas around this model's optimum (0.12 and 0.75-1.0 certify far less).
    fixed_sigmas = (0.25, 0.5) if args.quick else (0.25, 0.3, 0.35, 0.4, 0.5, 1.0)

    X, y = load_digits_images()
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=n_test, stratify=y, random_state=0)
    clf = SampleWiseSmoothedClassifier(
        DigitsCNN, module__width=8, training=UniformSigmaTraining(0.12, 1.0, objective=GaussianNoise(4)),
        sampler=FixedSampler(n=n_cert, n0=100), alpha=0.001, max_epochs=epochs, lr=0.05,
        optimizer=torch.optim.SGD, optimizer__momentum=0.9, batch_size=64,
        certify_batch_size=4000, random_state=0)
    seconds, _ = timed(clf.fit, X_train, y_train)
    print(f"DigitsCNN(width=8) trained {epochs} epochs (4 noisy copies per sample, sigma ~ U[0.12, 1.0] "
          f"per sample and epoch) in {seconds:.1f} s. {n_test} test digits certified "
          f"with n={n_cert}, n0=100, alpha=0.001; searches use their paper's n unless named.\n")

    rows = {}
    for sigma in fixed_sigmas:
        rows[f"Fixed sigma={sigma}"] = certify(clf, FixedSigma(sigma), X_test, y_test)
    best_fixed = max(rows, key=lambda name: rows[name]["acr"])
    searches = {
        GRID: GridSigmaSearch(),
        "Grid on FGSS's default range (0.25:0.05:1.0, 16 points)": GridSigmaSearch(0.25, 1.0, 0.05),
        "FGSS (Insta-RS defaults: sigma0=0.25, T=16)": MultiStartFGSS(),
        FGSS: MultiStartFGSS(sigma0=0.15, max_level=44),
        # The hard-vote certified radius the grid maximises, instead of the paper's soft score.
        FGSS_CERTIFIED: MultiStartFGSS(score="certified"),
        # DDRS's lr=1e-4, n=1 are tuned to CIFAR/ImageNet; on 64-pixel digits sigma then barely
        # moves from its start, so lr and n were raised (DDRS uses n=8 with MACER, Sec. 4.3).
        GRADIENT: GradientSigmaSearch(sigma_init=0.25, lr=1e-3, n=8, sigma_min=0.12, sigma_max=1.0),
    }
    for name, search in searches.items():
        rows[name] = certify(clf, search, X_test, y_test)

    baseline = float(np.median([rows[f"Fixed sigma={sigma}"]["seconds"] for sigma in fixed_sigmas]))
    header = ["method", "ACR", *(f"acc@{r}" for r in RADII), "avg steps", "sigma range", "wall s", "time / fixed"]
    markdown_table(header, [
        [f"**{name}** (best fixed)" if name == best_fixed else name, f"{row['acr']:.3f}",
         *(f"{a:.3f}" for a in row["curve"]), f"{row['steps']:.2f}",
         f"{row['sigma'].min():.2f}-{row['sigma'].max():.2f}", f"{row['seconds']:.1f}",
         f"{row['seconds'] / baseline:.2f}"]
        for name, row in rows.items()])

    grid = rows[GRID]
    print("\nTargets (wall times measured while the machine was shared):")
    for name in (FGSS, FGSS_CERTIFIED):
        fgss = rows[name]
        gap = fgss["acr"] - grid["acr"]
        print(f"- {name} ACR within 0.01 of {GRID}: {fgss['acr']:.3f} vs {grid['acr']:.3f} "
              f"({gap:+.3f}) -> {'met' if abs(gap) <= 0.01 else 'NOT met'}")
        ratio = fgss["steps"] / grid["steps"]
        print(f"- its steps <= 0.55x the grid's: {fgss['steps']:.2f} / {grid['steps']:.0f} = {ratio:.2f}x "
              f"-> {'met' if ratio <= 0.55 else 'NOT met'}")
    for name in (GRID, FGSS, FGSS_CERTIFIED, GRADIENT):
        verdict = "met" if rows[name]["acr"] > rows[best_fixed]["acr"] else "NOT met"
        print(f"- {name}: ACR {rows[name]['acr']:.3f} > best fixed ({best_fixed}) "
              f"{rows[best_fixed]['acr']:.3f} -> {verdict}")


if __name__ == "__main__":
    main()
