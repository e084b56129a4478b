"""glibc's malloc policy for CPU certification: keep freed memory for the next batch.

Every forward pass allocates its activations afresh. At glibc's default
settings, buffers above its adaptive mmap threshold are mapped and unmapped
for every batch, and the heap's top is trimmed back to the kernel after each
pass, so the next batch page-faults the same memory in again. On the digits
CNN this cost certify up to half of its CPU time, by an amount that moves from
run to run with the batch sizes that cross the threshold (``docs/scaling.md``).
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
#: Freed memory kept, and the largest block allocated on the heap rather than mapped (bytes).
THRESHOLD = 1 << 30
#: Environment variables with which a user sets glibc's thresholds; their choice is kept.
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory():
    """Keep freed memory in this process (glibc's trim and mmap thresholds raised to 1 GiB).

    Changes how fast the model runs on the CPU, never what it computes: no
    count or certificate depends on it. The process keeps the memory of its
    largest batch until it exits, instead of handing it back to the kernel
    after every batch.

    Returns
    -------
    bool
        True if the thresholds were raised; False, with nothing changed,
        where the C library is not glibc or where the environment already sets
        one of glibc's ``MALLOC_*_THRESHOLD_`` / ``MALLOC_TOP_PAD_`` variables.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in _USER_SETTINGS):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_TRIM_THRESHOLD, THRESHOLD)) and bool(mallopt(_M_MMAP_THRESHOLD, THRESHOLD))
