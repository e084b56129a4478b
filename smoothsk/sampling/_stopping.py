"""When sequential certification stops sampling an input: rules (a) and (b) of ``SequentialSampler``.

The rules only decide when to stop; the certificate's validity comes from
the confidence sequence, which holds at any stopping time
(``docs/sequential.md``). The alpha-spending strategies use the same rules to
predict where an input will stop.
"""

from dataclasses import dataclass

import numpy as np

from ..statistics import certified_radius
from ._input_specific import _min_sample_size, _radius_per_sigma

# Points of the confidence interval on which the decline rule (b) is checked: the value the sampler was
# written with (benchmarks/bench_sequential.py measures the decline it gives).
_DECLINE_GRID = 9


@dataclass(frozen=True)
class StoppingRule:
    """Rule (a), robust or not at ``radius``, or rule (b), the radius decline against ``n_max`` samples.

    Attributes
    ----------
    n_max : int
        Largest number of estimation samples; the reference radius is the
        Clopper-Pearson radius at this size (ISS Def. 1).
    decline : float
        Allowed decline of rule (b): radius units (``"absolute"``) or a
        fraction of the reference radius (``"relative"``).
    decline_type : {"absolute", "relative"}
    radius : float or None
        Rule (a)'s radius; None for rule (b).
    """

    n_max: int
    decline: float
    decline_type: str
    radius: float | None = None

    def reference_radius(self, p, sigma, alpha):
        """Clopper-Pearson radius at ``n_max`` samples and frequency ``p`` (ISS Def. 1).

        Parameters
        ----------
        p, sigma : ndarray of float, one shape
            Frequencies of the candidate, and the noise level at each.
        alpha : float
            Level of the bound.

        Returns
        -------
        radius : ndarray of float, the shape of ``p``
        """
        p = np.clip(p, 0.0, 1.0)
        return sigma * _radius_per_sigma(np.full(p.shape, int(self.n_max)), p, alpha)

    def required_radius(self, reference, margin=0.0):
        """Smallest radius within the allowed decline of ``reference`` (rule (b)), less a share ``margin`` of it.

        Parameters
        ----------
        reference : ndarray of float, any shape
            Reference radii.
        margin : float, default=0.0
            Share of the decline kept in reserve.

        Returns
        -------
        radius : ndarray of float, the shape of ``reference``
            Negative or zero where rule (b) asks no radius.
        """
        decline = (1.0 - margin) * self.decline
        if self.decline_type == "absolute":
            return reference - decline
        return (1.0 - decline) * reference

    def target_radius(self, p, sigma, reference_alpha):
        """Radius an input whose candidate has frequency ``p`` must reach to stop: ``radius``, or rule (b)'s.

        Parameters
        ----------
        p, sigma : ndarray of float, shape (n_points,)
            Frequencies of the candidate, and the noise level at each.
        reference_alpha : float
            Level of the reference radius at ``n_max`` (rule (b)).

        Returns
        -------
        radius : ndarray of float, shape (n_points,)
        """
        if self.radius is not None:
            return np.full(len(sigma), float(self.radius))
        return self.required_radius(self.reference_radius(p, sigma, reference_alpha))

    def fixed_size(self, p, sigma, level, reference_alpha):
        """Smallest size whose Clopper-Pearson bound at ``level``, from a count at frequency ``p``, stops an input.

        Parameters
        ----------
        p, sigma : ndarray of float, shape (n_points,)
            Frequencies of the candidate, and the noise level at each.
        level : float
            Level of the bound.
        reference_alpha : float
            Level of the reference radius at ``n_max`` (rule (b)).

        Returns
        -------
        size : ndarray of int64, shape (n_points,)
            In ``1 .. n_max``: where the bound certifies ``radius`` (rule (a))
            or the radius rule (b) requires; 1 where rule (b) requires no
            radius, ``n_max`` where no size suffices.
        """
        target = self.target_radius(p, sigma, reference_alpha)
        size = np.ones(len(sigma), dtype=np.int64)
        positive = target > 0
        size[positive] = _min_sample_size(p[positive], target[positive] / sigma[positive], int(self.n_max), level)
        return size

    def decided(self, low, high, certify_at, sigma, alpha, current_lower):
        """Rules (a) and (b) for inputs whose probability lies in ``[low, high]``.

        Rule (a): the bound reported now certifies ``radius``, or even the
        reference radius at ``high`` does not. Rule (b): at every point of a
        grid over ``[low, high]``, the radius certified from a count at that
        frequency is within the allowed decline of the reference radius there.

        Parameters
        ----------
        low, high : ndarray of float, shape (n_rows,)
            Confidence interval on the candidate's probability.
        certify_at : callable
            ``certify_at(p)`` maps frequencies, shape (n_rows, n_points), to the
            lower bound the sampler would report now from a count at that
            frequency (0 before any estimation sample).
        sigma : ndarray of float, shape (n_rows,)
            Noise level per row.
        alpha : float
            Failure probability of each certificate (the reference radius's level).
        current_lower : ndarray of float, shape (n_rows,)
            The bound reported now.

        Returns
        -------
        stop : ndarray of bool, shape (n_rows,)
        """
        if self.radius is not None:
            robust = certified_radius(sigma, current_lower) >= self.radius
            hopeless = self.reference_radius(high, sigma, alpha) < self.radius
            return robust | hopeless
        grid = low[:, None] + (high - low)[:, None] * np.linspace(0.0, 1.0, _DECLINE_GRID)
        sigma_grid = np.broadcast_to(sigma[:, None], grid.shape)
        required = self.required_radius(self.reference_radius(grid, sigma_grid, alpha))
        reached = certified_radius(sigma_grid, certify_at(grid))
        return np.all(reached >= required - 1e-12, axis=1)
