"""Exact search for pairs of L2 balls that meet, fast in high dimension.

Region allocators ask one question many times: which balls ``B(a_i, r_i)``
of one set come within reach of which balls ``B(b_j, s_j)`` of another,
``||a_i - b_j|| <= r_i + s_j``? Comparing every pair costs ``n^2 d`` and is
out of reach for 30,000 balls in 3,072 dimensions. Instead:

1. Every point is projected onto ``k`` orthonormal directions (the leading
   principal directions of a sample of the points). An orthonormal projection
   ``P`` never lengthens a vector, ``||P(a - b)|| <= ||a - b||``, so a pair
   that meets in the full space also meets in the projection: filtering in
   the projection loses no pair, whatever directions are chosen (good
   directions only make the filter sharper).
2. The few projected coordinates along which the two sets spread most go
   into k-d trees (scipy's ``cKDTree``), one per band of radii ``s_j``
   (radii within a factor of two), and each ``a_i`` is queried with radius
   ``r_i + max band radius``: low-dimensional trees stay fast.
3. The candidates are filtered again with all ``k`` projected coordinates,
   and the survivors get their exact distance in float64.

The result is exact; its cost is ``O(n d k)`` for the projection plus the
tree queries plus ``d`` per candidate pair, small when the data have few
dominant directions (images do) and the radii are small compared with the
spread of the data.
"""

import itertools

import numpy as np
from scipy.spatial import cKDTree
from sklearn.utils.extmath import randomized_svd

__all__ = ["PointSet", "Projection", "adjacency", "ball_pairs", "exact_distances", "overlap_graph"]

#: Directions kept by the projection filter.
N_COMPONENTS = 32
#: Projected coordinates the k-d trees are built on (trees slow down with dimension).
_TREE_DIMS = 8
#: Rows the projection's directions are estimated from.
_FIT_ROWS = 1024
#: Rows converted to float64 at once (bounds temporary memory).
_CHUNK = 2048
#: Radius bands per tree are ``(top / 2^(t+1), top / 2^t]`` for t < _BANDS - 1.
_BANDS = 8


class Projection:
    """Orthonormal projection used to filter candidate pairs.

    Parameters
    ----------
    mean : ndarray of float64, shape (n_features,)
        Subtracted before projecting (keeps the projected values small).
    components : ndarray of float64, shape (n_components, n_features) or None
        Orthonormal rows; None means the identity (few features).
    """

    def __init__(self, mean, components):
        self.mean = mean
        self.components = components

    @classmethod
    def fit(cls, *row_sets, n_components=N_COMPONENTS, seed=0):
        """Leading principal directions of a sample of the rows of ``row_sets``.

        Parameters
        ----------
        *row_sets : ndarray of float, shape (n_rows_i, n_features)
            Point sets the projection will filter (inputs, stored centres).
        n_components : int, default=N_COMPONENTS
        seed : int, default=0
            Seeds the row sample and the randomized SVD (the filter is exact
            for any seed; only its sharpness depends on the directions).

        Returns
        -------
        Projection
        """
        n_features = row_sets[0].shape[1]
        sizes = np.array([len(rows) for rows in row_sets])
        n_rows = int(sizes.sum())
        if n_features <= n_components or n_rows < 2:
            return cls(np.zeros(n_features), None)
        rng = np.random.default_rng(seed)
        picked = np.sort(rng.choice(n_rows, min(n_rows, _FIT_ROWS), replace=False))
        which = np.searchsorted(np.cumsum(sizes), picked, side="right")
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        sample = np.concatenate([row_sets[s][picked[which == s] - offsets[s]] for s in range(len(row_sets))])
        sample = sample.astype(np.float64)
        mean = sample.mean(axis=0)
        sample -= mean
        # Two power iterations: the directions need only be roughly principal.
        _, _, components = randomized_svd(sample, min(n_components, len(sample)), n_iter=2,
                                          power_iteration_normalizer="QR", random_state=seed)
        # Re-orthonormalise so that ||P v|| <= ||v|| holds up to rounding.
        components = np.linalg.qr(components.T)[0].T
        return cls(mean, components)

    def transform(self, points):
        """Projected coordinates, and a bound on their rounding error.

        The product is computed in float32. Each projected row is then off
        by at most ``(sqrt(k) + 1) * n_features * 2^-24 * ||x - mean||`` (the
        worst-case error of ``k`` float32 dot products of length
        ``n_features``, plus the centring; a fixed shift cancels in
        differences), which :func:`ball_pairs` adds to its search radii.

        Parameters
        ----------
        points : ndarray of float, shape (n_points, n_features)

        Returns
        -------
        projected : ndarray of float64, shape (n_points, n_components)
        rounding : float
            Bound on the error of any projected row (a distance between two
            rows is off by at most twice this).
        """
        if self.components is None:
            return np.asarray(points, dtype=np.float64) - self.mean, 0.0
        components = self.components.T.astype(np.float32)
        mean = self.mean.astype(np.float32)
        projected = np.empty((len(points), len(self.components)))
        largest = 0.0
        for start in range(0, len(points), _CHUNK):
            block = points[start:start + _CHUNK] - mean
            projected[start:start + _CHUNK] = block @ components
            largest = max(largest, float(np.sqrt(np.einsum("ij,ij->i", block, block).max())))
        # 1.01 covers the rounding of the float32 norm itself
        factor = (np.sqrt(len(self.components)) + 1.0) * len(self.mean) * 2.0 ** -24
        return projected, 1.01 * factor * largest

