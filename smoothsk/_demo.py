"""``smoothsk demo``: every preset trained on one data set, its test split certified, compared under stated guarantees.

Each row is one preset of :mod:`smoothsk._presets` with the allocator its
paper pairs it with; the table says which classifier each row's certificates
are about (``Certificates.guarantee``), so that only like claims are compared.
"""

import csv
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.base import clone
from sklearn.model_selection import train_test_split
from skorch.callbacks import Callback
from tqdm.auto import tqdm

from . import SampleWiseSmoothedClassifier
from ._presets import PRESETS, SELECTOR_ALPHA_SHARE, TRAINING_SETTINGS
from ._validation import smoothing_components
from .certificates import OWN_SIGMA_GUARANTEE, REGION_GUARANTEE, SAMPLE_WISE_GUARANTEES, is_fixed_sigma_guarantee
from .datasets import load_digits_images, make_heterogeneous_margins
from .metrics import average_certified_radius, certified_accuracy_curve
from .models import DigitsCNN, FlatMLP
from .regions import MemoryAllocator, NoRegions, OnlineBallAllocator
from .sampling import FixedSampler, InputSpecificSampler
from .sigma import BaseCertifiedSigma, classifier_levels
from .statistics import certified_radius, clopper_pearson_lower

#: Radii of the table's certified-accuracy columns.
RADII = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Settings of the full demo and of ``--quick``; command-line options override them one by one.
#: ``--quick`` trains as the full demo does (fewer epochs under-train PFAT's two stages, and the selector row
#: then loses to the fixed rows) and saves its time in the searches and the certification.
FULL = {"epochs": 20, "search_n": 200, "n": 1000, "n0": 100, "test_size": 0.25, "train_size": None}
QUICK = {"epochs": 20, "search_n": 100, "n": 500, "n0": 50, "test_size": 0.1, "train_size": None}
#: The allocator of each preset's row where its paper certifies with regions (PFAT Alg. 2, DDRS Alg. 3);
#: the other rows use ``NoRegions``.
ALLOCATORS = {"pfat": OnlineBallAllocator, "ddrs": MemoryAllocator}
#: What each guarantee word of the table means.
GUARANTEES = {
    "full": "a certificate of g at one fixed sigma, the very classifier predict queries (Cohen et al.)",
    "stateful regions": "a certificate of a classifier that remembers earlier answers (regions or memory): "
                        "sound for it, but its answers depend on the inputs certified before",
    "own-sigma only (not for the sample-wise classifier)": "g(., sigma(x)) at the input's own sigma: "
                        "an input x' near x may get another sigma, so this is NOT a certificate of "
                        "G(x') = g(x', sigma(x'))",
    "sample-wise classifier G, stateless": "a certificate of G(x') = g(x', sigma(x')) itself: either sigma(.) is "
                        "certified constant on the ball (a certified selector, alpha split between sigma and "
                        "class), or it is semi-elastic (a radius that allows for sigma varying on the ball)",
}


#: Each guarantee statement (``Certificates.guarantee``, the constants of
#: :mod:`smoothsk.certificates`) -> the table's short name (a key of :data:`GUARANTEES`). The fixed-sigma
#: statement names its sigma, so it is recognised by ``is_fixed_sigma_guarantee`` instead.
GUARANTEE_WORDS = {
    REGION_GUARANTEE: "stateful regions",
    OWN_SIGMA_GUARANTEE: "own-sigma only (not for the sample-wise classifier)",
    **{statement: "sample-wise classifier G, stateless" for statement in SAMPLE_WISE_GUARANTEES},
}


def guarantee_words(guarantee):
    """The table's short name of a ``Certificates.guarantee`` statement (a key of :data:`GUARANTEES`).

    Parameters
    ----------
    guarantee : str
        ``details.guarantee`` of a certification.

    Returns
    -------
    str
        "full" for a fixed-sigma statement, else the statement's entry in
        :data:`GUARANTEE_WORDS`, or ``guarantee`` itself when it has none.
    """
    if is_fixed_sigma_guarantee(guarantee):
        return "full"
    return GUARANTEE_WORDS.get(guarantee, guarantee)


def demo_methods(epochs, search_n):
    """The demo's methods: preset id -> (table name, keyword arguments of the estimator).

    Each preset's training schedule and test-time search (trained for the
    same total number of epochs), with its row's allocator
    (:data:`ALLOCATORS`, else ``NoRegions``).

    Parameters
    ----------
    epochs : int
        Total training epochs of every method.
    search_n : int
        Samples per noise-level evaluation of the sigma searches.

    Returns
    -------
    dict of str -> (str, dict)
    """
    return {preset_id: (preset.name, {**preset.build(epochs, search_n),
                                      "allocator": ALLOCATORS.get(preset_id, NoRegions)()})
            for preset_id, preset in PRESETS.items()}


