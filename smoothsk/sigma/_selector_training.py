"""Training of the certified sigma selector: each training sample's target level, and the training loop.

Only how the selector is trained lives here; the guarantee of
:class:`~smoothsk.sigma.CertifiedSigmaSelector` holds for any selector.
"""

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.neighbors import NearestNeighbors

from .._modes import evaluating
from .._stages import (
    SELECTOR_ASSIGNMENT_SALT,
    SELECTOR_MODULE_RANDOMNESS_SALT,
    SELECTOR_SHUFFLE_SALT,
    SELECTOR_TRAIN_NOISE_SALT,
)
from ..experts import takes_noise_level
from ._grid import sigma_radii

#: Monte Carlo samples per level and failure probability of the labelled level
#: assignment that makes the selector's training targets (PFAT Eq. 5, App. A.1).
_ASSIGN_SAMPLES = 500
_ASSIGN_ALPHA = 0.001

#: How often the selector's training restarts after its loss diverged, each time at this factor on the rate.
_RESTARTS = 3
_RESTART_LR_FACTOR = 0.25


@dataclass(frozen=True)
class _SelectorNet:
    """What a training objective reads from the net it trains (``BaseObjective.loss``): here, the selector's.

    ``history`` has one entry per epoch begun, as skorch's: the running
    epoch for a SmoothAdv warm-up or a deferred MACER term.
    """

    module_: torch.nn.Module
    criterion_: torch.nn.Module
    noise_generator_: torch.Generator
    history: list


def training_targets(context, X, y, levels, target_neighbors=None, min_level_gain=None):
    """Each training sample's target level (PFAT Eq. 5 over ``levels``), as an index into ``levels``; -1 for none.

    The schedule's own assignment where it is this one (the same grid, a
    level for every sample) and neither neighbours nor level gains are
    asked for; else the trained classifier's estimated radius at each level
    (500 samples, largest among levels where the smoothed prediction is the
    label), from the seed of :data:`~smoothsk._stages.SELECTOR_ASSIGNMENT_SALT`,
    each radius the one a certificate of the estimator's budget would get at
    that frequency (``sigma_radii``'s ``budget``): 500 samples alone cap a
    small level's radius well below its cap at the budget, and would send
    the selector to large levels that certify less.
    A sample that no level classifies correctly gets no target (-1): it
    says nothing about which level serves it, and as the first level among
    ties (radius 0 everywhere) it would push the selector to the smallest
    level.

    Parameters
    ----------
    context : SigmaFitContext
    X : torch.Tensor, shape (n_train, *input_shape)
    y : torch.Tensor of int64, shape (n_train,)
        Class indices.
    levels : ndarray of float, shape (K,)
    target_neighbors : int or None, default=None
        The best level of the radii averaged over each sample's nearest
        training inputs (itself included; never the schedule's assignment).
    min_level_gain : float or None, default=None
        Targets only among the levels :func:`useful_levels` keeps at this
        gain; None: among all levels.

    Returns
    -------
    targets : ndarray of int, shape (n_train,)
        Index into ``levels``, or -1 where the sample has no target.
    """
    assigned, train_sigmas = context.assignment_levels, context.train_sigmas
    if (target_neighbors is None and min_level_gain is None and assigned is not None and train_sigmas is not None
            and len(train_sigmas) == len(X) and np.array_equal(np.sort(assigned), np.sort(levels))):
        # The schedule's own assignment is this one: reuse it.
        match = np.isclose(train_sigmas[:, None], levels[None, :], rtol=0, atol=1e-9)
        if match.any(axis=1).all():
            return match.argmax(axis=1)
    engine = context.classifier_engine(root_seed=context.seed(SELECTOR_ASSIGNMENT_SALT))
    with evaluating(engine.module):
        radius = sigma_radii(engine, X, levels, _ASSIGN_SAMPLES, _ASSIGN_ALPHA, y.cpu().numpy(),
                             budget=context.certify_samples)
    uncertified = radius.max(axis=0) == 0
    if target_neighbors is not None:
        flat = X.reshape(len(X), -1).cpu().numpy()
        neighbors = NearestNeighbors(n_neighbors=min(target_neighbors, len(X))).fit(flat)
        radius = radius[:, neighbors.kneighbors(flat, return_distance=False)].mean(axis=2)  # (K, n_train)
    kept = np.arange(len(levels)) if min_level_gain is None else useful_levels(radius, min_level_gain)
    targets = kept[radius[kept].argmax(axis=0)]  # PFAT Eq. 5 / best_sigma_index: the first level among ties
    return np.where(uncertified, -1, targets)


