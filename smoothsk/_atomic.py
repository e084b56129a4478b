"""Files written whole or not at all: a temporary file in the target's folder, flushed, then renamed over it."""

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_file"]


def _umask():
    """The process's umask (read by setting it, then restoring it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


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
