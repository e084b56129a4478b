"""glibc's malloc policy for CPU certification and training: keep freed memory for the next batch.

Every forward pass allocates its activations afresh, and every training step
its noisy copies and gradients. At glibc's default settings, buffers above
its adaptive mmap threshold are mapped and unmapped for every batch, and the
heap's top is trimmed back to the kernel after each pass, so the next batch
page-faults the same memory in again. On the digits CNN this cost certify up
to half of its CPU time, by an amount that moves from run to run with the
batch sizes that cross the threshold; a MACER training epoch on real MNIST
(16 noisy copies per image) took 1.6x as long (``docs/scaling.md``).
Raising both thresholds keeps freed memory in the process for the next batch.

The policy is process-wide, so the library never sets it on its own: the
``smoothsk`` command does (it owns its process), and a script can call
:func:`keep_freed_memory` once at its start.
"""

import ctypes
import os
import platform

__all__ = ["keep_freed_memory"]

#: ``mallopt`` parameters of glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Largest block allocated on the heap rather than mapped (bytes); older glibc (before 2.35) refuses more
#: than 32 MiB on 64-bit systems, and then gets that.
MMAP_THRESHOLDS = (1 << 30, 32 << 20)
#: Freed memory at the top of the heap kept for the next allocation rather than trimmed (bytes).
TRIM_THRESHOLD = 1 << 30
#: Environment variables with which a user sets glibc's malloc; their choice is kept.
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def _user_sets_malloc():
    return (any(name in os.environ for name in _USER_SETTINGS)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


def keep_freed_memory():
    """Keep freed memory in this process (glibc's mmap and trim thresholds raised).

    Changes how fast the model runs on the CPU, never what it computes: no
    count or certificate depends on it. Freed memory stays with the process
    until it exits instead of going back to the kernel after every batch:
    about the largest batch's memory per thread that runs the model (each
    thread's heap keeps its own). Buffers larger than a thread's heap (64 MiB
    outside the main thread) are still mapped afresh.

    The mmap threshold is set first (1 GiB, or 32 MiB where glibc refuses
    more); the trim threshold only once that succeeded, since setting either
    one switches off glibc's adaptive mmap threshold.

    Returns
    -------
    bool
        True if both thresholds were raised; False, with nothing changed,
        where the C library is not glibc, where glibc refuses both mmap
        thresholds, or where the environment already sets glibc's malloc
        (``MALLOC_*_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or ``glibc.malloc.*``
        in ``GLIBC_TUNABLES``).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or _user_sets_malloc():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if not any(mallopt(_M_MMAP_THRESHOLD, threshold) for threshold in MMAP_THRESHOLDS):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
