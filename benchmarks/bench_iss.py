"""Input-specific sampling (ISS) vs input-agnostic sampling (IAS) at the same average cost.

Reproduces the comparisons of the ISS paper (papers/003, Tables 1, 3 and 5) at
digits scale and prints markdown tables:

1. the cost of building the map psi (Alg. 1) at ``n_max`` = 100,000;
2. simulated top-class probabilities (binomial counts, no model), where the
   true pA and hence the exact radius decline are known;
3. the digits CNN trained with Gaussian noise at sigma 0.25 and 0.5.

IAS is :class:`~smoothsk.sampling.FixedSampler` with ``n0 = 100`` and ``n``
chosen so that its samples per input (``n0 + n``) equal ISS's average
(pilot plus estimation). Columns: average samples per input (and as a
fraction of ``n_max``), wall time, ACR, MAD and certified accuracy at radii
that are multiples of sigma.

MAD (maximum absolute decline, ISS Def. 1 and Table 1) is
``max_i [r(n_max, p_i) - r(k_i, p_i)]``, where ``k_i`` is the number of
estimation samples input i got, ``r(k, p) = sigma Phi^-1(B(alpha; p k, k - p k + 1))``
is the radius certified by ``k`` samples at frequency ``p`` (0 where it
abstains), and ``p_i`` is the true pA for simulated inputs and, for the CNN,
the frequency of ISS's candidate class among all estimation samples the two
methods drew for input i (independent stages, about twice ISS's count).

Run ``OMP_NUM_THREADS=1 python benchmarks/bench_iss.py`` (about 4 minutes on one
core; on a shared machine one thread per process avoids oversubscription) or
add ``--quick`` (``n_max`` = 10,000, fewer inputs; about a minute).
"""

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_digits_images
from smoothsk.engine import MonteCarloEngine
from smoothsk.metrics import average_certified_radius, certified_accuracy_curve
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler, InputSpecificSampler
from smoothsk.sampling._input_specific import _psi_map
from smoothsk.statistics import certified_radius
from smoothsk.training import FixedSigmaTraining

from _common import BinomialEngine, clopper_pearson_radius, quick_parser, table_header, table_row, timed

ALPHA = 0.001
DECLINE = 0.05
IAS_N0 = 100
RADII_IN_SIGMA = (0.0, 1.0, 2.0, 3.0, 3.5)


class RecordingEngine:
    """Forwards ``class_counts`` to an engine and keeps each call's counts by stage."""

    def __init__(self, engine):
        self.engine = engine
        self.counts = {}

    def class_counts(self, X, sigma, n_samples, stage):
        counts = self.engine.class_counts(X, sigma, n_samples, stage)
        self.counts[tuple(stage)] = counts
        return counts


def run_pair(engine, X, y, sigma, n_max):
    """Certify with ISS, then with IAS at ISS's average samples per input.

    Returns a list of two row dicts (method, samples, k, time, prediction, radius)
    and ISS's candidate class per input.
    """
    n_inputs = len(y)
    sigma_in = np.full(n_inputs, sigma)
    engine.class_counts(X[:1], sigma_in[:1], 2000, (0,))  # warm-up, so neither method pays it
    iss = InputSpecificSampler(n_max=n_max, decline=DECLINE, decline_type="absolute", n0_fraction=0.01)
    iss_time, result = timed(iss.certify, engine, X, sigma_in, ALPHA, stage=(1,))
    n_pilot = engine.counts[(1, 0)].sum(axis=1)
    average = float(result.n_samples.mean())
    ias = FixedSampler(n=max(1, round(average) - IAS_N0), n0=IAS_N0)
    ias_time, fixed = timed(ias.certify, engine, X, sigma_in, ALPHA, stage=(2,))
    rows = []
    for name, res, k, elapsed in ((f"ISS-AD {DECLINE}", result, result.n_samples - n_pilot, iss_time),
                                   (f"IAS n={ias.n}", fixed, np.full(n_inputs, ias.n), ias_time)):
        rows.append({"method": name, "samples": res.n_samples, "k": k, "time": elapsed,
                     "prediction": res.prediction, "radius": certified_radius(sigma, res.p_lower)})
    return rows, result.prediction


def table(title, rows, y, p_reference, sigma, n_max, with_time=True):
    """Print one markdown table of ``rows`` (from :func:`run_pair`)."""
    radii = sigma * np.asarray(RADII_IN_SIGMA)
    print(f"\n### {title}\n")
    head = ["method", "avg samples", "avg / n_max"] + (["time (s)"] if with_time else []) + ["ACR", "MAD"]
    head += [f"CA({r:.3g})" for r in radii]
    table_header(head)
    full = clopper_pearson_radius(np.full(len(y), n_max), p_reference, sigma, ALPHA)
    for row in rows:
        mad = float(np.max(full - clopper_pearson_radius(row["k"], p_reference, sigma, ALPHA)))
        cells = [row["method"], f"{row['samples'].mean():.0f}", f"{row['samples'].mean() / n_max:.3f}"]
        cells += [f"{row['time']:.1f}"] if with_time else []
        cells += [f"{average_certified_radius(y, row['prediction'], row['radius']):.4f}", f"{mad:.4f}"]
        cells += [f"{a:.3f}" for a in certified_accuracy_curve(y, row["prediction"], row["radius"], radii)]
        table_row(cells)


