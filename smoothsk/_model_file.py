"""The model file's container: one safetensors file, its JSON document, and a digest or an HMAC of both.

What the file holds
-------------------
A `safetensors <https://huggingface.co/docs/safetensors>`_ file stores named
arrays and a string-to-string header; reading one runs no code (unlike pickle,
which joblib uses). A saved estimator is one such file:

- tensors, written from the CPU bit for bit: the module's ``state_dict``
  (``module_.<key>``), ``train_sigmas_`` and ``train_keys_``, the arrays of the region store
  (``regions_.<name>``, see :meth:`~smoothsk.regions.RegionStore.to_arrays`)
  and the fitted state of a certified sigma function (``sigma_search_.<name>``,
  :mod:`smoothsk._persistence`);
- header entry ``smoothsk``: a JSON document (keys sorted, no spaces) with
  the format version (:data:`FORMAT_VERSION`), the library version, the
  estimator class, the parameters a file may set (:mod:`smoothsk._persistence`), ``classes_``
  (values and numpy dtype), ``input_shape_``, the region store's scalar
  attributes, skorch's ``history``, the fitted certified sigma function's
  class and parameters (``sigma_search_``, or null), and a manifest of every
  tensor's dtype and shape;
- header entry ``smoothsk_sha256`` (an unkeyed file): the hex SHA-256 of the
  JSON document's UTF-8 bytes followed by the raw bytes of each tensor (as
  stored) in sorted name order; or ``smoothsk_hmac_sha256`` (a file saved with
  ``key``): the HMAC-SHA256 of the same bytes under the key.

One file, not a directory with weights and a JSON file beside them: it is
copied, moved and written (through a temporary file and a rename, so a crash
never leaves half a model) as one unit, and one digest covers the tensors and
the JSON together. Region centres go in as tensors, not JSON lists: they are
(n_regions, n_features) float32, exact and compact that way, and checked by
the digest like the weights.

What a digest means
-------------------
An unkeyed file's SHA-256 catches corruption and naive edits, not a
forger, who can recompute it: whether its weights deserve trust is the
user's call. A file saved with ``key`` loads only with that key
(HMAC-SHA256, compared in constant time, checked before the document is
parsed): it was written by a holder of the key and not changed since. A
keyed file is refused without the key, and an unkeyed file is refused when
a key is given, so a key-holding reader never accepts a file anyone could
have written.

Reading authenticates before it parses: the digest (or HMAC) is checked over
the document's bytes and the tensors before a value of the document is read,
then the JSON is parsed within :data:`MAX_NESTING` levels and 64-bit
integers, and the tensors are checked against the document's manifest. What
the document may hold is :mod:`smoothsk._persistence`'s business.
"""

import hashlib
import hmac
import json

import safetensors.torch
import torch
from safetensors import SafetensorError
from safetensors.torch import save as safetensors_bytes

from ._atomic import atomic_file
from ._messages import one_line, quoted
from ._module_state import tensor_spec
from ._regular_file import NotARegularFileError, read_regular_file

__all__ = ["DIGEST_KEY", "DOCUMENT_KEY", "FORMAT_VERSION", "HMAC_KEY", "MAX_NESTING", "MIN_KEY_BYTES", "check_key",
           "read_model_file", "read_safetensors", "write_model_file"]

#: Version of the file layout that saving writes and loading reads; any other is refused.
FORMAT_VERSION = 3
#: Header entries holding the JSON document and its digest (unkeyed files) or its HMAC (keyed files).
DOCUMENT_KEY = "smoothsk"
DIGEST_KEY = "smoothsk_sha256"
HMAC_KEY = "smoothsk_hmac_sha256"
#: The shortest key ``save``/``load`` take (HMAC-SHA256 keys of 32 random bytes are usual).
MIN_KEY_BYTES = 16

#: The deepest nesting of the JSON document (no saved model comes near it).
MAX_NESTING = 16


