"""Tests of smoothsk._npz: arrays of a hostile .npz are read only within checked bounds."""

import errno
import os
import re
import tracemalloc
import zipfile

import numpy as np
import pytest

from smoothsk._npz import MAX_COMPRESSION_RATIO, SMALL_MEMBER_BYTES, NpyFile, NpzArchive

from conftest import forbid
from npz_support import npy_bytes, write_npz


def read_all(path, max_bytes=None):
    with NpzArchive(path) as archive:
        return {name: archive.read(name, max_bytes) for name in archive.names}


def refused(path, words, name="X", max_bytes=None):
    """Assert that reading array ``name`` of ``path`` raises a one-line ValueError with ``words``."""
    with pytest.raises(ValueError, match=words) as error, NpzArchive(path) as archive:
        archive.read(name, max_bytes)
    assert "\n" not in str(error.value)


ARRAYS = {"X": np.arange(12, dtype=np.float32).reshape(3, 4), "fortran": np.asfortranarray(np.eye(3)[:, :2]),
          "labels": np.array(["cat", "dog"]), "flags": np.array([True, False]), "empty": np.zeros((0, 5)),
          "scalar": np.array(7)}


#: A header of 3,000 dimensions (under numpy's header limit): an error message quoting it whole is 10 kB long.
LONG_SHAPE_HEADER = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3, " + b"4," * 3000 + b")}\n"


