"""The Monte Carlo engine: every noisy forward pass of smoothsk goes through here.

Given a model, inputs, a noise level per input and a sample count per input,
:class:`MonteCarloEngine` draws Gaussian noisy copies in full batches packed
across inputs (a batch may hold the last copies of one input and the first of
the next) and reduces the model's outputs to class counts or mean softmax.

Reproducibility does not depend on how the work is split. The noise of copy
``j`` of an input depends only on the input's stream key (root seed, stage and
the input's position in the caller's array) and on ``j``: copies are drawn in
fixed per-input blocks, each from its own keyed generator. The copies of all
inputs are laid end to end and cut into batches of ``batch_size``; parallel
workers take contiguous runs of these batches and their partial counts are
summed. So any ``n_jobs`` or joblib back-end (dask, ray) gives the same
counts, and any ``batch_size``, subset or chunking of the inputs the same
noise (hence the same counts, up to the rare argmax flip that a model's
batch-size-dependent floating point can cause).
"""

import copy

import numpy as np
import torch
from joblib import Parallel, delayed, effective_n_jobs

__all__ = ["MonteCarloEngine", "stream_keys"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Noise is drawn in per-input blocks of about this many values (see _segment_filler).
_BLOCK_VALUES = 16384


def _splitmix64(values):
    """Splitmix64 finaliser, vectorised over a uint64 array (wraps modulo 2**64)."""
    z = values + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def stream_keys(root_seed, stage, n_inputs):
    """Independent noise-stream keys, one per input, for one sampling stage.

    Parameters
    ----------
    root_seed : int
        Non-negative seed of the whole call (from the estimator's ``random_state``).
    stage : tuple of int
        Identifies the sampling stage (search step, selection, estimation, ...):
        different stages give statistically independent noise.
    n_inputs : int
        Number of inputs.

    Returns
    -------
    keys : ndarray of uint64, shape (n_inputs,)
        Key of input ``i``; it depends only on ``root_seed``, ``stage`` and ``i``.
    """
    sequence = np.random.SeedSequence([int(root_seed), *(int(s) for s in stage)])
    return sequence.generate_state(max(n_inputs, 1), dtype=np.uint64)[:n_inputs]


class MonteCarloEngine:
    """Packed, seeded Monte Carlo sampling of a model under Gaussian input noise.

    Parameters
    ----------
    module : torch.nn.Module
        Base classifier returning logits of shape (batch, n_classes). It is
        used as given (the caller puts it in eval mode and on ``device``).
    n_classes : int
        Number of classes the module scores.
    batch_size : int
        Noisy copies per forward pass; bounds the memory used.
    device : str or torch.device
        Where noise is drawn and the module runs.
    n_jobs : int or None
        joblib workers over runs of batches (threads unless a joblib
        back-end such as dask or ray is active). ``None`` runs in-process.
    root_seed : int
        Seed of all noise drawn through this engine; see :func:`stream_keys`.
    progress : tqdm progress bar or None
        Advanced by the number of noisy copies of each batch.
    """

    def __init__(self, module, n_classes, batch_size, device="cpu", n_jobs=None, root_seed=0, progress=None):
        self.module = module
        self.n_classes = int(n_classes)
        self.batch_size = int(batch_size)
        self.device = torch.device(device)
        self.n_jobs = n_jobs
        self.root_seed = int(root_seed)
        self.progress = progress
        self.positions = None

    def restricted(self, rows):
        """An engine for the subset ``rows`` of the current inputs.

        Components sample subsets (a search's undecided inputs, an allocator's
        inputs to resample, a checkpointed chunk) by row; the restricted engine
        keys each row's noise by its position in the full input array, so an
        input gets the same noise whichever subset or chunk it is sampled in.

        Parameters
        ----------
        rows : ndarray of int, shape (n_rows,)
            Rows of the current inputs.

        Returns
        -------
        MonteCarloEngine
        """
        restricted = copy.copy(self)
        rows = np.asarray(rows, dtype=np.int64)
        restricted.positions = rows if self.positions is None else self.positions[rows]
        return restricted

    def keys(self, stage, n_inputs):
        """Noise-stream keys of the current inputs for a sampling stage.

        Parameters
        ----------
        stage : tuple of int
            Sampling stage; distinct stages draw independent noise.
        n_inputs : int
            Number of inputs.

        Returns
        -------
        keys : ndarray of uint64, shape (n_inputs,)
        """
        if self.positions is None:
            return stream_keys(self.root_seed, stage, n_inputs)
        size = int(self.positions.max()) + 1 if n_inputs else 0
        return stream_keys(self.root_seed, stage, size)[self.positions[:n_inputs]]

    def class_counts(self, X, sigma, n_samples, stage):
        """Count the module's predicted classes over noisy copies of each input.

        Parameters
        ----------
        X : torch.Tensor, shape (n_inputs, *input_shape)
            Clean inputs, in the module's input space.
        sigma : array-like of float, shape (n_inputs,)
            Noise standard deviation per input.
        n_samples : array-like of int, shape (n_inputs,)
            Noisy copies per input (0 allowed).
        stage : tuple of int
            Sampling stage: the same stage gives the same noise, distinct stages
            independent noise.

        Returns
        -------
        counts : ndarray of int64, shape (n_inputs, n_classes)
            ``counts[i, c]``: copies of input ``i`` classified as ``c``.
        """
        return self._run(X, sigma, n_samples, stage, soft=False)

    def mean_softmax(self, X, sigma, n_samples, stage):
        """Mean softmax of the module over noisy copies (the soft smoothed classifier).

        Parameters are those of :meth:`class_counts`.

        Returns
        -------
        probabilities : ndarray of float64, shape (n_inputs, n_classes)
            Average of ``softmax(module(x_i + noise))``; rows of inputs
            with no samples are zero.
        """
        totals = self._run(X, sigma, n_samples, stage, soft=True)
        n_samples = np.asarray(n_samples, dtype=np.float64)
        return totals / np.maximum(n_samples, 1.0)[:, None]

    def _run(self, X, sigma, n_samples, stage, soft):
        n_inputs = len(X)
        n_samples = np.broadcast_to(np.asarray(n_samples, dtype=np.int64), (n_inputs,))
        sigma = np.array(np.broadcast_to(sigma, (n_inputs,)), dtype=np.float64)
        out_dtype = np.float64 if soft else np.int64
        result = np.zeros((n_inputs, self.n_classes), dtype=out_dtype)
        ends = np.cumsum(n_samples)
        total = int(ends[-1]) if n_inputs else 0
        if total == 0:
            return result
        starts = ends - n_samples
        batch_starts = np.arange(0, total, self.batch_size)
        X = torch.as_tensor(X).to(self.device, non_blocking=True)
        sigma_t = torch.as_tensor(sigma, dtype=X.dtype, device=self.device)
        keys = self.keys(stage, n_inputs)
        plan = (X, sigma_t, starts, ends, keys, total, soft)
        runs = np.array_split(batch_starts, self._n_workers(len(batch_starts)))
        if len(runs) == 1:
            parts = [self._run_batches(plan, runs[0])]
        else:
            parts = Parallel(n_jobs=self.n_jobs, prefer="threads")(
                delayed(self._run_batches)(plan, run) for run in runs if len(run))
        for first, partial in parts:
            result[first:first + len(partial)] += partial
        return result

    def _n_workers(self, n_batches):
        if self.n_jobs in (None, 1):
            return 1
        return max(1, min(n_batches, effective_n_jobs(self.n_jobs)))

    def _segment_filler(self, noise):
        """A function ``fill(key, offset, position, length)`` writing standard normal noise.

        It fills ``noise[position:position + length]`` with the copies
        ``offset .. offset + length - 1`` of the input whose stream key is
        ``key``. Copies are grouped in fixed blocks of ``block`` copies per
        input, and each block is drawn whole from a generator keyed by
        ``(key, block index)``: the noise of a copy therefore depends only on
        its input's key and its index, not on how copies are packed into
        batches, split across workers or chunked. On CPU the generator is
        numpy's Philox with the 128-bit key ``(key, block)`` (torch's CPU
        generator truncates seeds to 32 bits); on an accelerator it is torch's
        Philox seeded with a 64-bit mix of both.
        """
        per_copy = int(np.prod(noise.shape[1:]))
        block = max(1, _BLOCK_VALUES // per_copy)
        scratch = torch.empty((block,) + tuple(noise.shape[1:]), dtype=noise.dtype, device=noise.device)
        if self.device.type == "cpu":
            def draw(key, index, out):
                generator = np.random.Generator(np.random.Philox(key=np.array([key, index], dtype=np.uint64)))
                generator.standard_normal(out=out.numpy(), dtype=out.numpy().dtype)
        else:
            generator = torch.Generator(device=self.device)

            def draw(key, index, out):
                generator.manual_seed(int(_splitmix64(np.uint64(key) ^ _splitmix64(np.uint64(index)))))
                out.normal_(generator=generator)

        def fill(key, offset, position, length):
            for index in range(offset // block, (offset + length - 1) // block + 1):
                lo, hi = max(offset, index * block), min(offset + length, (index + 1) * block)
                target = noise[position + lo - offset:position + hi - offset]
                if hi - lo == block:
                    draw(key, index, target)
                else:  # a partial block: draw it whole, keep the part this segment holds
                    draw(key, index, scratch)
                    target.copy_(scratch[lo - index * block:hi - index * block])
        return fill

    @torch.inference_mode()
    def _run_batches(self, plan, batch_starts):
        """Sum counts (or softmax) over the given batches of the packed plan.

        Returns the index of the first input touched and an array of shape
        (n_touched, n_classes) for the inputs ``first .. first + n_touched - 1``.
        """
        X, sigma, starts, ends, keys, total, soft = plan
        first = int(np.searchsorted(ends, batch_starts[0], side="right"))
        last_sample = min(int(batch_starts[-1]) + self.batch_size, total)
        last = int(np.searchsorted(ends, last_sample - 1, side="right"))
        accumulator = torch.zeros((last - first + 1) * self.n_classes,
                                  dtype=torch.float64 if soft else torch.int64, device=self.device)
        noise = torch.empty((min(self.batch_size, total),) + tuple(X.shape[1:]),
                            dtype=X.dtype, device=self.device)
        fill = self._segment_filler(noise)
        for batch_start in batch_starts:
            batch_start = int(batch_start)
            batch_end = min(batch_start + self.batch_size, total)
            # Inputs touched by this batch and the part of each one it holds.
            lo = int(np.searchsorted(ends, batch_start, side="right"))
            hi = int(np.searchsorted(ends, batch_end - 1, side="right")) + 1
            seg_begin = np.maximum(starts[lo:hi], batch_start)
            seg_end = np.minimum(ends[lo:hi], batch_end)
            offsets = (seg_begin - starts[lo:hi]).astype(np.uint64)
            position = 0
            for key, offset, length in zip(keys[lo:hi].tolist(), offsets.tolist(), (seg_end - seg_begin).tolist()):
                if length:
                    fill(key, offset, position, length)
                    position += length
            batch_noise = noise[:batch_end - batch_start]
            owner = torch.repeat_interleave(
                torch.arange(lo, hi, device=self.device),
                torch.as_tensor(seg_end - seg_begin, device=self.device),
                output_size=batch_end - batch_start)
            if hi - lo == 1:
                noisy = batch_noise.mul_(sigma[lo]).add_(X[lo])
            else:
                scale = sigma[owner].view((-1,) + (1,) * (X.dim() - 1))
                noisy = batch_noise.mul_(scale).add_(X[owner])
            logits = self.module(noisy)
            window = accumulator[(lo - first) * self.n_classes:(hi - first) * self.n_classes]
            slot = (owner - lo) * self.n_classes
            if soft:
                cells = slot[:, None] + torch.arange(self.n_classes, device=self.device)
                window.index_add_(0, cells.view(-1), torch.softmax(logits.double(), dim=1).view(-1))
            else:
                window += torch.bincount(slot + logits.argmax(dim=1), minlength=window.numel())
            if self.progress is not None:
                self.progress.update(batch_end - batch_start)
        return first, accumulator.view(-1, self.n_classes).cpu().numpy()
