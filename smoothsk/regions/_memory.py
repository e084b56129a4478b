"""DDRS's memory-based certification: differently-predicted regions never meet (Alg. 3)."""

import numpy as np

from .._stages import FIRST_PASS, SECOND_PASS
from ..certificates import ABSTAIN, Certificates
from ..statistics import certified_radius
from ._base import RegionAllocator
from ._geometry import adjacency, ball_pairs, overlap_graph
from ._layout import CallGeometry, CallLayout, certify_rows, room_inside, room_outside, take


def _adjust(candidates, prediction, radius):
    """DDRS Alg. 3 for one input against the regions that may meet its ball.

    Parameters
    ----------
    candidates : tuple of ndarray (distance, radius, prediction)
        Regions that may contain the input or meet its ball: distance from
        the input to their centre, their radius and class.
    prediction : int
        The input's Monte Carlo class (``ABSTAIN`` counts as a class).
    radius : float
        Its Monte Carlo radius.

    Returns
    -------
    adopted : int
        Position in ``candidates`` of the region whose class the input
        adopts, -1 if it keeps its own.
    radius : float
        The input's new radius.
    """
    distance, region_radius, region_prediction = candidates
    other = region_prediction != prediction
    within = np.flatnonzero(other & (distance < region_radius))
    if len(within):  # LargestInSubset: the deepest sub-ball of a containing region
        room = room_inside(distance[within], region_radius[within])
        return within[np.argmax(room)], float(room.max())
    if np.any(other):  # LargestOutSubset: clear of every other-class region
        radius = min(radius, float(room_outside(distance[other], region_radius[other]).min()))
    return -1, radius


