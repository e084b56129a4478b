"""Reading ``.npz`` archives and ``.npy`` files that may be hostile: every size is checked before any data is read.

``np.load`` trusts the file: it allocates whatever shape a member's ``.npy``
header declares, and a small deflated member may inflate a thousandfold (a
zip bomb). :class:`NpzArchive` reads an array only after checking, from the
zip directory and the member's ``.npy`` header:

- that the member's compressed size fits in the file, and that its
  uncompressed size is at most :data:`MAX_COMPRESSION_RATIO` times the
  compressed one (members of at most :data:`SMALL_MEMBER_BYTES` excepted:
  they cannot exhaust memory);
- that the header is an ``.npy`` header of format version 1 or 2, at most
  :data:`MAX_NPY_HEADER_BYTES` long, of a plain dtype (no records) that holds
  no Python objects (pickles are never loaded) and a shape numpy can create
  (``_read_npy_header``);
- that the data it declares (shape times item size) is exactly what the
  member holds, and at most the caller's ``max_bytes``.

A read therefore takes at most ``max_bytes`` of memory, and without that
limit at most :data:`MAX_COMPRESSION_RATIO` times the file's size. Every
problem is a one-line ``ValueError`` naming the array and what is wrong;
the caller names the file.

A single ``.npy`` file is opened by :class:`NpyFile` once its header passes
the same checks (version, length, no Python objects) and declares exactly the
bytes the file holds after it: nothing is allocated for the data, whose rows
are read from the checked descriptor when they are asked for (never mapped:
a mapped file cut short by its writer kills the reader with SIGBUS).
"""

import lzma
import math
import os
import tokenize
import weakref
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from ._messages import one_line, quoted
from ._regular_file import allocating, open_regular_file

__all__ = ["ArrayHeader", "NpyFile", "NpzArchive", "MAX_COMPRESSION_RATIO", "MAX_NPY_HEADER_BYTES",
           "SMALL_MEMBER_BYTES"]

#: Largest ratio of a member's uncompressed to compressed size that is read. Data sets that
#: ``np.savez_compressed`` writes stay well below it (deflate reaches about 1000 only on runs of one byte,
#: what a zip bomb is made of); an archive refused for it can be written uncompressed with ``np.savez``.
MAX_COMPRESSION_RATIO = 256
#: Members of at most this many bytes (uncompressed) are read whatever their compression ratio.
SMALL_MEMBER_BYTES = 1 << 20
#: Longest ``.npy`` header read (numpy's own default limit; the headers it writes are 128 bytes or so).
MAX_NPY_HEADER_BYTES = 10_000
#: Bytes read at a time, from a member or an ``.npy`` file, into the array being filled.
_CHUNK_BYTES = 1 << 20
_NPY_MAGIC = b"\x93NUMPY"
#: Bytes of an ``.npy`` file before its header: the magic string, the version and the header's length.
_NPY_PREAMBLE_BYTES = len(_NPY_MAGIC) + 2 + 4
#: What opening or reading a zip archive or one of its members may raise on a damaged or hostile file
#: (RuntimeError: an encrypted member or an unsupported compression method).
_ZIP_ERRORS = (OSError, EOFError, RuntimeError, zipfile.BadZipFile, zlib.error, lzma.LZMAError)
#: Most dimensions a numpy array has (``NPY_MAXDIMS`` of numpy 2).
_MAX_DIMENSIONS = 64
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


@dataclass(frozen=True)
class ArrayHeader:
    """What an array's ``.npy`` header declares.

    Attributes
    ----------
    shape : tuple of int
    dtype : numpy.dtype
    fortran_order : bool
    """

    shape: tuple
    dtype: np.dtype
    fortran_order: bool

    @property
    def nbytes(self):
        """Bytes of data the header declares (shape times item size)."""
        return math.prod(self.shape) * self.dtype.itemsize

    def __str__(self):
        return f"shape {quoted(self.shape)} of {self.dtype}"


