"""Resumable certification: a ``certify`` run in chunks, each finished chunk recorded in a file.

The file is a NumPy ``.npz`` archive read with ``allow_pickle=False``, so
reading it cannot run code. Its member ``header`` holds JSON: the format and
its version, the library version, the digest of each part of the run's
fingerprint (inputs, parameters, weights, ...), the run's root seed, the
number of finished chunks and the digests of the region store when the run
started and after its last finished chunk. The other members are the
certificates of the finished chunks (``certificates/<field>``) and the region
store after the last finished chunk (``regions/<field>``).

A certificate is a claim about one model with one set of parameters and one
region store: a checkpoint is resumed only by the run it was written for,
and refused, never overwritten, otherwise.

Any file may be hostile, and its fingerprint is no signature, so a file is
read within bounds the run sets and its contents are checked before any
sampling (:mod:`smoothsk._npz` checks every member's sizes in the zip
directory and ``.npy`` header before reading it): the header is at most
:data:`MAX_HEADER_BYTES`; each certificate array must be declared 1-d, of
``chunks_done * checkpoint_every`` rows (``n_inputs`` for the last chunk)
and of the dtype written (int64 or float64 as the field is); the region
arrays have at most one row per input more than ``regions_``, its row shape
and dtypes. Then the header's entries must be what a run writes
(``chunks_done`` within the run's chunks, ``root_seed`` an int seed, the
store's attributes, :meth:`RegionStore.attributes_problem`), and the
certificates what a run at this ``alpha`` makes: predictions class indices
or ``ABSTAIN``, sigma finite and positive, counts ``>= 0``, ``p_lower`` in
[0, 1], region indices into the recorded store, radii finite, ``>= 0``, 0
where abstained and at most the largest radius the input's recorded sigma
and ``n_samples`` certify (all samples of one class). Any other file is
refused with a one-line ``ValueError`` naming it. What the certificates are
about (``Certificates.guarantee``) is the run's own statement, never the
file's.

These checks make a damaged or foreign file fail loudly; they do not make a
forged one fail. The certificates are checked for consistency, not
recomputed: without a key, whoever can write the checkpoint can plant
certificates that pass (a larger sigma and ``n_samples`` allow a larger
radius) or regions into the store. With a key (``checkpoint_key``, the
command line's ``--key-file``) the file holds an HMAC-SHA256 under it of
the header and every array it records (:func:`_authentication`), checked
once they are read within the bounds above (the header is parsed first,
for its fingerprint and row counts) and before any certificate or region is
used: a checkpoint then resumes only if a holder of the key wrote it and
nothing changed since. Without one, keep a checkpoint where only you can write, as
you would the results it holds.

Region store protocol: every chunk is certified against a copy of the store
and the copy becomes the estimator's store only once the checkpoint that
records the chunk is on disk. A crash inside a chunk therefore leaves the
store as the last finished chunk left it, with no orphan regions, and the
store a run resumes onto is one of two states it can check by digest:

- the store after its last finished chunk (the same process resumes), or
- the store it started from (an estimator saved before the run, reloaded
  after a crash): the store recorded with the last finished chunk replaces it,
  which drops nothing, since that store is the start store plus the run's own
  regions.

Any other store (regions allocated by other calls, ``reset_regions()``) is
refused: resuming would mix certificates made against different stores.
"""

import copy
import hashlib
import hmac
import json
import os
from numbers import Integral

import joblib
import numpy as np

from ._atomic import atomic_file, resolved, unwritable_reason
from ._digest import module_fingerprint, value_digest
from ._messages import one_line, quoted
from ._npz import NpzArchive
from ._regular_file import open_regular_file
from ._version import __version__
from .certificates import ABSTAIN, Certificates
from .statistics import certified_radius, clopper_pearson_lower, first_offender

FORMAT = "smoothsk certify checkpoint"
FORMAT_VERSION = 1
#: The per-input arrays of a certificate record (its ``guarantee`` is the run's, never recorded).
_CERTIFICATE_FIELDS = tuple(name for name, field in Certificates.__dataclass_fields__.items()
                            if field.type is np.ndarray)
