"""Every file smoothsk reads is a regular file: FIFOs, sockets and devices are refused before they are opened.

Opening a FIFO blocks until another process writes to it, and opening a
device can act on it (a tape rewinds, a terminal is claimed); reading one
returns what it produces, not what a size check was made against. A path
that names one (directly or through a symbolic link) is refused from its
status alone. The file is then opened without blocking and its status
checked again through that descriptor, so the path cannot be swapped for a
FIFO between the check and the open: what is read is the regular file that
was checked, whose size the readers' checks can trust. (A device swapped in
between is opened, without blocking and without becoming the process's
terminal, then refused.) An empty file is
refused too: no reader takes one, and the files of ``/proc`` have size 0
whatever reading them produces.

Files parsed from memory (model files, images) are read whole through the
checked descriptor by :func:`read_regular_file`, which refuses a file larger
than its reader takes before allocating for it, and a file that changed
while it was read (safetensors would open a model file again by name, and
map it; Pillow would seek in a file as it pleases). A key file
(``--key-file``) is exempt: reading a key from a pipe (``--key-file <(pass
show key)``) is how keys are kept out of files, and at most a key's length
is read from it.
"""

import contextlib
import errno
import os
import stat

__all__ = ["NotARegularFileError", "allocating", "check_regular_file", "open_regular_file", "read_regular_file"]


class NotARegularFileError(OSError):
    """A path names a directory, FIFO, socket or device where a file is read.

    An ``OSError``, as opening the path would raise: every reader already
    names the file in its message, with ``strerror`` ("not a regular file
    (a FIFO)"). ``kind`` is what it is ("a FIFO").
    """

    def __init__(self, path, kind):
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", os.fspath(path))
        self.kind = kind


def _not_regular(mode):
    """What a file of this ``st_mode`` is, where it is not a regular file; else None."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def check_regular_file(path):
    """Raise an ``OSError`` unless ``path`` names a regular file (after symbolic links).

    Parameters
    ----------
    path : str or os.PathLike

    Raises
    ------
    NotARegularFileError
        It is a directory, FIFO, socket or device.
    OSError
        It does not exist or cannot be reached (as ``os.stat`` raises it).
    """
    kind = _not_regular(os.stat(path).st_mode)
    if kind is not None:
        raise NotARegularFileError(path, kind)


def open_regular_file(path):
    """The regular file at ``path``, open for reading in binary; an ``OSError`` for anything else.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    io.BufferedReader
        The caller closes it (``with open_regular_file(path) as file:``).

    Raises
    ------
    OSError
        As :func:`check_regular_file`, before the file is opened, or after
        it was opened, where the path was swapped meanwhile (a
        :class:`NotARegularFileError`); as opening it raises; or where it is
        empty (``strerror`` "an empty file"): no reader takes an empty file,
        and the files of ``/proc`` have size 0 whatever reading them gives.
    """
    check_regular_file(path)  # a device named here is not even opened: opening one can act on it
    # A FIFO swapped in opens without waiting, a terminal without becoming the process's controlling one.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        status = os.fstat(descriptor)
        kind = _not_regular(status.st_mode)
        if kind is not None:
            raise NotARegularFileError(path, kind)
        if status.st_size == 0:  # no reader takes one; and /proc's files say 0 whatever they produce
            raise OSError(errno.EINVAL, "an empty file", os.fspath(path))
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, "rb")  # owns the descriptor from here on, and closes it should it fail


def physical_memory():
    """The machine's memory in bytes: no file read whole, and no array read at once, can be larger."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@contextlib.contextmanager
def allocating(size, filename):
    """Run a block that allocates ``size`` bytes for what it reads from ``filename``, or refuse them.

    Sizes come from files, which may claim anything (a sparse file, a
    header): more than the machine's memory is refused before the block
    runs, and a ``MemoryError`` in the block becomes the file's refusal.

    Parameters
    ----------
    size : int
    filename : str or os.PathLike
        Named by the error.

    Raises
    ------
    OSError
        With ``filename``; ``strerror`` "N bytes, more than this machine's
        memory (M)" (``errno.EFBIG``) before the block, or "N bytes, more
        than this process can allocate" (``errno.ENOMEM``) from it.
    """
    memory = physical_memory()
    if size > memory:
        raise OSError(errno.EFBIG, f"{size} bytes, more than this machine's memory ({memory})", os.fspath(filename))
    try:
        yield
    except MemoryError:
        raise OSError(errno.ENOMEM, f"{size} bytes, more than this process can allocate", os.fspath(filename)) from None


def read_regular_file(path, largest=None):
    """The bytes of the regular file at ``path``, read whole through the descriptor :func:`open_regular_file` checked.

    What is returned is read from the file that was checked, whatever is
    renamed over ``path`` meanwhile; a file whose size changed while it was
    read is refused (one rewritten in place at the same size is read as it
    then is: callers that need more check a digest). A file above
    ``largest``, or above the machine's memory, is refused before anything
    is allocated for it; else the file's size and one byte are.

    Parameters
    ----------
    path : str or os.PathLike
    largest : int, optional
        The most bytes the caller takes; a larger file is refused before it
        is read.

    Returns
    -------
    bytes

    Raises
    ------
    OSError
        As :func:`open_regular_file`; ``strerror`` "N bytes, more than the
        L a file of its kind may take" or "N bytes, more than this machine's
        memory (M)" (``errno.EFBIG``); "N bytes, more than this process can
        allocate" (``errno.ENOMEM``); or "read K of the N bytes its size
        says: ..." (``errno.EIO``), where the file changed while it was read
        (or is not a file of stored bytes, as those of ``/sys``).
    """
    with open_regular_file(path) as file:
        size = os.fstat(file.fileno()).st_size
        if largest is not None and size > largest:
            raise OSError(errno.EFBIG, f"{size} bytes, more than the {largest} a file of its kind may take",
                          os.fspath(path))
        with allocating(size, path):
            content = file.read(size + 1)  # a byte more than the size checked: a file grown since shows
    if len(content) != size:
        raise OSError(errno.EIO, f"read {len(content)} of the {size} bytes its size says: it changed while it was "
                                 "read, or is not a file of stored bytes", os.fspath(path))
    return content
