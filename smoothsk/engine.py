"""The Monte Carlo engine: every noisy forward pass of smoothsk goes through here.

Given a model, inputs, a noise level per input and a sample count per input,
:class:`MonteCarloEngine` draws Gaussian noisy copies in full batches packed
across inputs (a batch may hold the last copies of one input and the first of
the next) and reduces the model's outputs to class counts or mean softmax.

Reproducibility does not depend on how the work is split. The noise of copy
``j`` of an input is a function of the root seed, the sampling stage, the
input's 64-bit identifier and ``j`` only. The identifier is by default the
input's position in the caller's input array, or any identifier the caller
supplies (:meth:`MonteCarloEngine.keyed_by`; the estimator uses a hash of the
input's values).

On the CPU each (stage, input) pair has a stream of its own: a Philox-4x64
counter generator (numpy's) whose 128-bit key is (stage key, identifier), so
no two pairs share a stream and, the stream being counter-based, copy ``j``
reads the words ``j * W .. (j + 1) * W - 1`` of it directly, without
drawing what comes before (``W`` words of 64 bits per copy: one per pair of
noise values in float32 and lower precisions, two in float64). The words
become standard normals by the Box-Muller transform, vectorised over the
whole batch: a pair of uniforms (u, v), u in (0, 1] drawn on a 32-bit grid
(53 in float64) and v an angle, gives the independent pair
``sqrt(-2 log u) * (cos 2 pi v, sin 2 pi v)``; the first half of a copy's
values are the cosines, the second half the sines. The grid's smallest u,
2**-33, cuts |noise| at 6.764 (float32; 8.652 in float64), a radius a true
Gaussian pair exceeds with probability 2**-33 (the GPU's cuRAND has the same
32-bit resolution; torch's CPU ``normal_`` uses 24 bits and cuts at 5.77).
Away from 0 (u above about 2**-8) float32 keeps 24 bits of u and of the angle;
u rounds to 1, and the pair to zeros, with probability 2**-25. The user guide
discusses what float arithmetic means for the certificates. Inputs in a lower
precision (float16, bfloat16) get the float32 noisy copy ``x + sigma * e``
rounded to their type: the module then sees a fixed function (the rounding) of
the float32 noisy input, never noise or sigma rounded before the sum, which
would make what it sees depend on ``x`` beyond ``x + sigma * e``.

On other devices a block of ``NOISE_BLOCK`` copies is drawn by the device's
generator seeded with a 64-bit hash of (stage, input, block): the
"accelerator path", which the private switch
``MonteCarloEngine._accelerator_path`` also takes on the CPU, so that the CPU
test suite runs it. The CPU does not use its torch generator, although its
``normal_`` is fast: it keeps only the low 32 bits of a seed, so among the
~2**16 blocks of a large run two would share their noise, and one input's
samples could repeat a block (a dependence Clopper-Pearson does not allow).
The counts of an input are therefore the same whatever the batch size, the
other inputs in a batch, ``n_jobs`` (workers take contiguous runs of batches
and their counts are summed) or the subset of rows being sampled
(:meth:`MonteCarloEngine.restricted`).
"""

import contextlib
import copy
import math
import sys
import warnings

import numpy as np
import torch
from joblib import Parallel, delayed, effective_n_jobs

from ._parallel import sharing_threads
from .experts import forward

__all__ = ["MonteCarloEngine", "NOISE_BLOCK", "runs_channels_last", "stage_key"]

#: Noisy copies per noise block (the unit of seeding on accelerators, independent of the batch size).
NOISE_BLOCK = 128

#: Pairs of noise values one Box-Muller pass transforms at most (bounds its temporaries to a few MB).
_PAIRS_PER_PASS = 1 << 18

#: Index of a 64-bit word's low 32 bits among its two 32-bit halves in memory.
_LOW_HALF = 0 if sys.byteorder == "little" else 1

_MASK64 = (1 << 64) - 1

#: Bound on |noise| of every noise path (6.764 on the CPU in float32, 8.652 in float64, 5.77 for torch's
#: CPU ``normal_``): a sigma up to the dtype's largest value over this keeps ``sigma * noise`` finite.
_NOISE_BOUND = 10.0

