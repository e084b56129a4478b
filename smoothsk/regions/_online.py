"""PFAT's online allocation of non-overlapping robust balls (Alg. 2; App. C.2 orders)."""

import numpy as np

from .._constraints import StrOptions
from .._stages import SECOND_PASS
from ..certificates import Certificates
from ..statistics import certified_radius
from ._base import RegionAllocator
from ._geometry import adjacency
from ._layout import CallLayout, certify_rows, room_inside, room_outside


def allocation_order(n_nodes, i, j, order):
    """Order in which balls are allocated (PFAT App. C.2).

    Parameters
    ----------
    n_nodes : int
    i, j : ndarray of int, shape (n_edges,)
        Edges of the overlap graph of the uncapped balls.
    order : {"given", "ascending", "descending"}
        Input order, or degree in the graph ascending / descending (ties
        keep input order).

    Returns
    -------
    order : ndarray of int64, shape (n_nodes,)
    """
    if order == "given":
        return np.arange(n_nodes)
    degree = np.bincount(np.concatenate([i, j]), minlength=n_nodes)
    return np.argsort(degree if order == "ascending" else -degree, kind="stable")


def allocate_in_order(graph, upper, order):
    """Allocate balls one by one (PFAT Alg. 2 on the geometry alone).

    Each node in turn either lies in a ball allocated before it and joins
    that ball (Alg. 2 lines 3-9; it opens no ball of its own), or opens the
    ball of radius ``min(upper, distance to every earlier ball)`` (Eq. 8).
    Only balls whose uncapped versions overlap can interact, so the loop
    visits the edges of the overlap graph once each; isolated nodes get
    their upper bound at once.

    Parameters
    ----------
    graph : tuple (indptr, indices, distances)
        Symmetric adjacency of the overlap graph of the uncapped balls
        (see :func:`~smoothsk.regions._geometry.adjacency`); nodes are
        distinct points.
    upper : ndarray of float, shape (n_nodes,)
        Largest radius each node's ball may have (uncapped radius, already
        capped by fixed obstacles).
    order : ndarray of int, shape (n_nodes,)
        Processing order.

    Returns
    -------
    ball : ndarray of float64, shape (n_nodes,)
        Radius of each node's ball, NaN for nodes that joined another ball.
    host : ndarray of int64, shape (n_nodes,)
        Node whose ball a node joined, -1 for nodes with their own ball.
    host_distance : ndarray of float64, shape (n_nodes,)
        Distance to the host's centre (NaN without host).
    """
    indptr, indices, distances = graph
    n_nodes = len(upper)
    ball = np.full(n_nodes, np.nan)
    host = np.full(n_nodes, -1, dtype=np.int64)
    host_distance = np.full(n_nodes, np.nan)
    isolated = indptr[1:] == indptr[:-1]
    ball[isolated] = upper[isolated]
    for node in order[~isolated[order]]:
        neighbours = indices[indptr[node]:indptr[node + 1]]
        distance = distances[indptr[node]:indptr[node + 1]]
        radius = ball[neighbours]
        allocated = ~np.isnan(radius)
        neighbours, distance, radius = neighbours[allocated], distance[allocated], radius[allocated]
        within = np.flatnonzero(distance < radius)
        if len(within):  # balls are disjoint: at most one contains the node
            host[node] = neighbours[within[0]]
            host_distance[node] = distance[within[0]]
        elif len(radius):  # Eq. 8
            ball[node] = min(upper[node], room_outside(distance, radius).min())
        else:
            ball[node] = upper[node]
    return ball, host, host_distance


