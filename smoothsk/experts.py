"""One classifier per noise level: experts that a certified sigma function routes each input to.

A base classifier that knows the noise level it is sampled at is a family
``f(., s)``, one classifier per level ``s``; the smoothed classifier at level
``s`` is ``g(x, s) = argmax_c P(f(x + e, s) = c)``, ``e ~ N(0, s^2 I)``. For a
fixed ``s`` it is an ordinary smoothed classifier (Cohen et al.'s Theorem 1
applies unchanged, since ``f(., s)`` is one fixed function), so every
certificate smoothsk gives at one level holds for it, and a certified sigma
function (:class:`~smoothsk.sigma.CertifiedSigmaSelector`) composes with it as
with one network: ``G(x) = g(x, sigma(x))`` with ``f(., sigma(x))`` the expert
of the chosen level (Dual Randomized Smoothing's routing of inputs to
off-the-shelf experts, Sun, Mao and Vechev 2026).

The Monte Carlo engine calls a module whose ``takes_noise_level`` is true as
``module(noisy_inputs, sigma)``, ``sigma`` the noise level of each row
(:func:`forward`); batches stay packed across inputs and levels.
"""

import inspect

import numpy as np
import torch
from torch import nn

from ._constraints import holds_bool
from ._messages import quoted

__all__ = ["NoiseLevelExperts", "forward", "materialize", "takes_noise_level"]


def takes_noise_level(module):
    """Whether ``module`` is called with the noise level of each row (``module(x, sigma)``)."""
    return bool(getattr(module, "takes_noise_level", False))


def forward(module, x, sigma):
    """The logits of ``module`` on noisy inputs ``x`` sampled at noise levels ``sigma``.

    Parameters
    ----------
    module : torch.nn.Module
    x : torch.Tensor, shape (batch, *input_shape)
        Noisy inputs.
    sigma : float or torch.Tensor of shape (batch,)
        The noise level each row was sampled at; passed on only to a module
        that takes it (:func:`takes_noise_level`).

    Returns
    -------
    torch.Tensor, shape (batch, n_classes)
    """
    if takes_noise_level(module):
        return module(x, sigma)
    return module(x)


def materialize(module, x):
    """Run ``module`` once on ``x`` at each noise level it takes, so that every lazy layer gets its shape.

    A module that takes the noise level (:func:`takes_noise_level`) is
    called as ``module(x, level)`` for each of its ``levels``, a float
    each, which runs every expert of a :class:`NoiseLevelExperts` without
    reading a tensor's values: this works on torch's ``meta`` device too,
    where a module from a file is first built.

    Parameters
    ----------
    module : torch.nn.Module
    x : torch.Tensor, shape (batch, *input_shape)
        A probe input (its values do not matter).

    Examples
    --------
    >>> from smoothsk.models import FlatMLP
    >>> with torch.device("meta"):
    ...     experts = NoiseLevelExperts((0.25, 1.0), (FlatMLP, FlatMLP), n_classes=3)
    ...     materialize(experts, torch.zeros(1, 5))
    >>> [expert.layers[1].weight.shape for expert in experts.experts]
    [torch.Size([64, 5]), torch.Size([64, 5])]
    """
    for level in module.levels if takes_noise_level(module) else (None,):
        forward(module, x, level)