class NpzArchive:
    """An ``.npz`` file whose arrays are read only within checked bounds (see the module docstring).

    Use it as a context manager; the file stays open until then.

    Parameters
    ----------
    path : str or Path

    Raises
    ------
    OSError
        Where the file cannot be opened, as :func:`~smoothsk._regular_file.open_regular_file` raises it
        (missing, not a regular file, empty).
    ValueError
        Where it is a single ``.npy`` array or not a zip archive.

    Attributes
    ----------
    names : list of str
        The arrays it holds (its members named ``<name>.npy``).
    """

    def __init__(self, path):
        self._file = open_regular_file(path)
        try:
            self._zip = self._open_zip()
        except BaseException:
            self._file.close()
            raise
        self.names = [info.filename.removesuffix(".npy") for info in self._zip.infolist()
                      if info.filename.endswith(".npy")]

    def _open_zip(self):
        if self._file.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
            raise ValueError("a single .npy array, not an .npz archive of named arrays")
        self._size = os.fstat(self._file.fileno()).st_size
        try:
            return zipfile.ZipFile(self._file)
        except (*_ZIP_ERRORS, ValueError) as error:
            raise ValueError(f"not an .npz archive ({one_line(error)})") from error

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        """Close the file."""
        self._zip.close()
        self._file.close()

    def header(self, name):
        """What array ``name``'s ``.npy`` header declares, checked against the zip directory; no data is read.

        Parameters
        ----------
        name : str

        Returns
        -------
        ArrayHeader

        Raises
        ------
        ValueError
            Naming the array: absent, its sizes in the zip directory (see the
            module docstring), a damaged or unreadable header, Python objects,
            or declared data that is not what the member holds.
        """
        return self._member(self._info(name), self._read_header)

    def read(self, name, max_bytes=None):
        """Array ``name``, read only once its sizes are checked (see the module docstring).

        Parameters
        ----------
        name : str
        max_bytes : int, optional
            Most bytes of data the array may declare, checked against the zip
            directory before anything is read, then against the header.

        Returns
        -------
        ndarray
            Writable, of the declared shape, dtype and order.

        Raises
        ------
        ValueError
            As :meth:`header`; also more data than ``max_bytes``, more than
            can be allocated, or a member cut short or damaged.
        """
        info = self._info(name, max_bytes)

        def read_array(member, info):
            header = self._read_header(member, info)
            if max_bytes is not None and header.nbytes > max_bytes:
                raise ValueError(f"array {name!r} declares {header.nbytes} bytes ({header}), more than the "
                                 f"{max_bytes} it may hold")
            return self._read_data(member, name, header)

        return self._member(info, read_array)

    def _info(self, name, max_bytes=None):
        """The zip directory's entry of array ``name``, its sizes checked (against ``max_bytes`` of data first)."""
        try:
            info = self._zip.getinfo(name + ".npy")
        except KeyError:
            raise ValueError(f"no array {name!r} (the file has {quoted(self.names)})") from None
        if max_bytes is not None and info.file_size > max_bytes + _NPY_PREAMBLE_BYTES + MAX_NPY_HEADER_BYTES:
            raise ValueError(f"array {name!r} takes {info.file_size} bytes by the zip directory, more than an array "
                             f"of {max_bytes} bytes may take")
        if info.compress_size > self._size:
            raise ValueError(f"array {name!r} takes {info.compress_size} bytes by the zip directory, more than the "
                             f"file's {self._size}")
        if info.file_size > max(SMALL_MEMBER_BYTES, MAX_COMPRESSION_RATIO * info.compress_size):
            raise ValueError(f"array {name!r} inflates from {info.compress_size} to {info.file_size} bytes, more "
                             f"than {MAX_COMPRESSION_RATIO} times (a zip bomb's ratio); save it with np.savez, "
                             f"uncompressed")
        return info

    def _member(self, info, action):
        """``action(member, info)`` on the open member of entry ``info``; zip errors become ValueErrors."""
        try:
            with self._zip.open(info) as member:
                return action(member, info)
        except _ZIP_ERRORS as error:
            raise ValueError(f"array {info.filename.removesuffix('.npy')!r} cannot be read ({one_line(error)})") \
                from error

    def _read_header(self, member, info):
        """Parse and check the ``.npy`` header at the start of ``member`` (entry ``info``)."""
        name = info.filename.removesuffix(".npy")
        header = _read_npy_header(member, f"array {name!r}")
        held = info.file_size - member.tell()
        if header.nbytes != held:
            raise ValueError(f"array {name!r} declares {header.nbytes} bytes ({header}) but holds {held}")
        return header

    @staticmethod
    def _read_data(member, name, header):
        """The ``header.nbytes`` bytes after the header, read straight into a new array."""
        try:
            flat = np.empty(math.prod(header.shape), dtype=header.dtype)
        except MemoryError as error:
            raise ValueError(f"array {name!r} needs {header.nbytes} bytes ({header}), more than can be "
                             f"allocated") from error
        target, filled = memoryview(flat.view(np.uint8)), 0
        while filled < header.nbytes:
            chunk = member.read(min(_CHUNK_BYTES, header.nbytes - filled))
            if not chunk:
                raise ValueError(f"array {name!r} is cut short: {filled} of its {header.nbytes} bytes")
            target[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
        return flat.reshape(header.shape, order="F" if header.fortran_order else "C")


class NpyFile:
    """The array of an ``.npy`` file, read by rows through the descriptor its header was checked on; never mapped.

    The header is checked when the file is opened (format version 1 or 2,
    at most :data:`MAX_NPY_HEADER_BYTES` long, no Python objects, exactly
    the bytes the file holds after it), and nothing is allocated for the
    data: :meth:`rows` reads the rows asked for, and ``np.asarray`` reads
    them all. Each read goes through the checked descriptor with
    ``os.pread``, so nothing renamed over ``path`` is read, and a file cut
    short in place by its writer is a ``ValueError`` naming it (a mapped
    file would kill the process with SIGBUS). The descriptor is closed with
    the object (or by :meth:`close`). A Fortran-ordered file's rows are
    read one feature at a time (its rows of one feature are one run of the
    file): one read per feature per chunk, about 1 s per 32 MiB chunk of
    3x224x224 inputs (0.04 s in C order); ``np.save`` a C-ordered array.

    Parameters
    ----------
    path : str or Path

    Attributes
    ----------
    shape : tuple of int
        The declared shape.
    dtype : np.dtype
        The declared dtype (never of Python objects; its byte order as stored).
    ndim : int
    filename : str
        ``path`` as given, for messages.

    Raises
    ------
    OSError
        Where the file cannot be opened, as :func:`~smoothsk._regular_file.open_regular_file` raises it.
    ValueError
        One line saying what is wrong (the caller names the file): it is
        not an ``.npy`` file of format version 1 or 2, has a header
        longer than :data:`MAX_NPY_HEADER_BYTES` or declaring Python objects,
        or declares other than the bytes that follow the header (or none).
    """

    def __init__(self, path):
        with open_regular_file(path) as file:
            header, self._offset = _checked_npy_header(file)
            self._descriptor = os.dup(file.fileno())
        self._close = weakref.finalize(self, os.close, self._descriptor)
        self.shape, self.dtype, self.ndim = header.shape, header.dtype, len(header.shape)
        self._fortran_order, self._size = header.fortran_order, self._offset + header.nbytes
        self.filename = os.fspath(path)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError(f"{self.filename}: an .npy file's values are read, never viewed without a copy.")
        return self.rows(0, len(self)).astype(dtype or self.dtype, copy=False)

    def close(self):
        """Close the descriptor (done anyway when the object is collected)."""
        self._close()

    def rows(self, start, stop):
        """Rows ``start`` to ``stop`` of the array, read from the file.

        Parameters
        ----------
        start, stop : int
            ``0 <= start < stop <= len(self)``.

        Returns
        -------
        ndarray of ``dtype``, shape (stop - start, *shape[1:])
            C-contiguous, writeable.

        Raises
        ------
        ValueError
            Naming the file: closed, more rows than the machine's memory
            holds, a read error, or fewer bytes than when it was opened.
        """
        if not self._close.alive:  # its descriptor's number may name another file by now
            raise ValueError(f"{self.filename}: read after it was closed.")
        count, features = stop - start, math.prod(self.shape[1:])
        try:
            with allocating(count * features * self.dtype.itemsize, self.filename):
                if not self._fortran_order:
                    rows = np.empty((count,) + self.shape[1:], self.dtype)
                    self._read_into(rows, start * features)
                    return rows
                # Fortran order: value (i, j) of the (n, features) array is at i + n * j, so the rows of each
                # feature are one run of the file, read into one row of the transposed chunk.
                runs = np.empty((features, count), self.dtype)
                for feature in range(features):
                    self._read_into(runs[feature], feature * len(self) + start)
                return np.ascontiguousarray(runs.T.reshape((count,) + self.shape[1:], order="F"))
        except OSError as error:
            reason = error.strerror or error
            raise ValueError(f"{self.filename}: cannot read rows {start} to {stop} ({reason}).") from error

    def _read_into(self, values, first):
        """Fill the C-contiguous array ``values`` from the data's value ``first`` on."""
        view = memoryview(values.reshape(-1).view(np.uint8))
        at = self._offset + first * self.dtype.itemsize
        done = 0
        while done < len(view):
            # In chunks: os.pread returns a new bytes object, so one read of all of it would take twice its size.
            piece = os.pread(self._descriptor, min(len(view) - done, _CHUNK_BYTES), at + done)
            if not piece:
                raise ValueError(f"{self.filename}: changed while it was read: nothing at its byte {at + done}, "
                                 f"of the {self._size} it held when opened.")
            view[done:done + len(piece)] = piece
            done += len(piece)


def _checked_npy_header(file):
    """The ``.npy`` header at the start of ``file``, checked (see :class:`NpyFile`), and where its data starts."""
    if file.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
        raise ValueError("not an .npy file (no .npy magic string)")
    file.seek(0)
    header = _read_npy_header(file, "it")
    offset = file.tell()
    held = os.fstat(file.fileno()).st_size - offset
    if header.nbytes != held:
        raise ValueError(f"it declares {header.nbytes} bytes ({header}) but holds {held} after its header")
    if header.nbytes == 0:
        raise ValueError(f"it holds no values ({header})")
    return header, offset


def _read_npy_header(file, subject):
    """What the ``.npy`` header at the start of ``file`` declares, checked against what numpy writes.

    The header must be of format version 1 or 2, at most
    :data:`MAX_NPY_HEADER_BYTES` long, of a plain dtype (no records, whose
    description alone may take the header's 10 kB; no Python objects), and
    declare a shape numpy can create: at most :data:`_MAX_DIMENSIONS`
    dimensions, each a non-negative ``int`` (numpy's reader also takes a
    ``bool``), items of non-zero size, and fewer than ``2**63`` bytes with
    every empty dimension counted as 1. So every size and dtype a message
    quotes is short, and every later step (the size check, the allocation,
    the reshape) gets the integers it expects.

    Parameters
    ----------
    file : binary file
        At the start of the ``.npy`` bytes; left just after the header.
    subject : str
        What the messages call the array (``"array 'X'"``, ``"it"``).

    Returns
    -------
    ArrayHeader
    """
    try:
        version = np.lib.format.read_magic(file)
        if version not in _HEADER_READERS:
            raise ValueError(f".npy format version {version}, which is not read")
        shape, fortran_order, dtype = _HEADER_READERS[version](file, max_header_size=MAX_NPY_HEADER_BYTES)
    except (ValueError, TypeError, SyntaxError, RecursionError, tokenize.TokenError) as error:
        # numpy's messages quote the header: up to 10 kB.
        raise ValueError(f"{subject} has no valid .npy header ({one_line(error)})") from error
    if dtype.fields is not None or dtype.subdtype is not None:  # nothing smoothsk reads is made of records
        fields = f"{len(dtype.fields)} fields" if dtype.fields is not None else "sub-arrays"
        raise ValueError(f"{subject} holds records ({fields}), which smoothsk never reads; save plain numeric or "
                         f"string arrays")
    header = ArrayHeader(tuple(shape), dtype, bool(fortran_order))
    if dtype.hasobject:
        raise ValueError(f"{subject} holds Python objects ({header}), which smoothsk never loads (unpickling runs "
                         f"code); save numeric or string arrays")
    if not (len(shape) <= _MAX_DIMENSIONS and all(type(size) is int and size >= 0 for size in shape)
            and dtype.itemsize > 0 and math.prod(max(size, 1) for size in shape) * dtype.itemsize < 2 ** 63):
        raise ValueError(f"{subject} declares {header}, which no array written by numpy has")
    return header
