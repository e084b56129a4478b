"""Súkeník et al.'s r-semi-elastic sigma function and the radius of ``G`` it certifies.

Súkeník, Kuvshinov, Günnemann (ICML 2022), "Intriguing properties of
input-dependent randomized smoothing": a sigma function is *r-semi-elastic*
when ``log sigma`` is r-Lipschitz,
``|log sigma(x) - log sigma(x')| <= r ||x - x'||``; then the sample-wise
classifier ``G(x) = g(x, sigma(x))`` has a certified radius computable from
the classifier's bound at ``sigma(x)`` alone, which shrinks with the input
dimension (their curse of dimensionality). Their design of such a function:
``sigma(x) = base_sigma * exp(r * (mean distance from x to its k nearest
training inputs - offset))``, here clipped to a finite positive range,
which keeps it r-semi-elastic (:class:`SemiElasticSigma`).

Derivation of the radius (:func:`semi_elastic_radius`)
-----------------------------------------------------
Fix ``x0`` with ``s0 = sigma(x0)``, the base classifier ``f`` and its top
class ``c`` at ``x0``, with ``P(f(x0 + s0 e) = c) >= p`` (``e ~ N(0, I_d)``).
Let ``x1 = x0 + R v`` (``||v|| = 1``) and ``s1 = sigma(x1)``; semi-elasticity
gives ``q = s1 / s0`` in ``[exp(-r R), exp(r R)]``. In units of ``s0``
(``w = (z - x0) / s0``, ``u = R / s0``, ``eps = r s0``), ``P0 = N(0, I)``
and ``P1 = N(u v, q^2 I)`` are the laws of the noisy input at ``x0`` and
``x1``; ``A = {w : f(x0 + s0 w) = c}`` has ``P0(A) >= p``, and ``G(x1) = c``
as soon as ``P1(A) > 1/2`` (every other class then has less than 1/2).

1. Two worst cases in closed form (Neyman-Pearson, as in Cohen et al.'s
   Theorem 1):

   - *Shift* at a common variance ``s^2``: ``Q(A) >= p'`` for ``Q = N(m, s^2 I)``
     gives ``N(m + u v, s^2 I)(A) >= Phi(PhiInv(p') - u / s)`` (Cohen).
   - *Variance* at a common centre ``m``: ``Q(A) >= p'`` for ``Q = N(m, I)``
     gives ``N(m, q^2 I)(A) >= V(p', q)``, where the likelihood ratio is a
     monotone function of ``||w - m||^2`` (chi-square with ``d`` degrees of
     freedom, cdf ``F``), so the worst set is a ball about ``m`` for
     ``q > 1``, ``V = F(F^-1(p') / q^2)``, and the outside of one for
     ``q < 1``, ``V = 1 - F(F^-1(1 - p') / q^2)``; ``V(p', 1) = p'``.
     The same holds with ``N(m, I)`` replaced by ``N(m, s^2 I)`` and ``q``
     by the ratio of the two scales.

2. Chaining them along two paths from ``P0`` to ``P1`` bounds ``P1(A)``
   from below (each step holds for every set ``A``, and each bound is
   non-decreasing in the probability it starts from):

   - shift, then variance: ``P0 -> N(u v, I) -> P1``:
     ``b1 = V(Phi(PhiInv(p) - u), q)``;
   - variance, then shift at scale ``q``: ``P0 -> N(0, q^2 I) -> P1``:
     ``Phi(PhiInv(V(p, q)) - u / q) >= b2 = Phi(PhiInv(V(p, q)) - u / min(q, 1))``.

   So ``P1(A) >= L(u, q) = max(b1, b2)``, with equality at ``q = 1``
   (Cohen) and at ``u = 0`` (pure variance). The dimension enters through
   ``V``: ``||w||^2`` concentrates at ``d``, and a variance ratio ``q`` moves
   it by ``(q^2 - 1) d``, which the smoothed probability feels unless
   ``eps sqrt(d)`` is small (Súkeník et al.'s curse of dimensionality).
3. The whole ball. ``V(p', q)`` is non-decreasing in ``p'`` and
   non-increasing in ``|log q|`` (``F`` is increasing, and ``t / q^2`` moves
   away from ``t`` as ``|log q|`` grows); ``Phi(PhiInv(p) - u)`` is
   decreasing in ``u``; and ``u / min(q, 1)`` is non-decreasing in ``u``
   and in ``|log q|``. Hence ``b1``, ``b2`` and ``L`` are non-increasing
   in ``u`` and in ``|log q|``. Every point of the open ball has a distance
   ``u' < u`` and a ratio with ``|log q'| <= eps u' <= eps u``, so
   ``P1(A) >= L(u', q') >= L(u, q') >= min(L(u, exp(eps u)), L(u, exp(-eps u)))``:
   if ``L > 1/2`` at both ends of the ratio interval at distance ``u``,
   ``G = c`` on the whole ball of radius ``u s0``. (Both ends are needed:
   ``L`` is not symmetric in ``log q``.) This bound is proven, not
   tight: the exact Neyman-Pearson worst case over ``(u, q)`` jointly
   (noncentral chi-square) is larger, but that its minimum over the ball
   lies at the two ends of the ratio interval at distance ``u`` was only
   checked numerically, so it is not used. tests/test_sigma_semi_elastic.py
   checks the certificate against that exact worst case computed by an
   independent quadrature, and against ``G`` evaluated exactly on a
   closed-form model.
4. The condition is monotone in ``u`` (step 3), so the certified distances
   form an interval and the radius is found per input by vectorised
   bisection on ``u`` in ``[0, PhiInv(p)]`` (Cohen's radius bounds it);
   the returned value is the bracket's certified end. ``r = 0`` gives
   Cohen's radius exactly, and a larger ``r`` widens the ratio interval,
   so the radius is non-increasing in ``r``.
"""

