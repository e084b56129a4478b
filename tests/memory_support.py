"""Peak host memory of a call, measured in a fresh interpreter (``tests/test_*_memory.py``).

A probe is Python source run by :func:`run_probe` in a new process, one
thread, with this folder importable: it builds what it measures, wraps the
call in :func:`peak_rss_growth` and prints a JSON line last.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


class PatchConv(torch.nn.Module):
    """A 16x16-patch convolution over 3-channel images, pooled to ``n_classes`` logits: little compute per pixel."""

    def __init__(self, n_classes=2):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 16, stride=16), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(4, n_classes))

    def forward(self, x):
        return self.layers(x)


@contextlib.contextmanager
def peak_rss_growth():
    """Yield a one-item list that holds, after the block, its peak resident set size growth in bytes.

    A thread samples the resident set size every millisecond (tracemalloc
    does not see torch's allocations); the growth is the peak minus the size
    before the block.
    """
    import psutil

    process = psutil.Process()
    before = process.memory_info().rss
    peak, done, growth = [before], threading.Event(), [0]

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield growth
    finally:
        done.set()
        sampler.join()
        growth[0] = peak[0] - before


def run_probe(probe, *args):
    """Run ``probe`` (Python source) with ``args`` in a fresh one-thread interpreter; its last line, parsed as JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", probe, *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])