class OnlineBallAllocator(RegionAllocator):
    """Non-overlapping robust balls allocated as inputs arrive (PFAT Alg. 2).

    The region classifier ``G`` is stateful: the store holds disjoint
    regions ``B_k`` (open balls plus their centres), each with a noise level
    ``sigma_k``; ``G(x) = g(x, sigma_k)`` for ``x`` in ``B_k`` (Eq. 9) and
    ``g(x, sigma(x))`` with the searched sigma elsewhere. Regions are never
    changed or removed, and a new region never meets an old one, so ``G``
    on an allocated region stays ``g(., sigma_k)`` for good.

    For each input ``x`` of a ``certify`` call, in ``order``:

    - if ``x`` lies in a region ``B_k`` (stored, or opened earlier in the
      call), it is certified at ``sigma_k`` and its radius is
      ``min(R(x, sigma_k), d(x, boundary of B_k))`` (Eq. 6); it opens no region;
    - otherwise it is certified at its searched sigma ``sigma(x)`` and opens
      the region ``B(x, r)`` with ``r = min(R(x, sigma(x)), distance to every
      region)`` (Eq. 8), which is also its certified radius.

    ``R(x, s)`` is the Monte Carlo radius of ``g(., s)`` at ``x``.

    Parameters
    ----------
    order : {"given", "ascending", "descending"}, default="given"
        Order within one call: as given, or by degree in the overlap graph
        of the uncapped balls ``B(x, R(x, sigma(x)))`` of the call's inputs
        that open regions, lowest first ("ascending", PFAT's choice in its
        experiments) or highest first ("descending") (PFAT App. C.2).

    Notes
    -----
    Guarantee (stateful region classifier). For every input, with
    probability at least ``1 - alpha`` over the certification samples, the
    returned class ``c`` and radius ``r`` satisfy ``g(x', sigma_k) = c`` for
    all ``||x' - x|| < r``, where ``B_k`` is the region ``details.region``
    names and ``B(x, r)`` lies inside ``B_k``; hence ``G(x') = c`` on that
    ball now and after any later allocation. A radius-0 certificate says
    ``G(x) = c`` (the input owns or lies in region ``B_k``).

    Why the certificates carry that probability, and which samples are
    reused. Noise levels come from the sigma search's own samples, and
    every sampling pass draws fresh noise (stages ``(1, t)`` and ``(2, t)``
    with ``t`` counting calls on the store, so no call reuses the noise
    that shaped stored regions). All inputs are certified in one packed
    first pass: at the region's sigma if they lie in a stored region (that
    is known before sampling), else at their searched sigma. An input found
    inside a ball opened earlier in the same call needs a certificate at
    that ball's sigma; it is never given the ball owner's certificate: the
    owner's samples decided the ball's radius and so whether the input is
    inside, and borrowing them would let one lucky draw certify many
    inputs. Such inputs are certified together in one second pass, except
    those whose first pass already used the same sigma, which keep it.
    Inputs that join a ball open none, so one second pass is always enough.

    With ``order="given"`` whether an input joins an earlier ball depends
    only on the samples of the inputs before it, so keeping or replacing its
    first certificate is decided independently of that certificate and each
    input's reported certificate fails with probability at most ``alpha``.
    With a degree order the order depends on each input's own first-pass
    radius; both passes then certify every input outside the stored
    regions at ``alpha / 2`` (union bound over the two certificates it may
    report), exact duplicates of an owner included: they share its noise,
    so the owner's first-pass samples, which choose the pass, are theirs.
    Members of stored regions are certified once, at a sigma known before
    sampling, at the full ``alpha``.

    ``predict`` answers as ``G``: an input in a region is smoothed with the
    region's sigma (Cohen et al.'s PREDICT on ``g(., sigma_k)``), any other
    input with its searched sigma. It does not allocate regions.

    Examples
    --------
    >>> OnlineBallAllocator(order="ascending")
    OnlineBallAllocator(order='ascending')
    """

    _parameter_constraints = {"order": [StrOptions({"given", "ascending", "descending"})]}

    def __init__(self, order="given"):
        self.order = order

    def _allocate(self, regions, X, sigma, certify_fn):
        layout = CallLayout(regions, X, sigma, regions.count_call())
        owner = layout.owner
        share = np.ones(len(X))
        if self.order != "given":
            # The order depends on the owners' own first-pass radii, so the
            # pass an owner (and each exact duplicate, which shares its
            # noise) reports is chosen with its own samples: union bound.
            share[layout.free] = 0.5
        first = layout.certify_first(certify_fn, share)
        radius_first = certified_radius(layout.sigma_first, first.p_lower)

        # Balls of the inputs that may open regions, capped by stored regions (Eq. 8).
        upper, i, j, distance = layout.owner_balls(regions, radius_first)
        order = allocation_order(len(owner), i, j, self.order)
        ball, host, host_distance = allocate_in_order(adjacency(len(owner), i, j, distance), upper, order)

        # Regions of the owners that opened one, in input order.
        opened = host < 0
        region_of_owner = np.full(len(owner), -1, dtype=np.int64)
        opener = owner[opened]
        region_of_owner[opened] = regions.append(
            X, ball[opened], layout.sigma_first[opener], first.prediction[opener], first.p_lower[opener],
            rows=opener)

        # Every input's region and its room in it (Eq. 6's distance to the
        # boundary; an opener's room is its ball): members keep their stored
        # region, owners that joined a ball take the host's, duplicates their
        # representative's.
        host_slot = np.where(opened, np.arange(len(owner)), host)
        owner_room = np.where(opened, ball, room_inside(host_distance, ball[np.maximum(host, 0)]))
        region = layout.spread(region_of_owner[host_slot], layout.stored_host)
        room = layout.spread(owner_room, layout.member_room())

        # Second pass, batched: inputs whose region's sigma differs from the
        # sigma of their first pass (openers and members never do).
        sigma_needed = regions.sigmas[region]
        again = np.flatnonzero(sigma_needed != layout.sigma_first)
        second = certify_rows(certify_fn, again, sigma_needed[again], (SECOND_PASS, layout.call), share[again])
        prediction, p_lower = first.prediction.copy(), first.p_lower.copy()
        n_samples = first.n_samples.copy()
        prediction[again] = second.prediction
        p_lower[again] = second.p_lower
        n_samples[again] += second.n_samples
        certified = radius_first.copy()
        certified[again] = certified_radius(sigma_needed[again], second.p_lower)
        radius = np.minimum(certified, room)  # Eq. 6 (for an opener: its ball, already <= R)
        return Certificates(prediction, radius, sigma_needed, p_lower, n_samples, region=region)
