"""Certification as functions over values: search -> allocate -> sample -> guarantee.

The estimator orchestrates; the work is done here, on a :class:`Smoothing`
record that holds everything certification reads from a fitted estimator
(the module, the resolved components, alpha, the engine's settings),
resolved once per call. The region store is passed in and extended, never
read from the estimator, so a chunk of a checkpointed run can be certified
against a copy of it.

Which classifier a certificate is about:

- without a certified sigma function, the allocator's statement
  (:func:`guarantee`): ``g`` at one fixed sigma, ``g(., sigma(x))`` at the
  input's own sigma, or a stateful region classifier;
- with one, ``G(x) = g(x, sigma(x))`` (:func:`_certify_sample_wise`): the
  sigma function certifies its choice at ``alpha_share * alpha`` and the
  classifier is certified at that sigma at the rest of ``alpha`` with fresh
  samples, so both hold with probability at least ``1 - alpha`` (union bound).
"""

import functools
from dataclasses import dataclass

import numpy as np
import torch

from . import _parallel
from ._data import input_ids
from ._digest import module_fingerprint
from ._params import Components
from ._stages import PREDICT_STAGE, REACHABLE_LEVEL_STAGE
from .certificates import ABSTAIN, Certificates, fixed_sigma_guarantee
from .engine import MonteCarloEngine
from .regions import NoRegions
from .sigma import BaseCertifiedSigma, FixedSigma
from .statistics import certified_radius, clopper_pearson_lower

__all__ = ["Smoothing", "certify_rows", "guarantee", "prediction_counts"]


@dataclass(frozen=True)
class Smoothing:
    """What certification and prediction read from a fitted estimator.

    Attributes
    ----------
    module : torch.nn.Module
        The base classifier (put in eval mode by :meth:`engine`).
    n_classes : int
        Width of its logits.
    n_features : int
        Features per input (the product of ``input_shape_``).
    components : Components
        The validated components in use.
    sigma_function : BaseCertifiedSigma or None
        The fitted certified sigma function (``sigma_search_``) where
        ``components.sigma_search`` is one, else None.
    alpha : float
        Failure probability of each certificate.
    batch_size, device, n_jobs, autocast, memory_format
        The engine's settings: ``certify_batch_size``, ``device``, ``n_jobs``,
        ``certify_autocast`` (``"bfloat16"``, ``"float16"`` or None),
        ``certify_memory_format``.
    """

    module: torch.nn.Module
    n_classes: int
    n_features: int
    components: Components
    sigma_function: BaseCertifiedSigma
    alpha: float
    batch_size: int
    device: str
    n_jobs: int
    autocast: str
    memory_format: str

    @property
    def guarantee(self):
        """The statement of every certificate this smoothing makes: the certified sigma function's where it has
        one, else :func:`guarantee` of its components (``Certificates.guarantee``)."""
        return guarantee(self.components) if self.sigma_function is None else self.sigma_function.guarantee

    def engine(self, X, root_seed, progress=None, one_worker=False):
        """The Monte Carlo engine for inputs ``X``, their noise keyed by their values.

        Keying each input's noise streams by a hash of its values (not by its
        row) makes its certificate independent of the other inputs and of its
        place in X: certifying X, a subset, a permutation or a chunk of it
        gives each input the same noise. ``one_worker`` runs the engine
        in-process (inside a worker of :mod:`smoothsk._parallel`).

        Parameters
        ----------
        X : ndarray of float32, shape (n_inputs, *input_shape)
        root_seed : int
        progress : tqdm progress bar, optional
        one_worker : bool, default=False

        Returns
        -------
        MonteCarloEngine
        """
        # On the engine's device, as the selector's module is: a model fitted or
        # loaded on one device, then set to another, certifies there.
        self.module.to(self.device).eval()
        engine = MonteCarloEngine(self.module, self.n_classes, self.batch_size, self.device,
                                  None if one_worker else self.n_jobs, root_seed=root_seed, progress=progress,
                                  autocast=None if self.autocast is None else getattr(torch, self.autocast),
                                  memory_format=self.memory_format)
        return engine.keyed_by(input_ids(X))

    def check_regions(self, regions):
        """Refuse a store of other weights, another allocator class, alpha or precision (before sampling).

        Parameters
        ----------
        regions : RegionStore
        """
        allocator = self.components.allocator
        if allocator.stateless and len(regions) == 0:
            return  # a stateless allocator never stores a region: no owner to check or adopt
        regions.check_owner(module_fingerprint(self.module), type(allocator).__name__, self.alpha, self.autocast)