from numbers import Integral, Real

import numpy as np
import torch
from scipy import stats
from sklearn.neighbors import NearestNeighbors

from .._constraints import Interval
from ..certificates import SEMI_ELASTIC_GUARANTEE
from ..statistics import abstains, certified_radius, check_noise_levels, check_probability
from ._base import BaseCertifiedSigma, CertifiedSigmaResult

__all__ = ["SemiElasticSigma", "semi_elastic_radius"]

#: Least and greatest sigma of :class:`SemiElasticSigma`: the smallest normal float32 and the square root of
#: the largest float32 (about 1.2e-38 and 1.8e19), so that sigma is positive and finite in float32, and the
#: noise ``sigma * e`` and ``sigma**2`` stay finite in it.
SIGMA_RANGE = (float(np.finfo(np.float32).tiny), float(np.sqrt(np.finfo(np.float32).max)))


def _variance_worst_case(p, ratio, n_features):
    """``V(p, q)``: the least ``N(m, q^2 I)(A)`` over sets with ``N(m, I)(A) >= p`` (step 1 of the module docstring).

    Parameters
    ----------
    p : ndarray of float, shape (n,)
        Probability of the set under ``N(m, I)``.
    ratio : ndarray of float, shape (n,)
        ``q``, the ratio of the two noise scales, > 0.
    n_features : int
        Input dimension ``d``.

    Returns
    -------
    ndarray of float, shape (n,)
    """
    chi2 = stats.chi2(n_features)
    grows = chi2.cdf(chi2.ppf(p) / ratio**2)  # q > 1: a ball about the common centre
    shrinks = chi2.sf(chi2.isf(p) / ratio**2)  # q < 1: the outside of a ball
    return np.where(ratio > 1, grows, np.where(ratio < 1, shrinks, p))


def _worst_case_bound(p, distance, ratio, n_features):
    """``L(u, q)``: a lower bound on ``P1(A)`` over every ``A`` with ``P0(A) >= p`` (step 2 of the module docstring).

    Parameters
    ----------
    p : ndarray of float, shape (n,)
        Lower bound on the top class's probability at ``x0``, > 1/2.
    distance : ndarray of float, shape (n,)
        ``u = ||x1 - x0|| / sigma(x0)``, >= 0.
    ratio : ndarray of float, shape (n,)
        ``q = sigma(x1) / sigma(x0)``, > 0.
    n_features : int
        Input dimension ``d``.

    Returns
    -------
    ndarray of float, shape (n,)
        Non-increasing in ``distance`` and in ``|log ratio|``.
    """
    shift_then_variance = _variance_worst_case(stats.norm.cdf(stats.norm.ppf(p) - distance), ratio, n_features)
    variance_then_shift = stats.norm.cdf(stats.norm.ppf(_variance_worst_case(p, ratio, n_features))
                                         - distance / np.minimum(ratio, 1.0))
    return np.maximum(shift_then_variance, variance_then_shift)


