"""``benchmarks/gpu_check.sh --dry-run``: every step of the GPU check at toy size on the CPU.

The GPU machine is lent rarely and briefly: a step that fails there for a
reason the CPU could have shown (a typo, a renamed option, a missing file)
costs the whole check. This runs the same script, the same steps and
commands, on the CPU, with a small stand-in for the shared MNIST.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from test_datasets import write_idx, write_mnist_csv

ROOT = Path(__file__).resolve().parents[1]


def test_every_step_runs_at_toy_size(tmp_path):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    rng = np.random.default_rng(0)
    write_idx(mnist / "t10k-images-idx3-ubyte", rng.integers(0, 256, (40, 28, 28)), compress=True)
    write_idx(mnist / "t10k-labels-idx1-ubyte", np.arange(40) % 10, compress=True)
    write_mnist_csv(mnist / "mnist_5k.csv.gz", rng.integers(0, 256, (20, 28, 28)), np.arange(20) % 10)
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], capture_output=True,
                            text=True, env={**os.environ, "OUT": str(out), "MNIST_DATA": str(mnist),
                                 # the script calls python3: this interpreter's, in a virtual environment too
                                 "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}, timeout=300)
    summary = (out / "summary.md").read_text()
    assert result.returncode == 0, summary
    assert summary.count(": exit 0 in ") == 5
    assert "| 200 | 2 | bf16 |" in (out / "cifar.log").read_text()
    assert "| gaussian | 1 |" in (out / "mnist.log").read_text()
    assert "| router-gaussian | per input |" in (out / "router.log").read_text()
