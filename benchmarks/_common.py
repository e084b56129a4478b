"""What the benchmark scripts share: the command line, timing, markdown tables, radii and stand-ins.

Run a benchmark from the repository root as ``python benchmarks/bench_x.py``:
Python then finds this module next to the script.
"""

import argparse
import time
from numbers import Real

import numpy as np
import torch

from smoothsk._constraints import HasMethods, Interval
from smoothsk.statistics import certified_radius, clopper_pearson_lower
from smoothsk.training import BaseTrainingSchedule, GaussianNoise

#: Radii at which certified accuracy is reported: 0 to 2 in steps of 0.25 (exact in binary); a script whose
#: radii stay smaller reports a part of them (``RADII[RADII <= 1.0]``).
RADII = np.arange(9) * 0.25


def quick_parser(doc, quick_help):
    """An argument parser described by the first line of ``doc``, with a ``--quick`` flag.

    Parameters
    ----------
    doc : str
        The script's module docstring.
    quick_help : str
        What ``--quick`` makes smaller.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser


def timed(function, *args, clock=time.perf_counter, **kwargs):
    """``(seconds, result)`` of one call ``function(*args, **kwargs)``, timed by ``clock``."""
    start = clock()
    result = function(*args, **kwargs)
    return clock() - start, result


def table_row(cells):
    """Print one markdown table row of already formatted ``cells`` (flushed: rows may take minutes)."""
    print("| " + " | ".join(cells) + " |", flush=True)


def table_header(header):
    """Print a markdown table's header row and its separator."""
    table_row(header)
    print("|" + "---|" * len(header))


def markdown_table(header, rows):
    """Print a markdown table: ``header`` (list of str) and ``rows`` (lists of formatted cells)."""
    table_header(header)
    for cells in rows:
        table_row(cells)


def clopper_pearson_radius(n_samples, p, sigma, alpha):
    """r(k, p): radius certified by ``n_samples`` samples at top-class frequency ``p`` (ISS Def. 1).

    Parameters
    ----------
    n_samples : array-like of int, shape (n,)
    p : array-like of float, shape (n,)
    sigma : float
    alpha : float

    Returns
    -------
    ndarray of float, shape (n,)
        ``sigma PhiInv(B(alpha; p k, k - p k + 1))``, 0 where the bound is below 1/2 (abstain).
    """
    n_samples = np.asarray(n_samples, dtype=np.float64)
    return certified_radius(sigma, clopper_pearson_lower(p * n_samples, n_samples, alpha))


class BinomialEngine:
    """Simulated base classifier: input i's noisy copies are class 0 with probability ``p_top[i]``, else 1.

    Stands in for :class:`~smoothsk.engine.MonteCarloEngine` in the samplers
    (``class_counts`` only), with the counts of each stage from its own seeded
    generator.

    Parameters
    ----------
    p_top : ndarray of float, shape (n_inputs,)
    seed : int
    """

    def __init__(self, p_top, seed):
        self.p_top = p_top
        self.seed = seed

    def class_counts(self, X, sigma, n_samples, stage):
        """Counts of classes 0 and 1, int64 (n_inputs, 2), of ``n_samples`` copies of each input."""
        n_samples = np.broadcast_to(np.asarray(n_samples, dtype=np.int64), self.p_top.shape)
        top = np.random.default_rng([self.seed, *stage]).binomial(n_samples, self.p_top)
        return np.stack([top, n_samples - top], axis=1)


class UniformSigmaTraining(BaseTrainingSchedule):
    """A fresh ``Uniform(sigma_min, sigma_max)`` sigma per sample at each epoch (PFAT Eq. 4).

    PFAT's pretraining stage alone: ``PretrainFinetune`` also draws the
    first epoch's sigmas before its stage and always assigns sigmas after
    it, which would change the random stream and so the benchmarks' figures.

    Parameters
    ----------
    sigma_min, sigma_max : float
        Range of the training noise levels.
    objective : BaseObjective or None
        Batch loss; None means Gaussian noise augmentation.
    """

    _parameter_constraints = {
        "sigma_min": [Interval(Real, 0, None, closed="neither")],
        "sigma_max": [Interval(Real, 0, None, closed="neither")],
        "objective": [HasMethods(["loss"]), None],
    }

    def __init__(self, sigma_min=0.12, sigma_max=1.0, objective=None):
        self.sigma_min = sigma_min
        self.sigma_max = sigma_max
        self.objective = objective

    def run(self, net, X, y, **fit_params):
        self.objective_ = GaussianNoise() if self.objective is None else self.objective
        net.train_sigmas_ = np.empty(len(X))
        net.fit_loop(X, y, **fit_params)

    def on_epoch_begin(self, net):
        draw = torch.rand(len(net.train_sigmas_), generator=net.noise_generator_, device=net.device)
        net.train_sigmas_ = (self.sigma_min + (self.sigma_max - self.sigma_min) * draw).double().cpu().numpy()

    def batch_sigma(self, net, X, y, index):
        return torch.as_tensor(net.train_sigmas_, device=X.device)[index].to(X.dtype)