def semi_elastic_radius(sigma, p_lower, r, n_features, rtol=1e-5):
    """Certified L2 radius of ``G(x) = g(x, sigma(x))`` for an r-semi-elastic ``sigma``.

    The certificate is about the sample-wise classifier ``G``: if the top
    class ``c`` of the base classifier under ``N(x, sigma(x)^2 I)`` has
    probability at least ``p_lower``, then ``G(x') = c`` for every ``x'``
    with ``||x' - x|| < radius``, for every sigma function with
    ``|log sigma(x) - log sigma(x')| <= r ||x - x'||`` (Súkeník et al.,
    ICML 2022; derivation in this module's docstring).

    Parameters
    ----------
    sigma : array-like of float, shape (n_inputs,)
        ``sigma(x)`` of each input, > 0.
    p_lower : array-like of float, shape (n_inputs,)
        Lower confidence bound on the top class's probability at ``sigma(x)``.
    r : float
        Semi-elasticity constant of the sigma function, >= 0.
    n_features : int
        Input dimension ``d`` (the number of noisy coordinates).
    rtol : float, default=1e-5
        Bisection stops when the bracket is narrower than ``rtol`` times
        Cohen's radius; the certified (lower) end is returned.

    Returns
    -------
    radius : ndarray of float, shape (n_inputs,)
        0 where ``p_lower <= 1/2``; at most Cohen's ``sigma * PhiInv(p_lower)``,
        equal to it when ``r = 0``.

    Examples
    --------
    >>> float(semi_elastic_radius(0.5, 0.99, 0.0, 64)) == 0.5 * float(stats.norm.ppf(0.99))
    True
    >>> float(semi_elastic_radius(0.5, 0.99, 0.1, 64)) < float(semi_elastic_radius(0.5, 0.99, 0.01, 64))
    True
    """
    sigma, p_lower = np.broadcast_arrays(np.asarray(sigma, dtype=np.float64),
                                         np.asarray(p_lower, dtype=np.float64))
    check_noise_levels(sigma)
    check_probability(p_lower, "p_lower")
    if not (isinstance(r, Real) and np.isfinite(r) and r >= 0):
        raise ValueError(f"r must be finite and >= 0; got {r!r}.")
    if not (isinstance(n_features, Integral) and n_features > 0):
        raise ValueError(f"n_features must be a positive int; got {n_features!r}.")
    if r == 0:  # sigma is constant on every ball: Cohen's radius
        return certified_radius(sigma, p_lower)
    shape = sigma.shape
    sigma, p_lower = sigma.ravel(), p_lower.ravel()
    radius = np.zeros(sigma.shape)
    active = ~abstains(p_lower)
    elasticity = float(r) * sigma[active]
    # p = 1 (not a Clopper-Pearson bound) would make the bracket infinite; the next float below is conservative.
    p = np.minimum(p_lower[active], np.nextafter(1.0, 0.0))
    low = np.zeros(p.shape)  # certified ends (distance 0 is)
    high = stats.norm.ppf(p)  # not certified: Cohen's radius at q = 1
    tolerance = rtol * high
    while True:
        open_ = high - low > tolerance
        if not open_.any():
            break
        middle = 0.5 * (low[open_] + high[open_])
        p_open, e_open = p[open_], elasticity[open_]
        # Both ends of the ratio interval at this distance bound the whole ball (step 3). Where r * sigma * u
        # is huge, the ratio overflows to inf (or underflows to 0) and the bound is its limit 0, a lower bound
        # of its value at every finite ratio: not certified (conservative), with no NaN.
        with np.errstate(over="ignore", divide="ignore"):
            certified = ((_worst_case_bound(p_open, middle, np.exp(e_open * middle), n_features) > 0.5)
                         & (_worst_case_bound(p_open, middle, np.exp(-e_open * middle), n_features) > 0.5))
        low[open_] = np.where(certified, middle, low[open_])
        high[open_] = np.where(certified, high[open_], middle)
    radius[active] = sigma[active] * low
    return radius.reshape(shape)


