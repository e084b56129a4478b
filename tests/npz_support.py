"""Hand-made ``.npz`` archives for the tests of hostile files (``test_npz``, ``test_checkpoint``, ``test_cli``)."""

import io
import zipfile

import numpy as np


def npy_bytes(array, shape=None):
    """The ``.npy`` bytes of ``array``; with ``shape``, a header declaring that shape over the same data."""
    buffer = io.BytesIO()
    if shape is None:
        np.lib.format.write_array(buffer, array, allow_pickle=True)
        return buffer.getvalue()
    np.lib.format.write_array_header_1_0(buffer, {"descr": np.lib.format.dtype_to_descr(array.dtype),
                                                  "fortran_order": False, "shape": tuple(shape)})
    return buffer.getvalue() + np.ascontiguousarray(array).tobytes()


def write_npz(path, members, compress=False, file_sizes=None, encrypted=()):
    """Write an ``.npz`` of ``members`` (name -> ndarray or ``.npy`` bytes), possibly lying in its zip directory.

    Parameters
    ----------
    path : Path
    members : dict of str to ndarray or bytes
    compress : bool, default=False
        Deflate the members (as ``np.savez_compressed``).
    file_sizes : dict of str to int, optional
        Uncompressed sizes the zip directory claims for some members (the data stays as it is).
    encrypted : tuple of str, default=()
        Members the zip directory flags as encrypted.
    """
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", method) as archive:
        for name, value in members.items():
            archive.writestr(name + ".npy", value if isinstance(value, bytes) else npy_bytes(value))
        for info in archive.infolist():  # the central directory is written on close, from these
            name = info.filename.removesuffix(".npy")
            info.file_size = (file_sizes or {}).get(name, info.file_size)
            if name in encrypted:
                info.flag_bits |= 0x1
