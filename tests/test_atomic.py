"""Tests of smoothsk._atomic: a file is written whole or not at all."""

import os

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