class SemiElasticSigma(BaseCertifiedSigma):
    """Súkeník et al.'s r-semi-elastic sigma from the distances to the training inputs.

    ``sigma(x) = base_sigma * exp(r * (h(x) - offset))`` with ``h(x)`` the
    mean L2 distance from ``x`` (flattened) to its ``k`` nearest training
    inputs, clipped to :data:`SIGMA_RANGE` (about 1.2e-38 to 1.8e19; the
    exponential alone overflows to ``inf`` once ``r * (h(x) - offset)``
    passes about 709). Each of the k smallest distances to a fixed set is
    1-Lipschitz in ``x``, so ``h`` is, and ``log sigma`` is r-Lipschitz:
    ``sigma`` is r-semi-elastic. Clipping ``log sigma`` to an interval
    keeps it r-Lipschitz (``|clip(a) - clip(b)| <= |a - b|``), so the
    clipped function is r-semi-elastic too, and sigma is finite and > 0
    everywhere. Far from the training data sigma grows (the classifier is
    less sure there anyway; at the clip the radius is typically 0), close
    to it sigma shrinks.

    **Guarantee.** Certificates are about the sample-wise classifier
    ``G(x) = g(x, sigma(x))``, stateless: with probability at least
    ``1 - alpha`` over the classifier's certification samples, ``G``
    predicts the returned class on the open L2 ball of the returned radius,
    where the radius is :func:`semi_elastic_radius` (a radius for
    input-dependent sigma in Súkeník et al.'s setting, proven in this
    module's docstring; it depends on the input dimension and is at most
    Cohen's radius at ``sigma(x)``). ``sigma`` is a deterministic
    function fixed at ``fit`` (the training inputs, and ``offset`` when
    learned), so it spends no alpha (``alpha_share = 0``), draws no samples
    and caps no radius; ``predict`` is Cohen's PREDICT at ``sigma(x)``, which
    returns ``G(x)`` or abstains with probability at least ``1 - alpha``.

    Parameters
    ----------
    base_sigma : float, default=0.25
        Sigma of an input whose neighbour distance equals ``offset``, > 0.
    r : float, default=0.05
        Semi-elasticity, >= 0, in 1 / (input-space distance). The radius of
        ``G`` falls quickly once ``r * sigma * sqrt(d)`` nears 1 (``d``:
        the input dimension): Súkeník et al.'s curse of dimensionality.
        ``r = 0`` is ``FixedSigma(base_sigma)`` with Cohen's radius.
    k : int, default=20
        Number of nearest training inputs averaged, >= 1, at most the
        number of training inputs (minus one when ``offset`` is learned);
        ``fit`` checks it before any training.
    offset : float or None, default=None
        Neighbour distance at which ``sigma = base_sigma``. None: learned at
        ``fit``, the mean over training inputs of their mean distance to
        their ``k`` nearest *other* training inputs (so a typical training
        input gets about ``base_sigma``).

    Attributes
    ----------
    training_inputs_ : ndarray of float64, shape (n_train, n_features)
        The flattened training inputs.
    neighbors_ : sklearn.neighbors.NearestNeighbors
        Fitted on ``training_inputs_``.
    offset_ : float
        The offset in use (``offset``, or the learned one).

    See Also
    --------
    semi_elastic_radius : the radius of ``G``.
    CertifiedSigmaSelector : sigma certified constant on a ball instead.

    References
    ----------
    Súkeník, Kuvshinov, Günnemann, "Intriguing properties of input-dependent
    randomized smoothing", ICML 2022.

    Examples
    --------
    >>> SemiElasticSigma(base_sigma=0.5, r=0.02, k=10)
    SemiElasticSigma(base_sigma=0.5, k=10, r=0.02)
    """

    _parameter_constraints = {
        "base_sigma": [Interval(Real, 0, None, closed="neither")],
        "r": [Interval(Real, 0, None, closed="left")],
        "k": [Interval(Integral, 1, None, closed="left")],
        "offset": [Interval(Real, None, None, closed="neither"), None],
    }
    guarantee = SEMI_ELASTIC_GUARANTEE
    # base_sigma and r change sigma but not what fit learns (neighbours, offset).
    _refit_free_parameters = ("base_sigma", "r")

    def __init__(self, base_sigma=0.25, r=0.05, k=20, offset=None):
        self.base_sigma = base_sigma
        self.r = r
        self.k = k
        self.offset = offset

    def _check_before_fit(self, levels, X):
        self._check_neighbours(len(X))

    def _check_neighbours(self, n_train):
        """Raise ``ValueError`` unless ``n_train`` training inputs hold ``k`` neighbours of each input."""
        learned = self.offset is None
        available = n_train - 1 if learned else n_train
        if self.k > available:
            raise ValueError(f"k={self.k} nearest training inputs are needed, but fit saw {n_train} training "
                             f"inputs{' (each input is not its own neighbour when offset is learned)' * learned}: "
                             f"use k <= {available}.")

    def _fit_sigma(self, context, X, y):
        X = _flat(X)
        self._check_neighbours(len(X))  # also where fit_sigma is called directly
        learned = self.offset is None
        self.training_inputs_ = X
        self.neighbors_ = NearestNeighbors(n_neighbors=self.k).fit(X)
        if learned:
            # kneighbors() without inputs leaves each training input out of its own neighbours.
            distances, _ = self.neighbors_.kneighbors()
            self.offset_ = float(distances.mean())
        else:
            self.offset_ = float(self.offset)
        return self

    def fitted_arrays(self):
        """The fitted state as named CPU tensors, for a safe file (:mod:`smoothsk._persistence`).

        Returns
        -------
        arrays : dict of str to torch.Tensor
            ``training_inputs``: float64, shape (n_train, n_features);
            ``offset``: ``offset_``, float64, shape ().
        """
        return {"training_inputs": torch.from_numpy(np.array(self.training_inputs_, dtype=np.float64)),
                "offset": torch.tensor(self.offset_, dtype=torch.float64)}

    def restore_fitted(self, estimator, arrays, source):
        """Set the fitted state :meth:`fitted_arrays` returned, after checking it.

        Parameters, return value and errors: the saving contract of
        :class:`~smoothsk.sigma.BaseCertifiedSigma`. The training inputs must
        have ``estimator.n_features_in_`` columns and at least ``k`` rows. The
        neighbour index is fitted again on them, exactly as in ``fit`` (a
        deterministic construction: the same distances).
        """
        inputs, offset = arrays.get("training_inputs"), arrays.get("offset")
        if set(arrays) != {"training_inputs", "offset"} or not (
                inputs.dtype == offset.dtype == torch.float64 and offset.ndim == 0 and inputs.ndim == 2
                and inputs.shape[1] == estimator.n_features_in_ and self.k <= len(inputs)):
            raise ValueError(
                f"{source}: sigma_search_ of a SemiElasticSigma must hold exactly 'training_inputs' (float64, "
                f"shape (n_train >= k={self.k}, {estimator.n_features_in_})) and 'offset' (float64, shape ()); "
                f"got { {name: _tensor_description(value) for name, value in arrays.items()} }.")
        self.training_inputs_ = inputs.numpy()
        self.neighbors_ = NearestNeighbors(n_neighbors=self.k).fit(self.training_inputs_)
        self.offset_ = float(offset)
        return self

    def sigma(self, X):
        """``sigma(x)`` of each input.

        Parameters
        ----------
        X : array-like or torch.Tensor, shape (n_inputs, *input_shape)

        Returns
        -------
        ndarray of float, shape (n_inputs,)
        """
        distances, _ = self.neighbors_.kneighbors(_flat(X))
        base = float(self.base_sigma)
        # Clipping log sigma to log(SIGMA_RANGE) keeps it r-Lipschitz (see the class docstring).
        low, high = np.log(np.divide(SIGMA_RANGE, base))
        return base * np.exp(np.clip(float(self.r) * (distances.mean(axis=1) - self.offset_), low, high))

    def _certify_sigma(self, engine, X, alpha):
        n_inputs = len(X)
        return CertifiedSigmaResult(self.sigma(X), np.zeros(n_inputs, dtype=np.int64), np.full(n_inputs, np.inf),
                                    np.zeros(n_inputs, dtype=np.int64), np.zeros(n_inputs, dtype=bool))

    def g_radius(self, sigma, p_lower, radius_cap, n_features):
        """The radius of ``G`` for r-semi-elastic sigma (:func:`semi_elastic_radius`), instead of Cohen's.

        Parameters and return value as in :meth:`BaseCertifiedSigma.g_radius`;
        ``radius_cap`` is ``inf`` here (sigma is deterministic).
        """
        return np.minimum(radius_cap, semi_elastic_radius(sigma, p_lower, float(self.r), int(n_features)))


def _flat(X):
    """Inputs as a float64 array of shape (n_inputs, n_features)."""
    X = X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else np.asarray(X)
    return X.reshape(len(X), -1).astype(np.float64)


def _tensor_description(tensor):
    return f"{str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}"