class PointSet:
    """Rows of a point array with their projected coordinates.

    Parameters
    ----------
    points : ndarray of float, shape (n_all, n_features)
        The full array (never copied).
    projected : ndarray of float64, shape (n_points, n_components)
        Projected coordinates of the selected rows.
    index : ndarray of int, shape (n_points,)
        Rows of ``points`` this set holds.
    rounding : float
        Bound on the rounding error of a projected row.
    """

    def __init__(self, points, projected, index, rounding):
        self.points = points
        self.projected = projected
        self.index = index
        self.rounding = rounding

    @classmethod
    def project(cls, points, projection):
        """All rows of ``points``, projected with ``projection``."""
        projected, rounding = projection.transform(points)
        return cls(points, projected, np.arange(len(points)), rounding)

    def take(self, rows):
        """The subset ``rows`` (positions in this set)."""
        return PointSet(self.points, self.projected[rows], self.index[rows], self.rounding)

    def __len__(self):
        return len(self.index)


def exact_distances(a_points, ia, b_points, ib):
    """Euclidean distances ``||a_points[ia] - b_points[ib]||`` in float64.

    Parameters
    ----------
    a_points, b_points : ndarray of float, shape (n_a, n_features), (n_b, n_features)
    ia, ib : ndarray of int, shape (n_pairs,)

    Returns
    -------
    distance : ndarray of float64, shape (n_pairs,)
    """
    distance = np.empty(len(ia))
    for start in range(0, len(ia), _CHUNK):
        stop = start + _CHUNK
        diff = np.subtract(a_points[ia[start:stop]], b_points[ib[start:stop]], dtype=np.float64)
        distance[start:stop] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    return distance


def _bands(radii):
    """Split indices of ``radii`` into bands of radii within a factor of two."""
    top = float(radii.max()) if len(radii) else 0.0
    if top <= 0.0:
        return [np.arange(len(radii))]
    level = np.floor(np.log2(top / np.maximum(radii, top * 2.0 ** -_BANDS)))
    level = np.minimum(level, _BANDS - 1).astype(np.int64)
    return [np.flatnonzero(level == t) for t in range(_BANDS) if np.any(level == t)]