#: What a device raises when a batch does not fit (``torch.OutOfMemoryError`` from torch 2.5).
_OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def _splitmix64(value):
    """Splitmix64 finaliser of a Python int, modulo 2**64."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def stage_key(root_seed, stage):
    """64-bit key of one sampling stage.

    Parameters
    ----------
    root_seed : int
        Non-negative seed of the whole call (from the estimator's ``random_state``).
    stage : tuple of int
        Identifies the sampling stage (search step, selection, estimation, ...).
        The stage's length is hashed with it, so ``(1,)``, ``(1, 0)`` and
        ``(1, 0, 0)`` are distinct stages with independent noise.

    Returns
    -------
    int
    """
    stage = tuple(int(part) for part in stage)
    sequence = np.random.SeedSequence([int(root_seed), len(stage), *stage])
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def _check_sigma(sigma, noise_dtype):
    """Refuse noise levels that are not positive or whose noise overflows ``noise_dtype``.

    Parameters
    ----------
    sigma : ndarray of float64, shape (n_inputs,)
    noise_dtype : torch.dtype
        float32 or float64 (:func:`_noise_dtype`).

    Raises
    ------
    ValueError
        Naming the first such sigma: an infinite ``sigma * noise``
        is not Gaussian noise, and a certificate computed from it would not be
        about g at that sigma.
    """
    limit = torch.finfo(noise_dtype).max / _NOISE_BOUND
    bad = np.flatnonzero(~((sigma > 0) & (sigma <= limit)))
    if len(bad):
        raise ValueError(f"sigma must be positive and at most {limit:.3g} for {str(noise_dtype)[6:]} noise (beyond, "
                         f"sigma * noise overflows); got sigma={float(sigma[bad[0]])!r}.")


def _noise_dtype(dtype):
    """dtype in which the noisy copies of inputs of ``dtype`` are computed: float64 or else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def runs_channels_last(memory_format, module, input_dim, accelerated):
    """Whether 4-D batches and the module run in ``channels_last`` layout.

    The rule is deterministic (never a timing): which layout runs must not
    depend on how busy the machine was, so that certificates are
    reproducible. ``"auto"`` picks ``channels_last`` for 4-D inputs on an
    accelerator, and on the CPU for a module with a 2-D convolution, where
    oneDNN's convolutions and torch's max pooling run fastest in it (a
    ``LeNet`` pooling with ``nn.MaxPool2d`` 1.3-1.7x, ``CifarResNet``
    1.05-1.35x, ``DigitsCNN`` 1.16x; ``LeNet`` pools with
    :class:`~smoothsk.models.TiledMaxPool2d`, fast in both layouts, and ran
    about as fast in either on an AVX2 CPU; ``benchmarks/bench_certify.py``);
    a module without one (a flattening MLP) stays contiguous, as a
    ``Flatten`` of a ``channels_last`` batch would copy it.

    Parameters
    ----------
    memory_format : {"auto", "channels_last", "contiguous"}
    module : torch.nn.Module
    input_dim : int
        Dimensions of a batch of inputs (4 for images: batch, channels, height, width).
    accelerated : bool
        Whether the engine takes the accelerator path.

    Returns
    -------
    bool
    """
    if input_dim != 4 or memory_format == "contiguous":
        return False
    if memory_format == "channels_last":
        return True
    return accelerated or any(isinstance(layer, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))
                              for layer in module.modules())


def _noise_buffer(n_copies, input_shape, dtype, device, channels_last):
    """A noise buffer written in memory order and the view the arithmetic uses.

    The noise source fills copies one after another in memory order
    (``stored``, contiguous); in ``channels_last`` layout that order is
    (height, width, channel), so the noise lands in the batch's final layout
    with no copy. Every value is an independent standard normal whichever
    order fills it; for one channel both orders are the same.

    Returns
    -------
    stored : torch.Tensor, shape (n_copies, *stored_shape)
        Contiguous; ``stored_shape`` is ``input_shape`` or, in ``channels_last``,
        (height, width, channels).
    noise : torch.Tensor, shape (n_copies, *input_shape)
        The same memory, in the batch's layout.
    """
    if not channels_last:
        stored = torch.empty((n_copies,) + input_shape, dtype=dtype, device=device)
        return stored, stored
    channels, height, width = input_shape
    stored = torch.empty((n_copies, height, width, channels), dtype=dtype, device=device)
    return stored, stored.permute(0, 3, 1, 2)