def useful_levels(radius, min_gain):
    """The levels worth a selector's choice: greedy, each raising the best radius's total by ``min_gain`` or more.

    Starting from the level of the largest total radius (the best fixed
    sigma on the training set), each step adds the level that raises
    ``sum_i max_{k in kept} radius[k, i]`` most, while that rise is at least
    ``min_gain`` times the total so far. Levels close to a kept one add
    little and stay out: the targets then do not split between levels that
    certify about the same radius (where the smoothed selector would be
    unsure, and its radius R1 would cap the certificate).

    Parameters
    ----------
    radius : ndarray of float, shape (K, n_train)
        Estimated radius of each training sample at each level (0 where
        not correct).
    min_gain : float
        Smallest relative rise of the total that earns a level its place.

    Returns
    -------
    kept : ndarray of int, shape (K',)
        Ascending indices of the kept levels, K' >= 1.
    """
    kept = [int(radius.sum(axis=1).argmax())]
    best = radius[kept[0]]
    while len(kept) < len(radius):
        rise = np.maximum(radius, best).sum(axis=1) - best.sum()
        candidate = int(rise.argmax())
        if rise[candidate] <= 0 or rise[candidate] < min_gain * best.sum():
            break
        kept.append(candidate)
        best = np.maximum(best, radius[candidate])
    return np.array(sorted(kept))


def start_from_classifier(selector, classifier, noise):
    """Copy into ``selector`` every parameter and buffer of the classifier's with the same name, shape and dtype.

    A classifier of experts per level (:class:`~smoothsk.experts.NoiseLevelExperts`)
    gives the expert of the level nearest ``noise`` (the larger of two as
    near): it was trained on inputs about as noisy as the selector's, and
    its features tell a robust input from a fragile one, which is what
    decides the level. A selector built as the classifier's class with K
    outputs so starts with all of its layers but the output layer (whose
    shape differs; where the classifier has exactly K classes, that layer
    too, a start that training then moves); one of another class keeps
    what it shares by name and shape only, e.g. nothing. The values are
    copied: training the selector leaves the classifier as it is.

    Parameters
    ----------
    selector : torch.nn.Module
        Changed in place.
    classifier : torch.nn.Module
        The trained classifier; read only.
    noise : float
        The selector's noise level.
    """
    if takes_noise_level(classifier):
        levels = np.asarray(classifier.levels, dtype=np.float64)
        distance = np.abs(levels - noise)
        nearest = np.flatnonzero(np.isclose(distance, distance.min(), rtol=1e-9, atol=0))
        classifier = classifier.experts[int(nearest[levels[nearest].argmax()])]
    state = selector.state_dict()
    shared = {key: value for key, value in classifier.state_dict().items()
              if key in state and state[key].shape == value.shape and state[key].dtype == value.dtype}
    selector.load_state_dict({**state, **shared})  # copies into the selector's own tensors