#: What each fingerprint part covers, for the refusal message.
_PART_NAMES = {
    "inputs": "the inputs X",
    "parameters": "the estimator's parameters (get_params(deep=True))",
    "weights": "the model (module_: weights, buffers and every other state it computes with; classes_)",
    "sigma function": "the fitted certified sigma function (sigma_search_)",
    "checkpoint_every": "checkpoint_every",
    "version": "the smoothsk version",
}
_START_OVER = "delete {path} to start over, or pass another checkpoint path"
#: The member holding a keyed checkpoint's HMAC-SHA256 (:func:`_authentication`).
_HMAC_MEMBER = "hmac"
#: Most bytes of JSON header read (a run's header takes a few kilobytes).
MAX_HEADER_BYTES = 1 << 20
#: The certificate arrays of integer dtype; the others are float.
_INTEGER_FIELDS = ("prediction", "n_samples", "search_steps", "region", "sigma_samples")
#: Relative slack of the largest-radius check: rounding only (radii come from the very formula it uses).
_RADIUS_RTOL = 1e-9
#: Parameters certificates do not depend on (tested): left out of the fingerprint.
_NOT_IN_CERTIFICATES = ("verbose", "n_jobs", "certify_batch_size")


def check_chunk_size(checkpoint_every):
    """Validate ``checkpoint_every``; returns it as an int.

    Parameters
    ----------
    checkpoint_every : int
        Inputs per chunk.

    Returns
    -------
    int
    """
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, Integral) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be a positive int (inputs per chunk), got {checkpoint_every!r}.")
    return int(checkpoint_every)


def check_path(checkpoint):
    """Validate the ``checkpoint`` argument; returns the file it names, symbolic links resolved.

    The file is written in its folder (a temporary file, then a rename), so
    the folder must exist and be writable: checked here, before any sampling.
    The run reads, writes and finally removes the returned path: a symbolic
    link (dangling or not) is resolved once, here, so the file removed at the
    end is the one the chunks were written to (the link is left as it is).

    Parameters
    ----------
    checkpoint : str or os.PathLike

    Returns
    -------
    Path
        Absolute, with every symbolic link resolved.
    """
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a file path (str or os.PathLike), got {checkpoint!r}.")
    reason = unwritable_reason(checkpoint)
    if reason is not None:
        raise ValueError(f"checkpoint {str(checkpoint)!r} cannot be written: {reason}.")
    return resolved(checkpoint)


