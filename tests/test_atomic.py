"""Tests of smoothsk._atomic: a file is written whole or not at all."""

import os
import stat
from pathlib import Path

import pytest

from smoothsk._atomic import atomic_file, unwritable_reason


def test_the_new_content_replaces_the_file_on_success(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("old")
    with atomic_file(path, "w") as file:
        file.write("new")
        assert path.read_text() == "old"  # not visible before the end
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["out.csv"]


def test_an_error_while_writing_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"), atomic_file(path) as file:
        file.write(b"half")
        raise OSError("disk full")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_a_symbolic_link_is_followed_and_kept(tmp_path):
    target, link = tmp_path / "target.csv", tmp_path / "link.csv"
    target.write_text("old")
    link.symlink_to(target)
    with atomic_file(link, "w") as file:
        file.write("new")
    assert link.is_symlink() and target.read_text() == "new"


def test_the_file_gets_the_permissions_open_would_give(tmp_path):
    umask = os.umask(0o027)
    try:
        with atomic_file(tmp_path / "out.bin") as file:
            file.write(b"x")
        (tmp_path / "plain.bin").write_bytes(b"x")
    finally:
        os.umask(umask)
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == (tmp_path / "plain.bin").stat().st_mode & 0o777 == 0o640


def test_unwritable_reason_names_what_atomic_file_would_fail_on(tmp_path):
    (tmp_path / "a-file").write_text("x")
    assert unwritable_reason(tmp_path / "out.csv") is None
    assert unwritable_reason(tmp_path) == "it is a directory"
    assert unwritable_reason(tmp_path / "missing" / "out.csv").endswith("missing' does not exist")
    assert unwritable_reason(tmp_path / "a-file" / "out.csv").endswith("a-file' is not a directory")


def test_rewriting_a_file_keeps_its_permissions(tmp_path):
    # The regression: a 0600 model rewritten through atomic_file became 0644 (0o666 less the umask).
    target, link = tmp_path / "model.bin", tmp_path / "link.bin"
    target.write_bytes(b"old")
    target.chmod(0o600)
    link.symlink_to(target)
    umask = os.umask(0o022)
    try:
        for path in (target, link):
            with atomic_file(path) as file:
                file.write(b"new")
    finally:
        os.umask(umask)
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o7777 == 0o600


def special_files(tmp_path):
    """A FIFO, a symbolic link to it and a device node: existing files that are not regular files."""
    fifo, link = tmp_path / "fifo", tmp_path / "link-to-fifo"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    return {"fifo": fifo, "link to a fifo": link, "device": Path(os.devnull)}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "device"])
def test_a_file_that_is_not_a_regular_file_is_refused_up_front(tmp_path, kind):
    assert unwritable_reason(special_files(tmp_path)[kind]) == "it is not a regular file (a device, FIFO or socket)"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_atomic_file_never_replaces_a_special_file(tmp_path):
    fifo = special_files(tmp_path)["fifo"]
    with pytest.raises(ValueError, match="not a regular file"), atomic_file(fifo) as file:
        file.write(b"x")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link-to-fifo"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_a_folder_no_file_can_be_created_in_is_refused_up_front():
    # /dev/stdout of a process writing to a pipe: /proc/<pid>/fd/pipe:[N], a path in a folder
    # that os.access calls writable (for root) but where no file can be created.
    read_end, write_end = os.pipe()
    try:
        reason = unwritable_reason(f"/proc/self/fd/{write_end}")
    finally:
        os.close(read_end)
        os.close(write_end)
    assert reason is not None and "is not writable (creating a file there failed" in reason


def test_a_symbolic_link_loop_is_an_os_error_naming_it_not_a_runtime_error(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert unwritable_reason(loop) == "it is a symbolic link loop"
    with pytest.raises(OSError, match="a symbolic link loop") as error, atomic_file(loop) as file:
        file.write(b"never")
    assert error.value.filename == str(loop)
