"""A smoothed selector over noise levels, certified constant on a ball (Dual Randomized Smoothing, Sun et al. 2026)."""

import copy
import inspect
from numbers import Integral, Real

import numpy as np
import torch
from scipy.stats import norm
from sklearn.exceptions import NotFittedError

from .._constraints import SAMPLE_SIZE, HasMethods, Interval
from .._messages import quoted
from .._modes import evaluating
from .._module_state import build_from_file
from .._stages import (
    CERTIFIED_SIGMA_CERTIFY,
    CERTIFIED_SIGMA_ESTIMATION,
    CERTIFIED_SIGMA_PREDICTION,
    CERTIFIED_SIGMA_SELECTION,
    SELECTOR_INIT_SALT,
)
from ..certificates import ABSTAIN
from ..models import FlatMLP
from ..objectives import Consistency
from ..sampling import FixedSampler
from ..statistics import (
    certified_radius,
    clopper_pearson_lower,
    quantile_class,
    quantile_test,
    top_two_test,
    votes_reaching,
)
from ._base import BaseCertifiedSigma, CertifiedSigmaResult
from ._fit_context import SigmaFitContext
from ._selector_training import start_from_classifier, train_selector, training_targets


def _construct(selector, kwargs, n_levels, probe):
    """A selector module built from its class with ``n_classes=K`` (when it takes it), lazy layers materialised.

    Raises
    ------
    TypeError or ValueError
        Naming ``selector``, if the class cannot be built so (the type of
        its own error) or fails on ``probe``.
    """
    if "n_classes" in inspect.signature(selector).parameters:
        kwargs = {**kwargs, "n_classes": n_levels}
    try:
        module = selector(**kwargs)
    except Exception as error:
        call = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
        raise (TypeError if isinstance(error, TypeError) else ValueError)(
            f"selector={selector.__name__} cannot be built as {selector.__name__}({call}): {error}. A selector "
            f"class is built with no arguments but n_classes=K (K={n_levels}) when it takes n_classes; pass a "
            "module instance otherwise.") from error
    _probe(module, probe, n_levels)  # materialise lazy layers before the optimizer sees them
    return module


def _probe(module, X, n_levels):
    """The selector's outputs on ``X`` without gradients; its failure is a ValueError naming ``selector``."""
    try:
        with torch.no_grad():
            return module(X)
    except Exception as error:
        raise ValueError(f"The selector ({type(module).__name__}) fails on an input of shape {tuple(X.shape)}: "
                         f"{type(error).__name__}: {error}. selector must take inputs of the training data's "
                         f"shape and return (batch, K) logits (K={n_levels}).") from error


class _SmallestLevelWhereUndefined(torch.nn.Module):
    """The selector as a function defined everywhere: a copy with NaN logits votes for the smallest level.

    Every certificate of the level (``_certify_reachable``, ``_certify_quantile``)
    and ``predict_sigma`` reason about a selector whose K level probabilities
    sum to one: the ``1 / K`` bound on the argmax's top level, ``S_0 = 1`` for
    the threshold rule, and the same denominator in ``predict``'s tests as in
    the bounds. The engine counts a copy with NaN logits as a vote for no
    class, which is sound for a classifier's lower bounds but would leave the
    levels' probabilities summing to less than one. Routed through this
    module, the selector is one fixed function into the levels, so every
    proof holds as written. The smallest level, so that ``S_0 = 1`` holds.

    Parameters
    ----------
    selector : torch.nn.Module
        Returns logits of shape (batch, K).
    smallest : int
        Index (among the K logits) of the smallest level.
    """

    def __init__(self, selector, smallest):
        super().__init__()
        self.selector = selector
        self.smallest = int(smallest)

    def forward(self, x):
        logits = self.selector(x)
        vote = torch.zeros(logits.shape[1:], dtype=logits.dtype, device=logits.device)
        vote[self.smallest] = 1.0
        return torch.where(torch.isnan(logits).any(dim=1, keepdim=True), vote, logits)


#: The selector's noise by default, per unit of the largest level. It caps every radius of ``G``: with all of
#: n = 10,000 votes on one level, ``R1 <= noise * 3.08`` (``alpha_share=0.1``, alpha = 0.001), which at 0.75 was
#: 2.31 on real MNIST, below what the sigma-1.0 experts certify (up to 3.8). Measured there at n = 100,000
#: (docs/mnist.md, routers over three LeNet experts, each against 0.75 over the same experts): 1.0 gives +4.2%
#: ACR over SmoothAdv + Consistency experts, +1.8% over SmoothAdv experts and -0.1% over Gaussian experts
#: (within one fit's spread); 1.5 lost to both over SmoothAdv + Consistency experts (first 80 images). On the
#: synthetic task of ``benchmarks/bench_selector_configurations.py`` 1.0 and 0.75 certify the same (1.29x /
#: 1.28x the best fixed sigma). Past the ceiling, a noisier selector blurs the structure that decides the level.
SELECTOR_NOISE_PER_LEVEL = 1.0


