"""Stochastic gradient ascent on the radius over sigma (DDRS, Alfarra et al. 2022)."""

from numbers import Integral, Real

import numpy as np
import torch

from .._constraints import SAMPLE_SIZE, Interval
from .._stages import SEARCH_STAGE
from ..statistics import soft_margin
from ._base import BaseSigmaSearch, SigmaSearchResult

#: DDRS App. A clamps both probabilities to [0.02, 0.98] before PhiInv.
_P_CLAMP = (0.02, 0.98)


def margin_radius(probabilities, sigma, y=None):
    """DDRS's differentiable radius ``sigma / 2 * (PhiInv(p_A) - PhiInv(p_B))`` (Eq. 1, 3).

    ``p_A`` is the top probability of the soft smoothed classifier, or with
    labels the label's; ``p_B`` the largest other one. Both are clamped to
    [0.02, 0.98] as in the paper's implementation (App. A): outside that range
    the gap is constant, so a confidently classified input's radius grows
    linearly with sigma.

    Parameters
    ----------
    probabilities : torch.Tensor, shape (n_inputs, n_classes)
        Mean softmax over noisy copies.
    sigma : torch.Tensor, shape (n_inputs,)
    y : torch.Tensor of int64, shape (n_inputs,), optional
        Class indices.

    Returns
    -------
    radius : torch.Tensor, shape (n_inputs,)
    """
    gap, _ = soft_margin(probabilities, _P_CLAMP, y)
    return sigma / 2 * gap


class GradientSigmaSearch(BaseSigmaSearch):
    """Per-input stochastic gradient ascent of the soft radius over sigma (DDRS Alg. 1).

    Maximises ``E_eps[ sigma / 2 * (PhiInv(p_A) - PhiInv(p_B)) ]`` of the soft
    smoothed classifier (:func:`margin_radius`) for each input, with the
    reparameterisation trick: the ``n`` noisy copies are ``x + sigma * eps``,
    ``eps ~ N(0, I)``, so the gradient flows to sigma through the model
    (DDRS Eq. 3). Each of the ``steps`` iterations draws fresh ``eps`` and
    takes ``sigma += lr * gradient``, then clips sigma to ``[sigma_min,
    sigma_max]`` (the paper leaves sigma free; the lower bound keeps the
    noise level positive). Inputs are processed together in batches
    of ``batch_size // n`` inputs of the engine.

    The noise of input ``i`` at iteration ``k`` comes from a generator seeded
    by the engine's stream key for stage ``(SEARCH_STAGE, k)``, so results are
    reproducible, do not depend on batching, and are independent of the
    certification samples. The gradient needs autograd through the module, so
    this search runs its own forward passes (``engine.module`` on
    ``engine.device``) instead of the engine's inference-mode sampling.

    Parameters
    ----------
    sigma_init : float, default=0.25
        Starting sigma of every input (DDRS starts at the training sigma).
    steps : int, default=100
        Gradient iterations K (DDRS App. B).
    lr : float, default=1e-4
        Step size alpha (DDRS Sec. 4). It is tuned to CIFAR-10/ImageNet inputs,
        whose radius gradient is large; low-dimensional inputs need a larger one.
    n : int, default=1
        Noisy copies per input and iteration (DDRS's default n = 1).
    sigma_min : float, default=0.01
        Smallest sigma allowed, > 0.
    sigma_max : float or None, default=None
        Largest sigma allowed; None for no upper bound.

    References
    ----------
    M. Alfarra, A. Bibi, P. Torr, B. Ghanem. Data Dependent Randomized
    Smoothing (UAI 2022), Sec. 3.4, Alg. 1, App. A.

    Examples
    --------
    >>> GradientSigmaSearch(lr=0.01, sigma_max=1.0)
    GradientSigmaSearch(lr=0.01, sigma_max=1.0)
    """

    _parameter_constraints = {
        "sigma_init": [Interval(Real, 0, None, closed="neither")],
        "steps": [Interval(Integral, 0, None, closed="left")],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "n": [SAMPLE_SIZE],
        "sigma_min": [Interval(Real, 0, None, closed="neither")],
        "sigma_max": [Interval(Real, 0, None, closed="neither"), None],
    }

    def __init__(self, sigma_init=0.25, steps=100, lr=1e-4, n=1, sigma_min=0.01, sigma_max=None):
        self.sigma_init = sigma_init
        self.steps = steps
        self.lr = lr
        self.n = n
        self.sigma_min = sigma_min
        self.sigma_max = sigma_max

    def _check_consistency(self):
        if self.sigma_max is not None and self.sigma_max < self.sigma_min:
            raise ValueError(f"sigma_max ({self.sigma_max}) must be >= sigma_min ({self.sigma_min}).")

    def _search(self, engine, X, y):
        return self.ascend(engine, X, np.full(len(X), float(self.sigma_init)), y)

    def ascend(self, engine, X, sigma, y=None):
        """Run the gradient ascent from given per-input starting sigmas.

        Parameters
        ----------
        engine : MonteCarloEngine
            Supplies ``module``, ``device``, ``batch_size`` and the search noise.
        X : torch.Tensor, shape (n_inputs, *input_shape)
        sigma : array-like of float, shape (n_inputs,)
            Starting sigma per input (e.g. a warm start from a previous epoch).
        y : array-like of int, shape (n_inputs,), optional
            Class indices; with labels ``p_A`` is the label's probability.

        Returns
        -------
        SigmaSearchResult
            Final sigma per input and ``steps`` iterations each.
        """
        self.validate()
        n_inputs = len(X)
        sigma = np.clip(np.asarray(sigma, dtype=np.float64), self.sigma_min, self.sigma_max)
        if y is not None:
            y = torch.as_tensor(y, dtype=torch.int64, device=engine.device)
        per_batch = max(1, engine.batch_size // self.n)
        for start in range(0, n_inputs, per_batch):
            rows = np.arange(start, min(start + per_batch, n_inputs))
            labels = None if y is None else y[rows]
            sigma[rows] = self._ascend_batch(engine.restricted(rows), X[rows], sigma[rows], labels)
        return SigmaSearchResult(sigma, np.full(n_inputs, self.steps, dtype=np.int64))

    def _ascend_batch(self, engine, X, sigma, y):
        """DDRS Alg. 1 for one batch of inputs, step ``k`` drawing noise at stage ``(SEARCH_STAGE, k)``."""
        X = torch.as_tensor(X).to(engine.device)
        batch, shape = len(X), tuple(X.shape[1:])
        sigma = torch.as_tensor(sigma, dtype=X.dtype, device=engine.device)
        for step in range(self.steps):
            eps = engine.standard_normal(X, self.n, (SEARCH_STAGE, step))
            with torch.enable_grad():
                leaf = sigma.clone().requires_grad_(True)
                scale = leaf.view((batch, 1) + (1,) * len(shape))
                noisy = (X[:, None] + scale * eps).view((batch * self.n,) + shape)  # reparameterisation
                logits = engine.module(noisy)
                probabilities = torch.softmax(logits, dim=1).view(batch, self.n, -1).mean(dim=1)
                radius = margin_radius(probabilities, leaf, y)
                (gradient,) = torch.autograd.grad(radius.sum(), leaf)
            sigma = (sigma + self.lr * gradient).clamp(self.sigma_min, self.sigma_max)
        return np.clip(sigma.double().cpu().numpy(), self.sigma_min, self.sigma_max)  # float32 round-off