def demo_data(name):
    """The demo's data and base model.

    Parameters
    ----------
    name : {"digits", "synthetic"}
        scikit-learn's bundled digits with :class:`DigitsCNN`, or the
        256-dimensional heterogeneous-margin mixture with :class:`FlatMLP`.

    Returns
    -------
    X : ndarray of float32, shape (n, *input_shape)
    y : ndarray of int64, shape (n,)
    module : type
    module_params : dict
    """
    if name == "digits":
        X, y = load_digits_images()
        return X, y, DigitsCNN, {}
    X, y = make_heterogeneous_margins()
    return X, y, FlatMLP, {"module__hidden": 256}


def radius_cap(n, alpha):
    """Largest radius per unit of sigma that ``n`` samples can certify at failure probability ``alpha``.

    With all ``n`` samples on the top class, the one-sided Clopper-Pearson
    bound is ``alpha ** (1 / n)``, so no certificate at noise level sigma
    exceeds ``sigma * PhiInv(alpha ** (1 / n))`` (Cohen et al., Theorem 1).

    Parameters
    ----------
    n : int
        Estimation samples per input.
    alpha : float
        Failure probability of the classifier's bound.

    Returns
    -------
    float
    """
    return float(certified_radius([1.0], clopper_pearson_lower([n], [n], alpha))[0])


class EpochProgress(Callback):
    """Advances a tqdm bar at the end of each training epoch (in place of skorch's epoch table).

    Parameters
    ----------
    bar : tqdm.tqdm
        The bar to advance; its owner closes it.
    """

    def __init__(self, bar):
        self.bar = bar

    def on_epoch_end(self, net, **kwargs):
        self.bar.update()


@dataclass
class DemoRow:
    """One method's results.

    Attributes
    ----------
    name : str
        The method's table name.
    guarantee : str
        ``details.guarantee`` of its certificates.
    y_true, prediction, radius, sigma : ndarray, shape (n_test,)
        Test labels, certified labels (``ABSTAIN`` where abstained), radii
        and the noise level each input was certified at.
    samples : float
        Monte Carlo samples per test input of the certification (the
        sampler's, plus a certified sigma function's own; the searches'
        evaluations are not counted).
    train_seconds, certify_seconds : float
        Wall time of ``fit`` and of ``certify``.
    """

    name: str
    guarantee: str
    y_true: np.ndarray
    prediction: np.ndarray
    radius: np.ndarray
    sigma: np.ndarray
    samples: float
    train_seconds: float
    certify_seconds: float

    def curve(self, radii):
        """Certified accuracy at each of ``radii`` (ndarray of shape (n_radii,))."""
        return certified_accuracy_curve(self.y_true, self.prediction, self.radius, radii)

    @property
    def acr(self):
        """Average certified radius (float)."""
        return average_certified_radius(self.y_true, self.prediction, self.radius)


def build_estimator(preset_id, params, data, settings, sampler, verbose):
    """One method's estimator, its parameters checked as ``fit`` checks them before training.

    Parameters
    ----------
    preset_id : str
        The method's preset id (named in the error).
    params : dict
        Keyword arguments of the estimator (:func:`demo_methods`).
    data : tuple
        ``(X_train, X_test, y_train, y_test, module, module_params)``.
    settings : dict
        ``epochs``, ``alpha``, ``seed``.
    sampler : BaseSampler
    verbose : bool
        Print skorch's epoch tables.

    Returns
    -------
    SampleWiseSmoothedClassifier
        Not fitted.

    Raises
    ------
    ValueError
        Naming the method, where one of its parameters is refused.
    """
    X_train, _, _, _, module, module_params = data
    clf = SampleWiseSmoothedClassifier(
        module, max_epochs=settings["epochs"], **TRAINING_SETTINGS, sampler=clone(sampler),
        alpha=settings["alpha"], random_state=settings["seed"], verbose=int(verbose), **module_params, **params)
    try:
        components = smoothing_components(clf)
        if isinstance(components.sigma_search, BaseCertifiedSigma):
            components.sigma_search.check_before_fit(classifier_levels(clf.module, components.training),
                                                     torch.from_numpy(X_train))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--methods {preset_id}: {exc}") from exc
    return clf


