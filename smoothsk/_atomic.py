"""Files written whole or not at all: a temporary file in the target's folder, flushed, then renamed over it."""

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["atomic_file", "resolved", "unwritable_reason"]

#: Why an existing file that is not a regular file is never written (:func:`unwritable_reason`).
NOT_REGULAR = "it is not a regular file (a device, FIFO or socket)"


def resolved(path):
    """``Path(path).resolve()``, but a loop of symbolic links is an ``OSError`` naming ``path``.

    Python 3.11 and 3.12 raise a ``RuntimeError`` there (3.13 an
    ``OSError``); every caller reports ``OSError`` in one line.

    Raises
    ------
    OSError
        ``errno.ELOOP``, "a symbolic link loop".
    """
    try:
        return Path(path).resolve()
    except RuntimeError as error:
        raise OSError(errno.ELOOP, "a symbolic link loop", os.fspath(path)) from error


def _umask():
    """The process's umask (read by setting it, then restoring it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _existing(path):
    """``os.stat`` of the resolved ``path``, or None where there is no file; refuses one that is not regular."""
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # no file yet, or no folder (refused where it is made)
        return None
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(f"{path}: {NOT_REGULAR}; only regular files are written.")
    return status


def unwritable_reason(path):
    """Why :func:`atomic_file` could not write ``path``, or None: checked before any expensive work.

    A file is created in the folder and removed again, so whatever would
    make the write fail there (a read-only file system, a folder of
    ``/proc``) fails here.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    str or None
        ``"it is a directory"``, ``"it is a symbolic link loop"``,
        :data:`NOT_REGULAR` (an existing device node, FIFO or socket:
        ``/dev/stdout`` on a terminal), or that the
        folder it would be written in (a symbolic link's target's) does not
        exist, is not a directory or is not writable.
    """
    path = Path(path)
    if path.is_dir():
        return "it is a directory"
    try:
        target = resolved(path)
    except OSError as error:
        return f"it is {error.strerror}"
    try:
        _existing(target)
    except ValueError:
        return NOT_REGULAR
    folder = target.parent
    if not folder.exists():
        return f"its folder {str(folder)!r} does not exist"
    if not folder.is_dir():
        return f"{str(folder)!r} is not a directory"
    try:
        handle, probe = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=folder)
    except OSError as error:
        return f"its folder {str(folder)!r} is not writable (creating a file there failed: {error.strerror})"
    os.close(handle)
    os.unlink(probe)
    return None


@contextlib.contextmanager
def atomic_file(path, mode="wb", **open_kwargs):
    """Open a temporary file next to ``path``; it replaces ``path`` on success and is removed on any error.

    A reader of ``path`` sees the old file or the whole new one, never part
    of it, even if the process dies while writing (``os.replace`` is atomic
    within a folder; the data is synced to disk first). A symbolic link is
    followed: its target is replaced. A file that is rewritten keeps its
    permission bits (and, where the process may set them, its owner and
    group); a new file gets the permissions a plain ``open`` would give it
    (0o666 less the umask).

    Parameters
    ----------
    path : str or Path
        The file to write. Its folder must exist.
    mode : str, default="wb"
        Opening mode of the temporary file (``"w"`` for text).
    **open_kwargs
        Passed on to :func:`open` (e.g. ``newline=""``).

    Yields
    ------
    file object

    Raises
    ------
    ValueError
        Before anything is written, where ``path`` is an existing file that
        is not a regular file (a device node, FIFO or socket).
    """
    path = resolved(path)  # a symbolic link: its target is replaced, in the target's folder
    existing = _existing(path)
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        if existing is None:
            os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's 0o600 -> what open() would have created
        else:
            with contextlib.suppress(OSError):  # best effort: only root may give a file to another user
                os.chown(temporary, existing.st_uid, existing.st_gid)
            os.chmod(temporary, stat.S_IMODE(existing.st_mode))  # after chown, which clears set-id bits
        with os.fdopen(handle, mode, **open_kwargs) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