class TestReads:
    @pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
    def test_reads_what_numpy_writes(self, tmp_path, save):
        path = tmp_path / "data.npz"
        save(path, **ARRAYS)
        arrays = read_all(path)
        assert list(arrays) == list(ARRAYS)
        for name, expected in ARRAYS.items():
            np.testing.assert_array_equal(arrays[name], expected)
            assert arrays[name].dtype == expected.dtype and arrays[name].flags.writeable
        assert arrays["fortran"].flags.f_contiguous

    def test_header_reads_no_data(self, tmp_path, monkeypatch):
        path = tmp_path / "data.npz"
        np.savez(path, **ARRAYS)
        forbid(monkeypatch, np, "empty", "allocated an array to describe one")
        with NpzArchive(path) as archive:
            header = archive.header("X")
        assert (header.shape, header.dtype, header.nbytes) == ((3, 4), np.float32, 48)

    def test_a_small_member_is_read_whatever_its_ratio(self, tmp_path):
        path = tmp_path / "zeros.npz"
        np.savez_compressed(path, X=np.zeros(SMALL_MEMBER_BYTES // 8 - 16))  # inflates about 500 times
        assert not read_all(path)["X"].any()


class TestRefusals:
    def test_object_arrays_are_never_unpickled(self, tmp_path):
        path = tmp_path / "objects.npz"
        np.savez(path, X=np.array([1, "text", None], dtype=object))
        refused(path, "holds Python objects")

    def test_a_single_npy_file_and_other_files_are_not_archives(self, tmp_path):
        np.save(tmp_path / "X.npy", ARRAYS["X"])
        (tmp_path / "text.npz").write_text("not a zip")
        with pytest.raises(ValueError, match="a single .npy array"):
            NpzArchive(tmp_path / "X.npy")
        with pytest.raises(ValueError, match="not an .npz archive"):
            NpzArchive(tmp_path / "text.npz")
        with pytest.raises(FileNotFoundError):
            NpzArchive(tmp_path / "missing.npz")

    def test_an_absent_array_is_named(self, tmp_path):
        path = tmp_path / "data.npz"
        np.savez(path, inputs=ARRAYS["X"])
        refused(path, r"no array 'X' \(the file has \['inputs'\]\)")

    def test_a_header_declaring_more_than_the_member_holds_is_refused_before_allocating(self, tmp_path,
                                                                                      monkeypatch):
        # The regression of the CLI: a 200-byte file whose header claims 10**13 rows (a MemoryError traceback).
        path = tmp_path / "claims.npz"
        write_npz(path, {"X": npy_bytes(np.zeros((1, 4), np.float32), shape=(10 ** 13, 4))})
        forbid(monkeypatch, np, "empty", "allocated the declared array")
        refused(path, r"declares 160000000000000 bytes \(shape \(10000000000000, 4\) of float32\) but holds 16")

    def test_a_dimension_numpy_never_writes_is_refused(self, tmp_path):
        # numpy's header reader takes a bool for an int; the reshape then raised a TypeError.
        path = tmp_path / "bool.npz"
        write_npz(path, {"X": npy_bytes(np.zeros(4, np.float32), shape=(True, 4))})
        refused(path, r"'X' declares shape \(True, 4\) of float32, which no array written by numpy has")

    @pytest.mark.parametrize("shape", [(2**63, 0), (2**62, 2**62, 0)])
    def test_a_shape_numpy_cannot_create_is_refused_even_if_empty(self, tmp_path, shape):
        # numpy's reshape raised 'Maximum allowed dimension exceeded', naming no array.
        path = tmp_path / "empty.npz"
        write_npz(path, {"X": npy_bytes(np.zeros(0, np.float32), shape=shape)})
        refused(path, r"'X' declares shape .*, which no array written by numpy has")

    def test_records_are_refused_without_quoting_their_fields(self, tmp_path):
        # A structured dtype of 500 fields fits a header: every message quoting it was 8 kB long.
        fields = np.dtype([(f"f{i}", "<f4") for i in range(500)])
        path = tmp_path / "records.npz"
        write_npz(path, {"X": np.zeros(1, fields)})
        with pytest.raises(ValueError, match=r"'X' holds records \(500 fields\)") as error, \
                NpzArchive(path) as archive:
            archive.header("X")
        assert len(str(error.value)) < 400

    def test_more_than_max_bytes_is_refused(self, tmp_path):
        path = tmp_path / "data.npz"
        np.savez(path, X=ARRAYS["X"])
        assert read_all(path, max_bytes=48)["X"].shape == (3, 4)
        refused(path, "declares 48 bytes .* more than the 47 it may hold", max_bytes=47)

    @pytest.mark.parametrize("compress", [False, True])
    def test_sizes_the_zip_directory_claims_are_checked_before_reading(self, tmp_path, monkeypatch, compress):
        path = tmp_path / "lies.npz"
        write_npz(path, {"X": ARRAYS["X"]}, compress=compress, file_sizes={"X": 5 << 30})
        forbid(monkeypatch, zipfile.ZipFile, "open", "opened a member")
        refused(path, f"more than {MAX_COMPRESSION_RATIO} times")
        refused(path, "takes 5368709120 bytes by the zip directory, more than an array of 48 bytes", max_bytes=48)

    def test_a_zip_bomb_is_refused_before_it_is_inflated(self, tmp_path, monkeypatch):
        path = tmp_path / "bomb.npz"
        np.savez_compressed(path, X=np.zeros((1 << 20, 4), dtype=np.float32))  # 16 MiB in about 16 KiB
        forbid(monkeypatch, zipfile.ZipFile, "open", "opened a member")
        refused(path, rf"inflates from \d+ to 16777344 bytes, more than {MAX_COMPRESSION_RATIO} times .* np.savez")

    def test_encrypted_members_and_unknown_compression_are_refused(self, tmp_path):
        path = tmp_path / "encrypted.npz"
        write_npz(path, {"X": ARRAYS["X"]}, encrypted=("X",))
        refused(path, "'X' cannot be read .*encrypted")
        path = tmp_path / "method.npz"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("X.npy", npy_bytes(ARRAYS["X"]))
            archive.infolist()[0].compress_type = 99
        refused(path, "'X' cannot be read .*compression method")

    def test_a_long_npy_header_is_refused(self, tmp_path):
        path = tmp_path / "long.npz"
        header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (0,), " + b" " * 20_000 + b"}\n"
        write_npz(path, {"X": b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header})
        refused(path, "no valid .npy header")

    def test_a_header_numpy_cannot_tokenize_is_refused(self, tmp_path):
        # numpy's header parser raises tokenize.TokenError (not a ValueError) on an unclosed bracket.
        header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), (" + b" " * 50 + b"\n"
        path = tmp_path / "unclosed.npz"
        write_npz(path, {"X": b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(48)})
        refused(path, "'X' has no valid .npy header .*EOF in multi-line statement")

    @pytest.mark.parametrize("header", [b"[" + b"1," * 4000 + b"]\n", LONG_SHAPE_HEADER], ids=["list", "long shape"])
    def test_a_long_header_is_not_quoted_whole(self, tmp_path, header):
        path = tmp_path / "quoted.npz"
        write_npz(path, {"X": b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header + bytes(48)})
        with pytest.raises(ValueError, match="'X' (has no valid .npy header|declares)") as error, \
                NpzArchive(path) as archive:
            archive.read("X")
        assert len(str(error.value)) < 400

    def test_a_failed_allocation_is_a_value_error(self, tmp_path, monkeypatch):
        path = tmp_path / "data.npz"
        np.savez(path, X=ARRAYS["X"])

        def out_of_memory(*args, **kwargs):
            raise MemoryError

        monkeypatch.setattr(np, "empty", out_of_memory)
        refused(path, "needs 48 bytes .* more than can be allocated")

    @pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
    def test_any_damaged_byte_is_read_or_refused_with_a_value_error(self, tmp_path, save):
        # Every single-byte change of a small archive: no other exception, no traceback.
        path, damaged = tmp_path / "data.npz", tmp_path / "damaged.npz"
        save(path, X=ARRAYS["X"], labels=ARRAYS["labels"])
        content = path.read_bytes()
        for index in range(len(content)):
            damaged.write_bytes(content[:index] + bytes([content[index] ^ 0xFF]) + content[index + 1:])
            try:
                read_all(damaged, max_bytes=1 << 10)
            except ValueError as error:
                assert "\n" not in str(error), index


class TestNpyFile:
    """``NpyFile``: a single ``.npy`` file read by rows through its checked descriptor, never mapped."""

    @pytest.mark.parametrize("name", ["X", "fortran", "labels", "flags"])
    def test_reads_what_numpy_writes_whole_and_by_rows(self, tmp_path, name):
        np.save(tmp_path / "a.npy", ARRAYS[name])
        npy = NpyFile(tmp_path / "a.npy")
        assert npy.shape == ARRAYS[name].shape and npy.dtype == ARRAYS[name].dtype and len(npy) == len(ARRAYS[name])
        np.testing.assert_array_equal(np.asarray(npy), ARRAYS[name])
        for start, stop in [(0, 1), (1, len(npy)), (len(npy) - 1, len(npy))]:
            rows = npy.rows(start, stop)
            np.testing.assert_array_equal(rows, ARRAYS[name][start:stop])
            assert rows.flags.c_contiguous and rows.flags.writeable

    def test_a_fortran_ordered_image_array_reads_rows_of_images(self, tmp_path):
        images = np.asfortranarray(np.arange(5 * 2 * 3 * 4, dtype=">f8").reshape(5, 2, 3, 4))
        np.save(tmp_path / "f.npy", images)
        npy = NpyFile(tmp_path / "f.npy")
        rows = npy.rows(1, 4)
        np.testing.assert_array_equal(rows, images[1:4])
        assert rows.dtype == np.dtype(">f8") and rows.flags.c_contiguous
        np.testing.assert_array_equal(np.asarray(npy, dtype=np.float32), images.astype(np.float32))

    def test_a_row_of_a_fortran_ordered_file_takes_the_memory_of_a_row(self, tmp_path):
        # 16,384 features: one run of the file each. A buffer and an array per run took about 680 bytes a feature.
        np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((2, 1 << 14), np.float32)))
        npy = NpyFile(tmp_path / "f.npy")
        tracemalloc.start()
        try:
            row = npy.rows(1, 2)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert row.shape == (1, 1 << 14) and (row == 1).all()
        assert peak < 4 * row.nbytes, peak

    def test_rows_of_a_c_ordered_file_take_the_memory_of_the_rows(self, tmp_path):
        # 64 MiB of rows: reading them whole into a bytes object first took twice that at the peak, so a file
        # between half the machine's memory and all of it passed the memory guard and could still be killed.
        np.save(tmp_path / "c.npy", np.ones((1 << 10, 1 << 14), np.float32))
        npy = NpyFile(tmp_path / "c.npy")
        tracemalloc.start()
        try:
            rows = npy.rows(0, len(npy))
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert (rows == 1).all()
        assert peak < 1.5 * rows.nbytes, peak

    def test_rows_beyond_the_machines_memory_are_refused_before_they_are_allocated(self, tmp_path):
        path = tmp_path / "huge.npy"
        content = npy_bytes(np.zeros((1, 1024), np.float32), shape=(1 << 28, 1024))
        path.write_bytes(content)
        os.truncate(path, len(content) - 4096 + (1 << 40))  # its header, then the 1 TiB it declares, of nothing
        npy = NpyFile(path)
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: cannot read rows 0 to 268435456 "
                                             r"\(1099511627776 bytes, more than this machine's memory \(\d+\)\)\.$"):
            np.asarray(npy)  # what a call that reads its inputs in one piece does (a stateful allocator)
        assert npy.rows(5, 6).shape == (1, 1024)

    def test_rows_the_process_cannot_allocate_are_refused_naming_the_file(self, tmp_path, monkeypatch):
        np.save(tmp_path / "a.npy", ARRAYS["X"])
        npy = NpyFile(tmp_path / "a.npy")

        def out_of_memory(*args, **kwargs):
            raise MemoryError

        monkeypatch.setattr(np, "empty", out_of_memory)
        with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'a.npy'))}: cannot read rows 0 to 2 "
                                             rf"\({2 * ARRAYS['X'][0].nbytes} bytes, more than this process can "
                                             r"allocate\)\.$"):
            npy.rows(0, 2)

    def test_a_read_error_names_the_file(self, tmp_path, monkeypatch):
        np.save(tmp_path / "a.npy", ARRAYS["X"])
        npy = NpyFile(tmp_path / "a.npy")

        def failing(*args):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "pread", failing)
        with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'a.npy'))}: cannot read rows 0 to 1 "
                                             r"\(Input/output error\)\.$"):
            npy.rows(0, 1)

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_a_file_cut_short_once_opened_is_a_value_error_naming_it(self, tmp_path, order):
        path = tmp_path / "a.npy"
        np.save(path, np.ones((100, 8), np.float32, order=order))
        npy = NpyFile(path)
        os.truncate(path, 1000)
        if order == "C":  # what is still there reads as it was
            np.testing.assert_array_equal(npy.rows(0, 1), np.ones((1, 8)))
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: changed while it was read: nothing at its "
                                             r"byte \d+, of the 3328 it held when opened\.$"):
            npy.rows(90, 100)

    def test_the_descriptor_is_closed_with_the_object(self, tmp_path):
        np.save(tmp_path / "a.npy", ARRAYS["X"])
        before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
        for _ in range(20):
            NpyFile(tmp_path / "a.npy").rows(0, 1)
        npy = NpyFile(tmp_path / "a.npy")
        npy.close()
        with pytest.raises(ValueError, match="read after it was closed"):
            npy.rows(0, 1)  # not from the descriptor's number, which may name another file by now
        if before is not None:
            assert len(os.listdir("/proc/self/fd")) == before

    @pytest.mark.parametrize("content, words", [
        (npy_bytes(np.array([{"a": 1}], dtype=object)), r"it holds Python objects \(shape \(1,\) of object\)"),
        (npy_bytes(np.zeros(4, np.float32), shape=(10**12, 3)),
         r"it declares 12000000000000 bytes \(shape \(1000000000000, 3\) of float32\) but holds 16 after its header"),
        (npy_bytes(np.zeros(4, np.float32)) + b"trailing", r"it declares 16 bytes .* but holds 24"),
        (npy_bytes(np.zeros((0, 5))), r"it holds no values"),
        (npy_bytes(np.zeros(4, np.float32), shape=(True, 4)),
         r"it declares shape \(True, 4\) of float32, which no array written by numpy has"),
        (b"\x93NUMPY\x03\x00" + bytes(100), r"no valid .npy header \(.npy format version \(3, 0\), which is not "),
        (b"\x93NUMPY\x02\x00" + (20_100).to_bytes(4, "little") + b"{'descr': '<f4'" + b" " * 20_000 + b"}\n",
         r"no valid .npy header"),
        (b"PK\x03\x04 an archive", r"not an .npy file"),
        (b"\x93NUMPY\x02\x00" + (8002).to_bytes(4, "little") + b"[" + b"1," * 4000 + b"]\n", r"no valid .npy header"),
        (b"\x93NUMPY\x02\x00" + len(LONG_SHAPE_HEADER).to_bytes(4, "little") + LONG_SHAPE_HEADER, r"it declares"),
    ], ids=["objects", "huge shape", "trailing bytes", "empty", "bool dimension", "version", "long header", "not npy",
            "long list header", "long shape"])
    def test_refused_in_one_line_before_any_data_is_read(self, tmp_path, monkeypatch, content, words):
        (tmp_path / "bad.npy").write_bytes(content)
        forbid(monkeypatch, np, "load", "read a file its header check refuses")
        with pytest.raises(ValueError, match=words) as error:
            NpyFile(tmp_path / "bad.npy")
        assert "\n" not in str(error.value) and len(str(error.value)) < 400

    def test_a_missing_file_is_the_os_error_of_opening_it(self, tmp_path):
        with pytest.raises(FileNotFoundError):
            NpyFile(tmp_path / "absent.npy")

    def test_any_damaged_byte_is_read_or_refused_with_a_value_error(self, tmp_path):
        path, damaged = tmp_path / "data.npy", tmp_path / "damaged.npy"
        np.save(path, ARRAYS["X"])
        content = path.read_bytes()
        for index in range(len(content)):
            damaged.write_bytes(content[:index] + bytes([content[index] ^ 0xFF]) + content[index + 1:])
            try:
                read = np.asarray(NpyFile(damaged))
            except ValueError as error:
                assert "\n" not in str(error), index
            else:
                assert read.nbytes == len(content) - 128, index
