"""Sequential certification (SequentialSampler) vs ISS and vs Cohen's fixed n, on simulated counts.

Prints markdown tables:

1. samples per input by pA bin, SequentialSampler (both confidence sequences)
   against InputSpecificSampler at the same ``n_max`` and decline ``U``, on the
   simulated pA distributions of ``bench_iss.py`` (binomial counts, no model);
   with the maximum realised decline ``max_i [r(n_max, p_i) - radius_i]``,
   where ``r(n_max, p)`` is the Clopper-Pearson radius at ``n_max`` samples and
   frequency p (ISS Def. 1) and ``radius_i`` the radius each method certified,
   and ISS's own MAD (its expected radius at its sample size, ISS Table 1);
2. the "robust at r" mode against Cohen's CERTIFY with ``n = n_max``: samples
   and agreement of the decisions "robust at r";
3. MAD as ISS defines it (Def. 1-2): max over a pA grid of r(n_max, pA) minus the
   simulated expected radius at stop, with Monte Carlo standard error, for ISS and the sequential variants;
4. the digits CNN (trained with Gaussian noise at sigma 0.25): samples by pA bin, pA estimated by
   pooling every sample the methods drew for the input;
5. where the samples go, against oracles that know pA (ISS's psi(pA) idea with the expected radius):
   the smallest fixed size whose expected Clopper-Pearson radius is within U of r(n_max, pA), at the
   full alpha and at 0.4 alpha (what one look of a split pays), plus the n0 = 100 selection samples;
   "prior" with its looks placed from the true pA instead of the selection's posterior; "prior" itself.

6. the closed-form linear model (pA = Phi(d / sigma), distances d from 0.0125 to 3, ``pA < 1``) at sigma 0.5
   and 1.0: samples per input of the defaults against ISS at the same n_max and decline, and the worst
   expected decline (MAD) over a pA grid from 0.54 (near the abstain threshold, where wrong candidates
   cost most) to 0.999; the evidence behind the defaults ``n0=None`` and ``alpha_spending="auto"``.

"Seq default" is ``SequentialSampler(n_max, decline)`` with its defaults (decline mode: ``alpha_spending``
"plan", ``n0`` 1.5 % of n_max; radius mode: "prior", ``n0`` 100). The other sequential variants keep
``n0 = 100`` (the former default, at which their constants were tuned): the union bound with alpha split
equally over the looks ("Seq union", the former default), the same with ``alpha_spending="predicted"``
("Seq predicted"), ``"prior"`` ("Seq prior") or ``"plan"`` ("Seq plan"; decline tables only, it has no
radius mode), and the betting confidence sequence ("Seq betting").

Run ``OMP_NUM_THREADS=1 python benchmarks/bench_sequential.py`` (n_max = 100,000 simulated and
10,000 on the digits, a few minutes on one core) or add ``--quick`` (n_max = 10,000 simulated and
2,000 on the digits, fewer inputs); ``--skip-digits`` leaves out table 4, ``--digits-only`` runs only it
(``--digits-n-max`` sets its n_max), ``--linear-only`` runs only table 6 (n_max 20,000 and 100,000; about a
minute). ``--seed-offset K`` shifts
every seed of the simulation (the pA draws and the binomial streams; the digits keep theirs): the
"plan" constants were tuned at offset 0, so other offsets are draws they never saw.
"""

import numpy as np
import torch
from scipy import stats
from sklearn.model_selection import train_test_split

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_digits_images
from smoothsk.engine import MonteCarloEngine
from smoothsk.models import DigitsCNN
from smoothsk.sampling import FixedSampler, InputSpecificSampler, SequentialSampler
from smoothsk.sampling._spending import PriorSpending
from smoothsk.statistics import certified_radius, clopper_pearson_lower
from smoothsk.training import FixedSigmaTraining

from _common import BinomialEngine, clopper_pearson_radius, quick_parser, table_header, table_row, timed

ALPHA = 0.001
DECLINE = 0.05
BINS = ((0.0, 0.9), (0.9, 0.99), (0.99, 0.999), (0.999, 1.0), (1.0, 1.0))


