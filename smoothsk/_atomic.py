"""Files written whole or not at all: a temporary file in the target's folder, flushed, then renamed over it."""

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_file", "unwritable_reason"]


def _umask():
    """The process's umask (read by setting it, then restoring it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def unwritable_reason(path):
    """Why :func:`atomic_file` could not write ``path``, or None: checked before any expensive work.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    str or None
        ``"it is a directory"``, or that the folder it would be written in
        (a symbolic link's target's) does not exist, is not a directory or is
        not writable.
    """
    path = Path(path)
    if path.is_dir():
        return "it is a directory"
    folder = path.resolve().parent
    if not folder.exists():
        return f"its folder {str(folder)!r} does not exist"
    if not folder.is_dir():
        return f"{str(folder)!r} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {str(folder)!r} is not writable"
    return None


@contextlib.contextmanager
def atomic_file(path, mode="wb", **open_kwargs):
    """Open a temporary file next to ``path``; it replaces ``path`` on success and is removed on any error.

    A reader of ``path`` sees the old file or the whole new one, never part
    of it, even if the process dies while writing (``os.replace`` is atomic
    within a folder; the data is synced to disk first). A symbolic link is
    followed: its target is replaced. The file gets the permissions a plain
    ``open`` would give it (0o666 less the umask).

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
    """
    path = Path(path).resolve()  # a symbolic link: its target is replaced, in the target's folder
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's 0o600 -> what open() would have created
        with os.fdopen(handle, mode, **open_kwargs) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
