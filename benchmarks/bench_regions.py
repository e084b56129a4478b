"""Region allocation at scale: online balls (PFAT Alg. 2) vs the transductive LP (PFAT Eq. 10).

Usage: ``python benchmarks/bench_regions.py [--quick]``

Allocation time of ``OnlineBallAllocator`` and ``TransductiveLPAllocator``
for 1,000 / 10,000 / 30,000 points in 3,072 dimensions (CIFAR-10 size), and
the sum of certified radii of each (PFAT App. D, Table 7 compares the two at
30,000 points). Sampling is replaced by a stand-in ``certify_fn`` that
returns synthetic radii at once, so the timings are of the allocation
itself: neighbour search, ordering, the sequential pass or the linear
program, and the bookkeeping.

Synthetic data (chosen so that balls overlap; with radii well below the
spacing of the points the problem is trivial):

- points come in clusters: ``n`` cluster labels drawn uniformly from ``n``
  clusters (so about 37% of points are alone in theirs); cluster centres lie
  in a random 16-dimensional subspace, about 10 apart; within a cluster each
  point adds isotropic Gaussian noise in all 3,072 dimensions, scaled so that
  two points of one cluster are 1.0 +- 0.03 apart (the regime of
  near-duplicate images, which is where certified balls overlap);
- "partial" radii ``R ~ U(0.25, 0.75)``: two balls of one cluster overlap
  about half the time, and no centre ever lies in another ball, so every
  online allocation is feasible for the LP and the LP's sum of radii can
  only be larger (it is the optimum of the same problem);
- "nested" radii ``R ~ U(0.25, 1.5)``: some centres lie inside other balls.
  The online allocator then lets such an input join the ball (Eq. 6),
  while Eq. 10 gives every input its own ball, so neither sum bounds the
  other.

The brute-force baseline is the time BLAS takes for the full ``n x n``
Gram matrix of the points (estimated from a 2,000-row block), the cheapest
way to get all pairwise distances without an index.
"""

import numpy as np
from scipy.stats import norm

from smoothsk.certificates import ABSTAIN
from smoothsk.regions import OnlineBallAllocator, RegionStore, TransductiveLPAllocator
from smoothsk.regions._geometry import PointSet, Projection, overlap_graph
from smoothsk.sampling._base import SamplingResult

from _common import quick_parser, table_header, table_row, timed

DIM = 3072
LATENT = 16


def latent_basis(rng):
    """Orthonormal basis (DIM, LATENT) of the subspace the cluster centres lie in."""
    return np.linalg.qr(rng.standard_normal((DIM, LATENT)))[0].astype(np.float32)


def clustered_points(rng, n, basis):
    """``n`` points in ``n`` random clusters (see the module docstring), float32 (n, DIM)."""
    centres = rng.standard_normal((n, LATENT)).astype(np.float32) * np.float32(10 / np.sqrt(2 * LATENT))
    points = rng.standard_normal((n, DIM), dtype=np.float32)
    points *= np.float32(1 / np.sqrt(2 * DIM))
    points += (centres @ basis.T)[rng.integers(0, n, n)]
    return points


class SyntheticCertifier:
    """Stand-in for the estimator's ``certify_fn``: certificates with given radii, at no cost."""

    def __init__(self, radius):
        self.radius = radius

    def __call__(self, rows, sigma, stage, alpha_share=1.0):
        p_lower = norm.cdf(self.radius[rows] / sigma)
        prediction = np.where(p_lower < 0.5, ABSTAIN, 0)
        return SamplingResult(prediction, p_lower, np.ones(len(rows), dtype=np.int64))


def allocate(allocator, points, radius, store=None):
    """Allocate ``points`` into ``store`` (a new one by default); returns (seconds, certificates, store)."""
    store = RegionStore.empty(DIM) if store is None else store
    certify = SyntheticCertifier(radius)
    seconds, certificates = timed(allocator.allocate, store, points, np.ones(len(points)), certify)
    return seconds, certificates, store


def gram_seconds(points):
    """BLAS time of the full Gram matrix of ``points``, extrapolated from a 2,000-row block."""
    block = points[:2000]
    return timed(np.matmul, block, points.T)[0] * len(points) / len(block)


def overlap_fraction(points, radius):
    """Fraction of points whose uncapped ball overlaps another's (nodes of PFAT's graph G)."""
    projected = PointSet.project(points, Projection.fit(points))
    i, j, _ = overlap_graph(projected, radius)
    return len(np.unique(np.concatenate([i, j]))) / len(points), len(i)


def main(quick):
    sizes = (1000, 3000) if quick else (1000, 10000, 30000)
    rng = np.random.default_rng(0)
    basis = latent_basis(rng)
    print("# Region allocation: online (PFAT Alg. 2) vs transductive LP (PFAT Eq. 10)\n")
    print(f"{DIM} dimensions; synthetic clustered points and radii (see the module docstring). "
          "Times measured while the machine was shared; ratios are against BLAS's all-pairs Gram "
          "matrix in the same process.\n")
    table_header(["radii", "points", "overlapping", "edges", "brute-force Gram (s)", "online given (s)",
                  "online ascending (s)", "LP (s)", "Gram / online", "sum r online given", "sum r online asc.",
                  "sum r LP", "LP - online given", "joined a ball"])
    for regime, high in (("partial", 0.75), ("nested", 1.5)):
        for n in sizes:
            if regime == "nested" and n > 10000:
                continue
            points = clustered_points(rng, n, basis)
            radius = rng.uniform(0.25, high, n)
            fraction, n_edges = overlap_fraction(points, radius)
            brute = gram_seconds(points)
            t_given, given, given_store = allocate(OnlineBallAllocator("given"), points, radius)
            t_asc, asc, _ = allocate(OnlineBallAllocator("ascending"), points, radius)
            t_lp, lp, _ = allocate(TransductiveLPAllocator(), points, radius)
            gap = lp.radius.sum() - given.radius.sum()
            table_row([regime, f"{n:,}", f"{fraction:.0%}", f"{n_edges:,}", f"{brute:.1f}", f"{t_given:.2f}",
                       f"{t_asc:.2f}", f"{t_lp:.2f}", f"{brute / t_given:.1f}", f"{given.radius.sum():.1f}",
                       f"{asc.radius.sum():.1f}", f"{lp.radius.sum():.1f}",
                       f"{gap:+.1f} ({gap / given.radius.sum():+.2%})", f"{n - len(given_store):,}"])
            if regime == "partial" and n == sizes[-1]:
                grown = (points, radius, given_store)
    points, radius, store = grown
    more = clustered_points(rng, len(points), basis)
    t_more, _, store = allocate(OnlineBallAllocator("given"), more, rng.uniform(0.25, 0.75, len(more)), store)
    searched = np.ones(len(more))
    t_assign, _ = timed(OnlineBallAllocator().assign_sigma, store, more, searched)
    print(f"\nA second online call with {len(more):,} new points against {len(points):,} stored regions: "
          f"{t_more:.2f} s; `assign_sigma` (what `predict` adds) for {len(more):,} inputs against "
          f"{len(store):,} regions: {t_assign:.2f} s.")


if __name__ == "__main__":
    main(quick_parser(__doc__, "1,000 and 3,000 points only").parse_args().quick)
