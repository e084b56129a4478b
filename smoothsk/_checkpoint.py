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
import json
import os
import zipfile
from numbers import Integral
from pathlib import Path

import joblib
import numpy as np

from ._atomic import atomic_file, unwritable_reason
from ._version import __version__
from .certificates import Certificates
from ._digest import module_fingerprint, value_digest

FORMAT = "smoothsk certify checkpoint"
FORMAT_VERSION = 1
#: The per-input arrays of a certificate record (its ``guarantee`` string goes in the header).
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
_START_OVER = "delete {path} to start over, or pass another path as checkpoint="
#: Parameters certificates do not depend on (tested): left out of the fingerprint.
_NOT_IN_CERTIFICATES = ("verbose", "n_jobs", "certify_batch_size")


def _library_version():
    return __version__


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
    """Validate the ``checkpoint`` argument; returns it as a Path.

    The file is written in its folder (a temporary file, then a rename), so
    the folder must exist and be writable: checked here, before any sampling.

    Parameters
    ----------
    checkpoint : str or os.PathLike

    Returns
    -------
    Path
    """
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a file path (str or os.PathLike), got {checkpoint!r}.")
    path = Path(checkpoint)
    reason = unwritable_reason(path)
    if reason is not None:
        raise ValueError(f"checkpoint {str(path)!r} cannot be written: {reason}.")
    return path