#: Selection samples of the named sequential variants: the former default, at which their constants were tuned.
VARIANT_N0 = 100


def decline_methods(n_max):
    """ISS, the sequential sampler's defaults and its named variants at the same n_max and decline U."""
    return {
        "ISS": InputSpecificSampler(n_max=n_max, decline=DECLINE),
        "Seq default": SequentialSampler(n_max=n_max, decline=DECLINE),
        "Seq union": SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0, alpha_spending="equal"),
        "Seq predicted": SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0, alpha_spending="predicted"),
        "Seq prior": SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0, alpha_spending="prior"),
        "Seq plan": SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0, alpha_spending="plan"),
        "Seq betting": SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0, confidence_sequence="betting"),
    }


def print_samples_by_bin(results, p_top):
    """Markdown table of mean samples per input by pA bin, each sequential variant also divided by ISS's."""
    labels = [label for label in results if label != "ISS"]
    table_header(["pA bin", "inputs", "ISS samples",
                  *(cell for label in labels for cell in (f"{label} samples", "/ ISS"))])
    rows = [(label, mask) for label, mask in bin_masks(p_top) if mask.any()]
    for label, mask in [*rows, ("all", np.ones(len(p_top), dtype=bool))]:
        iss = results["ISS"].n_samples[mask].mean()
        cells = [cell for m in labels for cell in (f"{results[m].n_samples[mask].mean():.0f}",
                                                    f"{results[m].n_samples[mask].mean() / iss:.2f}")]
        table_row([label, f"{mask.sum()}", f"{iss:.0f}", *cells])


def distributions(n_inputs, seed_offset=0):
    """The simulated pA distributions of bench_iss.py (drawn with seed ``seed_offset``)."""
    rng = np.random.default_rng(seed_offset)
    return {
        "pA = 1 - Beta(0.3, 20)": 1 - rng.beta(0.3, 20, n_inputs),
        "pA uniform on [0.3, 1]": rng.uniform(0.3, 1.0, n_inputs),
        "60 % pA = 1, 40 % uniform [0.5, 1]": np.where(rng.random(n_inputs) < 0.6, 1.0,
                                                       rng.uniform(0.5, 1.0, n_inputs)),
    }


def bin_masks(p_top):
    """(label, mask) per pA bin, pA taken as the candidate's probability max(p, 1 - p)."""
    top = np.maximum(p_top, 1 - p_top)
    for low, high in BINS:
        if low == high:
            yield "pA = 1", top == 1.0
        else:
            yield f"[{low}, {high})", (top >= low) & (top < high)


def bench_decline(n_max, n_inputs, seed_offset):
    """Samples by pA bin and maximum decline: ISS vs SequentialSampler at the same n_max and U."""
    for sigma in (0.25, 0.5):
        for name, p_top in distributions(n_inputs, seed_offset).items():
            X, sigmas = np.zeros((n_inputs, 1)), np.full(n_inputs, sigma)
            top = np.maximum(p_top, 1 - p_top)
            full = clopper_pearson_radius(np.full(n_inputs, n_max), top, sigma, ALPHA)
            methods = decline_methods(n_max)
            results, times = {}, {}
            for label, sampler in methods.items():
                engine = BinomialEngine(p_top, seed=1 + seed_offset)
                times[label], results[label] = timed(sampler.certify, engine, X, sigmas, ALPHA)
            iss_k = results["ISS"].n_samples - max(1, round(0.01 * n_max))
            iss_mad = float(np.max(full - clopper_pearson_radius(iss_k, top, sigma, ALPHA)))
            print(f"\n### {name}, sigma = {sigma}, {n_inputs} inputs, n_max = {n_max:,}, U = {DECLINE}\n")
            print_samples_by_bin(results, p_top)
            print()
            table_header(["method", "realised max decline", "inputs with realised decline > U",
                          "ACR-like mean radius", "time (s)"])
            for label, result in results.items():
                decline = full - certified_radius(sigma, result.p_lower)
                table_row([label, f"{decline.max():.4f}", f"{np.mean(decline > DECLINE + 1e-9):.3f}",
                           f"{certified_radius(sigma, result.p_lower).mean():.4f}", f"{times[label]:.1f}"])
            print(f"\nISS's MAD (expected radius at its sample size, ISS Table 1): {iss_mad:.4f}")