def _candidates(a, a_radii, b, b_radii, slack):
    """Pairs whose balls meet in the leading projected coordinates (a superset of the answer)."""
    # The trees use the projected coordinates along which these two sets spread most.
    spread = np.concatenate([a.projected, b.projected]).var(axis=0)
    dims = np.sort(np.argsort(-spread, kind="stable")[:_TREE_DIMS])
    queries = np.ascontiguousarray(a.projected[:, dims])
    ia_parts, ib_parts = [], []
    for band in _bands(b_radii):
        tree = cKDTree(b.projected[np.ix_(band, dims)])
        reach = (a_radii + b_radii[band].max()) * (1.0 + 1e-9) + slack
        found = tree.query_ball_point(queries, r=reach, return_sorted=False)
        counts = np.fromiter(map(len, found), dtype=np.int64, count=len(found))
        if counts.sum():
            ia_parts.append(np.repeat(np.arange(len(a)), counts))
            ib_parts.append(band[np.fromiter(itertools.chain.from_iterable(found), dtype=np.int64,
                                             count=int(counts.sum()))])
    if not ia_parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(ia_parts), np.concatenate(ib_parts)


def ball_pairs(a, a_radii, b, b_radii, strict):
    """All pairs of balls of ``a`` and ``b`` that meet.

    Parameters
    ----------
    a, b : PointSet
        Centres (projected with the same :class:`Projection`). When both
        hold rows of the same array, each pair of rows is reported once,
        with ``a``'s row first in that array, and a row is never paired with
        itself.
    a_radii : ndarray of float, shape (len(a),)
    b_radii : ndarray of float, shape (len(b),)
        Non-negative radii.
    strict : bool
        Keep pairs with ``distance < a_radii[i] + b_radii[j]`` (open balls
        overlap) if True, ``<=`` if False (closed balls touch; with zero
        radii this finds identical points).

    Returns
    -------
    ia, ib : ndarray of int64, shape (n_pairs,)
        Positions in ``a`` and ``b``, sorted by ``ia`` then ``ib``.
    distance : ndarray of float64, shape (n_pairs,)
        Exact distance of each pair.
    """
    a_radii = np.asarray(a_radii, dtype=np.float64)
    b_radii = np.asarray(b_radii, dtype=np.float64)
    empty = np.zeros(0, dtype=np.int64)
    if len(a) == 0 or len(b) == 0:
        return empty, empty, np.zeros(0)
    slack = a.rounding + b.rounding
    ia, ib = _candidates(a, a_radii, b, b_radii, slack)
    if a.points is b.points:
        keep = a.index[ia] < b.index[ib]
        ia, ib = ia[keep], ib[keep]
    # Second filter: all projected coordinates (still a contraction).
    reach = (a_radii[ia] + b_radii[ib]) * (1.0 + 1e-9) + slack
    gap = a.projected[ia] - b.projected[ib]
    keep = np.einsum("ij,ij->i", gap, gap) <= reach * reach
    ia, ib = ia[keep], ib[keep]
    order = np.lexsort((ib, ia))
    ia, ib = ia[order], ib[order]
    distance = exact_distances(a.points, a.index[ia], b.points, b.index[ib])
    reach = a_radii[ia] + b_radii[ib]
    keep = distance < reach if strict else distance <= reach
    return ia[keep], ib[keep], distance[keep]


def overlap_graph(points, radii):
    """Edges between balls of one set whose open balls overlap.

    Parameters
    ----------
    points : PointSet
    radii : ndarray of float, shape (len(points),)

    Returns
    -------
    i, j : ndarray of int64, shape (n_edges,)
        Positions in ``points``, ``i < j``.
    distance : ndarray of float64, shape (n_edges,)
    """
    return ball_pairs(points, radii, points, radii, strict=True)


def adjacency(n_nodes, i, j, distance):
    """Symmetric compressed adjacency lists of an undirected graph.

    Parameters
    ----------
    n_nodes : int
    i, j : ndarray of int, shape (n_edges,)
    distance : ndarray of float, shape (n_edges,)

    Returns
    -------
    indptr : ndarray of int64, shape (n_nodes + 1,)
        Neighbours of node ``v`` are ``indices[indptr[v]:indptr[v + 1]]``.
    indices : ndarray of int64, shape (2 * n_edges,)
    distances : ndarray of float64, shape (2 * n_edges,)
        Distance to each listed neighbour.
    """
    source = np.concatenate([i, j])
    target = np.concatenate([j, i])
    order = np.lexsort((target, source))
    indptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(source, minlength=n_nodes), out=indptr[1:])
    return indptr, target[order], np.concatenate([distance, distance])[order]
