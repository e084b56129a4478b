import errno
import os
import socket
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from test_datasets import write_idx

from smoothsk import SampleWiseSmoothedClassifier, _regular_file, datasets
from smoothsk._npz import NpyFile, NpzArchive
from smoothsk._regular_file import (
    NotARegularFileError,
    allocating,
    check_regular_file,
    open_regular_file,
    read_regular_file,
)
from smoothsk.cli import main
from smoothsk.datasets import load_cifar10, load_mnist, load_mnist_protocol
from smoothsk.models import FlatMLP

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")

#: Seconds a reader may take to refuse a FIFO; one that opens it waits for a writer for ever.
PATIENCE = 10


def outcome_without_a_writer(read, fifo):
    """What ``read()`` returned or raised, failing the test if it blocked on ``fifo`` waiting for a writer.

    The reader runs in a thread; a blocked one is released afterwards by
    opening the FIFO's write end, so that no thread outlives the test.
    """
    outcome = []

    def run():
        try:
            outcome.append(read())
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PATIENCE)
    blocked = thread.is_alive()
    if blocked:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader gets end of file
        thread.join(PATIENCE)
    assert not blocked, f"the reader opened the FIFO {fifo} and waited for a writer"
    return outcome[0]


class TestOpenRegularFile:
    def test_reads_a_regular_file_and_one_through_a_symbolic_link(self, tmp_path):
        (tmp_path / "file").write_bytes(b"content")
        (tmp_path / "link").symlink_to(tmp_path / "file")
        for name in ("file", "link"):
            check_regular_file(tmp_path / name)
            with open_regular_file(tmp_path / name) as file:
                assert file.read() == b"content"

    @pytest.mark.parametrize("kind", ["a FIFO", "a directory", "a device", "a socket"])
    def test_anything_else_is_refused_naming_what_it_is(self, tmp_path, kind):
        path = tmp_path / "special"
        if kind == "a FIFO":
            os.mkfifo(path)
        elif kind == "a directory":
            path.mkdir()
        elif kind == "a device":
            path = Path(os.devnull)
        else:
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(path))
            server.close()
        for check in (check_regular_file, open_regular_file):
            error = outcome_without_a_writer(lambda check=check: check(path), path)
            assert isinstance(error, OSError) and error.strerror == f"not a regular file ({kind})"
            assert error.filename == os.fspath(path)

    def test_a_fifo_behind_a_symbolic_link_is_refused(self, tmp_path):
        os.mkfifo(tmp_path / "fifo")
        (tmp_path / "link").symlink_to(tmp_path / "fifo")
        error = outcome_without_a_writer(lambda: open_regular_file(tmp_path / "link"), tmp_path / "fifo")
        assert isinstance(error, OSError) and "not a regular file (a FIFO)" in str(error)

    def test_a_fifo_swapped_in_after_the_check_is_refused_without_waiting(self, tmp_path, monkeypatch):
        path = tmp_path / "data"
        path.write_bytes(b"checked")
        real_open = os.open

        def swap_then_open(name, flags, *args):
            os.remove(name)
            os.mkfifo(name)
            return real_open(name, flags, *args)

        monkeypatch.setattr(os, "open", swap_then_open)
        error = outcome_without_a_writer(lambda: open_regular_file(path), path)
        assert isinstance(error, OSError) and "not a regular file (a FIFO)" in str(error)

    def test_an_empty_file_is_refused(self, tmp_path):
        (tmp_path / "empty").write_bytes(b"")
        with pytest.raises(OSError, match="an empty file"):
            open_regular_file(tmp_path / "empty")


def fifo_named(folder, name):
    path = Path(folder) / name
    os.mkfifo(path)
    return path