def bench_mad(n_max, n_streams, seed_offset):
    """MAD (ISS Def. 1-2) by simulation: max over a pA grid of r(n_max, pA) - E[radius at stop].

    Each grid value gets ``n_streams`` independent binomial streams run through the samplers' own
    ``certify`` (one packed call per method and sigma); E[radius] is the mean certified radius, with
    its Monte Carlo standard error; the reference is the Clopper-Pearson radius at n_max (ISS's).
    """
    grid = np.concatenate([np.linspace(0.55, 0.99, 23), [0.995, 0.998, 0.999, 0.9995, 0.9999, 1.0]])
    p_top = np.repeat(grid, n_streams)
    print(f"\n### MAD by simulation: {grid.size} pA values x {n_streams} streams, n_max = {n_max:,}, "
          f"U = {DECLINE}\n")
    table_header(["sigma", "method", "MAD = max_pA [r(n_max, pA) - E radius]", "+- MC s.e.", "at pA",
                  "<= U (+2 s.e.)?", "max over pA < 1", "+- MC s.e.", "at pA"])
    for sigma in (0.25, 0.5):
        X, sigmas = np.zeros((p_top.size, 1)), np.full(p_top.size, sigma)
        full = clopper_pearson_radius(np.full(grid.size, n_max), grid, sigma, ALPHA)
        for label, sampler in decline_methods(n_max).items():
            result = sampler.certify(BinomialEngine(p_top, seed=4 + seed_offset), X, sigmas, ALPHA)
            radius = certified_radius(sigma, result.p_lower).reshape(grid.size, n_streams)
            decline = full - radius.mean(axis=1)
            stderr = radius.std(axis=1, ddof=1) / np.sqrt(n_streams)
            worst = int(np.argmax(decline))
            below_one = int(np.argmax(np.where(grid < 1, decline, -np.inf)))
            table_row([f"{sigma}", label, f"{decline[worst]:.4f}", f"{stderr[worst]:.4f}", f"{grid[worst]:g}",
                       "yes" if decline[worst] <= DECLINE + 2 * stderr[worst] else "NO",
                       f"{decline[below_one]:.4f}", f"{stderr[below_one]:.4f}", f"{grid[below_one]:g}"])


def bench_radius(n_max, n_inputs, seed_offset):
    """"Robust at r": SequentialSampler(radius=r) vs Cohen's CERTIFY with n = n_max."""
    sigma = 0.5
    print(f"\n### Robust at r, sigma = {sigma}, {n_inputs} inputs; Cohen: n0 = 100, n = {n_max:,}\n")
    table_header(["pA distribution", "r", "CS", "Cohen samples", "Seq samples", "Cohen / Seq", "same decision",
                  "robust (Cohen / Seq)"])
    for name, p_top in distributions(n_inputs, seed_offset).items():
        X, sigmas = np.zeros((n_inputs, 1)), np.full(n_inputs, sigma)
        cohen = FixedSampler(n=n_max, n0=100).certify(BinomialEngine(p_top, seed=2 + seed_offset), X, sigmas, ALPHA)
        cohen_robust = certified_radius(sigma, cohen.p_lower)
        for r in (0.25, 0.5, 1.0):
            for cs, spending in (("default", None), ("union", "equal"), ("union", "predicted"), ("union", "prior"),
                                 ("betting", "equal")):
                seq = (SequentialSampler(n_max=n_max, radius=r) if spending is None else SequentialSampler(
                    n_max=n_max, radius=r, n0=VARIANT_N0, confidence_sequence=cs, alpha_spending=spending))
                seq = seq.certify(BinomialEngine(p_top, seed=3 + seed_offset), X, sigmas, ALPHA)
                cs_label = "defaults" if spending is None else f"{cs}, {spending}"
                robust_seq = certified_radius(sigma, seq.p_lower) >= r
                robust_cohen = cohen_robust >= r
                table_row([name, f"{r}", cs_label, f"{cohen.n_samples.mean():.0f}", f"{seq.n_samples.mean():.0f}",
                           f"{cohen.n_samples.mean() / seq.n_samples.mean():.1f}",
                           f"{np.mean(robust_seq == robust_cohen):.3f}",
                           f"{robust_cohen.mean():.3f} / {robust_seq.mean():.3f}"])