class NoiseLevelExperts(nn.Module):
    """K classifiers, one per noise level: ``f(x, s) = experts[k](x)`` for ``s = levels[k]``.

    Smoothed at level ``levels[k]``, this module is the smoothed classifier of
    ``experts[k]`` alone (see the module docstring): each certificate at one
    level is that expert's, and a certified sigma function over these levels
    makes ``G(x) = g_k(x)(x; levels[k(x)])`` with each input's own expert.
    Use it with :class:`~smoothsk.training.Pretrained` for experts trained
    elsewhere (or by smoothsk, one fixed-sigma estimator per level), and a
    :class:`~smoothsk.sigma.CertifiedSigmaSelector` over the same levels.

    Parameters
    ----------
    levels : sequence of float, length K
        Noise levels > 0, distinct in float32 (the precision rows are routed at); ``levels[k]`` is served
        by ``experts[k]``.
    experts : sequence of torch.nn.Module instances or classes, length K
        The experts, each returning (batch, n_classes) logits. An instance is
        used as it is (never copied or trained: with ``Pretrained``, its
        weights stay bit-identical); a class is built with ``n_classes``
        when it takes it, else with no arguments.
    n_classes : int or None, default=None
        Passed to the expert classes that take it (the estimator fills it in).

    Attributes
    ----------
    levels : tuple of float
    experts : torch.nn.ModuleList
    takes_noise_level : bool
        True: the engine calls ``module(x, sigma)``.

    Notes
    -----
    A model file records this module as its class with its
    :meth:`constructor_params` (``levels`` and the experts' classes); loading
    builds each expert class as above and gives it the saved weights, with no
    module argument (the classes from the allow-list, yours passed as
    ``load(path, allowed_classes=[...])``). Saving refuses an expert that its
    class does not build so (a ``FlatMLP(hidden=32)``, whose class builds
    ``hidden=64``): give it a class that does (a subclass whose ``__init__``
    takes only ``n_classes``).

    Examples
    --------
    >>> from smoothsk.models import FlatMLP
    >>> experts = NoiseLevelExperts((0.25, 1.0), (FlatMLP, FlatMLP), n_classes=3)
    >>> experts(torch.zeros(4, 5), torch.tensor([0.25, 1.0, 1.0, 0.25])).shape
    torch.Size([4, 3])
    """

    takes_noise_level = True

    def __init__(self, levels, experts, n_classes=None):
        super().__init__()
        given, levels = levels, np.asarray(levels, dtype=np.float64)
        # Distinct in float32: the engine samples float32 (and lower-precision) inputs at float32 levels, and a
        # row is routed by its level's value there. A bool would be read as level 1.0 (or 0.0).
        if (holds_bool(given) or levels.ndim != 1 or len(levels) == 0 or not np.all(np.isfinite(levels))
                or np.any(levels <= 0) or len(np.unique(levels.astype(np.float32))) != len(levels)):
            raise ValueError(f"levels must be a non-empty sequence of noise levels > 0 (numbers, not bools), finite "
                             f"and distinct in float32; got {quoted(given)}.")
        experts = list(experts)
        if len(experts) != len(levels):
            raise ValueError(f"experts must hold one module per level: {len(levels)} levels, {len(experts)} "
                             "experts.")
        self.levels = tuple(levels.tolist())
        self.experts = nn.ModuleList(_expert(item, n_classes, k) for k, item in enumerate(experts))
        self.register_buffer("_levels", torch.from_numpy(levels), persistent=False)

    def constructor_params(self):
        """What a model file records to rebuild this module: ``levels`` and the experts' classes.

        Returns
        -------
        dict
            ``{"levels": tuple of float, "experts": tuple of type}``.
        """
        return {"levels": self.levels, "experts": tuple(type(expert) for expert in self.experts)}

    def forward(self, x, sigma=None):
        """Each row's logits by the expert of its noise level.

        Parameters
        ----------
        x : torch.Tensor, shape (batch, *input_shape)
        sigma : float or torch.Tensor of shape (batch,)
            Noise level of each row; each must be one of ``levels``. A float
            is the level of every row, its expert found without reading a
            tensor (so on torch's ``meta`` device too).

        Returns
        -------
        torch.Tensor, shape (batch, n_classes)

        Raises
        ------
        TypeError
            Without ``sigma``.
        ValueError
            If a row's level has no expert.
        """
        if sigma is None:
            raise TypeError("NoiseLevelExperts routes each row to the expert of its noise level: call it as "
                            "module(x, sigma), sigma the level of each row (smoothsk's engine does).")
        if isinstance(sigma, (int, float)):
            if sigma not in self.levels:
                raise self._no_expert(sigma)
            return self.experts[self.levels.index(sigma)](x)
        sigma = torch.as_tensor(sigma, device=x.device)
        sigma = sigma.expand(len(x)) if sigma.ndim == 0 else sigma
        # Exact comparison in the dtype the levels were sampled at: the engine draws at these levels' values.
        match = sigma[:, None] == self._levels.to(sigma.dtype)[None, :]  # (batch, K)
        found = match.any(dim=1)
        if not bool(found.all()):
            raise self._no_expert(float(sigma[~found][0]))
        which = match.to(torch.int64).argmax(dim=1)
        first = int(which[0])
        if bool((which == first).all()):  # one level in the batch: no gather
            return self.experts[first](x)
        logits = None
        for k in torch.unique(which).tolist():
            rows = torch.nonzero(which == k).squeeze(1)
            out = self.experts[k](x[rows])
            if logits is None:
                logits = out.new_empty((len(x),) + tuple(out.shape[1:]))
            logits[rows] = out
        return logits

    def _no_expert(self, level):
        return ValueError(f"NoiseLevelExperts has no expert for noise level {level!r}; its levels are "
                          f"{list(self.levels)}: sample it only at those (e.g. a CertifiedSigmaSelector with the "
                          "same levels).")

    def extra_repr(self):
        return f"levels={list(self.levels)}"


def _expert(item, n_classes, k):
    """The expert ``item`` (a module instance, or a class built with ``n_classes`` when it takes it)."""
    if isinstance(item, nn.Module):
        return item
    if isinstance(item, type) and issubclass(item, nn.Module):
        takes_classes = n_classes is not None and "n_classes" in inspect.signature(item).parameters
        return item(n_classes=n_classes) if takes_classes else item()
    raise TypeError(f"experts[{k}] must be a torch.nn.Module instance or class; got {item!r}.")