def _hash_arrays(named_arrays):
    """SHA-256 hex digest of ``(name, array)`` pairs: names, dtypes, shapes and values."""
    digest = hashlib.sha256()
    for name, array in named_arrays:
        array = np.ascontiguousarray(array)
        digest.update(json.dumps([name, array.dtype.str, array.shape]).encode())
        digest.update(array.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def inputs_digest(X):
    """Digest of the inputs of a run.

    Parameters
    ----------
    X : ndarray of float32, shape (n_inputs, *input_shape)

    Returns
    -------
    str
    """
    return _hash_arrays([("X", X)])


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


def run_fingerprint(estimator, X):
    """Fingerprint digests of a ``certify`` run on ``X`` (the ``parts`` of :func:`certify_in_chunks`).

    A ``random_state`` that is a RandomState instance is recorded as such,
    not by its state: a run's noise comes from the root seed recorded in the
    checkpoint (as with ``random_state=None``), so a resume gets the
    certificates of the run it continues, whatever the instance drew since.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier
        Fitted.
    X : ndarray of float32, shape (n_inputs, *input_shape)

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
    return {"inputs": inputs_digest(X),
            "parameters": parameters_digest(params),
            "weights": weights_digest(estimator.module_, estimator.classes_),
            "sigma function": parameters_digest({"sigma_search_": getattr(estimator, "sigma_search_", None)})}


def _refuse(path, what):
    return ValueError(f"{path} is {what}; " + _START_OVER.format(path=path) + ".")


def _read(path, parts):
    """Header and arrays of the checkpoint at ``path``, checked against this run's ``parts``.

    The header is read and checked before any other member.
    """
    with open(path, "rb") as file:
        magic = file.read(4)
    if magic != b"PK\x03\x04":  # every .npz is a zip archive; a pickle is never read
        raise _refuse(path, "not a smoothsk certify checkpoint (not an .npz archive; files written by "
                            "earlier versions are pickles, which are never loaded)")
    data = None
    try:
        data = np.load(path, allow_pickle=False)
        header = json.loads(bytes(data["header"]).decode())
        if header["format"] != FORMAT:
            raise ValueError(f"format {header['format']!r}")
        format_version, recorded_parts = header["format_version"], dict(header["parts"])
    except (KeyError, TypeError, ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        if data is not None:
            data.close()
        raise _refuse(path, f"not a smoothsk certify checkpoint ({error!r})") from error
    with data:
        if format_version != FORMAT_VERSION:
            raise _refuse(path, f"a checkpoint of format version {format_version}; smoothsk {_library_version()} "
                                f"reads version {FORMAT_VERSION}")
        differ = [name for name in _PART_NAMES if recorded_parts.get(name) != parts[name]]
        if differ:
            raise _refuse(path, "the checkpoint of another run, which this run does not overwrite: its "
                          "fingerprint differs in " + "; ".join(_PART_NAMES[name] for name in differ))
        try:
            arrays = {name: data[name] for name in data.files if name != "header"}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
            raise _refuse(path, f"a damaged checkpoint ({error!r})") from error
    missing = [name for name in _CERTIFICATE_FIELDS if f"certificates/{name}" not in arrays]
    if missing or "regions_done" not in header or "regions_start" not in header:
        raise _refuse(path, f"a damaged checkpoint (certificates missing: {missing})")
    return header, arrays


def _write(path, header, certificates, store):
    """Write the checkpoint atomically (:func:`smoothsk._atomic.atomic_file`)."""
    arrays, attributes = store.to_arrays()
    header = {**header, "regions_attributes": attributes}
    members = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
    members.update({f"certificates/{name}": value for name, value in certificates.items()})
    members.update({f"regions/{name}": value for name, value in arrays.items()})
    with atomic_file(path) as file:
        np.savez(file, **members)


def certify_in_chunks(certify_rows, n_inputs, path, every, parts, root_seed, get_store, set_store, keep=False):
    """Certify inputs chunk by chunk, resuming from (and recording in) the checkpoint at ``path``.

    Parameters
    ----------
    certify_rows : callable
        ``certify_rows(rows, root_seed, store) -> Certificates`` certifies the
        inputs ``rows`` (ndarray of int) with Monte Carlo noise from
        ``root_seed`` against the region store ``store``, which it may extend.
        A chunk must get the certificates it would get in a one-shot run.
    n_inputs : int
        Number of inputs of the run.
    path : Path
        The checkpoint file (removed when the run completes, unless ``keep``).
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
    keep : bool, default=False
        Keep the file when the run completes: a rerun then reads every
        certificate from it, so the caller can remove it once the results
        are safely stored elsewhere.

    Returns
    -------
    Certificates
        The certificates of all ``n_inputs`` inputs.
    """
    parts = {**parts, "checkpoint_every": str(every), "version": _library_version()}
    store = get_store()
    if path.exists():
        header, arrays = _read(path, parts)
        current = store.digest()
        if current == header["regions_done"]:
            pass  # this process kept the store of the last finished chunk
        elif current == header["regions_start"]:
            recorded = type(store).from_arrays({
                name.split("/", 1)[1]: value for name, value in arrays.items() if name.startswith("regions/")},
                header["regions_attributes"])
            if recorded.digest() != header["regions_done"]:
                raise _refuse(path, "a checkpoint whose recorded regions do not match its header")
            store = recorded
            set_store(store)
        else:
            raise ValueError(
                f"regions_ changed since the interrupted run of checkpoint {path} (other certify calls or "
                f"reset_regions()): resuming would mix certificates made against different region stores. "
                f"Certify with regions_ as the run left it, or " + _START_OVER.format(path=path) + ".")
        done = {name: arrays[f"certificates/{name}"] for name in _CERTIFICATE_FIELDS}
    else:
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "library_version": _library_version(),
                  "parts": parts, "root_seed": int(root_seed), "chunks_done": 0,
                  "regions_start": store.digest(), "regions_done": store.digest()}
        done = None
    for start in range(header["chunks_done"] * every, n_inputs, every):
        rows = np.arange(start, min(start + every, n_inputs))
        extended = copy.deepcopy(store)
        chunk = certify_rows(rows, header["root_seed"], extended)
        done = {name: getattr(chunk, name) if done is None else np.concatenate([done[name], getattr(chunk, name)])
                for name in _CERTIFICATE_FIELDS}
        header = {**header, "chunks_done": header["chunks_done"] + 1, "regions_done": extended.digest(),
                  "guarantee": chunk.guarantee}
        _write(path, header, done, extended)
        store = extended
        set_store(store)  # only once the chunk is on disk
    if not keep:
        path.unlink(missing_ok=True)
    return Certificates(**done, guarantee=header["guarantee"])