class PoolingEngine:
    """Forwards ``class_counts`` to an engine and adds every call's counts per input and class."""

    def __init__(self, engine, n_inputs, n_classes):
        self.engine = engine
        self.pooled = np.zeros((n_inputs, n_classes), dtype=np.int64)

    def class_counts(self, X, sigma, n_samples, stage):
        counts = self.engine.class_counts(X, sigma, n_samples, stage)
        self.pooled += counts
        return counts


def bench_digits(n_max, n_test, epochs):
    """Samples by pA bin on the digits CNN trained at sigma 0.25: ISS vs the sequential variants."""
    sigma = 0.25
    X, y = load_digits_images()
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    X_test = torch.from_numpy(X_test[:n_test])
    clf = SampleWiseSmoothedClassifier(
        DigitsCNN, module__width=8, training=FixedSigmaTraining(sigma), max_epochs=epochs, lr=0.05,
        optimizer=torch.optim.SGD, optimizer__momentum=0.9, batch_size=64, random_state=0, verbose=0)
    clf.fit(X_train, y_train)
    clf.module_.eval()
    engine = PoolingEngine(MonteCarloEngine(clf.module_, len(clf.classes_), 1000, "cpu", root_seed=0),
                           n_test, len(clf.classes_))
    sigmas = np.full(n_test, sigma)
    results, times = {}, {}
    for index, (label, sampler) in enumerate(decline_methods(n_max).items()):
        times[label], results[label] = timed(sampler.certify, engine, X_test, sigmas, ALPHA, stage=(1 + index,))
    p_hat = engine.pooled.max(axis=1) / engine.pooled.sum(axis=1)
    print(f"\n### Digits CNN (width 8, {epochs} epochs), sigma = {sigma}, {n_test} test inputs, n_max = {n_max:,}, "
          f"U = {DECLINE}; pA = top-class frequency of all {engine.pooled.sum() / n_test:.0f} samples per input "
          f"the methods drew together\n")
    print_samples_by_bin(results, p_hat)
    print()
    table_header(["method", "mean certified radius", "time (s)"])
    for label, result in results.items():
        table_row([label, f"{certified_radius(sigma, result.p_lower).mean():.4f}", f"{times[label]:.0f}"])


def expected_radius(n_samples, p, sigma, alpha, n_points=64):
    """E[r] over the count K ~ Binomial(n, p) of the Clopper-Pearson radius, by ``n_points`` mid-quantiles of K.

    Parameters
    ----------
    n_samples, p : ndarray, shape (n,)
    sigma, alpha : float

    Returns
    -------
    ndarray of float, shape (n,)
    """
    counts = stats.binom.ppf((np.arange(n_points) + 0.5) / n_points, n_samples[:, None], p[:, None])
    trials = np.broadcast_to(n_samples[:, None], counts.shape).astype(np.float64)
    return certified_radius(sigma, clopper_pearson_lower(counts, trials, alpha)).mean(axis=1)


def oracle_size(p, sigma, level, n_max):
    """Smallest fixed size whose expected radius at ``level`` is within DECLINE of r(n_max, p) (bisection)."""
    target = clopper_pearson_radius(np.full(len(p), n_max), p, sigma, ALPHA) - DECLINE
    low, high = np.zeros(len(p), dtype=np.int64), np.full(len(p), n_max, dtype=np.int64)
    while np.any(high - low > 1):
        middle = (low + high) // 2
        reached = expected_radius(np.maximum(middle, 1), p, sigma, level) >= target
        high, low = np.where(reached, middle, high), np.where(reached, low, middle)
    return np.where(target > 0, high, 0)


