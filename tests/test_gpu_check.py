"""``benchmarks/gpu_check.sh`` and ``gpu_tables.sh`` with ``--dry-run``: every step at toy size on the CPU.

The GPU machine is lent rarely and briefly: a step that fails there for a
reason the CPU could have shown (a typo, a renamed option, a missing file)
costs the whole check. This runs the same script, the same steps and
commands, on the CPU, with a small stand-in for the shared MNIST.

They start a dozen fresh interpreters (90 s on two cores), so they run where
the scripts are about to be used, not in every run of the suite:
``benchmarks/gpu_check.sh --prepare`` runs them before it fills the kit (by
hand: ``python -m pytest -m gpu_scripts tests/test_gpu_check.py``).
"""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from test_datasets import write_idx, write_mnist_csv

pytestmark = pytest.mark.gpu_scripts

ROOT = Path(__file__).resolve().parents[1]


def toy_mnist(folder):
    """A small stand-in for the shared MNIST folder: 40 test images and 20 CSV training images."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    write_idx(folder / "t10k-images-idx3-ubyte", rng.integers(0, 256, (40, 28, 28)), compress=True)
    write_idx(folder / "t10k-labels-idx1-ubyte", np.arange(40) % 10, compress=True)
    write_mnist_csv(folder / "mnist_5k.csv.gz", rng.integers(0, 256, (20, 28, 28)), np.arange(20) % 10)
    return folder


def dry_run(script, out, mnist, **env):
    """Run ``benchmarks/<script> --dry-run`` with its output in ``out``; check it left no scratch folder.

    (torch's compile cache, ``torchinductor_<user>``, is torch's to keep.)
    """
    scratch = out.parent / f"{out.name}-tmp"
    scratch.mkdir()
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / script), "--dry-run"], capture_output=True, text=True,
                            env={**os.environ, "OUT": str(out), "MNIST_DATA": str(mnist), "TMPDIR": str(scratch),
                                 **env,
                                 # the script calls python3: this interpreter's, in a virtual environment too
                                 "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
                            timeout=300)
    left = sorted(path.name for path in scratch.iterdir() if not path.name.startswith("torchinductor_"))
    assert not left, f"{script} left {left} behind"
    return result


def test_every_step_runs_at_toy_size(tmp_path):
    out = tmp_path / "out"
    result = dry_run("gpu_check.sh", out, toy_mnist(tmp_path / "mnist"))
    summary = (out / "summary.md").read_text()
    assert result.returncode == 0, summary
    assert summary.count(": exit 0 in ") == 5
    assert "| 20 | 1 | bf16 |" in (out / "cifar.log").read_text()
    assert "| gaussian | 1 |" in (out / "mnist.log").read_text()
    assert "| router-gaussian | per input |" in (out / "router.log").read_text()


def test_the_tables_run_archives_every_row_and_resumes_from_the_archive(tmp_path):
    mnist, kit = toy_mnist(tmp_path / "mnist"), tmp_path / "kit"
    first = dry_run("gpu_tables.sh", tmp_path / "first", mnist)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "| macer | 1 |" in first.stdout and "| smoothadv+consistency | 0.25 |" in first.stdout
    with tarfile.open(tmp_path / "first" / "tables.tar.gz") as archive:
        names = archive.getnames()
        assert "tables/macer-sigma1-e1-published-optimizer.safetensors" in names
        archive.extractall(kit, filter="data")
    for certificates in (kit / "tables").glob("*.json"):
        certificates.unlink()  # as if the time limit had stopped the rows after training
    second = dry_run("gpu_tables.sh", tmp_path / "second", mnist, GPU_KIT=str(kit), ROWS="macer-1")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "| macer | 1 |" in second.stdout and "| read back |" in second.stdout  # certified, not trained again