def run_method(name, clf, data, settings, verbose):
    """Train one method and certify the test split.

    Parameters
    ----------
    name : str
        The method's table name.
    clf : SampleWiseSmoothedClassifier
        Its estimator (:func:`build_estimator`).
    data : tuple
        ``(X_train, X_test, y_train, y_test, module, module_params)``.
    settings : dict
        ``epochs``.
    verbose : bool
        Print skorch's epoch tables instead of a progress bar.

    Returns
    -------
    DemoRow
    """
    X_train, X_test, y_train, y_test, _, _ = data
    print(f"## {name}", file=sys.stderr)
    with tqdm(total=settings["epochs"], desc="train", unit="epoch", disable=verbose, file=sys.stderr) as bar:
        clf.set_params(callbacks=[] if verbose else [("progress", EpochProgress(bar))])
        started = time.perf_counter()
        clf.fit(X_train, y_train)
        train_seconds = time.perf_counter() - started
    clf.set_params(verbose=1)  # the certification's progress bar
    started = time.perf_counter()
    prediction, radius, details = clf.certify(X_test, return_details=True)
    certify_seconds = time.perf_counter() - started
    return DemoRow(name, details.guarantee, np.asarray(y_test), prediction, radius, details.sigma,
                   float(np.mean(details.n_samples + details.sigma_samples)), train_seconds, certify_seconds)


def table_columns(radii):
    """Header of the table (list of str)."""
    return ["method", *(f"r={r:g}" for r in radii), "ACR", "guarantee", "samples / input", "train (s)",
            "certify (s)"]


def table_cells(row, radii):
    """One row of the table as strings (list of str)."""
    return [row.name, *(f"{value:.3f}" for value in row.curve(radii)), f"{row.acr:.3f}",
            guarantee_words(row.guarantee), f"{row.samples:.0f}", f"{row.train_seconds:.1f}",
            f"{row.certify_seconds:.1f}"]


def markdown_table(rows, radii):
    """A markdown table: certified accuracy per radius, ACR, guarantee, samples per input, times.

    Parameters
    ----------
    rows : list of DemoRow
    radii : sequence of float

    Returns
    -------
    str
    """
    header = table_columns(radii)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(table_cells(row, radii)) + " |" for row in rows]
    return "\n".join(lines)


def how_to_read(rows, settings):
    """The notes printed under the table: the radius cap of the chosen ``n`` and ``alpha``, the guarantees.

    Parameters
    ----------
    rows : list of DemoRow
    settings : dict
        ``n``, ``alpha``, ``sampler`` of the run.

    Returns
    -------
    str
        Markdown.
    """
    n, alpha = settings["n"], settings["alpha"]
    cap = radius_cap(n, alpha)
    sizes = "n" if settings["sampler"] == "fixed" else "n_max (ISS draws fewer where a smaller n loses little radius)"
    lines = [
        "How to read this:",
        f"- Each certificate holds for its input with probability at least 1 - alpha = {1 - alpha:g}. With "
        f"{sizes} = {n} samples per input no radius exceeds sigma x PhiInv(alpha^(1/n)) = sigma x {cap:.2f}: "
        f"{0.25 * cap:.2f} at sigma 0.25, {0.5 * cap:.2f} at sigma 0.5. The selector row bounds its class at "
        f"{1 - SELECTOR_ALPHA_SHARE:g} x alpha (it splits alpha), so it is capped at sigma x "
        f"{radius_cap(n, (1 - SELECTOR_ALPHA_SHARE) * alpha):.2f}; its levels are 0.25, 0.5, 0.75 and 1.0, and its "
        "settings (smoothsk/_presets.py) were chosen on a validation split of the synthetic task's training split.",
        "- samples / input: the certification's Monte Carlo samples per test input (the selector's included); "
        "the sigma searches' own evaluations are not counted.",
        "- guarantee: which classifier the radius is about. Compare rows only within one guarantee:",
    ]
    used = {guarantee_words(row.guarantee) for row in rows}
    lines += [f"  - {words}: {meaning}" for words, meaning in GUARANTEES.items() if words in used]
    lines += [f"  - {words}: as stated" for words in sorted(used - set(GUARANTEES))]
    return "\n".join(lines)


def write_csv(rows, radii, path):
    """Write the table as CSV (one row per method; the guarantee in words and in full)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*table_columns(radii), "guarantee statement"])
        for row in rows:
            writer.writerow([*table_cells(row, radii), row.guarantee])


def save_pictures(rows, folder):
    """Save the certified-accuracy curves and the histogram of test sigmas as PNGs.

    Parameters
    ----------
    rows : list of DemoRow
    folder : pathlib.Path

    Returns
    -------
    list of pathlib.Path, or None
        The files written; None when matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plotting import plot_certified_accuracy, plot_sigma_histogram

    largest = max(float(np.max(row.radius, initial=0.0)) for row in rows)
    pictures = {
        "certified_accuracy.png": lambda ax: plot_certified_accuracy(
            {row.name: (row.y_true, row.prediction, row.radius) for row in rows},
            radii=np.linspace(0.0, max(1.0, largest), 200), ax=ax),
        "sigma_histogram.png": lambda ax: plot_sigma_histogram({row.name: row.sigma for row in rows}, ax=ax),
    }
    paths = []
    for filename, draw in pictures.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax)
        fig.tight_layout()
        fig.savefig(folder / filename, dpi=120)
        plt.close(fig)
        paths.append(folder / filename)
    return paths


