import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from test_datasets import write_idx

from smoothsk import _regular_file as regular_file
from smoothsk import datasets
from smoothsk._npz import NpzArchive, memory_map_npy
from smoothsk._regular_file import check_regular_file, open_regular_file, regular_file_path
from smoothsk.cli import main
from smoothsk.datasets import load_cifar10, load_mnist, load_mnist_protocol

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

    def test_the_name_handed_to_a_library_opens_the_file_checked_whatever_the_path_names_later(self, tmp_path):
        path, other = tmp_path / "data", tmp_path / "other"
        path.write_bytes(b"checked")
        other.write_bytes(b"renamed over it")
        with regular_file_path(path) as name:
            os.replace(other, path)
            with open(name, "rb") as file:
                assert file.read() == b"checked"

    @pytest.mark.parametrize("folders", ["none", "missing", "naming other files"])
    def test_where_descriptors_have_no_name_the_library_gets_the_path_checked(self, tmp_path, monkeypatch, folders):
        elsewhere = tmp_path / "fd"  # as a /proc of another process namespace: its names are other files
        if folders == "naming other files":
            elsewhere.mkdir()
            for descriptor in range(1024):
                (elsewhere / str(descriptor)).write_bytes(b"another file")
        monkeypatch.setattr(regular_file, "_DESCRIPTOR_FOLDERS", () if folders == "none" else (str(elsewhere),))
        (tmp_path / "data").write_bytes(b"checked")
        with regular_file_path(tmp_path / "data") as name:
            assert name == str(tmp_path / "data")

    def test_an_empty_file_is_refused(self, tmp_path):
        (tmp_path / "empty").write_bytes(b"")
        with pytest.raises(OSError, match="an empty file"):
            open_regular_file(tmp_path / "empty")


def fifo_named(folder, name):
    path = Path(folder) / name
    os.mkfifo(path)
    return path


#: A child process that reads each model file named in argv (``load`` for ``*-load.safetensors``, ``smoothsk
#: certify --module`` for ``*-module.safetensors``) and prints ``name<TAB>error`` for each. For ``swap-*`` files,
#: safetensors' ``safe_open`` first swaps the file for a FIFO (between smoothsk's check and safetensors' open).
MODEL_FILES_CHILD = """
import contextlib, io, os, sys
import numpy as np
import safetensors
real_safe_open, swap = safetensors.safe_open, []

def swap_then_safe_open(path, *args, **kwargs):
    if swap:
        model = swap.pop()
        os.remove(model)
        os.mkfifo(model)
    return real_safe_open(path, *args, **kwargs)

safetensors.safe_open = swap_then_safe_open  # before smoothsk imports it
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
    if os.path.basename(model).startswith("swap-"):
        swap.append(model)
    print(f"{os.path.basename(model)}\\t{error_of(model)}", flush=True)
"""


class TestEveryReaderRefusesAFifo:
    """Each file smoothsk reads, named by a FIFO: a one-line error naming it, never a wait for a writer."""

    @pytest.mark.parametrize("reader", [NpzArchive, memory_map_npy])
    def test_npz_and_npy(self, tmp_path, reader):
        fifo = fifo_named(tmp_path, "data.npz")
        error = outcome_without_a_writer(lambda: reader(fifo), fifo)
        assert isinstance(error, ValueError) and "not a regular file (a FIFO)" in str(error)

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
        # In a child process: safetensors opens a file holding the GIL, so a thread blocked there blocks the test.
        # A FIFO named as the model file; and a file checked (not safetensors, which is what must be reported)
        # then swapped for a FIFO before safetensors opens it.
        for route in ("load", "module"):
            fifo_named(tmp_path, f"fifo-{route}.safetensors")
            (tmp_path / f"swap-{route}.safetensors").write_bytes(b"\x05" * 100)
        models = [str(tmp_path / f"{case}-{route}.safetensors")
                  for case in ("fifo", "swap") for route in ("load", "module")]
        try:
            child = subprocess.run([sys.executable, "-c", MODEL_FILES_CHILD, *models], capture_output=True, text=True,
                                   timeout=PATIENCE)
        except subprocess.TimeoutExpired as killed:
            pytest.fail(f"reading a model file waited on a FIFO for a writer; read before: {killed.stdout!r}")
        errors = dict(line.split("\t") for line in child.stdout.splitlines())
        assert sorted(errors) == sorted(Path(model).name for model in models), child.stderr
        fifo, swapped = tmp_path / "fifo", tmp_path / "swap"
        assert errors["fifo-load.safetensors"] == f"{fifo}-load.safetensors: it is a FIFO, not a smoothsk model file."
        assert errors["fifo-module.safetensors"] == (f"{fifo}-module.safetensors: it is a FIFO, not a safetensors "
                                                     "file of --module flat-mlp's weights.")
        for route in ("load", "module"):
            assert errors[f"swap-{route}.safetensors"].startswith(f"{swapped}-{route}.safetensors: not a readable "
                                                                 "safetensors file (")

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