def train_selector(context, module, X, targets, objective, selector_sigma, epochs):
    """Train ``module`` in place with ``objective`` on ``(x, target level)``, every noise level ``selector_sigma``.

    Batches of the context's batch size in a shuffled order each epoch,
    with the context's optimizer; the objective sees a net whose
    ``module_`` is the selector, ``criterion_`` cross-entropy and
    ``noise_generator_`` a generator of its own. Shuffling, that noise and
    the module's own randomness (torch's global generator, restored
    afterwards) come from the seeds of the ``SELECTOR_*_SALT`` purposes.

    The selector sees its inputs at ``selector_sigma``, often twice the
    classifier's largest level: their norms, and with them the curvature of
    the loss, are several times those the estimator's learning rate was set
    for, and its training can diverge where the classifier's did not. Where
    the loss is not finite at the end of an epoch, the training restarts
    from the initial weights and the same seeds at a quarter of the rate
    (with a ``ConvergenceWarning``), up to :data:`_RESTARTS` times. A
    training that stays finite is the same with or without this: the rate
    changes only after a divergence.

    Parameters
    ----------
    context : SigmaFitContext
    module : torch.nn.Module
        On ``X``'s device; left in eval mode.
    X : torch.Tensor, shape (n_train, *input_shape)
    targets : torch.Tensor of int64, shape (n_train,)
        Index of each sample's level, on ``X``'s device; samples with -1 (no
        target) are left out.
    objective : BaseObjective
    selector_sigma : float
    epochs : int

    Raises
    ------
    FloatingPointError
        Where the training diverges at every rate tried.
    """
    X, targets = X[targets >= 0], targets[targets >= 0]
    if len(X) == 0:
        raise ValueError("No training input is classified correctly at any of the selector's levels: the selector "
                         "has no target to learn. Train the classifier longer, or check the levels.")
    initial = {name: value.clone() for name, value in module.state_dict().items()}
    rates = []
    for restart in range(_RESTARTS + 1):
        optimizer = context.optimizer_factory(module.parameters())
        for group in optimizer.param_groups:
            group["lr"] *= _RESTART_LR_FACTOR ** restart
        rates.append(optimizer.param_groups[0]["lr"])
        diverged_epoch = _train_epochs(context, module, X, targets, objective, selector_sigma, epochs, optimizer)
        if diverged_epoch is None:
            module.eval()
            return
        module.load_state_dict(initial)
        if restart < _RESTARTS:
            warnings.warn(f"The selector's training loss is not finite in epoch {diverged_epoch} at lr {rates[-1]}: "
                          f"it restarts from its initial weights at lr {rates[-1] * _RESTART_LR_FACTOR}.",
                          ConvergenceWarning, stacklevel=2)
    raise FloatingPointError(
        f"The selector's training loss is not finite in epoch {diverged_epoch} (objective "
        f"{type(objective).__name__}) at every rate tried, from the estimator's lr {rates[0]} down to {rates[-1]}: "
        f"its training diverged. Lower the estimator's lr (the selector trains with the estimator's optimizer) or "
        f"the objective's weights.")


def _train_epochs(context, module, X, targets, objective, selector_sigma, epochs, optimizer):
    """Train ``module`` as :func:`train_selector` does, with ``optimizer``: the first epoch not finite, or None."""
    batch_size = len(X) if context.batch_size is None else context.batch_size
    generator = torch.Generator(device=X.device).manual_seed(context.seed(SELECTOR_TRAIN_NOISE_SALT))
    shuffle = torch.Generator().manual_seed(context.seed(SELECTOR_SHUFFLE_SALT))
    net = _SelectorNet(module, torch.nn.CrossEntropyLoss(), generator, history=[])
    sigma = torch.full((batch_size,), float(selector_sigma), device=X.device, dtype=X.dtype)
    module.train()
    with torch.random.fork_rng(devices=[]):  # the module's own randomness (dropout)
        torch.manual_seed(context.seed(SELECTOR_MODULE_RANDOMNESS_SALT))
        finite = torch.ones((), dtype=torch.bool, device=X.device)
        for epoch in range(1, epochs + 1):
            net.history.append({"epoch": epoch})
            order = torch.randperm(len(X), generator=shuffle).to(X.device)
            for start in range(0, len(X), batch_size):
                index = order[start:start + batch_size]
                loss, _ = objective.loss(net, X[index], targets[index], sigma[:len(index)])
                finite &= torch.isfinite(loss.detach())  # read once per epoch: no host synchronisation per step
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if not finite:
                return epoch
    return None