def resolve_settings(args):
    """The run's settings: ``--quick`` or full defaults, overridden by the options given.

    Parameters
    ----------
    args : argparse.Namespace

    Returns
    -------
    dict
    """
    settings = dict(QUICK if args.quick else FULL)
    settings.update({key: getattr(args, key) for key in FULL if getattr(args, key) is not None})
    settings.update(alpha=args.alpha, seed=args.seed, sampler=args.sampler)
    return settings


def check_settings(settings):
    """Refuse a count below one, an alpha outside (0, 1) or a negative seed, naming its option (before any work).

    Parameters
    ----------
    settings : dict
        :func:`resolve_settings`.

    Raises
    ------
    ValueError
        Naming the option, the value and what was expected.
    """
    for key in ("epochs", "search_n", "n", "n0", "train_size"):
        value = settings[key]
        if value is not None and value < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be an int >= 1; got {value}.")
    if not 0 < settings["alpha"] < 1:
        raise ValueError(f"--alpha must be in (0, 1); got {settings['alpha']}.")
    if settings["seed"] < 0:
        raise ValueError(f"--seed must be an int >= 0; got {settings['seed']}.")


def output_folder(out):
    """Create the folder ``--out`` names (if needed) and check that it is writable, before any work.

    Parameters
    ----------
    out : str

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        Naming ``--out``: a path that exists and is not a folder, or one that
        cannot be created or written.
    """
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder; give a folder for the results.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create the folder ({exc}).") from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: the folder is not writable.")
    return folder


def select_methods(methods, names):
    """The methods named in ``--methods``, or all.

    Parameters
    ----------
    methods : dict of str -> (str, dict)
        :func:`demo_methods`.
    names : str
        ``"all"``, or comma-separated preset ids or their first word
        (``cohen`` means ``cohen-0.25`` and ``cohen-0.5``).

    Returns
    -------
    dict of str -> (str, dict)
        The chosen entries of ``methods``, in its order.

    Raises
    ------
    ValueError
        If a name matches no preset.
    """
    if names == "all":
        return methods
    wanted = [name.strip().lower() for name in names.split(",")]
    unknown = [name for name in wanted if not any(pid == name or pid.startswith(name + "-") for pid in methods)]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose among {sorted(methods)} or 'all'.")
    return {pid: method for pid, method in methods.items()
            if any(pid == name or pid.startswith(name + "-") for name in wanted)}


def run_demo(args):
    """``smoothsk demo``: train, certify, print the table and its notes, write ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed ``demo`` options.

    Returns
    -------
    list of DemoRow
    """
    settings = resolve_settings(args)
    check_settings(settings)
    methods = select_methods(demo_methods(settings["epochs"], settings["search_n"]), args.methods)
    folder = output_folder(args.out)
    X, y, module, module_params = demo_data(args.data)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=settings["test_size"], train_size=settings["train_size"], random_state=0, stratify=y)
    data = (X_train, X_test, y_train, y_test, module, module_params)
    if settings["sampler"] == "iss":
        sampler = InputSpecificSampler(n_max=settings["n"])
    else:
        sampler = FixedSampler(n=settings["n"], n0=settings["n0"])
    estimators = {preset_id: (name, build_estimator(preset_id, params, data, settings, sampler, args.verbose))
                  for preset_id, (name, params) in methods.items()}
    print(f"{args.data}: {len(X_train)} training and {len(X_test)} test inputs of shape {X.shape[1:]}; "
          f"{settings['epochs']} epochs per method; certifying with {sampler!r}, alpha={settings['alpha']}")
    rows = [run_method(name, clf, data, settings, args.verbose) for name, clf in estimators.values()]
    table, notes = markdown_table(rows, RADII), how_to_read(rows, settings)
    print(f"\n{table}\n\n{notes}\n")
    (folder / "results.md").write_text(f"{table}\n\n{notes}\n")
    write_csv(rows, RADII, folder / "results.csv")
    pictures = save_pictures(rows, folder)
    if pictures is None:
        print(f"table saved to {folder}/results.md and results.csv; matplotlib is not installed, so no pictures "
              f"(pip install 'smoothsk[plot]' to get them)")
    else:
        print(f"table saved to {folder}/results.md and results.csv; pictures: "
              f"{', '.join(str(path) for path in pictures)}")
    return rows