#: A child process that reads each model file named in argv (``load`` for ``*-load.safetensors``, ``smoothsk
#: certify --module`` for ``*-module.safetensors``) and prints ``name<TAB>error`` for each. A ``swap-*`` file is
#: swapped for a FIFO, a ``truncate-*`` file cut to 1,000 bytes in place, as soon as smoothsk has opened it (or,
#: should it hand safetensors the name instead, a FIFO before safetensors opens it, a cut once it has mapped it).
MODEL_FILES_CHILD = """
import contextlib, io, os, sys
import numpy as np
import safetensors
real_safe_open, real_fdopen, pending = safetensors.safe_open, os.fdopen, []

def tamper():
    model = pending.pop()
    if os.path.basename(model).startswith("swap-"):
        os.remove(model)
        os.mkfifo(model)
    else:
        os.truncate(model, 1000)

def fdopen_then_tamper(descriptor, *args, **kwargs):
    file = real_fdopen(descriptor, *args, **kwargs)
    if pending and os.fstat(descriptor).st_ino == os.stat(pending[-1]).st_ino:
        tamper()
    return file

class TamperedOnEntry:
    def __init__(self, file):
        self.file = file

    def __enter__(self):
        entered = self.file.__enter__()
        if pending:
            tamper()  # once it has mapped the file
        return entered

    def __exit__(self, *exc_info):
        return self.file.__exit__(*exc_info)

def tamper_around_safe_open(path, *args, **kwargs):
    if pending and os.path.basename(pending[-1]).startswith("swap-"):
        tamper()  # before it opens the path
    return TamperedOnEntry(real_safe_open(path, *args, **kwargs))

os.fdopen, safetensors.safe_open = fdopen_then_tamper, tamper_around_safe_open  # before smoothsk imports them
from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.cli import main

def error_of(model):
    if model.endswith("-load.safetensors"):
        try:
            SampleWiseSmoothedClassifier.load(model)
        except ValueError as error:
            return str(error)
        return "loaded"
    data = model + ".npz"
    np.savez(data, X=np.zeros((2, 4), dtype=np.float32))
    with contextlib.redirect_stderr(io.StringIO()) as stderr:
        main(["certify", model, data, "--module", "flat-mlp", "--classes", "0,1", "--sigma", "0.5",
              "--out", model + ".csv"])
    return stderr.getvalue().removeprefix("smoothsk certify: error: ").removesuffix("\\n")

for model in sys.argv[1:]:
    if not os.path.basename(model).startswith("fifo-"):
        pending.append(model)
    print(f"{os.path.basename(model)}\\t{error_of(model)}", flush=True)
"""


class TestEveryReaderRefusesAFifo:
    """Each file smoothsk reads, named by a FIFO: a one-line error naming it, never a wait for a writer."""

    @pytest.mark.parametrize("reader", [NpzArchive, NpyFile])
    def test_npz_and_npy(self, tmp_path, reader):
        fifo = fifo_named(tmp_path, "data.npz")
        error = outcome_without_a_writer(lambda: reader(fifo), fifo)
        assert isinstance(error, NotARegularFileError) and error.kind == "a FIFO"

    def test_the_data_file_of_the_command_line(self, tmp_path, capsys):
        fifo = fifo_named(tmp_path, "data.npz")
        code = outcome_without_a_writer(lambda: main(["fit", str(fifo), "--out", str(tmp_path / "m.safetensors")]),
                                        fifo)
        assert code == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and error.startswith(f"smoothsk fit: error: {fifo}: ")
        assert "not a regular file (a FIFO)" in error
        assert "np.savez" not in error  # how to write an archive does not help with a file that is none

    def test_model_files_read_by_load_and_by_certify_module(self, tmp_path):
        # In a child process: safetensors opens a file holding the GIL, so a thread blocked there blocks the test,
        # and a mapped file truncated in place kills the process. A FIFO named as the model file; a file checked
        # (not safetensors, which is what must be reported) then swapped for a FIFO; a model file and a weights file
        # then cut short in place by its writer (both read in whole, to compute the digest or copy the weights).
        cases = ("fifo", "swap", "truncate")
        for route in ("load", "module"):
            fifo_named(tmp_path, f"fifo-{route}.safetensors")
            (tmp_path / f"swap-{route}.safetensors").write_bytes(b"\x05" * 100)
        network, wide = FlatMLP(n_classes=2), FlatMLP(n_classes=2, hidden=4096)  # 2 kB and 100 kB of weights
        for module in (network, wide):
            module(torch.zeros(1, 4))  # the child's data: inputs of 4 features
        safetensors.torch.save_file({name: value.contiguous() for name, value in network.state_dict().items()},
                                    tmp_path / "truncate-module.safetensors")
        SampleWiseSmoothedClassifier.from_module(wide, input_shape=(4,), classes=[0, 1]).save(
            tmp_path / "truncate-load.safetensors")
        models = [str(tmp_path / f"{case}-{route}.safetensors") for case in cases for route in ("load", "module")]
        try:
            child = subprocess.run([sys.executable, "-c", MODEL_FILES_CHILD, *models], capture_output=True, text=True,
                                   timeout=PATIENCE)
        except subprocess.TimeoutExpired as killed:
            pytest.fail(f"reading a model file waited on a FIFO for a writer; read before: {killed.stdout!r}")
        assert child.returncode == 0, (child.returncode, child.stdout, child.stderr)
        errors = dict(line.split("\t") for line in child.stdout.splitlines() if "\t" in line)
        assert sorted(errors) == sorted(Path(model).name for model in models), child.stderr
        fifo = tmp_path / "fifo"
        assert errors["fifo-load.safetensors"] == f"{fifo}-load.safetensors: it is a FIFO, not a smoothsk model file."
        assert errors["fifo-module.safetensors"] == (f"{fifo}-module.safetensors: it is a FIFO, not a safetensors "
                                                     "file of --module flat-mlp's weights.")
        for case in ("swap", "truncate"):
            for route in ("load", "module"):
                model = tmp_path / f"{case}-{route}.safetensors"
                assert errors[model.name].startswith(f"{model}: not a readable safetensors file ("), errors[model.name]

    @pytest.mark.parametrize("name", ["t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz"])
    def test_mnist_files(self, tmp_path, name):
        fifo = fifo_named(tmp_path, name)
        fifo_named(tmp_path, "t10k-labels-idx1-ubyte")
        error = outcome_without_a_writer(lambda: load_mnist(tmp_path, train=False), fifo)
        assert isinstance(error, ValueError) and str(error).startswith(f"{fifo}: ")
        assert "not a regular file (a FIFO)" in str(error)

    def test_the_mnist_protocol_csv(self, tmp_path):
        write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((20, 28, 28)))
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(20))
        fifo = fifo_named(tmp_path, "mnist_5k.csv.gz")
        error = outcome_without_a_writer(lambda: load_mnist_protocol(tmp_path), fifo)
        assert isinstance(error, ValueError) and str(error).startswith(f"{fifo}: ")
        assert "not a regular file (a FIFO)" in str(error)

    def test_a_cifar_batch(self, tmp_path):
        fifo = fifo_named(tmp_path, "test_batch.bin")
        error = outcome_without_a_writer(lambda: load_cifar10(tmp_path, train=False), fifo)
        assert isinstance(error, ValueError) and "not a regular file (a FIFO)" in str(error)
        assert str(fifo) in str(error)


