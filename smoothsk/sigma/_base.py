"""Base class of the test-time noise-level searches."""

import copy
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.exceptions import NotFittedError

from .._components import Component
from .._digest import module_fingerprint
from ..certificates import SAMPLE_WISE_GUARANTEE
from ..statistics import certified_radius


@dataclass
class SigmaSearchResult:
    """Outcome of a search over inputs.

    Attributes
    ----------
    sigma : ndarray of float, shape (n_inputs,)
        Noise level chosen for each input.
    steps : ndarray of int, shape (n_inputs,)
        Search steps (noise-level evaluations) spent on each input.
    """

    sigma: np.ndarray
    steps: np.ndarray


class BaseSigmaSearch(Component):
    """Chooses a noise level per input.

    A search may look at the model through the engine, but only with noise
    from the ``SEARCH_STAGE`` streams: certification then draws fresh,
    independent samples at the chosen sigma, so the certificate stays valid.
    """

    per_input = True  # each input's sigma depends on that input alone; False: on the whole set (never chunked)

    def search(self, engine, X, y=None):
        """Choose sigma for each input.

        Parameters
        ----------
        engine : MonteCarloEngine
            Sampling access to the base model.
        X : torch.Tensor, shape (n_inputs, *input_shape)
            Inputs.
        y : array-like or torch.Tensor of int, shape (n_inputs,), optional
            Class indices; searches that use labels (training-time sigma
            assignment, PFAT Eq. 5) maximise the radius among correct
            predictions. Subclasses receive them as an int64 ndarray.

        Returns
        -------
        SigmaSearchResult
        """
        self.validate()
        if y is not None:
            y = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y, dtype=np.int64)
        result = self._search(engine, X, y)
        sigma = np.asarray(result.sigma, dtype=np.float64)
        bad = np.flatnonzero(~(np.isfinite(sigma) & (sigma > 0)))
        if len(bad):
            # Before any certification: a NaN, infinite or non-positive sigma has no certificate (and a region
            # allocator would store it).
            raise ValueError(f"{self!r} chose sigma={float(sigma[bad[0]])!r} for an input; a noise level must be "
                             f"finite and positive.")
        return SigmaSearchResult(sigma, np.asarray(result.steps, dtype=np.int64))

    @abstractmethod
    def _search(self, engine, X, y):
        """Return a :class:`SigmaSearchResult` for validated parameters."""

    def noise_levels(self):
        """The noise levels this search chooses among, where they form a grid.

        Returns
        -------
        levels : ndarray of float, shape (K,), or None
            Ascending; None (the default) for a search without a grid (a
            continuous sigma).
        """
        return None


@dataclass
class CertifiedSigmaResult(SigmaSearchResult):
    """A certified sigma function's values and the certificate of each, shape (n_inputs,) each.

    Attributes
    ----------
    sigma : ndarray of float
        ``sigma(x)`` of each input (where ``abstain``, or where
        ``level_reach`` is given and ``radius_cap`` is 0, the candidate
        value, which carries no certificate).
    steps : ndarray of int
        Search steps (0 for functions that do not search).
    radius_cap : ndarray of float
        ``R1``: with the certificate's probability, ``sigma(.)`` equals
        ``sigma(x)`` on the open L2 ball of this radius around ``x``;
        ``inf`` for a deterministic function (there the function's own
        radius rule, :meth:`BaseCertifiedSigma.g_radius`, accounts for how
        sigma varies); 0 where ``abstain``, and with ``level_reach`` where
        another level may be the function's value at ``x`` itself.
    n_samples : ndarray of int
        Noisy samples the certificate of sigma spent (0 for a deterministic
        function).
    abstain : ndarray of bool
        Where the sigma function gives no value (then ``G`` abstains too).
    level_reach : ndarray of float, shape (n_inputs, n_levels), or None
        Where the function certifies which of its levels it may switch to
        (``CertifiedSigmaSelector(certify_reachable_levels=True)``):
        ``level_reach[i, j]`` is a radius within which ``sigma(.)`` does not
        take ``levels[j]`` around input ``i`` (0 for the chosen level), and
        ``radius_cap`` is the smallest over the other levels. None otherwise.
    levels : ndarray of float, shape (n_levels,), or None
        The levels ``level_reach``'s columns stand for; None with it.
    """

    radius_cap: np.ndarray
    n_samples: np.ndarray
    abstain: np.ndarray
    level_reach: np.ndarray = None
    levels: np.ndarray = None