class CertifiedSigmaSelector(BaseCertifiedSigma):
    """Noise level per input from a smoothed selector, certified constant on a ball (Dual RS).

    A selector module maps an input to logits over the K noise ``levels``.
    Smoothed with Gaussian noise of ``selector_sigma``, it defines the sigma
    function ``sigma(x) = levels[k(x)]``, ``k(x) = argmax_k P(selector(x + e)
    = k)``, ``e ~ N(0, selector_sigma^2 I)``: a smoothed classifier over
    levels, so Cohen et al.'s CERTIFY certifies it constant on a ball. By
    default (``level_threshold=0.3``) ``k(x)`` is instead the largest level
    that 30% of the votes reach (on it or on a larger level), certified
    constant on a ball the same way (``level_threshold=None``: the argmax). A
    noisy copy on which the selector's logits are NaN votes for the smallest
    level, so that the selector is defined everywhere, as the certificates
    need. The estimator then certifies the classifier at that level (Sun, Mao and
    Vechev's Dual Randomized Smoothing; see
    :class:`~smoothsk.sigma.BaseCertifiedSigma` for how the estimator composes
    the two).

    **Guarantee.** For each input ``x`` and its certificate (class ``c``,
    radius ``r``), with probability at least ``1 - alpha`` over the noise:
    the sample-wise classifier ``G(x') = g(x', sigma(x'))`` equals ``c`` for
    every ``x'`` with ``||x' - x|| < r``. With
    ``certify_reachable_levels=False``, ``r = min(R1, R2)``:

    - ``R1 = selector_sigma * PhiInv(p1)``, ``p1`` the one-sided
      Clopper-Pearson lower bound at level ``alpha_share * alpha`` on the
      probability of the selector's top level, candidate from ``n0``
      samples (stage ``(CERTIFIED_SIGMA_STAGE, 0)``), bound from ``n``
      fresh ones (stage ``(CERTIFIED_SIGMA_STAGE, 1)``): ``sigma(.)`` equals
      that level on ``B(x, R1)`` (Cohen et al., Theorem 1, applied to the
      selector); with ``level_threshold``, ``R1`` is the smallest radius
      within which another level stays out of reach (``_certify_quantile``);
    - ``R2 = level * PhiInv(p2)``, ``p2`` the sampler's bound at level
      ``(1 - alpha_share) * alpha`` from the classifier's samples at that
      level (stages ``(1, ...)``: independent of the selector's samples,
      which chose the level): ``g(., level) = c`` on ``B(x, R2)``;
    - on ``B(x, min(R1, R2))``, ``G(x') = g(x', level) = c``. The union
      bound gives ``1 - alpha`` for both events together. The certificate
      abstains where either abstains (selector: ``p1 <= 1/2``).

    By default (``certify_reachable_levels=True``) the classifier's share
    of alpha is split evenly over the K levels in advance, so ``R2`` is
    bounded at ``(1 - alpha_share) * alpha / K``; where ``R1 < R2`` the
    radius widens from ``R1`` to the ball on which every level the selector
    may switch to certifies ``c`` too (the parameter's description; the
    proof is in ``smoothsk._certification._widen_to_reachable_levels``).
    The selector then abstains nowhere: where it is unsure even at ``x``
    (``p1 <= 1/2``), every level it may take there must certify ``c``, or
    the certificate abstains.

    ``predict`` smooths with the selector's PREDICT choice (Cohen et al.'s
    binomial test on the top two levels of ``n`` samples at level
    ``alpha_share * alpha``, stage ``(CERTIFIED_SIGMA_STAGE, 2)``, abstaining
    where it is not significant) and tests the classifier at the remaining
    ``(1 - alpha_share) * alpha``: a returned class is ``G(x)`` with
    probability at least ``1 - alpha``. Nothing is stored at certification:
    results do not depend on other inputs, their order, chunks or ``n_jobs``.
    With one level (K = 1) there is nothing to select: ``R1 = inf`` and no
    selector samples are drawn.

    **Training** (``fit_selector=True``, at the end of the estimator's
    ``fit``): each training sample's target is its best level, the labelled
    grid assignment of PFAT Eq. 5 over ``levels`` with the trained
    classifier (largest estimated radius among levels where the smoothed
    prediction is the label; 500 samples per level, each radius the one a
    certificate from the estimator's sampler's ``n`` (or ``n_max``) samples
    would get at that frequency), reused from PFAT's schedule when its
    assignment is that grid. The selector is trained on
    these targets with ``selector_objective`` (by default consistency
    regularization: cross-entropy on two noisy copies plus their
    disagreement) under Gaussian noise of ``selector_sigma`` (so that its
    smoothed version is accurate), with the estimator's optimizer, learning
    rate and batch size, for ``selector_epochs`` epochs, starting from the
    classifier's weights where they fit (``init_from_classifier``).

    With ``target_neighbors=k`` (default 100) each sample's target is the level
    with the largest estimated radius averaged over its ``k`` nearest
    training inputs (Euclidean, itself included; always from the selector's
    own assignment, never PFAT's): where neighbouring inputs' best levels are
    split between levels that certify about the same radius, the targets
    then agree on one level, which the smoothed selector can learn with
    confidence (a large ``p1``, so ``R1`` does not cap the radius). Only the
    training targets change; the guarantee above holds for any selector.

    With ``min_level_gain=g`` the targets are drawn only from the levels
    that earn their place: greedily from the best fixed level on the
    training set, each kept level raises the training set's total best
    radius by at least the fraction ``g``
    (:func:`~smoothsk.sigma._selector_training.useful_levels`). Many close
    levels (PFAT's grid) then do not split the targets between levels that
    certify about the same radius. Training samples that no level
    classifies correctly are always left out of the selector's training.

    ``selector_objective`` is any training objective of
    :mod:`smoothsk.training`, its labels the target
    levels and every sample's noise level ``selector_sigma``: e.g.
    ``GaussianNoise(num_noise=m)`` (``m`` noisy copies per input and step) or
    ``Macer(...)``, whose hinge on the soft radius (Zhai et al. 2020, Eq.
    8-10) pushes the selector's smoothed top-level probability, hence ``p1``
    and ``R1``, up. This too changes only how the selector is trained.

    Parameters
    ----------
    levels : array-like of float, shape (K,), or None, default=None
        Noise levels to choose from, distinct and > 0; the selector's logit
        ``k`` scores ``levels[k]``. None takes the classifier's grid
        (:func:`~smoothsk.sigma.classifier_levels`): a
        :class:`~smoothsk.experts.NoiseLevelExperts`' levels, else the
        training schedule's ``noise_levels()`` (PFAT's assignment grid,
        Insta-RS's levels ``sqrt(l) * sigma0``, a fixed sigma alone).
    selector : torch.nn.Module class or instance, or None, default=None
        Module returning (batch, K) logits. A class is built with
        ``n_classes=K`` when it takes ``n_classes``. None means the
        estimator's module class with ``n_classes=K`` (and its ``module__``
        parameters) when it takes ``n_classes``, else a ``FlatMLP``.
        A given class or instance is tried on one training input before
        any training: ``fit`` raises (naming ``selector``) if it cannot be
        built, fails on the input or does not return K logits.
        An instance is never changed: ``fit`` trains a copy of it. Set
        after ``fit``, a module is the fitted one only with the same class,
        attributes and weights; else ``certify`` asks for a refit.
    fit_selector : bool, default=True
        Train the selector in ``fit``. False uses the given module
        instance as it is.
    selector_sigma : float or None, default=None
        Noise level of the selector's smoothing (and of its training noise).
        It bounds every radius: even with all ``n`` samples on the top
        level, ``R1 <= selector_sigma * PhiInv((alpha_share * alpha) ** (1 / n))``
        (the one-sided Clopper-Pearson bound at ``k = n``), e.g. 3.17 x
        ``selector_sigma`` at ``n=10_000`` and 2.08 x at ``n=400`` (``alpha =
        0.001``, ``alpha_share=0.5``); where the training targets are mixed
        (levels that certify about the same radius), a larger
        ``selector_sigma`` averages them over a wider neighbourhood, so
        the selector follows the majority level there and stays confident.
        Too large a value blurs the structure that decides the level.
        None means the largest level (the best of the values measured,
        see ``SELECTOR_NOISE_PER_LEVEL``).
    n : int, default=10_000
        Estimation samples of the selector's certificate (and its PREDICT).
    n0 : int, default=100
        Selection samples of the selector's certificate.
    alpha_share : float, default=0.1
        Fraction of the estimator's ``alpha`` the selector's certificate
        uses, in (0, 1).
    selector_epochs : int or None, default=None
        Training epochs of the selector; None means the estimator's
        ``max_epochs``.
    target_neighbors : int or None, default=100
        Number of nearest training inputs whose estimated radii are
        averaged for each training target (above); None takes each
        sample's own best level (on real MNIST, selector noise 1.5, plain
        certificate: ACR 0.83 against 1.00 with 100 neighbours). The neighbour search costs
        ``O(n_train^2 d)`` (scikit-learn ``NearestNeighbors``).
    min_level_gain : float or None, default=0.02
        Targets only among the levels that earn their place (above): each
        kept level raises the training set's total best radius by at least
        this fraction. None takes every level.
    certify_reachable_levels : bool, default=True
        Where the selector's ``R1`` caps the certificate (``R1 < R2``), also
        certify the classifier at each level the selector may switch to
        within ``R2``, and widen the radius to ``min(R2, min_j max(R_j,
        rho_j))``: ``rho_j`` the radius within which the selector cannot
        switch to level ``j`` (with ``level_threshold``, from one bound per
        boundary between levels, see that parameter; with the argmax, from
        simultaneous bounds on every level's smoothed probability: the
        chosen one's at ``alpha_share * alpha / 2``, each other's at
        ``alpha_share * alpha / (2 (K - 1))``; level ``j`` must overtake the
        chosen one and reach ``1/K``), ``R_j``
        level ``j``'s radius where it certifies the same class, else 0.
        An input whose selector is unsure at ``x`` itself is certified where
        every level it may take there certifies the class (radius > 0), and
        abstains elsewhere.
        ``G`` is then constant on the ball whichever level the selector
        switches to. The classifier's alpha is split evenly over the
        ``K`` levels' certificates in advance (each at ``(1 - alpha_share)
        * alpha / K``); the other levels are sampled (at a stage of their
        own) only where they can widen a radius, so the cost is up to ``K
        - 1`` more classifier certificates for the capped inputs. Same
        classifier ``G``, same ``predict``; only the certificate changes.
        On real MNIST (three Gaussian LeNet experts, n = 100,000, the 500
        certify images) it lifts the ACR from 1.272 to 1.441 (+13%; R1
        caps 40% of the radii) for 6% more samples; False gives the plain
        ``min(R1, R2)`` above.
    reachable_n : int or None, default=20_000
        Classifier samples of each other level's certificate with
        ``certify_reachable_levels``, at most the sampler's ``n``
        (``prediction_sample_size``; None takes it): a one-sided
        Clopper-Pearson bound on the probability of the class the chosen
        level certifies (fixed before these samples are drawn, so no
        selection samples). A level is sampled only where its certificate
        can widen the radius. On real MNIST (three Gaussian LeNet experts,
        n = 100,000, 150 images) 20,000 certifies 1.1% less ACR than the
        sampler's n, with 18% more samples per image than one expert's
        certificate against 53%.
    selector_objective : BaseObjective or None, default=None
        Training objective of the selector (above), called with a view of
        the selector that has ``module_`` (the selector), ``criterion_``
        (cross-entropy) and ``noise_generator_``: ``GaussianNoise``,
        ``Consistency`` or ``Macer`` (``SmoothAdv`` needs the estimator's
        training history and is not supported). None means
        ``Consistency(lbd=5.0, eta=0.5)`` (Jeong and Shin 2020 on two noisy
        copies): its agreement term makes the smoothed selector confident,
        so ``p1`` and the radii ``rho_j`` grow (on real MNIST, plain
        certificate: ACR 1.13 against 1.07 with cross-entropy on one copy).
    init_from_classifier : bool, default=True
        Start the selector's training from the trained classifier's
        weights: every parameter and buffer of the same name, shape and
        dtype (:func:`~smoothsk.sigma._selector_training.start_from_classifier`),
        for experts per level from the expert of the level nearest
        ``selector_sigma_`` (the larger of two as near). A selector built as
        the classifier's class with K outputs (the default) so starts with
        every layer but the output layer (that one too where the classifier
        has K classes): with the features that tell a robust input from a
        fragile one, which decide its level. A given
        selector instance keeps its own weights. The classifier is never
        changed (the values are copied). On real MNIST (three Gaussian LeNet
        experts, n = 10,000, the 500 certify images) the router certifies
        ACR 1.358 (1.00x the best expert) against 1.334 (0.98x) from the
        selector's own initial weights, and R1 caps 41% of the correct
        images against 50%; at n = 100,000 it gains as much with targets
        scored at n = 10,000 (1.426 against 1.400) and ties with targets
        scored at n = 100,000 (1.436 against 1.441). On the synthetic task of
        ``benchmarks/bench_selector_configurations.py`` (one PFAT model)
        both certify 1.28-1.29x the best fixed sigma.
    level_threshold : float in (0, 1) or None, default=0.3
        How the smoothed selector's votes name the level. None: the level
        with the most votes (the argmax above, Dual RS's rule). A float
        ``t``: the largest level that at least a fraction ``t`` of the
        votes reach, on it or on a larger level: ``k(x) = max{k :
        P(selector(x + e) picks a level >= levels[k]) >= t}``
        (:func:`~smoothsk.statistics.quantile_class`; the median level for
        1/2). A threshold below 1/2 moves each boundary between two levels
        towards the smaller one, so that where the selector takes the larger
        level, whose certificates reach further, it stays there over a wider
        ball: the radius within which it cannot fall to a smaller level is
        ``selector_sigma * (PhiInv(L) - PhiInv(t))``, ``L`` the lower bound on
        the votes reaching the chosen level, against about half the gap
        between the two levels' ``PhiInv`` bounds for the argmax. Each of
        the ``K - 1`` boundaries between levels is bounded once, on the side
        the candidate level fixes, at ``alpha_share * alpha / (K - 1)``
        (proof in ``_certify_quantile``); ``predict`` keeps the level where
        one-sided binomial tests of both boundaries around it reject at
        ``alpha_share * alpha / 2`` (:func:`~smoothsk.statistics.quantile_test`).
        It defines the classifier ``G``; the selector's training does not
        change, so it can be set after ``fit``. 0.3 was the best of 0.1-0.5
        on 150 real-MNIST validation images (replays of the certificate over
        the routers' own votes and the experts' n = 100,000 certificates):
        ACR +3.3% over the argmax with Gaussian experts and +1.8% with
        SmoothAdv + Consistency experts (1.016x and 1.012x the best expert);
        on the synthetic task of ``benchmarks/bench_selector_configurations.py``
        it certifies what the argmax does (1.29x and 1.28x the best fixed
        sigma).

    Attributes
    ----------
    levels_ : ndarray of float, shape (K,)
        The levels in use.
    selector_sigma_ : float
        The selector's noise, resolved at fit (``selector_sigma``, or its
        default then): training and certificates use it, and a model file
        keeps it.
    selector_module_ : torch.nn.Module or None
        The selector (None when K = 1).
    train_levels_ : ndarray of int, shape (n_train,) or None
        Training targets (index into ``levels_``; -1 for a sample that no
        level classifies correctly, left out of the selector's training),
        None without training.

    References
    ----------
    C. Sun, Y. Mao, M. Vechev. Dual Randomized Smoothing: Beyond Global
    Noise Variance (ICLR 2026; arXiv 2512.01782), Sec. 4: certification with
    a noise level that is locally constant, from a smoothed variance
    estimator. J. Cohen, E. Rosenfeld, Z. Kolter. Certified Adversarial
    Robustness via Randomized Smoothing (ICML 2019): CERTIFY and PREDICT.
    L. Wang et al. (PFAT), Eq. 5: the labelled level assignment.

    Examples
    --------
    >>> CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), n=1000)
    CertifiedSigmaSelector(levels=(0.25, 0.5, 1.0), n=1000)
    """

    _parameter_constraints = {
        "levels": ["array-like", None],
        "selector": [callable, None],
        "fit_selector": ["boolean"],
        "selector_sigma": [Interval(Real, 0, None, closed="neither"), None],
        "n": [SAMPLE_SIZE],
        "n0": [SAMPLE_SIZE],
        "alpha_share": [Interval(Real, 0, 1, closed="neither")],
        "selector_epochs": [Interval(Integral, 0, None, closed="left"), None],
        "target_neighbors": [Interval(Integral, 1, None, closed="left"), None],
        "selector_objective": [HasMethods(["loss"]), None],
        "min_level_gain": [Interval(Real, 0, None, closed="left"), None],
        "certify_reachable_levels": ["boolean"],
        "reachable_n": [SAMPLE_SIZE, None],
        "init_from_classifier": ["boolean"],
        "level_threshold": [Interval(Real, 0, 1, closed="neither"), None],
    }
    _refit_free_parameters = ("n", "n0", "alpha_share", "certify_reachable_levels", "reachable_n",
                              "level_threshold")

    def __init__(self, levels=None, selector=None, fit_selector=True, selector_sigma=None, n=10_000, n0=100,
                 alpha_share=0.1, selector_epochs=None, target_neighbors=100, selector_objective=None,
                 min_level_gain=0.02, certify_reachable_levels=True, reachable_n=20_000, init_from_classifier=True,
                 level_threshold=0.3):
        self.levels = levels
        self.selector = selector
        self.fit_selector = fit_selector
        self.selector_sigma = selector_sigma
        self.n = n
        self.n0 = n0
        self.alpha_share = alpha_share
        self.selector_epochs = selector_epochs
        self.target_neighbors = target_neighbors
        self.selector_objective = selector_objective
        self.min_level_gain = min_level_gain
        self.certify_reachable_levels = certify_reachable_levels
        self.reachable_n = reachable_n
        self.init_from_classifier = init_from_classifier
        self.level_threshold = level_threshold

    def _check_consistency(self):
        if self.levels is not None:
            try:
                levels = np.asarray(self.levels)
            except ValueError:  # ragged, or nested deeper than numpy's dimensions
                levels = np.empty(0)
            if (levels.ndim != 1 or len(levels) == 0 or levels.dtype.kind not in "iuf"
                    or not np.all(np.isfinite(levels)) or np.any(levels <= 0)
                    or len(np.unique(levels)) != len(levels)):
                raise ValueError(f"levels must be a non-empty 1-D sequence of distinct finite noise levels > 0, "
                                 f"or None; got {quoted(self.levels)}.")
        selector = self.selector
        is_class = isinstance(selector, type) and issubclass(selector, torch.nn.Module)
        if selector is not None and not (is_class or isinstance(selector, torch.nn.Module)):
            raise ValueError(f"selector must be a torch.nn.Module class or instance returning (batch, K) "
                             f"logits, or None; got {selector!r}.")
        if not self.fit_selector and not isinstance(selector, torch.nn.Module):
            raise ValueError(f"fit_selector=False uses a given selector as it is: selector must be a trained "
                             f"torch.nn.Module instance; got {selector!r}.")

    # ----------------------------------------------------------------- fitting

    def _default_component(self, name):
        if name != "selector_objective":
            return None
        return Consistency(lbd=5.0, eta=0.5)

    def _check_before_fit(self, levels, X):
        # levels=None needs a classifier with a grid; a given module, or one built from a given class (on a
        # probe, the global random state untouched), must take the inputs and return K logits.
        n_levels = len(self._resolve_levels(levels))
        if self.selector is None or n_levels == 1:
            return
        if isinstance(self.selector, torch.nn.Module):
            self._check_outputs(self.selector, X[:1], n_levels)
            return
        with torch.random.fork_rng(devices=[]):  # a built class's construction and probe draw nothing global
            self._check_outputs(_construct(self.selector, {}, n_levels, X[:1]), X[:1], n_levels)

    def _resolve_levels(self, classifier_levels):
        """``levels`` as float64, or where None the classifier's grid ``classifier_levels``."""
        if self.levels is not None:
            return np.asarray(self.levels, dtype=np.float64)
        if classifier_levels is None:
            raise ValueError("levels=None takes the classifier's grid of noise levels (its experts' levels, or the "
                             "training schedule's grid), but it has none (e.g. DDRS's continuous sigma); pass "
                             "levels, e.g. levels=(0.25, 0.5, 1.0).")
        return classifier_levels

    def _fit_sigma(self, context, X, y):
        self.levels_ = self._resolve_levels(context.levels)
        # Resolved once, at fit: the selector certifies at the noise it was trained with, whatever later
        # versions' default (a model file keeps this value, not None).
        self.selector_sigma_ = (float(self.selector_sigma) if self.selector_sigma is not None
                                else SELECTOR_NOISE_PER_LEVEL * float(np.max(self.levels_)))
        self.train_levels_ = None
        n_levels = len(self.levels_)
        if n_levels == 1:
            self.selector_module_ = None
            return self
        if self.fit_selector:
            epochs = context.max_epochs if self.selector_epochs is None else self.selector_epochs
            if epochs is None:  # before the targets, the costly part of the fit
                raise ValueError("max_epochs=None: the selector trains for the estimator's max_epochs when "
                                 "selector_epochs is None; set either to an int >= 0.")
            self.train_levels_ = training_targets(context, X, y, self.levels_, self.target_neighbors,
                                                  self.min_level_gain)
            module = self._build_module(context, X, n_levels).to(context.device)
            if self.init_from_classifier and not isinstance(self.selector, torch.nn.Module):
                start_from_classifier(module, context.classifier, self.selector_sigma_)
            train_selector(context, module, X.to(context.device),
                           torch.as_tensor(self.train_levels_, device=context.device),
                           self._component("selector_objective"), self.selector_sigma_, epochs)
        else:
            module = self.selector.to(context.device)  # the estimator's clone: the user's module is untouched
        self._check_outputs(module, X[:1].to(context.device), n_levels)
        self.selector_module_ = module.eval()
        return self

    def _build_module(self, context, X, n_levels):
        """The selector to train: given, the classifier's class with K outputs, or a FlatMLP."""
        selector, kwargs = self.selector, {}
        if selector is None:
            selector, kwargs = ((context.module_class, context.module_params) if context.module_class is not None
                                else (FlatMLP, {}))
        if isinstance(selector, torch.nn.Module):
            # A copy: the parameter keeps the weights training starts from (what with_fitted_state compares).
            return copy.deepcopy(selector)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(context.seed(SELECTOR_INIT_SALT))
            return _construct(selector, kwargs, n_levels, X[:1])

    # ------------------------------------------------------------------ saving

    def fitted_arrays(self):
        """The fitted state as named CPU tensors, for a safe file (:mod:`smoothsk._persistence`).

        Returns
        -------
        arrays : dict of str to torch.Tensor
            ``levels``: ``levels_``, float64, shape (K,); ``selector_sigma``:
            ``selector_sigma_``, float64, shape (); ``train_levels``:
            ``train_levels_``, int64, shape (n_train,), when the selector was
            trained here; ``selector.<key>``: the selector module's
            ``state_dict`` (when K > 1).
        """
        arrays = {"levels": torch.from_numpy(np.array(self.levels_, dtype=np.float64)),
                  "selector_sigma": torch.tensor(self.selector_sigma_, dtype=torch.float64)}
        if self.train_levels_ is not None:
            arrays["train_levels"] = torch.from_numpy(np.array(self.train_levels_, dtype=np.int64))
        if self.selector_module_ is not None:
            arrays.update((f"selector.{key}", value.detach().to("cpu", copy=True).contiguous())
                          for key, value in self.selector_module_.state_dict().items())
        return arrays

    def restore_fitted(self, estimator, arrays, source):
        """Set the fitted state :meth:`fitted_arrays` returned, after checking it.

        Parameters, return value and errors: the saving contract of
        :class:`~smoothsk.sigma.BaseCertifiedSigma`. The selector module is
        rebuilt as ``fit`` built it (from ``selector`` or the estimator's
        module parameters, with K outputs, on a probe of shape ``(1,
        *estimator.input_shape_)``) and receives the saved weights on
        ``estimator.device``.
        """
        levels = arrays.get("levels")
        if not (isinstance(levels, torch.Tensor) and levels.dtype == torch.float64 and levels.ndim == 1
                and len(levels) > 0 and bool(torch.all(levels > 0)) and bool(torch.all(torch.isfinite(levels)))
                and len(torch.unique(levels)) == len(levels)):
            raise ValueError(f"{source}: sigma_search_ levels must be a non-empty float64 vector of distinct "
                             f"finite noise levels > 0; got {levels!r}.")
        self.levels_ = levels.numpy()
        noise = arrays.get("selector_sigma")
        if not (isinstance(noise, torch.Tensor) and noise.dtype == torch.float64 and noise.ndim == 0
                and bool(torch.isfinite(noise)) and float(noise) > 0):
            raise ValueError(f"{source}: sigma_search_ selector_sigma must be a float64 scalar noise level > 0; "
                             f"got {noise!r}.")
        self.selector_sigma_ = float(noise)
        n_levels = len(self.levels_)
        self.train_levels_ = arrays.get("train_levels")
        if self.train_levels_ is not None:
            self.train_levels_ = self.train_levels_.numpy()
            if (self.train_levels_.dtype != np.int64 or self.train_levels_.ndim != 1
                    or np.any(self.train_levels_ < -1) or np.any(self.train_levels_ >= n_levels)):
                raise ValueError(f"{source}: sigma_search_ train_levels must be an int64 vector of indices "
                                 f"into the {n_levels} levels, or -1 (no target).")
        state = {name.removeprefix("selector."): value for name, value in arrays.items()
                 if name.startswith("selector.")}
        unknown = sorted(set(arrays) - {"levels", "selector_sigma", "train_levels"}
                         - {f"selector.{key}" for key in state})
        if unknown:
            raise ValueError(f"{source}: sigma_search_ has arrays {unknown} that a CertifiedSigmaSelector "
                             "does not use.")
        if n_levels == 1:
            if state:
                raise ValueError(f"{source}: sigma_search_ has one level, which needs no selector, but the file "
                                 "holds selector weights.")
            self.selector_module_ = None
            return self

        context = SigmaFitContext.from_estimator(estimator)

        def build():  # on the meta device first (build_from_file): the probe takes no memory there either
            return self._build_module(context, torch.zeros((1, *estimator.input_shape_)), n_levels)

        module = build_from_file(build, state, source, "sigma_search_ selector")
        self.selector_module_ = module.to(context.device).eval()
        return self

    @staticmethod
    def _check_outputs(module, X, n_levels):
        with evaluating(module):
            shape = tuple(_probe(module, X, n_levels).shape)
        if shape != (len(X), n_levels):
            raise ValueError(f"The selector ({type(module).__name__}) returns outputs of shape {shape} for "
                             f"{len(X)} input(s); CertifiedSigmaSelector needs one logit per level: shape "
                             f"({len(X)}, {n_levels}).")

    # ------------------------------------------------------------ certifying

    def _selector_engine(self, engine):
        if not hasattr(self, "levels_"):
            raise NotFittedError("This CertifiedSigmaSelector is not fitted: the estimator fits it in fit.")
        if self.selector_module_ is None:
            return None
        module = self.selector_module_.to(engine.device).eval()
        return engine.with_module(_SmallestLevelWhereUndefined(module, np.argmin(self.levels_)), len(self.levels_))

    def _certify_sigma(self, engine, X, alpha):
        n_inputs = len(X)
        selector = self._selector_engine(engine)
        if selector is None:  # one level: sigma(.) is constant everywhere
            return CertifiedSigmaResult(np.full(n_inputs, self.levels_[0]), np.zeros(n_inputs, dtype=np.int64),
                                        np.full(n_inputs, np.inf), np.zeros(n_inputs, dtype=np.int64),
                                        np.zeros(n_inputs, dtype=bool))
        noise = np.full(n_inputs, self.selector_sigma_)
        if self.level_threshold is not None:
            return self._certify_quantile(selector, X, noise, alpha)
        if self.certify_reachable_levels:
            return self._certify_reachable(selector, X, noise, alpha)
        # Cohen et al.'s CERTIFY on the selector (levels as classes): the candidate level from n0 samples, its
        # bound from n fresh ones; p_lower > 1/2 makes it the smoothed selector's unique top level on B(x, R1).
        certified = FixedSampler(n=self.n, n0=self.n0).certify(selector, X, noise, alpha,
                                                               stage=CERTIFIED_SIGMA_CERTIFY)
        abstain = certified.prediction == ABSTAIN
        return CertifiedSigmaResult(self.levels_[certified.candidate], np.zeros(n_inputs, dtype=np.int64),
                                    certified_radius(self.selector_sigma_, certified.p_lower), certified.n_samples,
                                    abstain)

    def _certify_reachable(self, selector, X, noise, alpha):
        """The chosen level and, for every other level, a radius within which the selector cannot switch to it.

        The same samples as the plain certificate (stages of
        ``CERTIFIED_SIGMA_CERTIFY``), bounded simultaneously: the chosen
        level's probability from below at ``alpha / 2`` and each other
        level's from above at ``alpha / (2 (K - 1))`` (union bound). Cohen et
        al.'s Theorem 1 bounds how each moves on a ball of radius ``r``
        (noise ``s``): ``P_k(x') >= Phi(PhiInv(p_k) - r / s)`` and ``P_j(x')
        <= Phi(PhiInv(p_j) + r / s)``. Level ``j`` can be the top level at
        ``x'`` only if ``P_j(x') >= P_k(x')`` and ``P_j(x') >= 1 / K`` (the
        largest of K probabilities that sum to 1), so not within ``rho_j =
        max(s * (PhiInv(p_k) - PhiInv(p_j)) / 2, s * (PhiInv(1 / K) -
        PhiInv(p_j)))``: strictly inside, ``P_j(x')`` is below one of them.

        Nothing here needs the chosen level ``k`` to be the top level at
        ``x`` itself: where the selector is unsure (``p_k <= 1/2``) some
        ``rho_j`` are 0, and the estimator's certificate then needs those
        levels to certify the class at ``x`` too
        (``smoothsk._certification._widen_to_reachable_levels``). So no
        input abstains here; ``radius_cap`` (the smallest ``rho_j``) is 0
        where another level may be the top one at ``x``.
        """
        n_levels = len(self.levels_)
        selection = selector.class_counts(X, noise, self.n0, CERTIFIED_SIGMA_SELECTION)
        estimation = selector.class_counts(X, noise, self.n, CERTIFIED_SIGMA_ESTIMATION)
        chosen = selection.argmax(axis=1)
        rows = np.arange(len(X))
        top_lower = clopper_pearson_lower(estimation[rows, chosen], self.n, alpha / 2)
        other_upper = 1.0 - clopper_pearson_lower(self.n - estimation, self.n, alpha / (2 * (n_levels - 1)))
        other_z = norm.ppf(other_upper)
        below_chosen = noise[:, None] * (norm.ppf(top_lower)[:, None] - other_z) / 2
        below_one_in_k = noise[:, None] * (norm.ppf(1.0 / n_levels) - other_z)
        return self._level_result(chosen, np.maximum(below_chosen, below_one_in_k))

    def _certify_quantile(self, selector, X, noise, alpha):
        """The level ``level_threshold`` of the votes reach, and for every other level a radius it stays out of.

        Levels in increasing order ``0 .. K - 1``; ``S_b(x)`` the smoothed
        selector's probability of a level ``>= b`` (boundary ``b = 1 .. K -
        1``), and ``k(x) = max{k : S_k(x) >= t}`` (``t = level_threshold``;
        :func:`~smoothsk.statistics.quantile_class`). The candidate ``m``
        comes from ``n0`` samples (stage ``CERTIFIED_SIGMA_SELECTION``); ``n``
        fresh ones (``CERTIFIED_SIGMA_ESTIMATION``) bound each boundary once,
        on the side ``m`` fixes: from below for ``b <= m``, from above for
        ``b > m``, each at ``alpha / (K - 1)`` (union bound).

        **Proof.** Each ``S_b`` is a smoothed probability (of the event
        "level ``>= b``"), so ``PhiInv(S_b)`` is ``1 / s``-Lipschitz (Cohen
        et al., Theorem 1 / Salman et al., Lemma 2; noise ``s``). Level ``j
        < m`` needs ``S_{j+1}(x') < t``, but ``S_{j+1}(x') >= Phi(PhiInv(L_{j+1})
        - r / s)``, so not within ``rho_j = s (PhiInv(L_{j+1}) - PhiInv(t))``;
        level ``j > m`` needs ``S_j(x') >= t``, but ``S_j(x') <=
        Phi(PhiInv(U_j) + r / s)``, so not within ``rho_j = s (PhiInv(t) -
        PhiInv(U_j))`` (strictly inside each ball the inequality is strict).
        Nothing needs ``m`` to be ``k(x)``: where a bound crosses ``t`` some
        ``rho_j`` are 0, and those levels must certify the class at ``x``
        too (``smoothsk._certification._widen_to_reachable_levels``), or,
        with ``certify_reachable_levels=False``, the input abstains (its
        ``R1 = min_j rho_j`` is 0).

        A threshold below 1/2 moves the boundary between two levels towards
        the smaller one, so that where the selector takes the larger level
        it stays there over a wider ball: ``rho`` of the levels below is
        ``s (PhiInv(L) - PhiInv(t))``, against half the gap between the two
        levels' bounds for the argmax.
        """
        n_levels = len(self.levels_)
        ascending = self._ascending_levels()
        selection = selector.class_counts(X, noise, self.n0, CERTIFIED_SIGMA_SELECTION)[:, ascending]
        estimation = selector.class_counts(X, noise, self.n, CERTIFIED_SIGMA_ESTIMATION)[:, ascending]
        chosen = quantile_class(selection, self.level_threshold)
        reaching = votes_reaching(estimation)[:, 1:]  # boundaries b = 1 .. K - 1
        bound_alpha = alpha / (n_levels - 1)
        below = np.arange(1, n_levels)[None, :] <= chosen[:, None]  # b <= m: bounded from below
        z = norm.ppf(np.where(below, clopper_pearson_lower(reaching, self.n, bound_alpha),
                              1.0 - clopper_pearson_lower(self.n - reaching, self.n, bound_alpha)))
        z_threshold = norm.ppf(self.level_threshold)
        reach = np.zeros((len(X), n_levels))
        reach[:, :-1] = np.where(below, noise[:, None] * (z - z_threshold), 0.0)  # j < m: boundary j + 1
        reach[:, 1:] += np.where(below, 0.0, noise[:, None] * (z_threshold - z))  # j > m: boundary j
        in_order = np.empty_like(reach)
        in_order[:, ascending] = reach
        return self._level_result(ascending[chosen], in_order)

    def _level_result(self, chosen, reach):
        """The certified level and its radius from every other level's ``rho_j``.

        Parameters
        ----------
        chosen : ndarray of shape (n_inputs,)
            Index into ``levels_`` of each input's chosen level.
        reach : ndarray of shape (n_inputs, n_levels)
            ``rho_j``, in ``levels_``' order: the radius within which input
            ``i``'s selector cannot take level ``j`` (negative values mean
            0; the chosen level's entry is ignored).

        Returns
        -------
        CertifiedSigmaResult
            The chosen levels with ``radius_cap = min_j rho_j`` (``R1`` of
            ``G``'s certificate). With ``certify_reachable_levels``, also
            every ``rho_j`` (``level_reach``) for the widening, and no input
            abstains; else the plain certificate, abstaining where ``R1`` is
            0.
        """
        n_inputs = len(chosen)
        rows = np.arange(n_inputs)
        reach = np.maximum(reach, 0.0)
        reach[rows, chosen] = 0.0
        others = np.ones_like(reach, dtype=bool)
        others[rows, chosen] = False
        radius_cap = reach[others].reshape(n_inputs, len(self.levels_) - 1).min(axis=1)
        sigma, n_samples = self.levels_[chosen], np.full(n_inputs, self.n0 + self.n, dtype=np.int64)
        if not self.certify_reachable_levels:
            # The plain certificate: the level is constant on B(x, R1), R1 = min_j rho_j; 0 (unsure at x) abstains.
            return CertifiedSigmaResult(sigma, np.zeros(n_inputs, dtype=np.int64), radius_cap, n_samples,
                                        radius_cap <= 0)
        return CertifiedSigmaResult(sigma, np.zeros(n_inputs, dtype=np.int64), radius_cap, n_samples,
                                    np.zeros(n_inputs, dtype=bool), reach, self.levels_.copy())

    def _ascending_levels(self):
        """Indices that sort ``levels_`` increasingly: the threshold rule's quantiles need the levels' order."""
        return np.argsort(self.levels_, kind="stable")

    def predict_sigma(self, engine, X, alpha):
        self.validate()
        selector = self._selector_engine(engine)
        if selector is None:
            return np.full(len(X), self.levels_[0]), np.zeros(len(X), dtype=bool)
        counts = selector.class_counts(X, np.full(len(X), self.selector_sigma_), self.n,
                                       CERTIFIED_SIGMA_PREDICTION)
        if self.level_threshold is None:
            top, abstain = top_two_test(counts, alpha)
            return self.levels_[top], abstain
        ascending = self._ascending_levels()
        chosen, abstain = quantile_test(counts[:, ascending], self.level_threshold, alpha)
        return self.levels_[ascending[chosen]], abstain
