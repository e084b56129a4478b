"""PFAT's transductive allocation: non-overlapping balls by linear programming (App. C, Eq. 10)."""

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_array
from scipy.sparse.csgraph import connected_components

from ..certificates import Certificates
from ..statistics import certified_radius
from ._base import RegionAllocator
from ._layout import MARGIN, CallLayout


def max_radii_lp(i, j, distance, upper):
    """Largest sum of radii of disjoint balls (PFAT Eq. 10), by HiGHS.

    maximise ``sum_v r_v`` subject to ``r_i + r_j <= d_ij`` for every edge
    and ``0 <= r_v <= upper_v``. Only edges with ``d_ij < upper_i + upper_j``
    can bind, so only those become constraints; nodes without such an edge
    take their upper bound directly.

    Parameters
    ----------
    i, j : ndarray of int, shape (n_edges,)
        Pairs of balls whose uncapped versions overlap.
    distance : ndarray of float, shape (n_edges,)
        Distance between their centres.
    upper : ndarray of float, shape (n_nodes,)
        Upper bound of each radius.

    Returns
    -------
    radius : ndarray of float64, shape (n_nodes,)
        Optimal radii; every edge satisfies ``r_i + r_j <= d_ij`` exactly
        (with the module's relative margin), not only to the solver's
        tolerance.
    """
    radius = np.asarray(upper, dtype=np.float64).copy()
    binding = distance < radius[i] + radius[j]
    i, j, distance = i[binding], j[binding], distance[binding]
    if not len(i):
        return radius
    nodes, local = np.unique(np.concatenate([i, j]), return_inverse=True)
    li, lj = local[:len(i)], local[len(i):]
    n_edges = len(i)
    # In units of each radius's own bound (r_v = scale_v * u_v, 0 <= u_v <= 1) and each edge's own distance
    # ((scale_i u_i + scale_j u_j) / d_ij <= 1 - margin), each component's objective divided by its largest
    # bound: HiGHS's tolerances are absolute, so in raw units it stopped far from the optimum where distances
    # are small (41% short at 1e-6), and one unit for all edges or all components lost small clusters next
    # to large ones. A bound is first cut to the distance of the node's nearest neighbour (r_i + r_j <= d_ij
    # with r_j >= 0 implies it), which keeps every coefficient <= 1 (HiGHS refuses entries above 1e15).
    scale = radius[nodes].copy()
    np.minimum.at(scale, li, distance * (1.0 - MARGIN))
    np.minimum.at(scale, lj, distance * (1.0 - MARGIN))
    coefficients = np.divide(np.concatenate([scale[li], scale[lj]]), np.tile(distance, 2),
                             out=np.zeros(2 * n_edges), where=np.tile(distance, 2) > 0)
    constraints = csr_array((coefficients, (np.tile(np.arange(n_edges), 2), local)), shape=(n_edges, len(nodes)))
    bounds = np.column_stack([np.zeros(len(nodes)), np.ones(len(nodes))])
    # sum_v r_v is the sum over the independent components of their sums: dividing each by a positive
    # factor of its own leaves every component's optimum, and so the whole optimum, unchanged.
    _, component = connected_components(csr_array((np.ones(n_edges), (li, lj)), shape=(len(nodes), len(nodes))),
                                        directed=False)
    largest = np.zeros(component.max() + 1)
    np.maximum.at(largest, component, scale)
    objective = -np.divide(scale, largest[component], out=np.zeros(len(nodes)), where=largest[component] > 0)
    result = linprog(objective, A_ub=constraints, b_ub=np.full(n_edges, 1.0 - MARGIN), bounds=bounds,
                     method="highs")
    if result.status != 0:  # r = 0 is feasible and the objective is bounded: a solver failure
        raise RuntimeError(f"HiGHS did not solve the region LP: {result.message}")
    solution = np.clip(result.x * scale, 0.0, radius[nodes])
    # HiGHS meets constraints up to its tolerance (~1e-7); lower each node by
    # its largest excess over a slightly looser limit, which restores every
    # constraint exactly (a violated edge loses at least its excess).
    looser = distance * (1.0 - MARGIN / 2)
    excess = solution[li] + solution[lj] - looser
    while np.any(excess > 0):
        cut = np.zeros(len(nodes))
        over = excess > 0
        step = excess[over] + MARGIN / 4 * distance[over]
        np.maximum.at(cut, li[over], step)
        np.maximum.at(cut, lj[over], step)
        solution = np.maximum(solution - cut, 0.0)
        excess = solution[li] + solution[lj] - looser
    radius[nodes] = solution
    return radius