class BaseCertifiedSigma(BaseSigmaSearch):
    """A sigma function ``sigma(.)`` that carries its own certificate.

    With one of these as ``sigma_search``, the estimator's certificates and
    ``predict`` are about the sample-wise classifier it deploys,
    ``G(x) = g(x, sigma(x))``, where ``g(., s)`` is the smoothed classifier
    at noise level ``s``, and they are stateless (no regions: a certificate
    depends on its input alone, not on other inputs, their order, chunks or
    workers).

    **Contract** (what a subclass provides, and what the estimator does).

    - :meth:`fit_sigma` ``(context, X, y)`` learns what the function needs
      (a trained selector, the training inputs of a nearest-neighbour rule)
      from the trained classifier and the estimator's settings, which
      ``context`` (a :class:`~smoothsk.sigma.SigmaFitContext`) holds.
      The estimator calls it at the end of ``fit`` on a *clone* of its
      ``sigma_search`` and keeps the result as ``sigma_search_``: the user's
      object is never changed, and a refit (new weights) learns it anew.
    - :meth:`certify_sigma` ``(engine, X, alpha)`` returns sigma per input
      and its certificate (:class:`CertifiedSigmaResult`): with probability
      at least ``1 - alpha`` over the function's own samples, for every
      input not abstained, ``sigma(x') = sigma(x)`` for all ``x'`` with
      ``||x' - x|| < radius_cap`` (trivially true for ``inf`` caps of a
      deterministic function, which spends no alpha). Its samples come only
      from stages ``(CERTIFIED_SIGMA_STAGE, ...)``; they choose the sigma,
      and the classifier is certified at it with fresh samples.
    - :meth:`predict_sigma` ``(engine, X, alpha)``: the sigma ``predict``
      smooths with, and where it abstains; a returned sigma is ``sigma(x)``
      with probability at least ``1 - alpha``.
    - :attr:`alpha_share`: the fraction of the estimator's ``alpha`` the
      function's certificates use (0 for deterministic functions; a
      parameter of functions that sample).
    - :meth:`g_radius` ``(sigma, p_lower, radius_cap, n_features)``: the
      radius of ``G`` from the classifier's lower bound at ``sigma(x)``.
      The default is Dual Randomized Smoothing's ``min(R1, R2)`` with
      Cohen's ``R2 = sigma * PhiInv(p_lower)``: if ``sigma(.) = s`` on
      ``B(x, R1)`` and ``g(., s)`` predicts ``c`` on ``B(x, R2)``, then
      ``G(x') = g(x', s) = c`` on ``B(x, min(R1, R2))``. A function whose
      sigma varies inside the ball overrides it (for semi-elastic sigma, a
      lower bound on the radius in Súkeník et al.'s setting, proven in
      :mod:`smoothsk.sigma._semi_elastic`).
    - Saving (optional; :mod:`smoothsk._persistence` refuses to save a
      function without it): ``fitted_arrays()`` returns the fitted state as
      a dict of named CPU tensors; ``restore_fitted(estimator, arrays,
      source)`` sets it on an unfitted clone of the saved parameters and
      returns it. ``estimator`` is the loaded estimator, initialised
      (``input_shape_``, ``n_features_in_``, ``device``); ``arrays`` is what
      ``fitted_arrays`` returned, read from the file ``source`` (named in
      errors); it raises ``ValueError`` if an array is missing, extra, or
      of the wrong dtype or shape, and rebuilds what derives from the
      arrays (a module, a neighbour index) as ``fit`` built it.

    The estimator, given one of these, certifies each input as follows:
    ``certify_sigma`` at ``alpha_share * alpha``; then the classifier at
    the returned sigma, through the sampler (fixed or input-specific) and
    an allocator that composes (``NoRegions``; see each allocator's
    ``composes_with_certified_sigma``), at ``(1 - alpha_share) * alpha``,
    on stages disjoint from the function's; the radius is ``g_radius``,
    and the certificate abstains where either abstains. By the union
    bound, both certificates hold together with probability at least
    ``1 - alpha``, and then ``G`` predicts the returned class on the open
    ball of the returned radius. ``predict`` splits alpha the same way.
    ``details`` report ``radius_cap``, the function's samples
    (``sigma_samples``) and :attr:`guarantee`.
    """

    #: Fraction of the estimator's alpha the function's own certificate uses
    #: (an ``__init__`` parameter of subclasses that sample).
    alpha_share = 0.0
    #: What the certificates are about (``Certificates.guarantee``).
    guarantee = SAMPLE_WISE_GUARANTEE
    #: Parameters that may change after ``fit`` without refitting (sample
    #: sizes, the alpha share); every other parameter shapes the fitted state.
    _refit_free_parameters = ()

    def with_fitted_state(self, fitted):
        """This function's parameters on the state a fitted clone learned.

        Parameters
        ----------
        fitted : BaseCertifiedSigma
            The estimator's ``sigma_search_``, fitted from a clone of an
            earlier value of this parameter.

        Returns
        -------
        BaseCertifiedSigma
            A shallow copy of ``fitted`` with this object's refit-free
            parameters (``fitted`` itself is left unchanged).

        Raises
        ------
        sklearn.exceptions.NotFittedError
            If ``fitted`` is of another class or a parameter that shapes the
            fitted state differs: the estimator must be fitted again. Values
            are compared by :func:`_same_value` (modules by their weights,
            arrays and tensors element by element).
        """
        if type(fitted) is not type(self):
            raise NotFittedError(f"sigma_search is a {type(self).__name__}, but the estimator was fitted with a "
                                 f"{type(fitted).__name__}: call fit again.")
        mine, theirs = self.get_params(deep=False), fitted.get_params(deep=False)
        changed = [name for name in mine
                   if name not in self._refit_free_parameters and not _same_value(mine[name], theirs[name])]
        if changed:
            raise NotFittedError(f"sigma_search parameters {changed} changed since fit, and the fitted "
                                 f"{type(self).__name__} depends on them: call fit again.")
        return copy.copy(fitted).set_params(**{name: mine[name] for name in self._refit_free_parameters})

    def check_before_fit(self, levels, X):
        """Raise before any training where :meth:`fit_sigma` would fail.

        The estimator calls it at the start of ``fit``, before it changes
        any state. It validates the parameters; subclasses add checks that
        need the classifier's grid or the inputs (``_check_before_fit``).

        Parameters
        ----------
        levels : ndarray of float, shape (K,), or None
            The grid of noise levels ``fit_sigma`` will see as
            ``context.levels`` (:func:`~smoothsk.sigma.classifier_levels`).
        X : torch.Tensor, shape (n_train, *input_shape)
            Training inputs.
        """
        self.validate()
        self._check_before_fit(levels, X)

    def _check_before_fit(self, levels, X):
        """Checks beyond the parameters; the default has none."""

    def fit_sigma(self, context, X, y):
        """Learn what the sigma function needs from a trained classifier.

        Called by ``SampleWiseSmoothedClassifier.fit`` after training, on a
        clone of the estimator's ``sigma_search``; stores fitted attributes
        (ending in ``_``) on ``self`` only.

        Parameters
        ----------
        context : SigmaFitContext
            The trained classifier and the estimator's settings
            (``SigmaFitContext.from_estimator(estimator)``).
        X : torch.Tensor, shape (n_train, *input_shape)
            Training inputs.
        y : torch.Tensor of int64, shape (n_train,)
            Class indices of the training labels.

        Returns
        -------
        self
        """
        self.validate()
        return self._fit_sigma(context, X, y)

    def _fit_sigma(self, context, X, y):
        """Fit for validated parameters; the default learns nothing."""
        return self

    def certify_sigma(self, engine, X, alpha):
        """Sigma of each input with the certificate that it is constant on a ball.

        Parameters
        ----------
        engine : MonteCarloEngine
            The classifier's engine (root seed and input keys); a function
            with a module of its own samples it through
            ``engine.with_module(...)`` at stages ``(CERTIFIED_SIGMA_STAGE, ...)``.
        X : torch.Tensor, shape (n_inputs, *input_shape)
            Inputs.
        alpha : float
            Failure probability this certificate may use (the estimator's
            ``alpha_share * alpha``).

        Returns
        -------
        CertifiedSigmaResult
        """
        self.validate()
        result = self._certify_sigma(engine, X, float(alpha))
        return CertifiedSigmaResult(
            np.asarray(result.sigma, dtype=np.float64), np.asarray(result.steps, dtype=np.int64),
            np.asarray(result.radius_cap, dtype=np.float64), np.asarray(result.n_samples, dtype=np.int64),
            np.asarray(result.abstain, dtype=bool), result.level_reach, result.levels)

    @abstractmethod
    def _certify_sigma(self, engine, X, alpha):
        """Return a :class:`CertifiedSigmaResult` for validated parameters."""

    def predict_sigma(self, engine, X, alpha):
        """The sigma ``predict`` smooths each input with, and where it abstains.

        Parameters
        ----------
        engine : MonteCarloEngine
            As in :meth:`certify_sigma`.
        X : torch.Tensor, shape (n_inputs, *input_shape)
        alpha : float
            Probability that a returned (not abstained) sigma differs from
            ``sigma(x)``.

        Returns
        -------
        sigma : ndarray of float, shape (n_inputs,)
            Where abstained, the candidate value (``predict_proba`` uses it).
        abstain : ndarray of bool, shape (n_inputs,)
        """
        result = self.certify_sigma(engine, X, alpha)
        return result.sigma, result.abstain

    def _search(self, engine, X, y):
        # As a plain search: the values predict uses, without their certificate
        # (the candidate sigma does not depend on alpha; only abstention does).
        sigma, _ = self.predict_sigma(engine, X, 0.5)
        return SigmaSearchResult(sigma, np.zeros(len(X), dtype=np.int64))

    def g_radius(self, sigma, p_lower, radius_cap, n_features):
        """Certified radius of ``G`` from the classifier's bound at ``sigma(x)``.

        Parameters
        ----------
        sigma : ndarray of float, shape (n_inputs,)
            ``sigma(x)``.
        p_lower : ndarray of float, shape (n_inputs,)
            Lower confidence bound on the top class's probability under
            ``g(x, sigma(x))``.
        radius_cap : ndarray of float, shape (n_inputs,)
            ``R1`` of :meth:`certify_sigma`.
        n_features : int
            Input dimension (radii of varying sigma depend on it).

        Returns
        -------
        radius : ndarray of float, shape (n_inputs,)
            ``min(R1, sigma * PhiInv(p_lower))`` (Dual Randomized Smoothing,
            Sun et al. 2026, Sec. 4); 0 where ``p_lower <= 1/2``.
        """
        return np.minimum(radius_cap, certified_radius(sigma, p_lower))