def bench_map(n_max):
    """Cold build time of psi_ISS (Alg. 1 + Eq. 6) per decline type and bound (ISS Table 3)."""
    print(f"\n### Building psi at n_max = {n_max:,} (sigma = 0.25, alpha = {ALPHA})\n")
    table_header(["decline", "U", "build time (s)", "psi(1) / n_max", "Beta quantiles, bisection",
                  "Beta quantiles, scan over k"])
    grid = np.arange(10_001) / 10_000
    bisection_rounds = int(np.ceil(np.log2(n_max)))
    for decline_type in ("absolute", "relative"):
        for decline in (0.01, 0.05, 0.10):
            sampler = InputSpecificSampler(n_max=n_max, decline=decline, decline_type=decline_type)
            _psi_map.cache_clear()
            elapsed, _ = timed(sampler.sample_size, 1.0, 0.25, ALPHA)
            psi = sampler.sample_size(grid, 0.25, ALPHA)
            table_row([decline_type, f"{decline}", f"{elapsed:.3f}", f"{psi[-1] / n_max:.3f}",
                       f"<= {bisection_rounds * np.count_nonzero(psi):.2e}", f"{psi.sum():.2e}"])


def bench_simulated(n_max, n_inputs):
    """ISS vs IAS on simulated pA distributions, where the exact decline is known."""
    rng = np.random.default_rng(0)
    distributions = {
        "mass near 1 (pA = 1 - Beta(0.3, 20))": 1 - rng.beta(0.3, 20, n_inputs),
        "uniform pA on [0.3, 1]": rng.uniform(0.3, 1.0, n_inputs),
        "60 % at pA = 1, 40 % uniform on [0.5, 1]": np.where(
            rng.random(n_inputs) < 0.6, 1.0, rng.uniform(0.5, 1.0, n_inputs)),
    }
    y = np.zeros(n_inputs, dtype=np.int64)
    for sigma in (0.25, 0.5):
        for name, p_top in distributions.items():
            engine = RecordingEngine(BinomialEngine(p_top, seed=1))
            rows, _ = run_pair(engine, np.zeros((n_inputs, 1)), y, sigma, n_max)
            full = FixedSampler(n=n_max, n0=IAS_N0).certify(
                engine, np.zeros((n_inputs, 1)), np.full(n_inputs, sigma), ALPHA, stage=(3,))
            rows.append({"method": f"IAS n={n_max} (no acceleration)", "samples": full.n_samples,
                         "k": np.full(n_inputs, n_max), "time": 0.0, "prediction": full.prediction,
                         "radius": certified_radius(sigma, full.p_lower)})
            table(f"Simulated, {name}, sigma = {sigma}, {n_inputs} inputs", rows, y, p_top, sigma,
                  n_max, with_time=False)


def bench_digits(n_max, n_test, epochs):
    """ISS vs IAS on the digits CNN trained with Gaussian noise (ISS Tables 1 and 5)."""
    X, y = load_digits_images()
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    X_test, y_test = X_test[:n_test], y_test[:n_test]
    for sigma in (0.25, 0.5):
        clf = SampleWiseSmoothedClassifier(
            DigitsCNN, training=FixedSigmaTraining(sigma), max_epochs=epochs, lr=0.05,
            optimizer=torch.optim.SGD, optimizer__momentum=0.9, batch_size=64, random_state=0)
        train_time, _ = timed(clf.fit, X_train, y_train)
        clf.module_.eval()
        engine = RecordingEngine(MonteCarloEngine(clf.module_, len(clf.classes_), 1000, "cpu", root_seed=0))
        rows, candidate = run_pair(engine, torch.from_numpy(X_test), y_test, sigma, n_max)
        index = np.arange(n_test)
        pooled = engine.counts[(1, 1)] + engine.counts[(2, 1)]
        p_hat = pooled[index, candidate] / np.maximum(pooled.sum(axis=1), 1)
        table(f"Digits CNN, sigma = {sigma}, {n_test} test inputs (trained {epochs} epochs in "
              f"{train_time:.0f} s); p-hat >= 0.999 for {np.mean(p_hat >= 0.999):.0%}, "
              f"median p-hat {np.median(p_hat):.3f}", rows, y_test, p_hat, sigma, n_max)


def main():
    args = quick_parser(__doc__, "n_max = 10,000 and fewer inputs").parse_args()
    n_max, n_test, n_simulated, epochs = (10_000, 40, 1000, 10) if args.quick else (100_000, 100, 2000, 30)
    torch.manual_seed(0)
    print(f"## ISS vs IAS (U_AD = {DECLINE}, n_max = {n_max:,}, alpha = {ALPHA}, k0 = 0.01 n_max; "
          f"timings measured while the machine may be shared)")
    bench_map(100_000)
    bench_simulated(n_max, n_simulated)
    bench_digits(n_max, n_test, epochs)


if __name__ == "__main__":
    main()