def guarantee(components):
    """Which classifier certificates of ``components`` are about (``Certificates.guarantee``).

    The allocator's statement, except that ``NoRegions`` with ``FixedSigma``
    certifies ``g`` at one sigma for every input: that is the very
    classifier ``predict`` queries (Cohen et al.), so the certificate is
    about the deployed classifier.

    Parameters
    ----------
    components : Components

    Returns
    -------
    str
    """
    if isinstance(components.allocator, NoRegions) and isinstance(components.sigma_search, FixedSigma):
        return fixed_sigma_guarantee(components.sigma_search.sigma)
    return components.allocator.guarantee


def certify_rows(smoothing, inputs, start, stop, root_seed, regions, progress=None):
    """Certify the inputs of rows ``start`` to ``stop`` against (and extending) the region store ``regions``.

    A chunk gets the noise it would get in a one-shot run. Where the
    certificates of a chunk do not depend on the other inputs (a stateless
    allocator and a per-input sigma search, :func:`smoothsk._parallel.can_split`)
    the rows are read and certified chunk by chunk (:meth:`Inputs.chunks
    <smoothsk._inputs.Inputs.chunks>`: one chunk for an array, bounded ones
    for a stream), each split over joblib workers with ``n_jobs`` (see
    :mod:`smoothsk._parallel`), each worker with a one-worker engine (no
    nested parallelism); otherwise they are read and certified in one pass here.

    Parameters
    ----------
    smoothing : Smoothing
    inputs : smoothsk._inputs.Inputs
    start, stop : int
        The rows to certify, ``0 <= start < stop <= inputs.n_inputs``.
    root_seed : int
        Root seed of the Monte Carlo noise.
    regions : RegionStore
        Checked against ``smoothing`` first, then extended by a stateful allocator.
    progress : tqdm progress bar, optional

    Returns
    -------
    Certificates
        One entry per row, about the classifier :func:`guarantee` names (``G``
        with a certified sigma function).
    """
    smoothing.check_regions(regions)
    if not _parallel.can_split(smoothing.components):
        return _certify_chunk(smoothing, inputs.read(start, stop), root_seed, progress, regions)
    parts = []
    for begin, end in inputs.chunks(start, stop):
        X_chunk = inputs.read(begin, end)
        if _parallel.n_chunks(len(X_chunk), smoothing.n_jobs) > 1:
            certify_chunk = functools.partial(_certify_chunk, smoothing, root_seed=root_seed, progress=None,
                                              regions=regions, one_worker=True)
            parts.append(_parallel.certify_in_parallel(certify_chunk, X_chunk, smoothing.n_jobs, progress))
        else:
            parts.append(_certify_chunk(smoothing, X_chunk, root_seed, progress, regions))
    return Certificates.concatenate(parts)