def _same_value(first, second):
    """Whether two parameter values are equal by value, as far as a fitted state depends on them.

    Modules are equal when their class and everything they compute with
    (:func:`~smoothsk._digest.module_fingerprint`: weights, other buffers and
    attributes, children in order) are; arrays and tensors when
    their dtype, shape and elements are; sequences, dicts and components
    (``get_params``) element by element; other values by ``repr``, which a
    module's or a long array's omits (weights, buffers, summarised elements).

    Parameters
    ----------
    first, second : object

    Returns
    -------
    bool
    """
    if type(first) is not type(second):
        return False
    if isinstance(first, torch.nn.Module):
        return module_fingerprint(first) == module_fingerprint(second)
    if isinstance(first, torch.Tensor):
        return (first.dtype == second.dtype and first.shape == second.shape
                and bool(torch.equal(first.detach().cpu(), second.detach().cpu())))
    if isinstance(first, np.ndarray):
        return first.dtype == second.dtype and np.array_equal(first, second, equal_nan=first.dtype.kind in "fc")
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(_same_value, first, second))
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(_same_value(first[key], second[key]) for key in first)
    if hasattr(first, "get_params") and not isinstance(first, type):
        return _same_value(first.get_params(deep=False), second.get_params(deep=False))
    return repr(first) == repr(second)