class KnownFrequencySpending(PriorSpending):
    """The "prior" strategy with every posterior quantile at ``known_p``."""

    def __init__(self, known_p, *args):
        super().__init__(*args)
        self.known_p = known_p

    def posterior_quantiles(self, selected, quantiles):
        return np.full((len(selected), len(quantiles)), self.known_p)


class KnownFrequencyPrior(SequentialSampler):
    """``alpha_spending="prior"`` with every posterior quantile at the true pA (set ``known_p`` first).

    Valid only as an oracle on streams that all share ``known_p``: the looks then ignore the selection.
    """

    known_p = None

    def _spending(self, rule):
        prior = super()._spending(rule)
        return KnownFrequencySpending(self.known_p, prior.rule, prior.n0, prior.geometric, prior.sequence)


def bench_oracle(n_max, n_streams, seed_offset):
    """Samples / ISS per pA against oracles that know pA, and "prior" with looks from the true pA."""
    grid = np.array([0.6, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999])
    print(f"\n### Where the samples go: {n_streams} streams per pA, n_max = {n_max:,}, U = {DECLINE}; "
          f"samples / ISS's\n")
    table_header(["sigma", "pA", "ISS samples", "oracle(alpha) + 100", "oracle(0.4 alpha) + 100",
                  "prior, looks from true pA", "Seq prior", "Seq prior decline", "Seq plan", "Seq plan decline"])
    for sigma in (0.25, 0.5):
        X, sigmas = np.zeros((n_streams, 1)), np.full(n_streams, sigma)
        oracle = {share: oracle_size(grid, sigma, share * ALPHA, n_max) + 100 for share in (1.0, 0.4)}
        for index, p in enumerate(grid):
            p_top = np.full(n_streams, p)
            iss = InputSpecificSampler(n_max=n_max, decline=DECLINE).certify(
                BinomialEngine(p_top, seed=6 + seed_offset), X, sigmas, ALPHA).n_samples.mean()
            known = KnownFrequencyPrior(n_max=n_max, decline=DECLINE, n0=VARIANT_N0, alpha_spending="prior")
            known.known_p = p
            known_n = known.certify(BinomialEngine(p_top, seed=7 + seed_offset), X, sigmas, ALPHA).n_samples.mean()
            full = clopper_pearson_radius(np.array([n_max]), np.array([p]), sigma, ALPHA)[0]
            cells = []
            for spending in ("prior", "plan"):
                sampler = SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0, alpha_spending=spending)
                result = sampler.certify(BinomialEngine(p_top, seed=7 + seed_offset), X, sigmas, ALPHA)
                cells += [f"{result.n_samples.mean() / iss:.2f}",
                          f"{full - certified_radius(sigma, result.p_lower).mean():.4f}"]
            table_row([f"{sigma}", f"{p:g}", f"{iss:.0f}", f"{oracle[1.0][index] / iss:.2f}",
                       f"{oracle[0.4][index] / iss:.2f}", f"{known_n / iss:.2f}", *cells])


#: Distances to the boundary of the closed-form linear model (table 6): pA = Phi(d / sigma) < 1.
LINEAR_DISTANCES = np.linspace(3 / 240, 3, 240)
#: pA values at which table 6 simulates the expected decline: near the abstain threshold, and up to 0.999.
LINEAR_DECLINE_GRID = np.array([0.54, 0.55, 0.56, 0.58, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999])