def test_a_gzipped_file_is_bounded_by_the_size_of_the_file_opened_not_of_what_the_path_names_later(tmp_path,
                                                                                                     monkeypatch):
    n_images = 20_000  # 15.7 MB of zeros, gzipped to about 15 kB: over the ratio MNIST's files stay within
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((n_images, 28, 28)), compress=True)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(n_images), compress=True)
    larger = tmp_path / "larger"
    with open(larger, "wb") as file:
        file.truncate(1 << 30)

    def open_then_replace(path):  # another process renames a larger file over the path once it is open
        opened = open_regular_file(path)
        os.replace(larger, path)
        return opened

    monkeypatch.setattr(datasets, "open_regular_file", open_then_replace)
    with pytest.raises(ValueError, match="over 256 times the gzipped file's size"):
        datasets.load_mnist(tmp_path, train=False)


class TestReadRegularFile:
    def test_the_bytes_of_the_file_are_returned(self, tmp_path):
        (tmp_path / "file").write_bytes(b"\x00smoothsk\xff")
        assert read_regular_file(tmp_path / "file") == b"\x00smoothsk\xff"
        assert read_regular_file(tmp_path / "file", largest=10) == b"\x00smoothsk\xff"

    def test_a_file_over_largest_is_refused_before_anything_is_allocated_for_it(self, tmp_path):
        with open(tmp_path / "sparse", "wb") as file:
            file.truncate(1 << 30)
        tracemalloc.start()
        try:
            with pytest.raises(OSError, match="1073741824 bytes, more than the 4096 a file of its kind may take"):
                read_regular_file(tmp_path / "sparse", largest=4096)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 1 << 20, peak

    def test_a_file_larger_than_memory_is_refused_before_anything_is_allocated_for_it(self, tmp_path):
        with open(tmp_path / "sparse", "wb") as file:
            file.truncate(1 << 42)  # 4 TiB of nothing: no reader can hold it whole
        tracemalloc.start()
        try:
            with pytest.raises(OSError, match=r"4398046511104 bytes, more than this machine's memory \(\d+\)"):
                read_regular_file(tmp_path / "sparse")
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 1 << 20, peak

    def test_a_failed_allocation_is_the_files_refusal(self):
        with pytest.raises(OSError) as refusal, allocating(100, "f.bin"):
            raise MemoryError
        assert (refusal.value.errno, refusal.value.strerror, refusal.value.filename) == (
            errno.ENOMEM, "100 bytes, more than this process can allocate", "f.bin")

    @pytest.mark.parametrize("change, read", [(b"more", 104), (None, 50)])
    def test_a_file_that_grows_or_shrinks_once_opened_is_refused(self, tmp_path, monkeypatch, change, read):
        path = tmp_path / "file"
        path.write_bytes(bytes(100))

        class ChangedOnRead:  # another process writes to the file in place between its status and the read
            def __init__(self, name):
                self.file = open_regular_file(name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.file.close()

            def fileno(self):
                return self.file.fileno()

            def read(self, size):
                with open(path, "r+b") as file:
                    if change is None:
                        file.truncate(50)
                    else:
                        file.seek(0, os.SEEK_END)
                        file.write(change)
                return self.file.read(size)

        monkeypatch.setattr(_regular_file, "open_regular_file", ChangedOnRead)
        expected = f"read {min(read, 101)} of the 100 bytes its size says: it changed while it was read"
        with pytest.raises(OSError, match=expected):
            read_regular_file(path)