def _certify_chunk(smoothing, X_chunk, root_seed, progress, regions, one_worker=False):
    """Certify the inputs ``X_chunk`` (float32 ndarray) in one pass against the store ``regions``."""
    engine = smoothing.engine(X_chunk, root_seed, progress, one_worker)
    if smoothing.sigma_function is not None:
        return _certify_sample_wise(smoothing, X_chunk, engine, regions)
    components, X_rows = smoothing.components, torch.from_numpy(X_chunk)
    searched = components.sigma_search.search(engine, X_rows)

    def certify_fn(subset, sigma, stage, alpha_share=1.0):
        return components.sampler.certify(engine.restricted(subset), X_rows[subset], sigma,
                                          smoothing.alpha * alpha_share, stage)

    certificates = components.allocator.allocate(regions, X_chunk.reshape(len(X_chunk), -1), searched.sigma,
                                                 certify_fn)
    certificates.search_steps = searched.steps
    certificates.guarantee = smoothing.guarantee
    return certificates


def _certify_sample_wise(smoothing, X, engine, regions):
    """Certificates of ``G(x) = g(x, sigma(x))`` with a certified sigma function.

    The sigma function certifies itself at ``alpha_share * alpha`` on its
    own stages; the classifier is certified at the chosen sigma (sampler
    and a composing allocator) at the rest of ``alpha`` with fresh samples
    (its stages differ). By the union bound both certificates hold with
    probability at least ``1 - alpha``, and then ``G`` predicts the class
    on the ball of radius ``g_radius`` (see :class:`~smoothsk.sigma.BaseCertifiedSigma`).
    Inputs where the sigma function abstains are not sampled and abstain.
    """
    sigma_function, sampler = smoothing.sigma_function, smoothing.components.sampler
    share = float(sigma_function.alpha_share)
    X_t = torch.from_numpy(X)
    chosen = sigma_function.certify_sigma(engine, X_t, share * smoothing.alpha)
    rows = np.flatnonzero(~chosen.abstain)
    # Where the function certifies the levels it may switch to, each level's certificate (the chosen one's
    # and those of the levels it may switch to) gets an equal part of the classifier's alpha, fixed in advance.
    level_alpha = (1.0 - share) * smoothing.alpha / (1 if chosen.level_reach is None else len(chosen.levels))

    def certify_fn(subset, sigma, stage, alpha_share=1.0):
        subset = rows[np.asarray(subset, dtype=np.int64)]
        return sampler.certify(engine.restricted(subset), X_t[subset], sigma, level_alpha * alpha_share, stage)

    classified = smoothing.components.allocator.allocate(
        regions, X[rows].reshape(len(rows), smoothing.n_features), chosen.sigma[rows], certify_fn)
    prediction = np.full(len(X), ABSTAIN, dtype=np.int64)
    p_lower = np.zeros(len(X))
    n_samples = np.zeros(len(X), dtype=np.int64)
    prediction[rows], p_lower[rows], n_samples[rows] = classified.prediction, classified.p_lower, classified.n_samples
    if chosen.level_reach is None:
        radius = sigma_function.g_radius(chosen.sigma, p_lower, chosen.radius_cap, smoothing.n_features)
    else:
        reachable_n = sampler.prediction_sample_size
        if sigma_function.reachable_n is not None:
            reachable_n = min(reachable_n, sigma_function.reachable_n)
        radius, reachable_samples = _widen_to_reachable_levels(engine, X_t, reachable_n, chosen, prediction,
                                                               p_lower, level_alpha)
        n_samples += reachable_samples
        # Radius 0: a level that may be the selector's choice at x itself does not certify the class there.
        prediction[~(radius > 0)] = ABSTAIN
    radius = np.where(prediction >= 0, np.maximum(radius, 0.0), 0.0)
    return Certificates(prediction, radius, chosen.sigma, p_lower, n_samples, chosen.steps,
                        radius_cap=chosen.radius_cap, sigma_samples=chosen.n_samples,
                        guarantee=smoothing.guarantee)