class MemoryAllocator(RegionAllocator):
    """Memory of certified balls in which differently-predicted regions never meet (DDRS Alg. 3).

    Every certified input is remembered as a region (its ball, class and
    sigma). Inputs are processed in the given order; each is certified at
    its searched sigma (class ``c``, radius ``R``), then, against the memory:

    - if it lies in a remembered region of another class, it takes that
      region's class and sigma (``LargestInSubset``; the deepest such region
      if several) and is certified again, with fresh samples, at that sigma:
      if its own class there is the region's, its radius is the smaller of
      that certificate's radius and the largest ball around it inside the
      region; otherwise it abstains (and adds no region);
    - otherwise its radius shrinks to the largest ball, at most ``R``, that
      meets no region of another class (``LargestOutSubset``);

    and it is added to the memory. Regions of the same class may overlap.
    An input identical to a remembered centre gets the remembered answer
    without sampling. ``ABSTAIN`` is treated as a class (an input that
    abstains at its own sigma is remembered as the point region of its
    centre), so a later region never covers such an abstention; an input
    that abstains after taking a region's class adds no region, and a later
    region may cover it.

    Notes
    -----
    The classifier (stateful memory classifier ``G``): an input that lies
    in a remembered region (its centre included) gets that region's class
    (all remembered regions that contain a point have one class, see the
    invariant); any other input gets the Monte Carlo class at its searched
    sigma ``sigma(x)``. ``certify`` answers as ``G`` (or abstains) and then
    remembers the input's region; ``predict`` answers as ``G`` with the
    current memory (Cohen et al.'s PREDICT at ``sigma(x)`` outside the
    regions) and remembers nothing. ``predict_proba`` gives the Monte Carlo
    frequencies only, not ``G``.

    Invariant: regions of different classes never meet. Hence, for every
    certified input with class ``c`` and radius ``r``:

    1. (consistency, with probability one) every later answer of ``G`` at a
       point of ``B(x, r)``, by ``certify`` or ``predict``, is ``c``, and no
       earlier remembered answer of another class (an earlier ``certify``'s,
       except an abstention after taking a region's class) lies in
       ``B(x, r)``; ``predict`` remembers nothing, so an earlier ``predict``
       answer in ``B(x, r)`` may differ from ``c``. This holds by
       construction, whatever the Monte Carlo outcomes (DDRS App. C: it
       would hold for any radii).
    2. (link to the smoothed classifier, with probability at least
       ``1 - alpha``) ``g(x', sigma) = c`` for all ``||x' - x|| < r``, with
       ``sigma = details.sigma``. The statement is the input's own
       certificate: the first pass at ``sigma(x)`` if it kept its class
       (``r <= R``), the second pass at the taken region's sigma if it took
       a region's class (``details.p_lower`` is that certificate's). Another
       region only chooses the sigma and caps the radius; its certificate
       is never reported for this input, so a failed region certificate
       does not propagate to the inputs that take its class.

    Why ``1 - alpha``: an input reports at most one of its two
    certificates, each at ``alpha / 2`` (stages ``(1, t)`` and ``(2, t)``,
    ``t`` counting calls on the store, so every pass draws fresh noise).
    Its own first-pass samples (and earlier inputs') choose which; the
    second pass's sigma is fixed before its samples are drawn. By the union
    bound the reported statement fails with probability at most ``alpha``.
    An abstention states nothing about ``g``: ``details.region`` then names
    the region it lies in (``G`` answers that region's class there, by
    construction only), ``details.p_lower`` is 0.

    The one remaining dependence: an input identical to a remembered centre
    (or to an earlier input of the same call) reports that centre's
    certificate again; it draws no samples and chooses nothing, so the
    statement, about that very point, still fails with probability at most
    ``alpha``. The store records the ``alpha`` it was made at and is
    refused at another one (:class:`~smoothsk.regions.RegionStore`).

    Examples
    --------
    >>> MemoryAllocator()
    MemoryAllocator()
    """

    def predict_override(self, regions, X, prediction):
        """``G``: the class of the remembered region an input lies in, else ``prediction``.

        ``prediction`` is Cohen et al.'s PREDICT at the searched sigma;
        ``ABSTAIN`` counts as a class, as in the allocation. Arguments and
        result as in :meth:`BaseAllocator.predict_override`.
        """
        if len(regions) == 0:
            return prediction
        host, _ = CallGeometry(regions, X).locate()
        return np.where(host >= 0, regions.predictions[np.maximum(host, 0)], prediction)

    def assign_sigma(self, regions, X, sigma):
        """The searched sigma: outside the regions ``G`` is the Monte Carlo class at ``sigma(x)``."""
        return np.asarray(sigma, dtype=np.float64)

    def _allocate(self, regions, X, sigma, certify_fn):
        # Inputs identical to a remembered centre (members) get the remembered answer.
        layout = CallLayout(regions, X, sigma, regions.count_call(), members="centres")
        owner, geometry = layout.owner, layout.geometry

        # Union bound (each input's statement fails with probability <= alpha):
        # an input reports at most one of two certificates, each at alpha / 2:
        # its first pass (stage (1, t)) at its searched sigma, if it keeps its
        # class; or a second pass (stage (2, t), fresh samples) at the sigma of
        # the region whose class it takes. The first-pass samples (its own and
        # earlier inputs') choose which; the second pass's sigma is fixed
        # before its samples are drawn, so given that choice it holds with
        # probability >= 1 - alpha / 2. Abstaining states nothing and never fails.
        first = certify_rows(certify_fn, owner, sigma[owner], (FIRST_PASS, layout.call), np.full(len(owner), 0.5))
        uncapped = certified_radius(sigma[owner], first.p_lower)
        prediction = first.prediction.copy()
        new_sigma = sigma[owner].copy()
        p_lower = first.p_lower.copy()
        radius = uncapped.copy()
        # The region an owner takes the class of: stored (index) or opened earlier in this call (owner slot).
        host_stored = np.full(len(owner), -1, dtype=np.int64)
        host_owner = np.full(len(owner), -1, dtype=np.int64)

        # Regions that may meet an owner's ball: remembered ones, and earlier
        # owners of this call whose uncapped balls overlap it. An owner that
        # adopted a class lies, ball and all, in the region it adopted from,
        # so only owners that kept their class need checking.
        owners = geometry.inputs.take(owner)
        sa, sb, sd = ball_pairs(owners, uncapped, geometry.centres, regions.radii, strict=True)
        s_ptr = np.searchsorted(sa, np.arange(len(owner) + 1))
        i, j, d = overlap_graph(owners, uncapped)
        c_ptr, c_idx, c_dist = adjacency(len(owner), i, j, d)
        kept = np.ones(len(owner), dtype=bool)
        for v in np.flatnonzero((s_ptr[1:] > s_ptr[:-1]) | (c_ptr[1:] > c_ptr[:-1])):
            stored = sb[s_ptr[v]:s_ptr[v + 1]]
            earlier = c_idx[c_ptr[v]:c_ptr[v + 1]]
            pick = (earlier < v) & kept[earlier]
            earlier, earlier_distance = earlier[pick], c_dist[c_ptr[v]:c_ptr[v + 1]][pick]
            candidates = (np.concatenate([sd[s_ptr[v]:s_ptr[v + 1]], earlier_distance]),
                          np.concatenate([regions.radii[stored], radius[earlier]]),
                          np.concatenate([regions.predictions[stored], prediction[earlier]]))
            adopted, radius[v] = _adjust(candidates, prediction[v], uncapped[v])
            if adopted >= len(stored):  # a region opened earlier in this call
                kept[v] = False
                host_owner[v] = u = earlier[adopted - len(stored)]
                prediction[v], new_sigma[v] = prediction[u], new_sigma[u]
            elif adopted >= 0:  # a remembered region
                kept[v] = False
                host_stored[v] = k = stored[adopted]
                prediction[v], new_sigma[v] = regions.predictions[k], regions.sigmas[k]

        # An owner that took a region's class (radius[v] is its room in that
        # region) gets its own certificate at the region's sigma: it reports
        # min(own radius, room) if its own class is the region's, else it abstains.
        adopter = np.flatnonzero(~kept)
        second = certify_rows(certify_fn, owner[adopter], new_sigma[adopter], (SECOND_PASS, layout.call),
                              np.full(len(adopter), 0.5))
        agrees = second.prediction == prediction[adopter]
        radius[adopter] = np.where(agrees, np.minimum(certified_radius(new_sigma[adopter], second.p_lower),
                                                      radius[adopter]), 0.0)
        p_lower[adopter] = np.where(agrees, second.p_lower, 0.0)
        n_samples = first.n_samples.copy()
        n_samples[adopter] += second.n_samples

        # Every owner with a certified class (or its own abstention) is
        # remembered; an adopter that abstains adds nothing: it lies in its
        # host region, whose class G already answers there.
        abstains = adopter[~agrees]
        remembers = np.ones(len(owner), dtype=bool)
        remembers[abstains] = False
        region_of_owner = np.full(len(owner), -1, dtype=np.int64)
        region_of_owner[remembers] = regions.append(
            X, radius[remembers], new_sigma[remembers], prediction[remembers], p_lower[remembers],
            rows=owner[remembers])
        region_of_owner[abstains] = np.where(host_stored[abstains] >= 0, host_stored[abstains],
                                             region_of_owner[np.maximum(host_owner[abstains], 0)])
        prediction[abstains] = ABSTAIN

        # Members report their remembered certificate, duplicates their owner's
        # (without samples of their own: they drew none).
        host = layout.stored_host
        region = layout.spread(region_of_owner, host)
        n_samples_per_input = np.zeros(len(X), dtype=np.int64)
        n_samples_per_input[owner] = n_samples
        return Certificates(layout.spread(prediction, take(regions.predictions, host, ABSTAIN)),
                            layout.spread(radius, take(regions.radii, host, 0.0)),
                            layout.spread(new_sigma, take(regions.sigmas, host, 0.0)),
                            layout.spread(p_lower, take(regions.p_lowers, host, 0.0)),
                            n_samples_per_input, region=region)
