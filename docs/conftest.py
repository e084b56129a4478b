"""The docs' examples: ``docs/mnist.md`` runs on the shared real MNIST, and is skipped without it."""

from pathlib import Path

import pytest

#: The shared real MNIST, beside the repository (``../shared/data/mnist`` from its root).
MNIST_FOLDER = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"


@pytest.fixture(autouse=True)
def _mnist_folder(request, doctest_namespace):
    """Give ``docs/mnist.md`` the folder as ``MNIST_FOLDER``; skip it where the folder is absent."""
    if Path(str(request.node.fspath)).name == "mnist.md":
        if not MNIST_FOLDER.exists():
            pytest.skip(f"the shared real MNIST ({MNIST_FOLDER}) is absent")
        doctest_namespace["MNIST_FOLDER"] = str(MNIST_FOLDER)