def check_key(key, name="key"):
    """``key`` as bytes: None, or bytes of at least :data:`MIN_KEY_BYTES`; a TypeError naming the argument ``name``."""
    if key is None:
        return None
    if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
        raise TypeError(f"{name} must be None or bytes of at least {MIN_KEY_BYTES} bytes (e.g. "
                        f"secrets.token_bytes(32), kept where only the file's writers and readers see it); got "
                        f"{type(key).__name__}"
                        + (f" of {len(key)} bytes" if isinstance(key, (bytes, bytearray)) else "") + ".")
    return bytes(key)


def _digest(document, tensors, key=None):
    """Hex SHA-256 (HMAC-SHA256 under ``key``) of the JSON document's bytes, then each tensor's in sorted name order."""
    digest = hashlib.sha256() if key is None else hmac.new(key, digestmod=hashlib.sha256)
    digest.update(document.encode("utf-8"))
    for name in sorted(tensors):
        if tensors[name].numel():  # an empty tensor has no bytes (and no byte view)
            digest.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def write_model_file(path, document, tensors, key=None):
    """Write ``document`` (JSON data) and ``tensors`` to ``path`` with their digest, or their HMAC under ``key``.

    Parameters
    ----------
    path : Path
        Checked writable by the caller; replaced atomically (:func:`~smoothsk._atomic.atomic_file`).
    document : dict
        JSON data, written with sorted keys and no spaces.
    tensors : dict of str to torch.Tensor
        CPU tensors, contiguous, none sharing memory with another.
    key : bytes, optional
        Checked by :func:`check_key`.
    """
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    entry = DIGEST_KEY if key is None else HMAC_KEY
    content = safetensors_bytes(tensors, metadata={DOCUMENT_KEY: text, entry: _digest(text, tensors, key)})
    with atomic_file(path) as file:
        file.write(content)


def read_safetensors(path, expected):
    """The header and tensors of the safetensors file at ``path``, read whole from the regular file checked there.

    The file is read into memory by
    :func:`~smoothsk._regular_file.read_regular_file`, through the
    descriptor :func:`~smoothsk._regular_file.open_regular_file` opened and
    checked, then parsed from those bytes. So what is parsed is the file that was
    checked, whatever is renamed over ``path`` meanwhile, and no mapping of
    the file is left for a writer to shrink under the reader (a mapped file
    truncated in place kills the process with SIGBUS). Memory: the file's
    bytes, then the tensors copied out of them; twice its size at most.

    Parameters
    ----------
    path : str or os.PathLike
    expected : str
        What the file should be, for the message where it is no file
        (e.g. "a smoothsk model file").

    Returns
    -------
    metadata : dict of str to str
        The safetensors header's entries.
    tensors : dict of str to torch.Tensor
        CPU tensors, by name.

    Raises
    ------
    ValueError
        One line naming ``path``: missing, unreadable, empty, not a regular
        file, larger than the machine's memory, changed while it was read,
        or not safetensors.
    """
    try:
        content = read_regular_file(path)
    except NotARegularFileError as exc:
        raise ValueError(f"{path}: it is {exc.kind}, not {expected}.") from exc
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc}).") from exc
    try:
        tensors = safetensors.torch.load(content)
    except (SafetensorError, KeyError) as exc:  # KeyError: a dtype torch does not have
        raise ValueError(f"{path}: not a readable safetensors file ({one_line(exc)}).") from exc
    # safetensors has checked the header: its 8-byte length, then a JSON object whose "__metadata__" (if any)
    # maps strings to strings.
    header_size = int.from_bytes(content[:8], "little")
    return json.loads(content[8:8 + header_size]).get("__metadata__") or {}, tensors