def _passes(segments, rows_per_pass):
    """Segments of copies cut into passes of at most ``rows_per_pass`` consecutive copies.

    Parameters
    ----------
    segments : list of (int, int, int)
        ``(input_id, begin, end)``, laid out one after another.
    rows_per_pass : int

    Yields
    ------
    first : int
        Position of the pass's first copy in the layout.
    pieces : list of (int, int, int)
        The parts of the segments the pass holds, in order, in the same form.
    """
    pieces, first, row = [], 0, 0
    for input_id, begin, end in segments:
        while begin < end:
            take = min(end - begin, rows_per_pass - (row - first))
            pieces.append((input_id, begin, begin + take))
            begin, row = begin + take, row + take
            if row - first == rows_per_pass:
                yield first, pieces
                pieces, first = [], row
    if pieces:
        yield first, pieces


class _NoiseSource:
    """Standard normal noise of chosen copies of chosen inputs for one stage.

    Parameters
    ----------
    key : int
        The stage's key (:func:`stage_key`).
    input_shape : tuple of int
    dtype : torch.dtype
    device : torch.device
    accelerator_path : bool
        Draw with the device's torch generator even on the CPU.
    """

    def __init__(self, key, input_shape, dtype, device, accelerator_path=False):
        self.key = key
        self.input_shape = tuple(input_shape)
        self.on_cpu = device.type == "cpu" and not accelerator_path
        if self.on_cpu:
            self.size = math.prod(self.input_shape)
            self.pairs = (self.size + 1) // 2
            self.wide = dtype == torch.float64
            self.compute_dtype = torch.float64 if self.wide else torch.float32
            # Direct: the transform writes into the batch, whose copies are whole pairs in the compute dtype.
            self.direct = dtype == self.compute_dtype and self.size % 2 == 0
            self.words_per_copy = self.pairs * (2 if self.wide else 1)
            # Half a grid step (u's offset) and the angle of one grid step, in the compute dtype.
            self.half = torch.tensor(0.5, dtype=self.compute_dtype)
            self.turn = torch.tensor(2 * math.pi * 2.0 ** (-53 if self.wide else -32), dtype=self.compute_dtype)
            self.words = np.empty(0, dtype=np.uint64)
            # One generator, moved to each segment's (key, counter) by setting its
            # state: the same words as a new Philox(key, counter), ten times cheaper.
            self.bits = np.random.Philox()
            self.state = self.bits.state
        else:
            self.generator = torch.Generator(device=device)
            self.scratch = torch.empty((NOISE_BLOCK,) + self.input_shape, dtype=dtype, device=device)
            self.scratch_block = None

    def fill_segments(self, out, segments):
        """Write the noise of consecutive segments of copies into ``out``, one after another.

        Parameters
        ----------
        out : torch.Tensor, shape (n_copies, *input_shape)
            Contiguous destination; ``n_copies`` is the total length of the segments.
        segments : list of (int, int, int)
            ``(input_id, begin, end)``: copies ``begin .. end - 1`` of the input ``input_id``.
        """
        if not self.on_cpu:
            written = 0
            for input_id, begin, end in segments:
                self._fill_blocks(out[written:written + end - begin], input_id, begin, end)
                written += end - begin
            return
        rows_per_pass = max(1, _PAIRS_PER_PASS // self.pairs)
        for first, pieces in _passes(segments, rows_per_pass):
            rows = sum(end - begin for _, begin, end in pieces)
            if len(pieces) == 1:  # the common case at large n: the generator's own array, no copy
                words = self._draw(*pieces[0])
            else:
                words = np.concatenate([self._draw(*piece) for piece in pieces], out=self._gathered(rows))
            self._box_muller(out[first:first + rows], torch.from_numpy(words.view(np.int64)).view(rows, -1))

    def _gathered(self, rows):
        """A reused buffer of the words of ``rows`` copies (a pass over several inputs gathers them there)."""
        n_words = rows * self.words_per_copy
        if len(self.words) < n_words:
            self.words = np.empty(n_words, dtype=np.uint64)
        return self.words[:n_words]

    def _draw(self, input_id, begin, end):
        """The words of copies ``begin .. end - 1`` of input ``input_id``: a new array of uint64."""
        first = begin * self.words_per_copy
        # A Philox counter value gives 4 words: start at the one holding word ``first``.
        self.state["state"]["key"] = np.array([self.key, int(input_id)], dtype=np.uint64)
        self.state["state"]["counter"] = np.array([first // 4, 0, 0, 0], dtype=np.uint64)
        self.state["buffer_pos"], self.state["has_uint32"] = 4, 0
        self.bits.state = self.state
        self.bits.random_raw(first % 4)
        return self.bits.random_raw((end - begin) * self.words_per_copy)

    def _box_muller(self, out, words):
        """Standard normals of shape ``out.shape`` from 64-bit words of shape (len(out), words_per_copy)."""
        if self.direct:
            halves = out.view(len(out), 2, self.pairs)
        else:
            halves = torch.empty((len(out), 2, self.pairs), dtype=self.compute_dtype)
        # Each pair's angle in both halves, the second shifted by a quarter turn
        # (sin t = cos(t - pi / 2)), so that one cosine covers the whole batch.
        # Each integer to float conversion is one pass with the first step on its values: an integer
        # tensor and a 0-dim tensor of the compute dtype give the compute dtype, whatever torch's default.
        if self.wide:
            # Two words per pair, 53 bits of each.
            words = words.view(len(out), self.pairs, 2)
            u = torch.add((words[..., 0] >> 11) & ((1 << 53) - 1), self.half).mul_(2.0 ** -53)
            torch.mul(words[..., 1] >> 11, self.turn, out=halves[:, 0])
        else:
            # One word per pair: its low 32 bits give u, its high 32 bits (a signed
            # value, uniform over [-2**31, 2**31)) an angle uniform over [-pi, pi).
            # Read as two 32-bit halves in place (views, no shift or mask pass).
            low = words.view(torch.uint32).view(len(out), self.pairs, 2)[..., _LOW_HALF]
            u = torch.add(low, self.half).mul_(2.0 ** -32)
            torch.mul(words.view(torch.int32).view(len(out), self.pairs, 2)[..., 1 - _LOW_HALF], self.turn,
                      out=halves[:, 0])
        torch.sub(halves[:, 0], math.pi / 2, out=halves[:, 1])
        halves.cos_().mul_(u.log_().mul_(-2.0).sqrt_().unsqueeze(1))
        if not self.direct:
            out.view(len(out), -1).copy_(halves.view(len(out), -1)[:, :self.size])

    def _fill_blocks(self, out, input_id, begin, end):
        """The accelerator path: copies ``begin .. end - 1`` from the input's noise blocks."""
        written = 0
        for block in range(begin // NOISE_BLOCK, (end - 1) // NOISE_BLOCK + 1):
            block_begin = max(begin, block * NOISE_BLOCK)
            block_end = min(end, (block + 1) * NOISE_BLOCK)
            self._draw_block(out[written:written + block_end - block_begin], input_id, block,
                             block_begin - block * NOISE_BLOCK)
            written += block_end - block_begin

    def _draw_block(self, out, input_id, block, skip):
        """Rows ``skip .. skip + len(out) - 1`` of one noise block into ``out``."""
        # A device generator's first k values depend on how many are drawn:
        # always draw the whole block, in place where the whole block is
        # wanted, else into the scratch block, which keeps the last block
        # drawn for the rest of it (a block split between two batches).
        seed = _splitmix64(_splitmix64(self.key ^ int(input_id)) ^ block)
        if len(out) == NOISE_BLOCK and out.is_contiguous():
            out.normal_(generator=self.generator.manual_seed(seed))
            return
        if self.scratch_block != (input_id, block):
            self.scratch.normal_(generator=self.generator.manual_seed(seed))
            self.scratch_block = (input_id, block)
        out.copy_(self.scratch[skip:skip + len(out)])


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
        back-end such as dask or ray is active; threads share torch's CPU
        threads, see :func:`smoothsk._parallel.sharing_threads`). ``None``
        runs in-process.
    root_seed : int
        Seed of all noise drawn through this engine; see :func:`stage_key`.
    progress : tqdm progress bar or None
        Advanced by the number of noisy copies of each batch.
    autocast : torch.dtype or None
        Run the module under ``torch.autocast`` with this dtype
        (``torch.bfloat16`` or ``torch.float16``); None runs it as it is.
        Counts are then those of the module as run in that precision.
    memory_format : {"auto", "channels_last", "contiguous"}, default="auto"
        Layout of 4-D (image) batches and of the module's 4-D weights while
        sampling; see :func:`runs_channels_last`. The module is converted in
        place (its values are untouched, only their strides). Counts are those
        of the module as run in that layout.

    Notes
    -----
    On an accelerator (any device but the CPU) the noise is drawn and the
    counts are reduced on the device, with no host synchronisation per batch
    (the counts come back once per call and worker); the inputs are copied from pinned
    host memory on CUDA. A batch that runs out of device memory is retried at
    half the batch size, with a warning, down to one copy per batch: the
    noise of each copy does not depend on the batch size, so neither do the
    counts.

    Examples
    --------
    >>> module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    >>> engine = MonteCarloEngine(module.eval(), n_classes=3, batch_size=64, root_seed=0)
    >>> counts = engine.class_counts(torch.zeros(5, 4), sigma=0.5, n_samples=100, stage=(1,))
    >>> counts.shape, counts.sum(axis=1).tolist()
    ((5, 3), [100, 100, 100, 100, 100])
    """

    #: Private switch: take the accelerator path (noise from the device's torch
    #: generator, ``channels_last`` 4-D batches) on the CPU too, for the tests.
    _accelerator_path = False

    def __init__(self, module, n_classes, batch_size, device="cpu", n_jobs=None, root_seed=0, progress=None,
                 autocast=None, memory_format="auto"):
        self.module = module
        self.n_classes = int(n_classes)
        self.batch_size = int(batch_size)
        self.device = torch.device(device)
        self.n_jobs = n_jobs
        self.root_seed = int(root_seed)
        self.progress = progress
        self.autocast = autocast
        self.memory_format = memory_format
        self.input_ids = None

    def restricted(self, rows):
        """An engine for the subset ``rows`` of the current inputs.

        Components sample subsets (a search's undecided inputs, an allocator's
        inputs to resample) by row; the restricted engine keeps each row's
        noise identifier (its position in the full input array unless
        :meth:`keyed_by` set another), so an input gets the same noise
        whichever subset it is sampled in.

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
        restricted.input_ids = rows.astype(np.uint64) if self.input_ids is None else self.input_ids[rows]
        return restricted

    def keyed_by(self, input_ids):
        """An engine that keys each input's noise by a given identifier.

        Parameters
        ----------
        input_ids : array-like of uint64, shape (n_inputs,)
            Identifier of each current input (e.g. a hash of its values, so
            that an input's noise does not depend on where it stands in X).

        Returns
        -------
        MonteCarloEngine
        """
        keyed = copy.copy(self)
        keyed.input_ids = np.asarray(input_ids, dtype=np.uint64)
        return keyed

    def with_module(self, module, n_classes):
        """The same engine (root seed, input keys, batching, workers) over another module.

        For a second model sampled alongside the first, such as a certified
        sigma function's selector. Its noise for a (stage, input) is the
        noise the first module gets for that stage and input, so the two are
        independent only through distinct stages.

        Parameters
        ----------
        module : torch.nn.Module
            Returns logits of shape (batch, n_classes); used as given (eval
            mode, on ``device``).
        n_classes : int

        Returns
        -------
        MonteCarloEngine
        """
        other = copy.copy(self)
        other.module = module
        other.n_classes = int(n_classes)
        return other

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
        n_samples = np.broadcast_to(np.asarray(n_samples, dtype=np.float64), (len(X),))
        return totals / np.maximum(n_samples, 1.0)[:, None]

    def standard_normal(self, X, n_copies, stage):
        """The unscaled noise of copies ``0 .. n_copies - 1`` of each input, as a tensor.

        For searches that differentiate through the model (the
        reparameterisation ``x + sigma * noise``) and so cannot use the packed
        inference path. Draws the same streams as :meth:`class_counts` for the
        same stage.

        Parameters
        ----------
        X : torch.Tensor, shape (n_inputs, *input_shape)
            Inputs (only their number, shape and dtype are used).
        n_copies : int
            Noisy copies per input.
        stage : tuple of int
            Sampling stage.

        Returns
        -------
        noise : torch.Tensor, shape (n_inputs, n_copies, *input_shape)
            Standard normal values on the engine's device.
        """
        stored, noise = _noise_buffer(len(X) * n_copies, tuple(X.shape[1:]), X.dtype, self.device,
                                      self._channels_last(X))
        source = _NoiseSource(stage_key(self.root_seed, stage), stored.shape[1:], X.dtype, self.device,
                              self._accelerated())
        # The inputs' copies one after another: one pass over all of them.
        source.fill_segments(stored, [(input_id, 0, n_copies) for input_id in self._ids(len(X)).tolist()])
        return noise.view((len(X), n_copies) + tuple(X.shape[1:]))

    def _accelerated(self):
        return self.device.type != "cpu" or self._accelerator_path

    def _channels_last(self, X):
        return runs_channels_last(self.memory_format, self.module, X.dim(), self._accelerated())

    def _run(self, X, sigma, n_samples, stage, soft):
        while True:
            try:
                return self._run_packed(X, sigma, n_samples, stage, soft)
            except _OUT_OF_MEMORY:
                if self.batch_size == 1:
                    raise
                # Each copy's noise is keyed by its index, not its batch: the
                # rerun at a smaller batch gives the same counts.
                warnings.warn(f"Out of memory on {self.device} at {self.batch_size} noisy copies per forward pass; "
                              f"retrying at {self.batch_size // 2} (the results do not depend on the batch size).",
                              RuntimeWarning, stacklevel=3)
                self.batch_size //= 2
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()

    def _run_packed(self, X, sigma, n_samples, stage, soft):
        n_inputs = len(X)
        n_samples = np.broadcast_to(np.asarray(n_samples, dtype=np.int64), (n_inputs,))
        sigma = np.array(np.broadcast_to(sigma, (n_inputs,)), dtype=np.float64)
        X = torch.as_tensor(X)
        _check_sigma(sigma, _noise_dtype(X.dtype))
        out_dtype = np.float64 if soft else np.int64
        result = np.zeros((n_inputs, self.n_classes), dtype=out_dtype)
        ends = np.cumsum(n_samples)
        total = int(ends[-1]) if n_inputs else 0
        if total == 0:
            return result
        starts = ends - n_samples
        batch_starts = np.arange(0, total, self.batch_size)
        if self.device.type == "cuda":
            X = X.pin_memory()
        X = X.to(self.device, non_blocking=True)
        channels_last = self._channels_last(X)  # decided once per call, for every worker's batches
        if X.dim() == 4:
            layout = torch.channels_last if channels_last else torch.contiguous_format
            X = X.contiguous(memory_format=layout)
            self.module.to(memory_format=layout)
        sigma_t = torch.as_tensor(sigma, dtype=_noise_dtype(X.dtype), device=self.device)
        # Sample ends on the device: the owner of each copy is found there, with no host copy per batch.
        ends_t = torch.as_tensor(ends, device=self.device)
        plan = (X, sigma_t, starts, ends, ends_t, self._ids(n_inputs), stage_key(self.root_seed, stage), total,
                soft, channels_last)
        runs = np.array_split(batch_starts, self._n_workers(len(batch_starts)))
        if len(runs) == 1:
            parts = [self._run_batches(plan, runs[0])]
        else:
            run_batches = sharing_threads(self._run_batches, len(runs))
            parts = Parallel(n_jobs=self.n_jobs, prefer="threads")(
                delayed(run_batches)(plan, run) for run in runs if len(run))
        for first, partial, _ in parts:
            result[first:first + len(partial)] += partial
        undefined = sum(part[2] for part in parts)
        if undefined:
            warnings.warn(f"The module returned NaN logits for {undefined} of {total} noisy copies; they vote for no "
                          f"class (counted against every class, so the certificates stay sound). Check the model "
                          f"for NaN weights or overflow at these noise levels.", RuntimeWarning, stacklevel=4)
        return result

    def _ids(self, n_inputs):
        """Noise identifiers of the current inputs (positions unless keyed otherwise)."""
        return np.arange(n_inputs, dtype=np.uint64) if self.input_ids is None else self.input_ids[:n_inputs]

    def _n_workers(self, n_batches):
        if self.n_jobs in (None, 1):
            return 1
        return max(1, min(n_batches, effective_n_jobs(self.n_jobs)))

    @torch.inference_mode()
    def _run_batches(self, plan, batch_starts):
        """Sum counts (or softmax) over the given batches of the packed plan.

        Returns the index of the first input touched, an array of shape
        (n_touched, n_classes) for the inputs ``first .. first + n_touched - 1``,
        and the number of copies whose output had no class (NaN logits), which
        add nothing.
        """
        X, sigma, starts, ends, ends_t, input_ids, key, total, soft, channels_last = plan
        first = int(np.searchsorted(ends, batch_starts[0], side="right"))
        last_sample = min(int(batch_starts[-1]) + self.batch_size, total)
        last = int(np.searchsorted(ends, last_sample - 1, side="right"))
        # Cell (i - first) * n_classes + c sums input i's votes (or softmax) for class c; one more cell, past
        # them, counts the copies with no class, so that one scatter per batch accounts for every copy.
        no_class = (last - first + 1) * self.n_classes
        accumulator = torch.zeros(no_class + 1, dtype=torch.float64 if soft else torch.int64, device=self.device)
        votes_weight = torch.ones(min(self.batch_size, total), dtype=torch.int64, device=self.device)
        class_cells = torch.arange(self.n_classes, device=self.device)
        noise_dtype = _noise_dtype(X.dtype)
        stored, noise = _noise_buffer(min(self.batch_size, total), tuple(X.shape[1:]), noise_dtype, self.device,
                                      channels_last)
        source = _NoiseSource(key, stored.shape[1:], noise_dtype, self.device, self._accelerated())
        # Entered once per batch; reusable. Without autocast, no context at all: entering a disabled
        # torch.autocast costs as much as a small kernel.
        precision = (contextlib.nullcontext() if self.autocast is None
                     else torch.autocast(self.device.type, dtype=self.autocast))
        for batch_start in batch_starts:
            batch_start = int(batch_start)
            batch_end = min(batch_start + self.batch_size, total)
            # Inputs touched by this batch and the copies of each one it holds.
            lo = int(np.searchsorted(ends, batch_start, side="right"))
            hi = int(np.searchsorted(ends, batch_end - 1, side="right")) + 1
            copy_begin = np.maximum(starts[lo:hi], batch_start) - starts[lo:hi]
            copy_end = np.minimum(ends[lo:hi], batch_end) - starts[lo:hi]
            batch_noise = noise[:batch_end - batch_start]
            source.fill_segments(stored[:batch_end - batch_start], [
                (input_id, begin, end)
                for input_id, begin, end in zip(input_ids[lo:hi].tolist(), copy_begin.tolist(), copy_end.tolist(),
                                                strict=True)
                if end > begin])
            if hi - lo == 1:
                row_cells = (lo - first) * self.n_classes
                row_sigma = sigma[lo]
                noisy = batch_noise.mul_(row_sigma).add_(X[lo])
            else:
                owner = torch.searchsorted(ends_t, torch.arange(batch_start, batch_end, device=self.device),
                                           right=True)
                row_cells = (owner - first) * self.n_classes
                row_sigma = sigma[owner]
                noisy = batch_noise.mul_(row_sigma.view((-1,) + (1,) * (X.dim() - 1))).add_(X[owner])
            noisy = noisy.to(X.dtype)  # rounds a half-precision input's float32 noisy copies; else no copy
            with precision:
                logits = forward(self.module, noisy, row_sigma)  # the level too, to a module of experts
            if logits.shape[1:] != (self.n_classes,):
                # Else a vote for a class >= n_classes would be added to the next input's row.
                raise ValueError(f"The module returned {' x '.join(map(str, logits.shape[1:])) or 'no'} logits per "
                                 f"input; expected n_classes={self.n_classes} (logits of shape (batch, "
                                 f"{self.n_classes})); for a fitted estimator: was module_ replaced after fit?")
            # The base classifier is undefined on a copy with NaN logits (torch's argmax would pick the NaN's
            # index): it votes for no class, which can only lower each class's count, so every bound stays sound.
            if soft:
                # Infinite logits clamped: the softmax of [inf, 0] is [1, 0], as argmax votes, not NaN.
                largest = torch.finfo(torch.float64).max
                probabilities = torch.softmax(logits.double().clamp(-largest, largest), dim=1).nan_to_num_(0.0)
                cells = (torch.as_tensor(row_cells, device=self.device).view(-1, 1) + class_cells)
                accumulator.index_add_(0, cells.expand(len(noisy), -1).reshape(-1), probabilities.view(-1))
                accumulator[no_class:].add_(torch.isnan(logits).any(dim=1).sum())
            else:
                # A row's max is NaN where any of its logits is; index_add_ rather than bincount, which
                # synchronises with the host on CUDA.
                top, votes = logits.max(dim=1)
                votes.add_(row_cells).masked_fill_(top.isnan(), no_class)
                accumulator.index_add_(0, votes, votes_weight[:len(votes)])
            if self.progress is not None:
                self.progress.update(batch_end - batch_start)
        counts = accumulator.cpu().numpy()
        return first, counts[:no_class].reshape(-1, self.n_classes), int(counts[no_class])