class TransductiveLPAllocator(RegionAllocator):
    """Balls for a whole test set at once, by linear programming (PFAT App. C).

    The inputs of one ``certify`` call are the known test set. Inputs in a
    stored region are certified at its sigma with radius
    ``min(R(x, sigma_k), d(x, boundary of B_k))`` (PFAT Eq. 6). Every other
    input ``x_v`` is certified at its searched sigma, giving the uncapped
    radius ``R_v``; it gets its own region ``B(x_v, r_v)``, where the radii
    maximise ``sum_v r_v`` subject to ``r_u + r_v <= ||x_u - x_v||`` for every
    pair whose uncapped balls overlap, ``0 <= r_v <= R_v``, and ``r_v`` at most
    the distance to every stored region (Eq. 10 with the stored regions
    fixed). The sparse program is solved by HiGHS
    (``scipy.optimize.linprog``), with one constraint per edge of the
    overlap graph.

    The classifier is the stateful region classifier of
    :class:`OnlineBallAllocator` (regions are disjoint, never change, and
    persist across calls). Unlike the online allocator, no input joins a
    ball opened in the same call: each input is the centre of its own ball,
    so an input deep inside another's uncapped ball may get a radius near 0
    where the online allocator would let it share that ball.

    Notes
    -----
    Guarantee (stateful region classifier). For every input, with
    probability at least ``1 - alpha`` over the certification samples, the
    returned class ``c`` and radius ``r`` satisfy ``g(x', sigma_k) = c`` for
    all ``||x' - x|| < r``, where ``B_k`` (``details.region``) contains
    ``B(x, r)``; hence the region classifier is ``c`` on that ball now and
    after any later allocation. Each input is sampled once (stage
    ``(1, t)``, ``t`` counting calls on the store) at a sigma fixed before
    sampling, and its radius never exceeds its own Monte Carlo radius: the
    program uses every input's samples to size the regions, but shrinking a
    certified ball keeps it certified, so no ``alpha`` is split.

    ``predict`` answers as the region classifier: an input in a region is
    smoothed with the region's sigma (Cohen et al.'s PREDICT on
    ``g(., sigma_k)``), any other input with its searched sigma; it does
    not allocate regions.

    Examples
    --------
    >>> TransductiveLPAllocator()
    TransductiveLPAllocator()
    """

    def _allocate(self, regions, X, sigma, certify_fn):
        layout = CallLayout(regions, X, sigma, regions.count_call())
        owner = layout.owner
        first = layout.certify_first(certify_fn, np.ones(len(X)))
        radius_first = certified_radius(layout.sigma_first, first.p_lower)

        upper, i, j, distance = layout.owner_balls(regions, radius_first)
        ball = max_radii_lp(i, j, distance, upper)  # Eq. 10

        region_of_owner = regions.append(X, ball, layout.sigma_first[owner], first.prediction[owner],
                                         first.p_lower[owner], rows=owner)
        region = layout.spread(region_of_owner, layout.stored_host)
        # duplicates sit at their owner's centre: their room is its ball
        room = layout.spread(ball, layout.member_room())
        radius = np.minimum(radius_first, room)
        return Certificates(first.prediction, radius, layout.sigma_first, first.p_lower,
                            first.n_samples, region=region)