def read_model_file(path, key):
    """The JSON document and tensors of a smoothsk file, authenticated, then checked against its manifest.

    Parameters
    ----------
    path : Path
    key : bytes or None
        Checked by :func:`check_key`; required for (and only for) a keyed file.

    Returns
    -------
    document : dict
    tensors : dict of str to torch.Tensor
        CPU tensors, by name.

    Raises
    ------
    ValueError
        One line naming ``path`` and what is wrong.

    Notes
    -----
    The digest (or, under ``key``, the HMAC) is checked over the document's
    bytes and the tensors before the document is parsed: a file that fails it
    is refused without reading a value from it. Reading allocates no more
    than twice the file's size (:func:`read_safetensors`; safetensors checks
    every offset against it).
    """
    metadata, tensors = read_safetensors(path, "a smoothsk model file")
    text = metadata.get(DOCUMENT_KEY)
    if text is None or (DIGEST_KEY not in metadata and HMAC_KEY not in metadata):
        raise ValueError(f"{path}: not a smoothsk model file (its safetensors header has no {DOCUMENT_KEY!r} entry "
                         f"with a {DIGEST_KEY!r} or {HMAC_KEY!r} entry).")
    if key is None and HMAC_KEY in metadata:
        raise ValueError(f"{path}: the file is authenticated with a key; pass it: load(path, key=...) "
                         "(smoothsk certify --key-file FILE).")
    if key is not None and HMAC_KEY not in metadata:
        raise ValueError(f"{path}: the file is not authenticated (saved without a key), but a key was given: "
                         "refused, as anyone could have written it.")
    if key is None and not _same(_digest(text, tensors), metadata[DIGEST_KEY]):
        raise ValueError(f"{path}: the content does not match its SHA-256 digest: the file was edited or "
                         "corrupted after it was saved.")
    if key is not None and not _same(_digest(text, tensors, key), metadata[HMAC_KEY]):
        raise ValueError(f"{path}: the file was not written with this key, or was edited after it was saved "
                         "(its HMAC-SHA256 does not match).")
    document = _parse(text, path)
    version = document.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise ValueError(f"{path}: format version {quoted(version)} is not the one this smoothsk reads "
                         f"({FORMAT_VERSION}); the file says smoothsk {quoted(document.get('library_version'))} "
                         f"wrote it.")
    manifest = document.get("tensors")
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: the document has no tensor manifest.")
    missing, extra = sorted(set(manifest) - set(tensors)), sorted(set(tensors) - set(manifest))
    if missing:
        raise ValueError(f"{path}: tensors {quoted(missing)} are missing from the file.")
    if extra:
        raise ValueError(f"{path}: the file holds tensors {quoted(extra)} that its manifest does not list.")
    for name, spec in manifest.items():
        if spec != tensor_spec(tensors[name]):
            raise ValueError(f"{path}: tensor {quoted(name)} has {quoted(tensor_spec(tensors[name]))} "
                             f"but the manifest says {quoted(spec)}: the tensor was reshaped or replaced.")
    return document, tensors


def _same(computed, recorded):
    """Whether a computed hex digest equals the recorded one (in constant time: an HMAC is compared)."""
    return hmac.compare_digest(computed.encode(), recorded.encode("utf-8", "replace"))


def _integer(text):
    """A JSON integer of at most 64 bits (signed or not): no saved value is larger, and float() takes any of them."""
    value = int(text)
    if not -2**63 <= value < 2**64:
        raise ValueError(f"the integer {text[:20]}... has more than 64 bits")
    return value


def _parse(text, path):
    """The JSON object ``text``, nested at most :data:`MAX_NESTING` deep, its integers of at most 64 bits."""
    try:
        document = json.loads(text, parse_int=_integer)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError, and so is int()'s digit limit
        raise ValueError(f"{path}: its {DOCUMENT_KEY!r} header entry is not valid JSON nested at most "
                         f"{MAX_NESTING} deep with integers of at most 64 bits ({type(exc).__name__}: "
                         f"{one_line(exc)}).") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: its {DOCUMENT_KEY!r} header entry is not a JSON object.")
    level, depth = [document], 1
    while level:
        level = [item for value in level for item in (value.values() if isinstance(value, dict) else value)
                 if isinstance(item, (dict, list))]
        depth += bool(level)
        if depth > MAX_NESTING:
            raise ValueError(f"{path}: its {DOCUMENT_KEY!r} document nests values more than {MAX_NESTING} deep, "
                             "which no saved model does.")
    return document


