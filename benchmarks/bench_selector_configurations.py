"""The certified selector as users configure it: its defaults, PFAT's default grid, the preset, a tuned grid.

The synthetic task of the experts issue: ``make_heterogeneous_margins``
(2,000 inputs, 300 held out), ``FlatMLP(hidden=256)``, 30 epochs of
``GaussianNoise(2)`` at learning rate 0.05 (a tenth after half), n = 10,000,
n0 = 100, alpha = 0.001. Fixed-sigma rows (Cohen) at 0.25, 0.5 and 1.0 give
the baseline; two PFAT classifiers (``PretrainFinetune`` over 0.12-1.0 with
its default grid of 18 levels, and over 0.125-1.0 with the 8-level grid of
step 0.125) get each selector configuration fitted on them (the same
classifier, the selector refitted) and certified on the held-out inputs.
Each row reports the mean sigma chosen, the ACR, its ratio to the best fixed
sigma and the share of correctly classified inputs whose radius the
selector's own radius R1 caps (R1 < R2).

Run ``python benchmarks/bench_selector_configurations.py [--quick]``.
"""

import json
from pathlib import Path

import numpy as np
import torch
from sklearn.base import clone
from sklearn.model_selection import train_test_split

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import make_heterogeneous_margins
from smoothsk.metrics import average_certified_radius
from smoothsk.models import FlatMLP
from smoothsk.regions import NoRegions
from smoothsk.sigma import CertifiedSigmaSelector
from smoothsk.statistics import certified_radius

from _common import markdown_table, quick_parser, timed
from bench_selector import make_classifier, refit_selector

#: (name, classifier's grid step: None for PFAT's default grid from 0.12, selector parameters).
CONFIGURATIONS = (
    ("defaults", None, {}),
    ("the selector preset's settings", None, {"selector_sigma": 2.0, "alpha_share": 0.25, "target_neighbors": 100,
                                              "selector_epochs": 100}),
    ("tuned: noise 1.5, alpha share 0.1, 100 neighbours", 0.125,
     {"selector_sigma": 1.5, "alpha_share": 0.1, "target_neighbors": 100, "selector_epochs": 100}),
    ("defaults", 0.125, {}),
)


def pfat_classifier(step, epochs, n_cert, seed):
    """A PFAT classifier over 0.12-1.0 (default grid) or step:step:1.0 (grid of ``step``), not yet fitted."""
    clf = make_classifier(FlatMLP, {"module__hidden": 256}, epochs, n_cert, None, CertifiedSigmaSelector(),
                          step or 0.12, seed)
    if step is None:
        clf.training.set_params(assignment=None, sigma_min=0.12)
    return clf


def fitted(path, estimator, X, y):
    """The classifier saved at ``path``, or ``estimator`` fitted on ``X``, ``y`` and saved there (None: not kept)."""
    if path is not None and path.exists():
        clf = SampleWiseSmoothedClassifier.load(path)
        clf.training_ = clone(clf.training)  # what fit leaves, and a refitted selector reads its grid from
        return clf
    clf = estimator.fit(X, y)
    if path is not None:
        clf.save(path)
    return clf


def main():
    parser = quick_parser(__doc__, "500 inputs, 10 epochs, n = 1,000")
    parser.add_argument("--models", help="folder keeping the trained classifiers between runs (default: none)")
    parser.add_argument("--only", type=json.loads, action="append", default=[],
                        help='a configuration of its own instead of the four, as JSON: {"step": null or 0.125, '
                             '"params": {...selector parameters...}} (repeatable)')
    args = parser.parse_args()
    models = None if args.models is None else Path(args.models)
    if models is not None:
        models.mkdir(parents=True, exist_ok=True)
    configurations = ([(json.dumps(spec["params"]), spec["step"], spec["params"]) for spec in args.only]
                      or CONFIGURATIONS)
    n_samples, epochs, n_cert = (500, 10, 1000) if args.quick else (2000, 30, 10_000)
    X, y = make_heterogeneous_margins(n_samples=n_samples, random_state=0)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.15, random_state=0, stratify=y)
    rows, best = [], 0.0
    for sigma in (0.25, 0.5, 1.0):
        fixed = fitted(models and models / f"cohen-{sigma:g}-e{epochs}.safetensors",
                       make_classifier(FlatMLP, {"module__hidden": 256}, epochs, n_cert, sigma),
                       X_train, y_train)
        fixed.set_params(sampler__n=n_cert)
        prediction, radius = fixed.certify(X_test)
        acr = average_certified_radius(y_test, prediction, radius)
        best = max(best, acr)
        rows.append([f"Cohen, fixed sigma {sigma}", "-", f"{sigma:.3f}", f"{acr:.3f}", "-", "-", "-"])
    classifiers = {}
    for name, step, params in configurations:
        if step not in classifiers:
            classifiers[step] = fitted(models and models / f"pfat-{step or 'default'}-e{epochs}.safetensors",
                                       pfat_classifier(step, epochs, n_cert, 0), X_train, y_train)
        clf = classifiers[step]
        selector = CertifiedSigmaSelector(n=n_cert, **params)
        fit_seconds, _ = timed(refit_selector, clf, selector, X_train, y_train)
        clf.set_params(allocator=NoRegions())
        _, (prediction, radius, details) = timed(clf.certify, X_test, return_details=True)
        acr = average_certified_radius(y_test, prediction, radius)
        correct = prediction == y_test
        own = certified_radius(details.sigma, details.p_lower)
        capped = np.mean(details.radius_cap[correct] < own[correct]) if correct.any() else 0.0
        levels = len(clf.training.noise_levels())
        grid_name = f"PFAT default ({levels} levels)" if step is None else f"step {step} ({levels} levels)"
        rows.append([name, grid_name, f"{details.sigma.mean():.3f}", f"{acr:.3f}", f"{acr / best:.2f}x",
                     f"{capped:.2f}", f"{fit_seconds:.0f}"])
    markdown_table(["selector", "grid", "mean sigma", "ACR", "vs best fixed", "R1 caps (share of correct)",
                    "selector fit (s)"], rows)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