def bench_linear(n_max_values, repeats, n_streams, seed_offset):
    """The defaults against ISS on the closed-form linear model: samples per input and the worst expected decline."""
    grid = LINEAR_DECLINE_GRID
    print(f"\n### Closed-form linear model: {LINEAR_DISTANCES.size} distances 0.0125-3 to the boundary x {repeats} "
          f"streams, pA = Phi(d / sigma); expected decline over pA in [{grid[0]}, {grid[-1]}], {n_streams} streams "
          f"each; U = {DECLINE}\n")
    table_header(["n_max", "sigma", "method", "samples per input", "/ ISS", "worst expected decline",
                  "+- MC s.e.", "at pA", "<= U (+2 s.e.)?"])
    for n_max in n_max_values:
        for sigma in (0.5, 1.0):
            p_top = np.tile(stats.norm.cdf(LINEAR_DISTANCES / sigma), repeats)
            grid_p = np.repeat(grid, n_streams)
            full = clopper_pearson_radius(np.full(grid.size, n_max), grid, sigma, ALPHA)
            methods = {
                "ISS": InputSpecificSampler(n_max=n_max, decline=DECLINE),
                "Seq default": SequentialSampler(n_max=n_max, decline=DECLINE),
                "Seq union (the former default)": SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0,
                                                                    alpha_spending="equal"),
                f"Seq plan, n0 = {VARIANT_N0}": SequentialSampler(n_max=n_max, decline=DECLINE, n0=VARIANT_N0,
                                                                   alpha_spending="plan"),
            }
            iss = None
            for label, sampler in methods.items():
                samples = sampler.certify(BinomialEngine(p_top, seed=1 + seed_offset), np.zeros((p_top.size, 1)),
                                          np.full(p_top.size, sigma), ALPHA).n_samples.mean()
                iss = samples if iss is None else iss
                result = sampler.certify(BinomialEngine(grid_p, seed=4 + seed_offset), np.zeros((grid_p.size, 1)),
                                         np.full(grid_p.size, sigma), ALPHA)
                radius = certified_radius(sigma, result.p_lower).reshape(grid.size, n_streams)
                decline = full - radius.mean(axis=1)
                stderr = radius.std(axis=1, ddof=1) / np.sqrt(n_streams)
                worst = int(np.argmax(decline))
                table_row([f"{n_max:,}", f"{sigma}", label, f"{samples:.0f}", f"{samples / iss:.3f}",
                           f"{decline[worst]:.4f}", f"{stderr[worst]:.4f}", f"{grid[worst]:g}",
                           "yes" if decline[worst] <= DECLINE + 2 * stderr[worst] else "NO"])


def main():
    parser = quick_parser(__doc__, "n_max = 10,000 and fewer inputs")
    parser.add_argument("--skip-digits", action="store_true", help="simulated counts only")
    parser.add_argument("--seed-offset", type=int, default=0, help="added to every simulation seed (default 0)")
    parser.add_argument("--digits-n-max", type=int, default=10_000, help="n_max of table 4 (default 10,000)")
    parser.add_argument("--digits-only", action="store_true", help="table 4 only")
    parser.add_argument("--linear-only", action="store_true", help="table 6 only")
    args = parser.parse_args()
    n_max, n_inputs = (10_000, 500) if args.quick else (100_000, 1000)
    torch.manual_seed(0)
    print(f"## SequentialSampler (first = 500, growth = 1.5; defaults: n0 = 1.5 % of n_max and \"plan\" when "
          f"bounding the decline, n0 = 100 and \"prior\" with a radius; named variants at n0 = {VARIANT_N0}) vs ISS "
          f"(k0 = 0.01 n_max) and Cohen; alpha = {ALPHA}")
    if args.linear_only:
        bench_linear((20_000, 100_000), 20, 400, args.seed_offset)
        return
    if not args.digits_only:
        bench_mad(n_max, 40 if args.quick else 200, args.seed_offset)
        bench_decline(n_max, n_inputs, args.seed_offset)
        bench_radius(n_max, n_inputs, args.seed_offset)
        bench_oracle(n_max, 100 if args.quick else 400, args.seed_offset)
        bench_linear((n_max,) if args.quick else (20_000, n_max), 10 if args.quick else 20,
                     100 if args.quick else 400, args.seed_offset)
    if not args.skip_digits:
        bench_digits(*((2_000, 30, 10) if args.quick else (args.digits_n_max, 100, 20)))


if __name__ == "__main__":
    main()