def _widen_to_reachable_levels(engine, X, n_samples, chosen, prediction, p_lower, alpha):
    """Radii of ``G`` where the chosen level's certificate is capped by a level the selector may switch to.

    **Proof.** Let ``c`` be the class ``g(., s_k)`` certifies at the chosen
    level ``s_k`` on ``B(x, R_k)``, and ``rho_j`` the radius within which
    the sigma function does not take level ``s_j`` (``chosen.level_reach``).
    Where ``rho_j < R_k`` for some other level, ``g(., s_j)`` is certified
    too: ``n_samples`` fresh copies at a stage of its own (which levels and
    inputs are sampled, and ``c``, depend on the selector's and the chosen
    level's samples only, never on these) bound ``P(f(x + s_j e) = c)`` from
    below at ``alpha`` (one-sided Clopper-Pearson: ``c`` is fixed before
    they are drawn, so no selection samples are needed); above 1/2 it
    certifies ``g(., s_j) = c`` on ``B(x, R_j)``, ``R_j = s_j *
    PhiInv(bound)`` (Cohen et al., Theorem 1), else ``R_j = 0``. On a ball
    of radius ``r <= min(R_k, min_j max(R_j, rho_j))`` every ``x'`` has
    ``sigma(x') = s_j`` for a level with ``r <= rho_j`` (impossible within
    the ball) or ``r <= R_j``, or the chosen one: so ``G(x') = g(x',
    sigma(x')) = c``. The selector's bounds and each level's certificate
    hold together with probability at least ``1 - alpha_share * alpha - K *
    alpha_level``, the estimator's ``alpha``. Where no other level is
    reachable within ``R_k`` the radius is ``min(R_k, R1)``, as without this
    widening.

    Parameters
    ----------
    engine : MonteCarloEngine
        The classifier's engine, keyed by the inputs.
    X : torch.Tensor, shape (n_inputs, *input_shape)
    n_samples : int
        Copies per reachable level's certificate.
    chosen : CertifiedSigmaResult
        With ``level_reach`` and ``levels``.
    prediction : ndarray of int, shape (n_inputs,)
        ``c`` (``ABSTAIN`` where the chosen level abstains).
    p_lower : ndarray of float, shape (n_inputs,)
        The chosen level's lower bound on ``c``'s probability.
    alpha : float
        Failure probability of each level's certificate.

    Returns
    -------
    radius : ndarray of float, shape (n_inputs,)
    spent : ndarray of int, shape (n_inputs,)
        Classifier samples spent at the other levels.
    """
    own = certified_radius(chosen.sigma, p_lower)
    capped = (prediction >= 0) & (chosen.radius_cap < own)
    # A level's certificate gives at most this radius: all n_samples copies on c.
    largest = certified_radius(chosen.levels, np.full(len(chosen.levels), clopper_pearson_lower(
        n_samples, n_samples, alpha)))
    wanted = capped[:, None] & levels_worth_sampling(own, chosen.sigma, chosen.levels, chosen.level_reach, largest)
    level_radius = np.zeros_like(chosen.level_reach)  # R_j: 0 where a level is not sampled
    spent = np.zeros(len(X), dtype=np.int64)
    for index, level in enumerate(chosen.levels):
        rows = np.flatnonzero(wanted[:, index])
        if len(rows):
            counts = engine.restricted(rows).class_counts(X[rows], np.full(len(rows), level), n_samples,
                                                          (REACHABLE_LEVEL_STAGE, index))
            bound = clopper_pearson_lower(counts[np.arange(len(rows)), prediction[rows]], n_samples, alpha)
            level_radius[rows, index] = certified_radius(level, bound)
            spent[rows] += n_samples
    return _widened_radius(own, chosen.sigma, chosen.levels, level_radius, chosen.level_reach), spent