def _hash_arrays(named_arrays):
    """SHA-256 hex digest of ``(name, array)`` pairs: names, dtypes, shapes and values."""
    digest = hashlib.sha256()
    for name, array in named_arrays:
        array = np.ascontiguousarray(array)
        digest.update(json.dumps([name, array.dtype.str, array.shape]).encode())
        digest.update(array.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def inputs_digest(inputs):
    """Digest of the inputs of a run, read chunk by chunk (the digest of the array they make).

    Parameters
    ----------
    inputs : smoothsk._inputs.Inputs

    Returns
    -------
    str
        ``_hash_arrays([("X", X)])`` of the float32 array ``X`` of every input.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps(["X", np.dtype(np.float32).str, (inputs.n_inputs, *inputs.input_shape)]).encode())
    for begin, end in inputs.chunks(0, inputs.n_inputs):
        digest.update(inputs.read(begin, end).reshape(-1).view(np.uint8))
    return digest.hexdigest()


def weights_digest(module, classes):
    """Digest of everything the module computes with (:func:`~smoothsk._digest.module_fingerprint`) and ``classes_``.

    Parameters
    ----------
    module : torch.nn.Module
    classes : ndarray, shape (n_classes,)

    Returns
    -------
    str
    """
    return _hash_arrays([
        ("module_", np.frombuffer(module_fingerprint(module).encode(), dtype=np.uint8)),
        ("classes_", np.frombuffer(joblib.hash(np.asarray(classes)).encode(), dtype=np.uint8))])


def parameters_digest(params):
    """Digest of parameter values (not of their reprs, which scikit-learn elides).

    Equal values give equal digests, whatever the objects' identities: two
    equal modules, tensors or components holding them (see
    :func:`smoothsk._digest.value_digest`).

    Parameters
    ----------
    params : dict
        ``get_params(deep=True)`` of the estimator.

    Returns
    -------
    str
    """
    digests = [(name, value_digest(params[name])) for name in sorted(params)]
    return hashlib.sha256(json.dumps(digests).encode()).hexdigest()


def run_fingerprint(estimator, inputs):
    """Fingerprint digests of a ``certify`` run on ``inputs`` (the ``parts`` of :func:`certify_in_chunks`).

    A ``random_state`` that is a RandomState instance is recorded as such,
    not by its state: a run's noise comes from the root seed recorded in the
    checkpoint (as with ``random_state=None``), so a resume gets the
    certificates of the run it continues, whatever the instance drew since.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        Fitted.
    inputs : smoothsk._inputs.Inputs

    Returns
    -------
    dict of str to str
        Digests of the inputs, the parameters certificates depend on, the
        weights and the fitted certified sigma function.
    """
    params = {name: value for name, value in estimator.get_params(deep=True).items()
              if name not in _NOT_IN_CERTIFICATES}
    if isinstance(params.get("random_state"), np.random.RandomState):
        # As with None, a run's noise comes from the root seed drawn once and recorded in the checkpoint: the
        # instance's state, which each use advances, is not part of the run.
        params["random_state"] = "a numpy RandomState instance"
    return {"inputs": inputs_digest(inputs),
            "parameters": parameters_digest(params),
            "weights": weights_digest(estimator.module_, estimator.classes_),
            "sigma function": parameters_digest({"sigma_search_": getattr(estimator, "sigma_search_", None)})}


def _refuse(path, what):
    return ValueError(f"{path} is {what}; " + _START_OVER.format(path=path) + ".")


def _read(path, parts, n_inputs, every, store, alpha, n_classes, key):
    """Header, certificates and recorded region arrays of the checkpoint at ``path``, checked against this run.

    The header is read and its fingerprint checked before any other member;
    every member is read within the bounds the run sets (see the module
    docstring), and the contents are checked before they are returned.

    Returns
    -------
    header : dict
    certificates : dict of str to ndarray
        The recorded ``Certificates`` arrays of the finished chunks.
    regions : dict of str to ndarray
        The recorded region store's arrays (:meth:`RegionStore.to_arrays`).
    """
    try:
        with open_regular_file(path) as file:
            magic = file.read(4)
    except OSError as error:
        raise _refuse(path, f"not a readable checkpoint ({error.strerror or error})") from error
    if magic != b"PK\x03\x04":  # every .npz is a zip archive; a pickle is never read
        raise _refuse(path, "not a smoothsk certify checkpoint (not an .npz archive; files written by "
                            "earlier versions are pickles, which are never loaded)")
    try:
        archive = NpzArchive(path)
    except OSError as error:  # gone, or swapped, since its magic was read
        raise _refuse(path, f"not a readable checkpoint ({error.strerror or error})") from error
    except ValueError as error:
        raise _refuse(path, f"not a smoothsk certify checkpoint ({error})") from error
    with archive:
        header, header_bytes = _read_header(path, archive, parts)
        problem = _header_problem(header, -(-n_inputs // every), store)
        if problem is not None:
            raise _refuse(path, f"a damaged checkpoint ({problem})")
        rows = min(header["chunks_done"] * every, n_inputs)
        try:
            certificates = {name: _read_array(archive, f"certificates/{name}", (rows,), _certificate_dtype(name))
                            for name in _CERTIFICATE_FIELDS}
            regions = _read_regions(archive, store, n_inputs)
            recorded_mac = _read_array(archive, _HMAC_MEMBER, (32,), np.dtype(np.uint8)) \
                if _HMAC_MEMBER in archive.names else None
        except ValueError as error:
            raise _refuse(path, f"a damaged checkpoint ({error})") from error
    _check_authentication(path, key, recorded_mac, {
        "header": header_bytes, **{f"certificates/{name}": value for name, value in certificates.items()},
        **{f"regions/{name}": value for name, value in regions.items()}})
    problem = _certificate_problem(certificates, alpha, n_classes, len(regions["radii"]))
    if problem is not None:
        raise _refuse(path, f"a damaged checkpoint ({problem})")
    return header, certificates, regions


def _read_header(path, archive, parts):
    """The JSON header of the checkpoint in ``archive`` (and its bytes), refused unless of this format and this run."""
    try:
        header_bytes = archive.read("header", max_bytes=MAX_HEADER_BYTES)
        if header_bytes.dtype != np.uint8 or header_bytes.ndim != 1:
            raise ValueError(f"a header of {header_bytes.dtype} and {header_bytes.ndim} dimensions, not bytes")
        header = json.loads(header_bytes.tobytes().decode())
        if header["format"] != FORMAT:
            raise ValueError(f"format {quoted(header['format'])}")
        format_version, recorded_parts = header["format_version"], dict(header["parts"])
    except (KeyError, TypeError, ValueError, RecursionError) as error:  # RecursionError: deeply nested JSON
        raise _refuse(path, f"not a smoothsk certify checkpoint ({type(error).__name__}: {one_line(error)})") \
            from error
    if type(format_version) is not int or format_version != FORMAT_VERSION:
        raise _refuse(path, f"a checkpoint of format version {quoted(format_version)}; smoothsk "
                            f"{__version__} reads version {FORMAT_VERSION}")
    differ = [name for name in _PART_NAMES if recorded_parts.get(name) != parts[name]]
    if differ:
        raise _refuse(path, "the checkpoint of another run, which this run does not overwrite: its "
                      "fingerprint differs in " + "; ".join(_PART_NAMES[name] for name in differ))
    return header, header_bytes


def _authentication(key, members):
    """HMAC-SHA256 under ``key`` of the arrays ``members`` (name -> ndarray), as 32 uint8.

    The format's name, then each array's name, dtype (its full description:
    fields too), shape and bytes in C order, in name order, each piece
    preceded by its length, so that no two sets of arrays give one sequence
    of bytes, and no model file's HMAC under the same key is a checkpoint's.
    """
    mac = hmac.new(key, FORMAT.encode(), digestmod=hashlib.sha256)
    for name in sorted(members):
        array = np.asarray(members[name])
        for piece in (name.encode(), repr(array.dtype.descr).encode(), repr(array.shape).encode(),
                      np.ascontiguousarray(array).tobytes()):
            mac.update(len(piece).to_bytes(8, "little") + piece)
    return np.frombuffer(mac.digest(), dtype=np.uint8)


def _check_authentication(path, key, recorded_mac, members):
    """Refuse the checkpoint unless its HMAC (``recorded_mac``, None if it has none) is ``members``' under ``key``."""
    if key is None and recorded_mac is not None:
        raise _refuse(path, "a checkpoint authenticated with a key; pass it (checkpoint_key=..., --key-file) to resume")
    if key is not None and recorded_mac is None:
        raise _refuse(path, "a checkpoint without authentication, but a key was given: no holder of the key wrote it")
    if key is not None and not hmac.compare_digest(recorded_mac.tobytes(), _authentication(key, members).tobytes()):
        raise _refuse(path, "a checkpoint not written with this key, or edited since (its HMAC-SHA256 does not "
                            "match)")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _header_problem(header, n_chunks, store):
    """What in a header (of this run's fingerprint) no run of ``n_chunks`` chunks writes, or None."""
    expected = {
        "root_seed": (lambda value: _is_int(value) and 0 <= value < 2 ** 32, "an int in [0, 2**32)"),
        "chunks_done": (lambda value: _is_int(value) and 1 <= value <= n_chunks, f"an int in [1, {n_chunks}]"),
        "regions_start": (lambda value: isinstance(value, str), "a digest"),
        "regions_done": (lambda value: isinstance(value, str), "a digest"),
    }
    for key, (valid, description) in expected.items():
        if key not in header:
            return f"its header has no {key}"
        if not valid(header[key]):
            return f"its header's {key} is {quoted(header[key])}, not {description}"
    if "regions_attributes" not in header:
        return "its header has no regions_attributes"
    problem = type(store).attributes_problem(header["regions_attributes"])
    return None if problem is None else f"its header's regions_attributes: {problem}"


def _read_array(archive, name, shape, dtype):
    """Array ``name``, refused before it is read unless declared of ``shape`` and exactly ``dtype`` (as written)."""
    declared = archive.header(name)
    if declared.shape != shape or declared.dtype != dtype:
        raise ValueError(f"{name} is declared with {declared}, not shape {shape} of {dtype}")
    return archive.read(name, max_bytes=declared.nbytes)


def _certificate_dtype(name):
    """The dtype a checkpoint records certificate field ``name`` in (:func:`_write`), and the only one it reads."""
    return np.dtype(np.int64 if name in _INTEGER_FIELDS else np.float64)


def _read_regions(archive, store, n_inputs):
    """The recorded region arrays: at most ``n_inputs`` rows more than ``store``, rows shaped as its rows."""
    template = store.to_arrays()[0]
    first, limit = next(iter(template)), len(store) + n_inputs
    shape = archive.header(f"regions/{first}").shape
    if not shape or shape[0] > limit:
        raise ValueError(f"regions/{first} is declared with shape {shape}, not at most {limit} rows (the "
                         f"{len(store)} regions of regions_ and one per input)")
    return {name: _read_array(archive, f"regions/{name}", shape[:1] + value.shape[1:], value.dtype)
            for name, value in template.items()}


def _certificate_problem(certificates, alpha, n_classes, n_regions):
    """What in recorded certificates no run at ``alpha`` with ``n_classes`` classes makes, or None.

    A radius is at most the largest that ``n_samples`` noisy samples, all
    of one class, certify at the input's sigma: ``sigma * PhiInv(p)`` with
    ``p`` the Clopper-Pearson lower bound of ``n_samples`` successes in
    ``n_samples`` at ``alpha``. No valid bound from that many samples at
    level ``alpha`` or less exceeds it, whatever the sampler, and every
    radius is at most Theorem 1's for its bound.
    """
    def largest_radius():
        n_samples = certificates["n_samples"]
        return certified_radius(certificates["sigma"], clopper_pearson_lower(n_samples, n_samples, alpha))

    abstained = certificates["prediction"] == ABSTAIN
    rules = (
        ("prediction", lambda v: abstained | ((v >= 0) & (v < n_classes)),
         f"a class index below {n_classes} or ABSTAIN ({ABSTAIN})"),
        ("sigma", lambda v: np.isfinite(v) & (v > 0), "a finite positive noise level"),
        ("n_samples", lambda v: v >= 0, "a count"),
        ("search_steps", lambda v: v >= 0, "a count"),
        ("sigma_samples", lambda v: v >= 0, "a count"),
        ("p_lower", lambda v: (v >= 0) & (v <= 1), "a probability"),
        ("region", lambda v: (v >= -1) & (v < n_regions), f"-1 or the index of one of the {n_regions} regions"),
        ("radius_cap", lambda v: v >= 0, "a radius (>= 0, or inf)"),
        ("radius", lambda v: np.isfinite(v) & (v >= 0) & ((v == 0) | ~abstained),
         "a finite radius >= 0, and 0 where the certificate abstains"),
        ("radius", lambda v: v <= largest_radius() * (1 + _RADIUS_RTOL),
         f"at most the largest radius its sigma and n_samples certify at alpha={alpha}"),
    )
    for name, valid, expected in rules:
        values = certificates[name]
        bad = ~valid(values)
        if bad.any():
            return f"certificates/{name} holds {first_offender(values, bad)}, not {expected}"
    return None


def _write(path, header, certificates, store, key):
    """Write the checkpoint atomically (:func:`smoothsk._atomic.atomic_file`), with its HMAC under ``key`` if any."""
    arrays, attributes = store.to_arrays()
    header = {**header, "regions_attributes": attributes}
    members = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
    members.update({f"certificates/{name}": np.asarray(value, _certificate_dtype(name))
                    for name, value in certificates.items()})
    members.update({f"regions/{name}": value for name, value in arrays.items()})
    if key is not None:
        members[_HMAC_MEMBER] = _authentication(key, members)
    with atomic_file(path) as file:
        np.savez(file, **members)


def certify_in_chunks(certify_rows, n_inputs, path, every, parts, root_seed, get_store, set_store, alpha, n_classes,
                      guarantee, key=None, keep=False):
    """Certify inputs chunk by chunk, resuming from (and recording in) the checkpoint at ``path``.

    Parameters
    ----------
    certify_rows : callable
        ``certify_rows(start, stop, root_seed, store) -> Certificates``
        certifies the inputs of rows ``start`` to ``stop`` with Monte Carlo
        noise from ``root_seed`` against the region store ``store``, which it
        may extend. A chunk must get the certificates it would get in a
        one-shot run.
    n_inputs : int
        Number of inputs of the run.
    path : Path
        The checkpoint file as :func:`check_path` returns it (links
        resolved), removed when the run completes unless ``keep``.
    every : int
        Inputs per chunk (validated by :func:`check_chunk_size`).
    parts : dict of str to str
        Fingerprint digests of the run: ``inputs``, ``parameters`` and
        ``weights`` (this module adds ``checkpoint_every`` and ``version``).
    root_seed : int
        Root seed of the Monte Carlo noise of a new run (a resumed run keeps
        its recorded one).
    get_store, set_store : callable
        Read and replace the estimator's region store.
    alpha : float
        The run's failure probability: a recorded radius is refused if
        larger than any its sigma and sample size certify at it.
    n_classes : int
        Number of classes: a recorded prediction is a class index below it
        or ``ABSTAIN``.
    guarantee : str
        The statement of the run's certificates (``Smoothing.guarantee``):
        the returned certificates carry it, whatever the file holds.
    key : bytes or None, default=None
        Authenticate the checkpoint with HMAC-SHA256 under this key (checked
        by :func:`smoothsk._model_file.check_key`): it is written with one,
        and resumed only if its HMAC matches (see the module docstring).
    keep : bool, default=False
        Keep the file when the run completes: a rerun then reads every
        certificate from it, so the caller can remove it once the results
        are safely stored elsewhere.

    Returns
    -------
    Certificates
        The certificates of all ``n_inputs`` inputs.
    """
    parts = {**parts, "checkpoint_every": str(every), "version": __version__}
    store = get_store()
    if path.exists():
        header, done, regions = _read(path, parts, n_inputs, every, store, alpha, n_classes, key)
        current = store.digest()
        if current == header["regions_done"]:
            pass  # this process kept the store of the last finished chunk
        elif current == header["regions_start"]:
            try:
                recorded = type(store).from_arrays(regions, header["regions_attributes"], store.centres.shape[1],
                                                   n_classes)
            except ValueError as exc:
                raise _refuse(path, f"a checkpoint whose recorded regions are not a store's ({exc})") from None
            if recorded.digest() != header["regions_done"]:
                raise _refuse(path, "a checkpoint whose recorded regions do not match its header")
            store = recorded
            set_store(store)
        else:
            raise ValueError(
                f"regions_ changed since the interrupted run of checkpoint {path} (other certify calls or "
                f"reset_regions()): resuming would mix certificates made against different region stores. "
                f"Certify with regions_ as the run left it, or " + _START_OVER.format(path=path) + ".")
    else:
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "library_version": __version__,
                  "parts": parts, "root_seed": int(root_seed), "chunks_done": 0,
                  "regions_start": store.digest(), "regions_done": store.digest()}
        done = None
    for start in range(header["chunks_done"] * every, n_inputs, every):
        extended = copy.deepcopy(store)
        chunk = certify_rows(start, min(start + every, n_inputs), header["root_seed"], extended)
        done = {name: getattr(chunk, name) if done is None else np.concatenate([done[name], getattr(chunk, name)])
                for name in _CERTIFICATE_FIELDS}
        header = {**header, "chunks_done": header["chunks_done"] + 1, "regions_done": extended.digest()}
        _write(path, header, done, extended, key)
        store = extended
        set_store(store)  # only once the chunk is on disk
    if not keep:
        path.unlink(missing_ok=True)
    # The run's own statement, never the file's: a checkpoint records certificates, not what they are about.
    return Certificates(**done, guarantee=guarantee)
