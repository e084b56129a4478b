"""Training of the certified sigma selector: each training sample's target level, and the training loop.

Only how the selector is trained lives here; the guarantee of
:class:`~smoothsk.sigma.CertifiedSigmaSelector` holds for any selector.
"""

from dataclasses import dataclass

import numpy as np
import torch
from sklearn.neighbors import NearestNeighbors

from .._modes import evaluating
from .._stages import (
    SELECTOR_ASSIGNMENT_SALT,
    SELECTOR_MODULE_RANDOMNESS_SALT,
    SELECTOR_SHUFFLE_SALT,
    SELECTOR_TRAIN_NOISE_SALT,
)
from ._grid import sigma_radii

#: Monte Carlo samples per level and failure probability of the labelled level
#: assignment that makes the selector's training targets (PFAT Eq. 5, App. A.1).
_ASSIGN_SAMPLES = 500
_ASSIGN_ALPHA = 0.001


@dataclass(frozen=True)
class _SelectorNet:
    """What a training objective reads from the net it trains (``BaseObjective.loss``): here, the selector's."""

    module_: torch.nn.Module
    criterion_: torch.nn.Module
    noise_generator_: torch.Generator


def training_targets(context, X, y, levels, target_neighbors=None):
    """Each training sample's best level (PFAT Eq. 5 over ``levels``), as an index into ``levels``.

    The schedule's own assignment where it is this one (the same grid, a
    level for every sample); else the trained classifier's estimated radius
    at each level (500 samples, largest among levels where the smoothed
    prediction is the label; the first level among ties), from the seed of
    :data:`~smoothsk._stages.SELECTOR_ASSIGNMENT_SALT`.

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

    Returns
    -------
    targets : ndarray of int, shape (n_train,)
    """
    assigned, train_sigmas = context.assignment_levels, context.train_sigmas
    if (target_neighbors is None and assigned is not None and train_sigmas is not None
            and len(train_sigmas) == len(X) and np.array_equal(np.sort(assigned), np.sort(levels))):
        # The schedule's own assignment is this one: reuse it.
        match = np.isclose(train_sigmas[:, None], levels[None, :], rtol=0, atol=1e-9)
        if match.any(axis=1).all():
            return match.argmax(axis=1)
    engine = context.classifier_engine(root_seed=context.seed(SELECTOR_ASSIGNMENT_SALT))
    with evaluating(engine.module):
        radius = sigma_radii(engine, X, levels, _ASSIGN_SAMPLES, _ASSIGN_ALPHA, y.cpu().numpy())
    if target_neighbors is not None:
        flat = X.reshape(len(X), -1).cpu().numpy()
        neighbors = NearestNeighbors(n_neighbors=min(target_neighbors, len(X))).fit(flat)
        radius = radius[:, neighbors.kneighbors(flat, return_distance=False)].mean(axis=2)  # (K, n_train)
    return radius.argmax(axis=0)  # PFAT Eq. 5 / best_sigma_index: the first level among ties


def train_selector(context, module, X, targets, objective, selector_sigma, epochs):
    """Train ``module`` in place with ``objective`` on ``(x, target level)``, every noise level ``selector_sigma``.

    Batches of the context's batch size in a shuffled order each epoch,
    with the context's optimizer; the objective sees a net whose
    ``module_`` is the selector, ``criterion_`` cross-entropy and
    ``noise_generator_`` a generator of its own. Shuffling, that noise and
    the module's own randomness (torch's global generator, restored
    afterwards) come from the seeds of the ``SELECTOR_*_SALT`` purposes.

    Parameters
    ----------
    context : SigmaFitContext
    module : torch.nn.Module
        On ``X``'s device; left in eval mode.
    X : torch.Tensor, shape (n_train, *input_shape)
    targets : torch.Tensor of int64, shape (n_train,)
        Index of each sample's level, on ``X``'s device.
    objective : BaseObjective
    selector_sigma : float
    epochs : int
    """
    optimizer = context.optimizer_factory(module.parameters())
    batch_size = len(X) if context.batch_size is None else context.batch_size
    generator = torch.Generator(device=X.device).manual_seed(context.seed(SELECTOR_TRAIN_NOISE_SALT))
    shuffle = torch.Generator().manual_seed(context.seed(SELECTOR_SHUFFLE_SALT))
    net = _SelectorNet(module, torch.nn.CrossEntropyLoss(), generator)
    sigma = torch.full((batch_size,), float(selector_sigma), device=X.device, dtype=X.dtype)
    module.train()
    with torch.random.fork_rng(devices=[]):  # the module's own randomness (dropout)
        torch.manual_seed(context.seed(SELECTOR_MODULE_RANDOMNESS_SALT))
        for _ in range(epochs):
            order = torch.randperm(len(X), generator=shuffle).to(X.device)
            for start in range(0, len(X), batch_size):
                index = order[start:start + batch_size]
                loss, _ = objective.loss(net, X[index], targets[index], sigma[:len(index)])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    module.eval()