def _widened_radius(own, sigma, levels, level_radius, reach):
    """``min(R_k, min_j max(R_j, rho_j))`` over the levels ``j`` other than each input's chosen one.

    Parameters
    ----------
    own : ndarray of float, shape (n_inputs,)
        ``R_k``, the chosen level's radius.
    sigma : ndarray of float, shape (n_inputs,)
        The chosen level.
    levels : ndarray of float, shape (K,)
    level_radius : ndarray of float, shape (n_inputs, K) or (1, K)
        ``R_j``.
    reach : ndarray of float, shape (n_inputs, K)
        ``rho_j``.

    Returns
    -------
    ndarray of float, shape (n_inputs,)
    """
    other = sigma[:, None] != levels[None, :]
    return np.minimum(own, np.where(other, np.maximum(level_radius, reach), np.inf).min(axis=1))


def levels_worth_sampling(own, sigma, levels, reach, largest):
    """Where another level's certificate can widen the radius of ``G``, whatever its samples.

    The widened radius is ``min(R_k, min_j max(R_j, rho_j))`` over the other
    levels ``j`` (:func:`_widen_to_reachable_levels`), with ``0 <= R_j <=
    largest_j``. It is at most the ceiling ``c = min(R_k, min_j max(largest_j,
    rho_j))``; a level with ``rho_j >= c`` has ``max(R_j, rho_j) >= c`` for any
    ``R_j``, so its term never binds, and its certificate (``R_j = 0`` in its
    place) changes no radius. The choice depends on the selector's and the
    chosen level's samples only, so the sampled levels' bounds stay
    independent of it.

    Parameters
    ----------
    own : ndarray of float, shape (n_inputs,)
        ``R_k``, the chosen level's radius.
    sigma : ndarray of float, shape (n_inputs,)
        The chosen level.
    levels : ndarray of float, shape (K,)
    reach : ndarray of float, shape (n_inputs, K)
        ``rho_j``, within which the selector cannot switch to level ``j``.
    largest : ndarray of float, shape (K,)
        The largest radius each level's certificate can give.

    Returns
    -------
    ndarray of bool, shape (n_inputs, K)
    """
    ceiling = _widened_radius(own, sigma, levels, largest[None, :], reach)
    return (sigma[:, None] != levels[None, :]) & (reach < ceiling[:, None])


def prediction_counts(smoothing, X, root_seed, regions):
    """Class counts of ``predict``'s noisy samples, where it must abstain, and the alpha of its test.

    ``predict`` smooths with the searched sigma, then the allocator's (region)
    sigma, with no abstention and the whole ``alpha``; or, with a certified
    sigma function, with its PREDICT choice and abstentions at
    ``alpha_share * alpha``, leaving the rest of ``alpha`` to the
    classifier's test (so a returned class is ``G(x)`` with probability at
    least ``1 - alpha``).

    Parameters
    ----------
    smoothing : Smoothing
    X : ndarray of float32, shape (n_inputs, *input_shape)
    root_seed : int
    regions : RegionStore
        Checked against ``smoothing``, then read (an allocator's sigma of the
        region ``x`` lies in), never extended.

    Returns
    -------
    counts : ndarray of int64, shape (n_inputs, n_classes)
    n : int
        Noisy samples per input.
    abstain : ndarray of bool, shape (n_inputs,)
        Where the sigma function abstains.
    alpha : float
        The level of the top-two test.
    """
    smoothing.check_regions(regions)
    engine = smoothing.engine(X, root_seed)
    X_t = torch.from_numpy(X)
    if smoothing.sigma_function is not None:
        fitted = smoothing.sigma_function
        sigma, abstain = fitted.predict_sigma(engine, X_t, fitted.alpha_share * smoothing.alpha)
        alpha = (1.0 - fitted.alpha_share) * smoothing.alpha
    else:
        sigma = smoothing.components.sigma_search.search(engine, X_t).sigma
        sigma = smoothing.components.allocator.assign_sigma(regions, X.reshape(len(X), -1), sigma)
        abstain, alpha = np.zeros(len(X), dtype=bool), smoothing.alpha
    n = smoothing.components.sampler.prediction_sample_size
    return engine.class_counts(X_t, sigma, n, PREDICT_STAGE), n, abstain, alpha
