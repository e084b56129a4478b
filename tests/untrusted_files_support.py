"""Hostile files for ``tests/test_untrusted_files_fuzz.py`` and ``benchmarks/bench_untrusted_files.py``.

Model files start from valid saved models (:func:`base_models`) and are
mutated by one of the :data:`FAMILIES`: the JSON document (its parameters,
labels, input shape, regions, fitted sigma function, manifest), the tensors,
the JSON text itself, the safetensors header, the raw bytes, the
authentication entries of a keyed file, or a planted payload that would leave
a marker file if any code from the file ran. An unkeyed file is mostly
re-signed as a forger can (the SHA-256 of the JSON text's bytes, then of each
tensor's bytes in sorted name order), so that the mutation reaches the
parser instead of stopping at the digest; some are left unsigned. A keyed
file is never re-signed with its key: every change to what it authenticates
must be refused.

Checkpoints and ``.npz`` inputs start from valid files (:func:`base_archives`)
and are mutated by the :data:`ARCHIVE_FAMILIES` (the zip directory, the
``.npy`` headers, array values, the raw bytes) and, for checkpoints, the
:data:`CHECKPOINT_FAMILIES` (the JSON header); a checkpoint's region store is
mostly re-digested as a forger can.

:func:`run_files` reads each file in a worker process (many files per
process, under an address-space limit) and records per file its
:class:`Outcome`. What is read and differs from its base is then used (a
``certify``, within a time limit), and an exception other than ValueError
there is a failure too: reading let through a value the estimator cannot use.

Run as a script, this module is that worker: ``python untrusted_files_support.py JOBS RESULTS``.
"""

import dataclasses
import hashlib
import hmac
import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
from pathlib import Path

#: Address-space limit of each worker (torch alone maps about 1.5 GB).
ADDRESS_SPACE_LIMIT = 4 * 2**30
#: Largest peak-RSS growth allowed while loading a small hostile file.
RSS_GROWTH_LIMIT_MB = 200
#: Files smaller than this are "small": their loads must stay within RSS_GROWTH_LIMIT_MB.
SMALL_FILE_BYTES = 10_000
#: Seconds a load may take, and a certify call of one input on a loaded file.
LOAD_SECONDS, USE_SECONDS = 60, 10
#: The key of the keyed base model.
KEY = b"fuzz-key-" + b"k" * 23

#: Parameter names a mutation sets: the file's own, those a file may not set, internals and made-up ones.
PARAMETER_NAMES = [
    "alpha", "batch_size", "certify_autocast", "certify_batch_size", "certify_memory_format", "device", "lr",
    "max_epochs", "n_jobs", "random_state", "verbose", "warm_start", "module", "optimizer", "allocator", "sampler",
    "sigma_search", "training", "module__hidden", "module__n_classes", "module__width", "module__blocks",
    "optimizer__momentum", "optimizer__params", "compile", "compile__options", "compile__backend",
    "torch_load_kwargs", "callbacks", "callbacks__print_log__sink", "criterion", "criterion__weight",
    "iterator_train", "iterator_train__collate_fn", "iterator_valid", "dataset", "train_split",
    "predict_nonlinearity", "use_caching", "module_", "classes_", "history", "_params_to_validate", "initialized_",
    "__class__", "__dict__", "", "module__", "module____init__", "module__experts", "module__levels",
]
#: Dotted class names a mutation writes: allowed ones, the estimator's own and names of code.
CLASS_NAMES = [
    "smoothsk.models.FlatMLP", "smoothsk.models.CifarResNet", "smoothsk.models.DigitsCNN", "smoothsk.models.LeNet",
    "smoothsk.sampling.FixedSampler", "smoothsk.sampling.SequentialSampler", "smoothsk.sampling.InputSpecificSampler",
    "smoothsk.sampling.BaseSampler", "smoothsk.sampling.SamplingResult", "smoothsk.sigma.FixedSigma",
    "smoothsk.sigma.GridSigmaSearch", "smoothsk.sigma.CertifiedSigmaSelector", "smoothsk.sigma.SemiElasticSigma",
    "smoothsk.sigma.BaseCertifiedSigma", "smoothsk.regions.MemoryAllocator", "smoothsk.regions.OnlineBallAllocator",
    "smoothsk.regions.TransductiveLPAllocator", "smoothsk.regions.RegionStore", "smoothsk.training.Macer",
    "smoothsk.training.FixedSigmaTraining", "smoothsk.training.PretrainFinetune", "smoothsk.training.Stage",
    "torch.optim.SGD", "torch.optim.Adam", "torch.optim.LBFGS", "smoothsk.estimator.SampleWiseSmoothedClassifier",
    "skorch.NeuralNet", "torch.nn.Module", "torch.nn.Linear", "os.system", "subprocess.Popen", "builtins.eval",
    "builtins.exec", "builtins.__import__", "posix.system", "pickle.loads", "torch.load", "numpy.load",
    "smoothsk.models.torch.nn.Linear", "smoothsk.models.FlatMLP.__init__", "smoothsk.models", "", ".", "os.system\n",
    "smoothsk.experts.NoiseLevelExperts", "smoothsk.experts.forward",
]
#: numpy dtype strings for classes_.
DTYPES = ["<i8", "|O", "O", "V8", "<U500000000", "<U0", "<U1", "<U256", "|S5", "<f2", "<f8", "?", "|b1", "|i1",
          "<u8", "<c16", "M8[ns]", "(2,)i4", "i4,f8", "<U99999999999999999999", "", "float128", "str", 1, None]
#: Input shapes.
SHAPES = [[], [0], [-1], [6], [3, 2], [2**26], [2**26 + 1], [10**6, 10**6], [1.5], ["6"], [True], [[6]], [2**63],
          [2**64], [1] * 100, [0, 6], None, 6, {"shape": [6]}]
#: torch dtypes a tensor is cast to.
TENSOR_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool",
                 "float8_e4m3fn", "uint64"]
#: Integers at the edges of the types they may land in.
EDGE_INTEGERS = [0, 1, -1, 2, 255, 256, 5000, 100_000, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63,
                 2**64 - 1, 2**64, -2**63 - 1, 10**9 + 1, 10**18, 10**100, 10**1000]
EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 0.5, 1.0, 1.5, 1e300, 3.5e38, float("nan"), float("inf"), float("-inf")]


# ------------------------------------------------------------------ files

@dataclasses.dataclass
class Model:
    """A model file taken apart: its header metadata, JSON document and tensors (torch, by name)."""

    metadata: dict
    document: dict
    tensors: dict
    key: bytes = None


def read_model(path, key=None):
    """The :class:`Model` in the file at ``path``."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as file:
        metadata = dict(file.metadata())
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118
    return Model(metadata, json.loads(metadata["smoothsk"]), tensors, key)


def digest(text, tensors, key=None):
    """What the loader checks: SHA-256 (HMAC-SHA256 under ``key``) of the text's bytes, then each tensor's by name."""
    import torch

    state = hashlib.sha256() if key is None else hmac.new(key, digestmod=hashlib.sha256)
    state.update(text.encode("utf-8", "surrogatepass"))
    for name in sorted(tensors):
        if tensors[name].numel():
            state.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return state.hexdigest()


def manifest(tensors):
    """The document's ``tensors`` entry for ``tensors``."""
    return {name: {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
            for name, tensor in tensors.items()}


def pack(header, data):
    """A safetensors file: the header's length (8 bytes, little-endian), the header's JSON, the data."""
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def unpack(raw):
    """(header as a dict, data bytes) of a safetensors file's bytes."""
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + length]), raw[8 + length:]


_SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                       "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
                       "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "uint16": "U16", "uint32": "U32",
                       "uint64": "U64"}


def serialise(tensors, metadata):
    """The bytes of a safetensors file holding ``tensors`` (any order of names) and string ``metadata``."""
    import torch

    header, chunks, offset = {"__metadata__": metadata}, [], 0
    for name, tensor in tensors.items():
        data = (tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        header[name] = {"dtype": _SAFETENSORS_DTYPES[str(tensor.dtype).removeprefix("torch.")],
                        "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    return pack(header, b"".join(chunks))


def signed(text, tensors, *, key=None, entries=None):
    """File bytes of the JSON ``text`` and ``tensors``, signed (a digest, or an HMAC under ``key``) unless ``entries``
    gives the authentication entries."""
    if entries is None:
        entries = {"smoothsk_sha256" if key is None else "smoothsk_hmac_sha256": digest(text, tensors, key)}
    return serialise(tensors, {"smoothsk": text, **entries})


def dumps(document):
    """The JSON text saving writes for ``document``."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


# ------------------------------------------------------------------ base models

def base_models(folder, names=("regions", "keyed", "selector", "semi_elastic")):
    """Fit and save the valid models mutations start from; name -> base entry of :func:`run_files`.

    ``regions``: a FlatMLP (hidden 8) on 6 features with an
    OnlineBallAllocator and 3 regions; ``keyed``: the same saved with
    :data:`KEY`; ``selector``: a CertifiedSigmaSelector of 2 levels;
    ``semi_elastic``: a SemiElasticSigma (k=3). Each file is under 7 KB.
    """
    import numpy as np

    from smoothsk import SampleWiseSmoothedClassifier
    from smoothsk.models import FlatMLP
    from smoothsk.regions import OnlineBallAllocator
    from smoothsk.sampling import FixedSampler
    from smoothsk.sigma import CertifiedSigmaSelector, SemiElasticSigma
    from smoothsk.training import FixedSigmaTraining

    X = np.random.RandomState(0).rand(40, 6).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(np.int64)
    common = {"module__hidden": 8, "training": FixedSigmaTraining(0.25), "sampler": FixedSampler(n=100, n0=10),
              "max_epochs": 1, "random_state": 0}
    folder = Path(folder)
    made = {}
    if {"regions", "keyed"} & set(names):
        clf = SampleWiseSmoothedClassifier(FlatMLP, allocator=OnlineBallAllocator(), **common).fit(X, y)
        clf.certify(X[:3])
        for name, key in (("regions", None), ("keyed", KEY)):
            if name in names:
                clf.save(folder / f"{name}.safetensors", key=key)
                made[name] = {"kind": "model", "path": str(folder / f"{name}.safetensors"), "key": key and key.hex()}
    for name, search in (("selector", CertifiedSigmaSelector(levels=[0.25, 0.5], n=100, n0=10)),
                         ("semi_elastic", SemiElasticSigma(k=3))):
        if name in names:
            SampleWiseSmoothedClassifier(FlatMLP, sigma_search=search, **common).fit(X, y).save(
                folder / f"{name}.safetensors")
            made[name] = {"kind": "model", "path": str(folder / f"{name}.safetensors"), "key": None}
    return made


def read_models(bases):
    """Name -> :class:`Model` of the model entries of ``bases`` (from :func:`base_models`)."""
    return {name: read_model(base["path"], base["key"] and bytes.fromhex(base["key"]))
            for name, base in bases.items()}


# ------------------------------------------------------------------ values

def random_value(rng, depth=0):
    """A JSON value of any type: edge numbers, long strings, class and component forms, nesting."""
    kind = rng.choice(["none", "bool", "int", "float", "string", "class", "component", "tuple", "list", "dict",
                       "deep"] + ["long"] * (depth == 0) if depth < 3 else ["none", "bool", "int", "float", "string"])
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice(EDGE_INTEGERS) * rng.choice([1, 1, -1])
    if kind == "float":
        return rng.choice(EDGE_FLOATS)
    if kind == "string":
        return rng.choice(["", "a", "cpu", "meta", "cuda:99", "float16", "\u0000", "\udcff", "é" * 3, "../../etc",
                           "$(touch /tmp/x)", "None", "1e999", "two\nlines"] + CLASS_NAMES)
    if kind == "long":
        return "x" * rng.choice([300, 5000, 200_000])
    if kind == "class":
        return {"type": rng.choice(CLASS_NAMES)}
    if kind == "component":
        return {"class": rng.choice(CLASS_NAMES), "params": {rng.choice(["n", "n0", "sigma", "hidden", "levels", "k",
                                                                         "selector", "objective", "order", "x"]):
                                                              random_value(rng, depth + 1)
                                                              for _ in range(rng.randrange(3))}}
    if kind == "tuple":
        return {"tuple": [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]}
    if kind == "list":
        if rng.random() < 0.2:
            return [rng.choice(EDGE_INTEGERS[:12] + EDGE_FLOATS)] * 1000
        return [random_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 5]))]
    if kind == "dict":
        return {rng.choice(["dict", "tuple", "type", "class", "params", "a", ""]): random_value(rng, depth + 1)
                for _ in range(rng.randrange(3))}
    nested = None
    for _ in range(rng.choice([15, 17, 40, 500])):
        nested = [nested] if rng.random() < 0.5 else {"a": nested}
    return nested


def _paths(value, prefix=()):
    """Every path (tuple of keys and indices) into the JSON value ``value``."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _get(document, path):
    for key in path:
        document = document[key]
    return document


def _set(document, path, value):
    """``document`` with the value at ``path`` replaced (deleted when ``value`` is ``_DELETE``)."""
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


_DELETE = object()


# ------------------------------------------------------------------ mutations

@dataclasses.dataclass
class Mutation:
    """A mutated file: its bytes, what was done, how it is signed and the key to load it with."""

    family: str
    description: str
    data: bytes
    signing: str  # "forged" (re-signed as a forger can), "unsigned" (left as it was), "keyed" or "none" (.npz)
    key: bytes = None
    marker: str = ""  # the file a payload in it would create


def _copy(model):
    return Model(dict(model.metadata), json.loads(json.dumps(model.document)),
                 {name: tensor.clone() for name, tensor in model.tensors.items()}, model.key)


def _finish(family, description, model, rng, text=None, new_manifest=None):
    """The :class:`Mutation` of an edited model: re-signed as a forger can, or left with its old entries.

    The document's manifest is made to match the tensors (``new_manifest``;
    by default 4 times in 5) or left as it was.
    """
    if new_manifest is None:
        new_manifest = rng.random() < 0.8
    if text is None:
        text = dumps({**model.document, "tensors": manifest(model.tensors)}
                     if "tensors" in model.document and new_manifest else model.document)
    entries = {name: value for name, value in model.metadata.items() if name != "smoothsk"}
    if model.key is not None:
        return Mutation(family, description, signed(text, model.tensors, entries=entries), "keyed", model.key)
    if rng.random() < 0.1:
        return Mutation(family, description + " (unsigned)", signed(text, model.tensors, entries=entries), "unsigned")
    return Mutation(family, description, signed(text, model.tensors), "forged")


def mutate_document(model, rng, marker):
    """A parameter set or deleted, or any entry of the document replaced by another JSON value."""
    model = _copy(model)
    document = model.document
    choice = rng.random()
    numbers = [path for path in _paths(document) if path and path[0] != "tensors"
               and type(_get(document, path)) in (int, float)]
    if choice < 0.25 and numbers:  # a number in range of its kind replaced by an edge value
        path = rng.choice(numbers)
        value = rng.choice(EDGE_INTEGERS if type(_get(document, path)) is int else EDGE_FLOATS)
        _set(document, path, value)
        description = f"document{_path_text(path)} = {_short(value)}"
    elif choice < 0.5:
        name = rng.choice(PARAMETER_NAMES) if rng.random() < 0.85 else "".join(
            rng.choice("abc_XYZ.é0") for _ in range(rng.randrange(1, 12)))
        value = random_value(rng)
        document["params"][name] = value
        description = f"params[{name!r}] = {_short(value)}"
    elif choice < 0.6 and document["params"]:
        name = rng.choice(sorted(document["params"]))
        del document["params"][name]
        description = f"del params[{name!r}]"
    else:
        path = rng.choice([path for path in _paths(document) if path and path[0] != "tensors"])
        value = _DELETE if rng.random() < 0.15 else random_value(rng)
        _set(document, path, value)
        description = f"document{_path_text(path)} = {'<deleted>' if value is _DELETE else _short(value)}"
    return _finish("document", description, model, rng)


def mutate_fitted(model, rng, marker):
    """classes_ (dtypes, values), input_shape_, the region store's attributes, the fitted sigma function, history."""
    model = _copy(model)
    document = model.document
    target = rng.choice(["classes_dtype", "classes_values", "input_shape", "regions", "sigma_search_", "history",
                         "format", "estimator", "manifest"])
    if target == "classes_dtype":
        dtype = rng.choice(DTYPES)
        document["classes_"]["dtype"] = dtype
        if rng.random() < 0.5:
            document["classes_"]["values"] = rng.choice([["0", "1"], ["a" * 300, "b"], [0, 1.5], [True, False],
                                                         [2**63, 0], ["x"] * 3000, [[0], [1]]])
        description = f"classes_ = {_short(document['classes_'])}"
    elif target == "classes_values":
        document["classes_"]["values"] = random_value(rng) if rng.random() < 0.5 else [
            random_value(rng, 3) for _ in range(rng.choice([0, 1, 2, 3, 500]))]
        description = f"classes_.values = {_short(document['classes_']['values'])}"
    elif target == "input_shape":
        document["input_shape_"] = rng.choice(SHAPES)
        description = f"input_shape_ = {_short(document['input_shape_'])}"
    elif target == "regions":
        name = rng.choice(["n_calls", "weights", "allocator", "alpha", "autocast", "extra"])
        document["regions_"][name] = random_value(rng) if rng.random() < 0.7 else rng.choice(
            [-1, 0, 2**63, "OnlineBallAllocator", "MemoryAllocator", 0.5, "float16"])
        description = f"regions_[{name!r}] = {_short(document['regions_'][name])}"
    elif target == "sigma_search_":
        document["sigma_search_"] = rng.choice([
            random_value(rng), None, {"class": "smoothsk.sigma.SemiElasticSigma",
                                      "params": {"base_sigma": 0.25, "k": rng.choice([0, 1, 3, 10**9]), "offset": None,
                                                 "r": rng.choice([0.05, -1.0, 0.0])}},
            {"class": "smoothsk.sigma.CertifiedSigmaSelector", "params": {"levels": [0.25, 0.5]}},
            {"class": "smoothsk.sigma.FixedSigma", "params": {"sigma": 0.25}}])
        description = f"sigma_search_ = {_short(document['sigma_search_'])}"
    elif target == "history":
        document["history"] = rng.choice([random_value(rng), [{}] * 5, [{"epoch": 2**63}], [[1]], "x"])
        description = f"history = {_short(document['history'])}"
    elif target == "format":
        document["format_version"] = rng.choice([2, 4, "3", 3.0, True, None, 2**64])
        description = f"format_version = {document['format_version']!r}"
    elif target == "estimator":
        document["estimator"] = rng.choice(CLASS_NAMES + ["smoothsk.SampleWiseSmoothedClassifier"])
        description = f"estimator = {document['estimator']!r}"
    else:
        name = rng.choice(sorted(document["tensors"]))
        spec = document["tensors"][name]
        edit = rng.choice(["dtype", "shape", "drop", "add", "not_a_dict"])
        if edit == "dtype":
            spec["dtype"] = rng.choice(TENSOR_DTYPES + ["torch.float32", "F32", "", None])
        elif edit == "shape":
            spec["shape"] = rng.choice(SHAPES)
        elif edit == "drop":
            del document["tensors"][name]
        elif edit == "add":
            document["tensors"]["module_.extra"] = {"dtype": "float32", "shape": [2**40]}
        else:
            document["tensors"] = rng.choice([[], None, "x", {name: []}])
        return _finish("fitted", f"manifest {edit} of {name}", model, rng, new_manifest=False)
    return _finish("fitted", description, model, rng)


def mutate_tensors(model, rng, marker):
    """A tensor cast, reshaped, renamed, swapped with another, dropped, added or filled with edge values."""
    import torch

    model = _copy(model)
    tensors = model.tensors
    name = rng.choice(sorted(tensors))
    action = rng.choice(["cast", "reshape", "rename", "swap", "drop", "add", "values", "empty"])
    if action == "cast":
        dtype = rng.choice(TENSOR_DTYPES)
        tensors[name] = tensors[name].to(getattr(torch, dtype))
        description = f"{name} cast to {dtype}"
    elif action == "reshape":
        shape = rng.choice([(0,), (1,), (tensors[name].numel(),), (2, 0, 3), (0, 2**40), (1, 1, 1, 1)])
        same = tensors[name].numel() == torch.Size(shape).numel()
        tensors[name] = tensors[name].reshape(shape) if same else torch.zeros(shape, dtype=tensors[name].dtype)
        description = f"{name} reshaped to {shape}"
    elif action == "rename":
        new = rng.choice(["module_.layers.9.weight", "module_.", "regions_.extra", "sigma_search_.x", "train_sigmas",
                          "other", "module_.layers.1.weight\u0000", "module_._orig_mod.layers.1.weight"])
        tensors[new] = tensors.pop(name)
        description = f"{name} renamed {new!r}"
    elif action == "swap":
        other = rng.choice(sorted(tensors))
        tensors[name], tensors[other] = tensors[other], tensors[name]
        description = f"{name} swapped with {other}"
    elif action == "drop":
        del tensors[name]
        description = f"{name} dropped"
    elif action == "add":
        new = rng.choice(["module_.extra", "regions_.extra", "sigma_search_.extra", "unknown", "train_keys_",
                          "sigma_search_.levels", "sigma_search_.offset"])
        tensors[new] = torch.zeros(rng.choice([(), (3,), (2, 2)]), dtype=getattr(torch, rng.choice(TENSOR_DTYPES)))
        description = f"{new} added"
    elif action == "values":
        fill = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 7.0, 1e30, -2.0])
        tensors[name] = torch.full_like(tensors[name], fill) if tensors[name].is_floating_point() else \
            torch.full_like(tensors[name], rng.choice([-2, -1, 7, 2**31 - 1]))
        description = f"{name} filled with {fill}"
    else:
        tensors[name] = tensors[name].reshape(-1)[:0]
        description = f"{name} emptied"
    return _finish("tensors", description, model, rng)


def mutate_text(model, rng, marker):
    """The JSON text edited as text: huge integers, NaN and Infinity, deep nesting, cuts, flips, escapes."""
    text = dumps(model.document)
    action = rng.choice(["huge_int", "constant", "nest", "cut", "flip", "escape", "duplicate", "long"])
    numbers = [index for index, char in enumerate(text) if char.isdigit() and text[index - 1] in ":[,"]
    at = rng.choice(numbers) if numbers else 0
    end = at
    while end < len(text) and text[end] in "0123456789.eE-+":
        end += 1
    if action == "huge_int":
        token = rng.choice(["9" * 5000, "9" * 400, str(2**64), "-" + str(2**63 + 1), "1" + "0" * 309])
        text, description = text[:at] + token + text[end:], f"number at {at} -> {token[:12]}... ({len(token)} chars)"
    elif action == "constant":
        token = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999"])
        text, description = text[:at] + token + text[end:], f"number at {at} -> {token}"
    elif action == "nest":
        depth = rng.choice([16, 17, 100, 10_000, 100_000])
        text, description = text[:at] + "[" * depth + "]" * depth + text[end:], f"number at {at} -> {depth} nested []"
    elif action == "cut":
        cut = rng.randrange(len(text))
        text, description = text[:cut], f"text cut at {cut} of {len(text)}"
    elif action == "flip":
        chars = list(text)
        for _ in range(rng.randrange(1, 4)):
            chars[rng.randrange(len(chars))] = rng.choice('{}[]":,0aé\\\u0000')
        text, description = "".join(chars), "characters flipped"
    elif action == "escape":
        token = rng.choice(['"\\ud800"', '"\\u0000"', '"\\udfff\\ud800"', '"\\x41"', '"\\u00e9"'])
        text, description = text[:at] + token + text[end:], f"number at {at} -> string {token}"
    elif action == "duplicate":
        text = text.replace('"params":{', '"params":{"alpha":0.5,"alpha":0.001,', 1)
        description = "params with a duplicated key"
    else:
        text = text.replace('"library_version":"', '"library_version":"' + "v" * 1_000_000, 1)
        description = "a 1 MB library_version"
    model = _copy(model)
    return _finish("text", description, model, rng, text=text)


def mutate_header(model, rng, marker):
    """The safetensors header: its length field, a tensor's offsets, dtype or shape, duplicate names, metadata."""
    raw = signed(dumps(model.document), model.tensors, key=model.key) if model.key is not None else \
        signed(dumps(model.document), model.tensors)
    header, data = unpack(raw)
    names = [name for name in header if name != "__metadata__"]
    name = rng.choice(names)
    action = rng.choice(["length", "offsets", "dtype", "shape", "duplicate", "metadata", "padding", "order"])
    text = json.dumps(header, separators=(",", ":")).encode()
    if action == "length":
        length = rng.choice([0, 1, 7, len(text) - 1, len(text) + 1, 2**31, 2**63, 2**64 - 1, 100_000_000])
        result, description = struct.pack("<Q", length) + text + data, f"header length {length}"
    else:
        if action == "offsets":
            begin, end = header[name]["data_offsets"]
            header[name]["data_offsets"] = rng.choice([[end, begin], [0, len(data) + 8], [begin, end + 1],
                                                       [begin - 1, end - 1], [0, 2**64 - 1], [2**63, 2**63 + 4]])
            description = f"{name} data_offsets {header[name]['data_offsets']}"
        elif action == "dtype":
            header[name]["dtype"] = rng.choice(["F64", "BF16", "F8_E4M3", "U64", "BOOL", "XX", "", 3, "F32 "])
            description = f"{name} dtype {header[name]['dtype']!r}"
        elif action == "shape":
            header[name]["shape"] = rng.choice([[2**32, 2**32], [2**62, 4], [-1], [0], [], [1.5], ["2"], [2**64]])
            description = f"{name} shape {header[name]['shape']}"
        elif action == "duplicate":
            entry = json.dumps(header[name], separators=(",", ":"))
            text = text.replace(b"{", b"{" + json.dumps(rng.choice(names)).encode() + b":" + entry.encode() + b",", 1)
            description = f"duplicate entry for {name}"
        elif action == "metadata":
            header["__metadata__"] = rng.choice([{"smoothsk": 1}, [], None, {**header["__metadata__"], "x": {}},
                                                 {"smoothsk": header["__metadata__"]["smoothsk"]}])
            description = f"__metadata__ = {_short(header['__metadata__'])}"
        elif action == "padding":
            text += b" " * rng.choice([1, 7, 8])
            description = "header padded with spaces"
        else:
            header = dict(reversed(list(header.items())))
            description = "header entries reversed"
        if action not in ("duplicate", "padding"):
            text = json.dumps(header, separators=(",", ":")).encode()
        result = pack(text, data)
    signing = "keyed" if model.key is not None else "unsigned"
    return Mutation("header", description, result, signing, model.key)


def flip_bits(raw, rng):
    """``raw`` with 1 to 8 random bits flipped, and a description of where."""
    data = bytearray(raw)
    where = sorted(rng.randrange(len(data)) for _ in range(rng.randrange(1, 9)))
    for index in where:
        data[index] ^= 1 << rng.randrange(8)
    return bytes(data), f"bits flipped at {where}"


def mutate_bytes(model, rng, marker):
    """Raw bytes: flips, truncation, appended bytes, an empty or random file."""
    raw = signed(dumps(model.document), model.tensors, key=model.key)
    action = rng.choice(["flip", "flip", "truncate", "append", "empty", "random"])
    if action == "flip":
        result, description = flip_bits(raw, rng)
    elif action == "truncate":
        cut = rng.randrange(len(raw))
        result, description = raw[:cut], f"truncated to {cut} of {len(raw)} bytes"
    elif action == "append":
        result, description = raw + bytes(rng.randrange(256) for _ in range(rng.choice([1, 8, 100]))), "bytes appended"
    elif action == "empty":
        result, description = b"", "empty file"
    else:
        result = bytes(rng.randrange(256) for _ in range(rng.choice([7, 8, 100, 4000])))
        description = f"{len(result)} random bytes"
    return Mutation("bytes", description, result, "keyed" if model.key is not None else "unsigned", model.key)


def mutate_authentication(model, rng, marker):
    """The digest and HMAC entries: both at once, one for the other, non-ASCII, empty, another key's, cased."""
    text = dumps(model.document)
    tensors = model.tensors
    edited = _copy(model)
    edited.document["params"]["alpha"] = 0.5  # what a forger changes
    edited_text = dumps(edited.document)
    true_hmac = digest(text, tensors, KEY)
    action = rng.choice(["both", "digest_for_hmac", "non_ascii", "empty", "other_key", "upper", "edited_keep_hmac",
                         "edited_both", "none", "unkeyed_with_key"])
    entries = {
        "both": {"smoothsk_sha256": digest(edited_text, tensors), "smoothsk_hmac_sha256": true_hmac},
        "digest_for_hmac": {"smoothsk_sha256": digest(edited_text, tensors)},
        "non_ascii": {"smoothsk_hmac_sha256": "é" * 64},
        "empty": {"smoothsk_hmac_sha256": ""},
        "other_key": {"smoothsk_hmac_sha256": digest(edited_text, tensors, b"o" * 32)},
        "upper": {"smoothsk_hmac_sha256": true_hmac.upper()},
        "edited_keep_hmac": {"smoothsk_hmac_sha256": true_hmac},
        "edited_both": {"smoothsk_hmac_sha256": true_hmac, "smoothsk_sha256": digest(edited_text, tensors)},
        "none": {},
        "unkeyed_with_key": {"smoothsk_sha256": digest(edited_text, tensors)},
    }[action]
    body = text if action in ("upper", "non_ascii", "empty") else edited_text
    return Mutation("authentication", f"{action}: {sorted(entries)}", signed(body, tensors, entries=entries),
                    "keyed", KEY)


def mutate_payload(model, rng, marker):
    """A payload that leaves ``marker`` if code from the file runs: compile options, classes naming code, strings."""
    model = _copy(model)
    params = model.document["params"]
    command = f"touch {marker}"
    action = rng.choice(["compile", "torch_load_kwargs", "popen_module", "system_component", "exec_training",
                         "eval_selector", "sink", "iterator", "traversal", "strings", "estimator", "regions_allocator"])
    if action == "compile":
        params["compile"] = True
        wrapper = f"native -wrapper '/bin/sh,-c,{command}; exec \"$0\" \"$@\"'"
        params["compile__options"] = {"dict": {"cpp.march": wrapper}}
        model.tensors = {name.replace("module_.", "module_._orig_mod.", 1): tensor
                         for name, tensor in model.tensors.items()}
    elif action == "torch_load_kwargs":
        params["torch_load_kwargs"] = {"dict": {"weights_only": False, "pickle_module": {"type": "os.system"}}}
    elif action == "popen_module":
        params["module"] = {"type": "subprocess.Popen"}
        params["module__args"] = ["/bin/sh", "-c", command]
    elif action == "system_component":
        params[rng.choice(["sampler", "allocator", "training"])] = {"class": rng.choice(["os.system", "posix.system"]),
                                                                    "params": {"command": command}}
    elif action == "exec_training":
        params["training"] = {"class": "builtins.exec", "params": {"source": f"open({str(marker)!r}, 'w')"}}
    elif action == "eval_selector":
        params["sigma_search"] = {"class": "smoothsk.sigma.CertifiedSigmaSelector",
                                  "params": {"levels": [0.25, 0.5], "selector": {"type": "builtins.eval"}}}
    elif action == "sink":
        params["callbacks__print_log__sink"] = {"type": "os.system"}
    elif action == "iterator":
        params["iterator_train"] = {"type": "subprocess.Popen"}
        params["iterator_train__args"] = ["/bin/sh", "-c", command]
    elif action == "traversal":
        params["optimizer"] = {"type": rng.choice(["smoothsk.models.os.system", "torch.optim.os.system",
                                                   "torch.optim.SGD.__init__.__globals__"])}
    elif action == "strings":
        params["module__hidden"] = f"$({command})"
        model.document["classes_"] = {"dtype": "|O", "values": [f"__import__('os').system({command!r})", "b"]}
    elif action == "estimator":
        model.document["estimator"] = "os.system"
    else:
        model.document["regions_"]["allocator"] = "os.system"
    return _finish("payload", f"{action} (marker {Path(marker).name})", model, rng)


#: Mutation families and their weights in a run.
FAMILIES = {mutate_document: 25, mutate_fitted: 15, mutate_tensors: 15, mutate_text: 10, mutate_header: 10,
            mutate_bytes: 8, mutate_authentication: 5, mutate_payload: 12}


def mutations(models, count, seed, marker_folder):
    """``count`` mutations of the base ``models`` (name -> :class:`Model`), drawn by ``seed``; (base name, Mutation).

    Authentication mutations start from the keyed model's content; every
    other family from a base drawn among ``models``, the keyed one (whose
    mutations are never re-signed) a third as often as each other.
    """
    rng = random.Random(seed)
    families, weights = zip(*FAMILIES.items(), strict=True)
    names = sorted(models)
    base_weights = [1 if models[name].key is not None else 3 for name in names]
    made = []
    for index in range(count):
        family = rng.choices(families, weights)[0]
        name = "keyed" if family is mutate_authentication and "keyed" in models else rng.choices(names, base_weights)[0]
        marker = Path(marker_folder) / f"model-{index:05d}"
        mutation = family(models[name], rng, marker)
        mutation.marker = str(marker)
        made.append((name, mutation))
    return made


def _short(value, limit=80):
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _path_text(path):
    return "".join(f"[{key!r}]" for key in path)


# ------------------------------------------------------------------ .npz files and checkpoints

def base_archives(folder, model_path):
    """Write the valid ``.npz`` files mutations start from; name -> base entry of :func:`run_files`.

    ``npz`` and ``npz_compressed``: inputs ``X`` (6, 6) float32 and labels
    ``y`` for the command line (``np.savez``, ``np.savez_compressed``);
    ``npy`` and ``npy_fortran``: ``X`` alone (``np.save``, C and Fortran order);
    ``checkpoint``: the checkpoint of ``certify(X, checkpoint=...,
    checkpoint_every=2, keep_checkpoint=True)`` on the model of
    ``model_path`` with a MemoryAllocator, whose regions a resumed run takes
    from the checkpoint (saved next to it as ``memory.safetensors``).
    """
    import numpy as np

    from smoothsk import SampleWiseSmoothedClassifier
    from smoothsk.regions import MemoryAllocator

    folder = Path(folder)
    X = np.random.RandomState(2).rand(6, 6).astype(np.float32)
    np.save(folder / "inputs.npy", X)
    bases = {}
    for name, save in (("npz", np.savez), ("npz_compressed", np.savez_compressed)):
        with open(folder / f"{name}.npz", "wb") as file:
            save(file, X=X, y=np.arange(6) % 2)
        bases[name] = {"kind": "npz", "path": str(folder / f"{name}.npz")}
    for name, inputs in (("npy", X), ("npy_fortran", np.asfortranarray(X))):
        np.save(folder / f"{name}.npy", inputs)
        bases[name] = {"kind": "npy", "path": str(folder / f"{name}.npy")}
    clf = SampleWiseSmoothedClassifier.load(model_path).set_params(allocator=MemoryAllocator())
    clf.reset_regions()
    clf.save(folder / "memory.safetensors")
    clf.certify(X, checkpoint=folder / "checkpoint.npz", checkpoint_every=2, keep_checkpoint=True)
    bases["checkpoint"] = {"kind": "checkpoint", "path": str(folder / "checkpoint.npz"),
                           "model": str(folder / "memory.safetensors"), "inputs": str(folder / "inputs.npy"),
                           "every": 2}
    return bases


def read_archive(path):
    """Member file name -> bytes of a (trusted) ``.npz``, in order, and whether its members are deflated."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        return {info.filename: archive.read(info) for info in infos}, infos[0].compress_type != zipfile.ZIP_STORED


def npy(array):
    """The ``.npy`` bytes of ``array`` (no pickles)."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
    return buffer.getvalue()


def npy_parts(data):
    """(header text, data bytes) of ``.npy`` bytes of format version 1 or 2."""
    length_bytes = 2 if data[6] == 1 else 4
    length = int.from_bytes(data[8:8 + length_bytes], "little")
    start = 8 + length_bytes
    return data[start:start + length].decode("latin1"), data[start + length:]


def npy_from_parts(header, data, version=(1, 0)):
    """``.npy`` bytes of a header text (any, padded as numpy pads it) and data, under ``version``'s magic."""
    text = header.encode("latin1") if isinstance(header, str) else header
    length_bytes = 2 if version[0] == 1 else 4
    text += b" " * (-(8 + length_bytes + len(text) + 1) % 64) + b"\n"
    length = len(text) if version[0] != 1 or len(text) < 2**16 else 2**16 - 1
    return b"\x93NUMPY" + bytes(version) + length.to_bytes(length_bytes, "little") + text + data


def zipped(members, compressed, edit=None, comment=b""):
    """Bytes of a zip archive of ``members`` (file name -> bytes); ``edit(infos)`` may then lie in its directory."""
    import io
    import warnings
    import zipfile

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED) as archive:
            for name, data in members:
                archive.writestr(name, data)
            if edit is not None:
                edit(archive.infolist())  # the central directory is written on close, from these
            archive.comment = comment
    return buffer.getvalue()


class _Pickled:
    """An object whose pickle calls ``os.system`` when loaded (never by the readers under test)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def mutate_zip(archive, rng, marker):
    """The zip directory: declared sizes, compression methods, flags, names, duplicates, bombs, many members."""
    import numpy as np

    members, compressed = archive
    items = list(members.items())
    index = rng.randrange(len(items))
    name = items[index][0]
    action = rng.choice(["file_size", "compress_size", "method", "encrypted", "rename", "duplicate", "drop", "bomb",
                         "small_bomb", "many", "comment", "compressed"])
    edit, comment = None, b""
    if action in ("file_size", "compress_size", "method", "encrypted"):
        value = {"file_size": [0, 1, 7, 2**31, 2**32 + 5, 2**63 - 1], "compress_size": [0, 1, 2**40],
                 "method": [0, 8, 12, 14, 99], "encrypted": [1]}[action]
        value = rng.choice(value)

        def edit(infos):
            if action == "encrypted":
                infos[index].flag_bits |= value
            elif action == "method":
                infos[index].compress_type = value
            elif action == "file_size":
                infos[index].file_size = rng.choice([value, infos[index].file_size + rng.choice([-1, 1, 64])])
            else:
                infos[index].compress_size = rng.choice([value, infos[index].compress_size + rng.choice([-1, 1])])
        description = f"{name}: zip directory {action} lie"
    elif action == "rename":
        new = rng.choice(["../escape.npy", "/absolute.npy", "X", "X.npy.npy", "x" * 300 + ".npy", "header.npy",
                          "é.npy", "certificates/prediction", "y.npy", "X.npy"])
        items[index] = (new, items[index][1])
        description = f"{name} renamed {new!r}"
    elif action == "duplicate":
        items.append((name, npy(np.zeros(3, np.float32))))
        description = f"{name} twice (the second a different array)"
    elif action == "drop":
        del items[index]
        description = f"{name} dropped"
    elif action in ("bomb", "small_bomb"):
        header, data = npy_parts(items[index][1])
        rows = 2**21 if action == "bomb" else 2**15  # 64 MiB or 1 MiB of zeros in float32 rows of 8
        items[index] = (name, npy(np.zeros((rows, 8), np.float32)))
        compressed = True
        description = f"{name}: {rows * 32 // 2**20} MiB of zeros, deflated"
    elif action == "many":
        items += [(f"extra{i}.npy", npy(np.zeros(1))) for i in range(3000)]
        description = "3,000 more members"
    elif action == "comment":
        comment = b"x" * 65535
        description = "a 64 KiB archive comment"
    else:
        compressed = not compressed
        description = "members " + ("deflated" if compressed else "stored")
    return Mutation("zip", description, zipped(items, compressed, edit, comment), "none")


def mutate_npy(archive, rng, marker):
    """A member's ``.npy`` header (shape, dtype, order, version, text) or data; a pickle that would touch ``marker``."""
    members, compressed = archive
    items = list(members.items())
    index = rng.randrange(len(items))
    name = items[index][0]
    content, description = _edited_npy(items[index][1], rng, marker)
    items[index] = (name, content)
    return Mutation("npy", f"{name}: {description}", zipped(items, compressed), "none")


def mutate_npy_file(content, rng, marker):
    """An ``.npy`` file's header or data, as :func:`mutate_npy` edits an archive's member."""
    edited, description = _edited_npy(content, rng, marker)
    return Mutation("npy-file", description, edited, "none")


def mutate_npy_bytes(content, rng, marker):
    """Raw bytes of an ``.npy`` file: flips, truncation, appended bytes, an empty file, a pickle."""
    return _raw_bytes("npy-bytes", content, bytes(16), rng, marker)


def _edited_npy(content, rng, marker):
    """(``.npy`` bytes, description): ``content``'s header (shape, dtype, order, version, text) or data edited."""
    import pickle

    header, data = npy_parts(content)
    action = rng.choice(["shape", "shape", "dtype", "dtype", "fortran", "version", "text", "pickle", "data"])
    version = (1, 0)
    if action == "shape":
        shape = rng.choice([(2**40,), (10**6, 10**6), (-1,), (0,), (), (2**62, 4), (1, len(data)), (len(data),),
                            (len(data) // 8,), (len(data) // 4,), (2, len(data) // 16)])
        header = _header_text(header, shape=shape)
        description = f"declares shape {shape}"
    elif action == "dtype":
        descr = rng.choice(["|O", "<U500000000", "|V8", [("a", "|O")], ">f8", "<f2", "|S0", "<M8[ns]", "<c16", "|b1",
                            "<i8", "<u8", "<f4", "<i4", "|u1"])
        header = _header_text(header, descr=descr)
        description = f"declares dtype {descr!r}"
    elif action == "fortran":
        header = _header_text(header, fortran_order=True)
        description = "in Fortran order"
    elif action == "version":
        version = rng.choice([(2, 0), (3, 0), (0, 0), (255, 255)])
        description = f".npy version {version}"
    elif action == "text":
        header = rng.choice([header + "junk", f"__import__('os').system('touch {marker}')", "(" * 5000 + ")" * 5000,
                             "{'descr': '<f4'}", "{'descr': '<f4', 'fortran_order': False, 'shape': '6'}",
                             "{" + "'a': 1, " * 20000 + "}", "é" * 100, ""])
        description = f"header text {_short(header, 60)}"
    elif action == "pickle":
        header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
        data = pickle.dumps(_Pickled(f"touch {marker}"))
        description = "an object array whose pickle touches the marker"
    else:
        cut = rng.choice(["truncated", "longer", "random"])
        data = {"truncated": data[:len(data) // 2], "longer": data + b"\0" * 8,
                "random": bytes(rng.randrange(256) for _ in range(len(data)))}[cut]
        description = f"data {cut}"
    return npy_from_parts(header, data, version), description


def _header_text(header, **changes):
    """``.npy`` header text with some of its keys changed."""
    import ast

    fields = ast.literal_eval(header)
    fields.update(changes)
    return repr(fields)


def mutate_values(archive, rng, marker):
    """An array's values (edge values in one element), dtype or shape; a checkpoint's region store re-digested."""
    import io

    import numpy as np

    members, compressed = archive
    items = list(members.items())
    arrays = [i for i, (name, _) in enumerate(items) if name != "header.npy"]
    index = rng.choice(arrays)
    name = items[index][0]
    array = np.load(io.BytesIO(items[index][1]))
    action = rng.choice(["value", "value", "value", "cast", "reshape", "rows"])
    if action == "value" and array.size:
        array = array.copy()
        flat = array.reshape(-1)
        value = rng.choice([np.nan, np.inf, -np.inf, -1, 7, 2, -2, 1e30, 0, 2**40] if array.dtype.kind in "fc" else
                           [-2, -1, 7, 2, 2**40, 0] if array.dtype.kind in "iu" else [0, 1])
        with np.errstate(all="ignore"):
            flat[rng.randrange(flat.size)] = np.array(value).astype(array.dtype)
        description = f"{name}: one value {value}"
    elif action == "cast":
        dtype = rng.choice(["float64", "float32", "float16", "int64", "int8", "uint8", "bool", "complex64", "<U3"])
        with np.errstate(all="ignore"):
            array = array.astype(dtype)
        description = f"{name} cast to {dtype}"
    elif action == "reshape":
        array = rng.choice([array.reshape(-1), array.reshape(array.shape + (1,)), array.reshape(1, -1)])
        description = f"{name} reshaped to {array.shape}"
    else:
        array = rng.choice([array[:-1], array[:0], np.concatenate([array, array[:1]])])
        description = f"{name} with {len(array)} rows"
    items[index] = (name, npy(array))
    if "header.npy" in members and name.startswith("regions/") and rng.random() < 0.8:
        items = redigested(items)  # as a forger can: the store's digest has no secret
        description += ", regions_done re-digested"
    return Mutation("values", description, zipped(items, compressed), "none")


def redigested(items):
    """A checkpoint's members with ``regions_done`` in its header set to the digest of its region arrays."""
    import io

    import numpy as np

    from smoothsk.regions import RegionStore

    members = dict(items)
    header = json.loads(np.load(io.BytesIO(members["header.npy"])).tobytes())
    arrays = {name.removeprefix("regions/").removesuffix(".npy"): np.load(io.BytesIO(data))
              for name, data in members.items() if name.startswith("regions/")}
    try:
        header["regions_done"] = RegionStore(**arrays, **header["regions_attributes"]).digest()
    except (TypeError, ValueError, KeyError):
        return items
    members["header.npy"] = npy(np.frombuffer(json.dumps(header).encode(), np.uint8))
    return list(members.items())


def mutate_checkpoint_header(archive, rng, marker):
    """A checkpoint's JSON header: its entries, values of every JSON type, and its text."""
    import io

    import numpy as np

    members, compressed = archive
    header = json.loads(np.load(io.BytesIO(members["header.npy"])).tobytes())
    key = rng.choice(["chunks_done", "root_seed", "regions_start", "regions_done", "guarantee", "regions_attributes",
                      "parts", "format", "format_version", "library_version", "text"])
    if key == "text":
        text = json.dumps(header)
        text = rng.choice([text[:len(text) // 2], text.replace('"chunks_done": 3', '"chunks_done": ' + "9" * 5000),
                           text.replace('"chunks_done": 3', '"chunks_done": NaN'), "[" * 100_000 + "]" * 100_000,
                           text + "x", "\udcff"])
        data = text.encode("utf-8", "surrogateescape")
        description = f"header text {_short(text, 60)}"
    else:
        if key == "parts":
            value = rng.choice([{**header["parts"], "inputs": "0" * 64}, {}, [], None, "x"])
        elif key == "regions_attributes":
            value = rng.choice([{**header["regions_attributes"], "n_calls": rng.choice([-1, 2**63, "4", True])},
                                {**header["regions_attributes"], "alpha": rng.choice([0.5, "x", None, [1]])},
                                {**header["regions_attributes"], "weights": 0}, {}, random_value(rng)])
        elif key in ("chunks_done", "root_seed"):
            value = rng.choice([0, 1, 2, 4, -1, 2**32, 2**63, True, "3", 3.0, None])
        else:
            value = random_value(rng)
        header[key] = value
        if key == "regions_start" and rng.random() < 0.5:  # the estimator's store is the start: resume replaces it
            header["regions_start"] = header["regions_done"]
        data = json.dumps(header).encode()
        description = f"header[{key!r}] = {_short(value)}"
    members = {**members, "header.npy": npy(np.frombuffer(data, np.uint8))}
    return Mutation("checkpoint-header", description, zipped(list(members.items()), compressed), "none")


def mutate_archive_bytes(archive, rng, marker):
    """Raw bytes of the archive: flips, truncation, appended bytes, an empty file, a pickle."""
    raw = zipped(list(archive[0].items()), archive[1])
    return _raw_bytes("archive-bytes", raw, b"PK\x05\x06" + bytes(18) + b"\0" * 10, rng, marker)


def _raw_bytes(family, raw, tail, rng, marker):
    """A :class:`Mutation` of a file's bytes ``raw``: flips, truncation, ``tail`` appended, empty, a pickle."""
    import pickle

    action = rng.choice(["flip", "flip", "truncate", "append", "empty", "pickle"])
    if action == "flip":
        data, description = flip_bits(raw, rng)
        return Mutation(family, description, data, "none")
    if action == "truncate":
        cut = rng.randrange(len(raw))
        return Mutation(family, f"truncated to {cut} of {len(raw)} bytes", raw[:cut], "none")
    if action == "append":
        return Mutation(family, "bytes appended", raw + tail, "none")
    if action == "empty":
        return Mutation(family, "empty file", b"", "none")
    return Mutation(family, "a pickle that touches the marker", pickle.dumps(_Pickled(f"touch {marker}")), "none")


#: Mutation families of ``.npz`` files (and checkpoints), those of checkpoints only, and those of ``.npy`` files;
#: their weights.
ARCHIVE_FAMILIES = {mutate_zip: 20, mutate_npy: 25, mutate_values: 25, mutate_archive_bytes: 10}
CHECKPOINT_FAMILIES = {mutate_checkpoint_header: 20}
NPY_FAMILIES = {mutate_npy_file: 3, mutate_npy_bytes: 1}


def archive_mutations(bases, count, seed, marker_folder):
    """``count`` mutations of the ``.npz``, ``.npy`` and checkpoint ``bases`` (from :func:`base_archives`); (base
    name, Mutation). A checkpoint is drawn twice as often as each of the others."""
    rng = random.Random(seed)
    archives = {name: Path(base["path"]).read_bytes() if base["kind"] == "npy" else read_archive(base["path"])
                for name, base in bases.items()}
    names = sorted(bases)
    weights = [2 if bases[name]["kind"] == "checkpoint" else 1 for name in names]
    made = []
    for index in range(count):
        name = rng.choices(names, weights)[0]
        kind = bases[name]["kind"]
        families = NPY_FAMILIES if kind == "npy" else {**ARCHIVE_FAMILIES,
                                                        **(CHECKPOINT_FAMILIES if kind == "checkpoint" else {})}
        family = rng.choices(list(families), list(families.values()))[0]
        marker = Path(marker_folder) / f"archive-{index:05d}"
        mutation = family(archives[name], rng, marker)
        mutation.marker = str(marker)
        made.append((name, mutation))
    return made


# ------------------------------------------------------------------ running

@dataclasses.dataclass
class Outcome:
    """What reading one mutated file did.

    ``result`` is ``"loaded-equal"`` (what was read equals what its base
    gives: a model, a checkpoint's certificates and region store, an
    ``.npz``'s arrays), ``"loaded-different"``, ``"refused"`` (a one-line
    ValueError naming the file), or a failure: ``"refused-badly"`` (a
    ValueError over several lines or not naming the file), ``"exception"``
    (another type), ``"crash"`` (the worker died, or was killed after its
    time), ``"timeout"``, ``"unauthenticated"`` (an unsigned or keyed model
    file that loaded other content than its base). ``use`` says what using
    a read that differs did (``certify`` of one input of a model; of the
    run's inputs after a resumed checkpoint): ``"ok"``, ``"ValueError"``,
    ``"timeout"``, ``"skipped"`` or, a failure, another exception type,
    ``"invalid-certificate"`` or ``"invalid-store"`` (a resumed run left
    regions no certificate holds).
    """

    result: str
    error: str = ""
    message: str = ""
    rss_growth_mb: float = 0.0
    use: str = ""
    use_message: str = ""
    marker: bool = False

    @property
    def failed(self):
        return (self.result not in ("loaded-equal", "loaded-different", "refused") or self.marker
                or self.use not in ("", "ok", "ValueError", "timeout", "skipped"))


def prepare(made, bases, folder):
    """Write each mutation of ``made`` (from :func:`mutations` or :func:`archive_mutations`) into ``folder``; the
    ``jobs`` of :func:`run_files` (their markers' folders made)."""
    jobs = []
    for index, (base, mutation) in enumerate(made):
        kind = bases[base]["kind"]
        path = Path(folder) / f"mutated-{index:05d}{ {'model': '.safetensors', 'npy': '.npy'}.get(kind, '.npz')}"
        path.write_bytes(mutation.data)
        Path(mutation.marker).parent.mkdir(parents=True, exist_ok=True)
        jobs.append({"kind": kind, "path": str(path), "base": base, "signing": mutation.signing,
                     "key": mutation.key and mutation.key.hex(), "marker": mutation.marker})
    return jobs


def run_files(jobs, bases, folder, per_worker=250, python=sys.executable):
    """Read each job's file in worker processes; one :class:`Outcome` per job, in order.

    Parameters
    ----------
    jobs : list of dict
        ``kind`` (``"model"``, ``"npz"``, ``"npy"`` or ``"checkpoint"``), ``path``,
        ``base`` (a name in ``bases``), ``signing``, ``key`` (hex or None),
        ``marker`` (a path), as :func:`prepare` writes them.
    bases : dict of str to dict
        Name -> entry of :func:`base_models` or :func:`base_archives`: read
        first in each worker, the reference a file read is compared with.
    folder : path
        Where job and result files go.
    per_worker : int
        Files per worker process (a crash ends a worker; the next starts
        after the file it died on).
    """
    folder = Path(folder)
    outcomes = [None] * len(jobs)
    start = 0
    while start < len(jobs):
        stop = min(start + per_worker, len(jobs))
        spec, results = folder / f"jobs-{start}.json", folder / f"results-{start}.jsonl"
        spec.write_text(json.dumps({"bases": bases, "jobs": jobs[start:stop], "first": start}))
        results.write_text("")
        worker = subprocess.Popen([python, str(Path(__file__).resolve()), str(spec), str(results)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore"})
        try:
            _, stderr = worker.communicate(timeout=(stop - start) * (LOAD_SECONDS + USE_SECONDS) + 120)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, stderr = worker.communicate()
        started = None
        for line in results.read_text().splitlines():
            record = json.loads(line)
            if "started" in record:
                started = record["started"]
            else:
                outcomes[record["index"]] = Outcome(**record["outcome"])
                started = None
        if started is not None:  # the worker died (or was killed after its time) loading this file
            outcomes[started] = Outcome("crash", f"exit status {worker.returncode}",
                                        " ".join((stderr or "").split())[-300:])
            start = started + 1
        elif not all(outcomes[start:stop]):  # died before its first file: the bases or the import
            raise RuntimeError(f"worker failed before loading any file: {(stderr or '')[-2000:]}")
        else:
            start = stop
    for job, outcome in zip(jobs, outcomes, strict=True):
        outcome.marker = outcome.marker or Path(job["marker"]).exists()
    return outcomes


def _rss_mb(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _reset_peak():
    """Reset the peak RSS (VmHWM) to the current RSS, where Linux allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


class _Timeout(BaseException):
    """Raised by the alarm: a BaseException, so that no ``except Exception`` in the code under test swallows it."""


def _alarm(signum, frame):
    raise _Timeout()


def _summary(clf):
    """A digest of everything a loaded estimator was given by its file, to compare two loads."""
    from smoothsk._digest import value_digest

    sigma_function = getattr(clf, "sigma_search_", None)
    return value_digest({
        "params": {name: value for name, value in clf.get_params(deep=False).items() if name != "callbacks"},
        "classes": (clf.classes_.dtype.str, clf.classes_.tolist()), "input_shape": clf.input_shape_,
        "state": clf.module_.state_dict(), "train_sigmas": getattr(clf, "train_sigmas_", None),
        "train_keys": getattr(clf, "train_keys_", None), "regions": clf.regions_.to_arrays(),
        "history": list(clf.history),
        "sigma_search_": None if sigma_function is None else (
            type(sigma_function).__name__, sigma_function.get_params(deep=False), sigma_function.fitted_arrays())})


def _certify_checked(clf, X):
    """``certify(X)`` within USE_SECONDS: ``(use, message)`` (see :class:`Outcome`)."""
    signal.alarm(USE_SECONDS)
    try:
        prediction, radius = clf.certify(X)
    except _Timeout:
        return "timeout", ""
    except Exception as error:  # noqa: BLE001 - any type is recorded
        name = "ValueError" if isinstance(error, ValueError) else type(error).__name__
        return name, " ".join(str(error).split())[:300]
    finally:
        signal.alarm(0)
    valid = all((label in clf.classes_ or label == -1) for label in prediction) and bool((radius >= 0).all())
    return ("ok", "") if valid else ("invalid-certificate", f"predictions {prediction!r}, radii {radius!r}")


def _store_problem(store, n_classes):
    """What in a region store no certificate holds (as a model file's store is checked), or ``""``."""
    import numpy as np

    arrays, attributes = store.to_arrays()
    kinds = {"centres": "f", "radii": "f", "sigmas": "f", "predictions": "i", "p_lowers": "f"}
    wrong = [f"regions_.{name} of dtype {arrays[name].dtype}" for name, kind in kinds.items()
             if np.asarray(arrays[name]).dtype.kind != kind]
    if wrong or not isinstance(attributes["n_calls"], int):
        return ", ".join(wrong) or f"regions_.n_calls {attributes['n_calls']!r}"
    rules = {"centres": np.isfinite(store.centres).all(), "radii": (store.radii >= 0).all(),
             "sigmas": (np.isfinite(store.sigmas) & (store.sigmas > 0)).all(),
             "predictions": ((store.predictions >= -1) & (store.predictions < n_classes)).all(),
             "p_lowers": ((store.p_lowers >= 0) & (store.p_lowers <= 1)).all(), "n_calls": store.n_calls >= 0}
    return ", ".join(f"regions_.{name}" for name, valid in rules.items() if not valid)


class _Kinds:
    """What a worker does with each kind of file: read it (the call under test), digest what it read, use it."""

    def __init__(self):
        from smoothsk import SampleWiseSmoothedClassifier
        from smoothsk.cli import read_npy, read_npz

        self.load, self.read_npz, self.read_npy, self.inputs = SampleWiseSmoothedClassifier.load, read_npz, read_npy, {}

    def read(self, job, base):
        if job.get("kind", "model") == "model":
            return self.load(job["path"], key=job["key"] and bytes.fromhex(job["key"]))
        if job["kind"] == "npz":
            return self.read_npz(job["path"], require_y=False)
        if job["kind"] == "npy":  # opened, then every row read as certify reads them
            X = self.read_npy(job["path"])
            return X.rows(0, len(X))
        clf = self.load(base["model"])
        _, _, details = clf.certify(self._inputs(base), checkpoint=job["path"], checkpoint_every=base["every"],
                                    keep_checkpoint=True, return_details=True)
        return clf, details

    def digest(self, kind, value):
        import numpy as np

        from smoothsk._digest import value_digest

        if kind == "model":
            return _summary(value)
        if kind in ("npz", "npy"):
            return value_digest(value)
        clf, details = value  # the certificates, and the region store the run left
        return value_digest(({name: np.asarray(item) for name, item in vars(details).items()},
                             clf.regions_.to_arrays()))

    def use(self, kind, value, base):
        """What using what was read did: certify one input (a model), the inputs again (a resumed run)."""
        import numpy as np

        if kind in ("npz", "npy"):
            return "", ""
        if kind == "checkpoint":  # the store the run left, which answers these inputs again (MemoryAllocator)
            problem = _store_problem(value[0].regions_, len(value[0].classes_))
            return ("invalid-store", problem) if problem else _certify_checked(value[0], self._inputs(base))
        if value.n_features_in_ > 2**20:
            return "skipped", "input over 2**20 features"
        return _certify_checked(value, np.random.RandomState(1).rand(1, *value.input_shape_).astype(np.float32))

    def _inputs(self, base):
        import numpy as np

        if base["inputs"] not in self.inputs:
            self.inputs[base["inputs"]] = np.load(base["inputs"])
        return self.inputs[base["inputs"]]


def _worker(spec_path, results_path):
    """Read every job of ``spec_path``, appending a started record and an outcome per job to ``results_path``."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    import shutil
    import warnings

    warnings.simplefilter("ignore")
    kinds = _Kinds()
    spec = json.loads(Path(spec_path).read_text())
    reference = {}
    for name, base in spec["bases"].items():
        kind = base.get("kind", "model")
        copy = Path(results_path).with_name(f"reference-{name}{Path(base['path']).suffix}")
        shutil.copyfile(base["path"], copy)  # a resumed checkpoint may be rewritten
        reference[name] = kinds.digest(kind, kinds.read({**base, "path": str(copy), "kind": kind}, base))
    signal.signal(signal.SIGALRM, _alarm)
    with open(results_path, "a") as results:
        for index, job in enumerate(spec["jobs"], start=spec["first"]):
            results.write(json.dumps({"started": index}) + "\n")
            results.flush()
            outcome = _read_one(kinds, job, spec["bases"][job["base"]], reference[job["base"]])
            outcome.marker = Path(job["marker"]).exists()
            results.write(json.dumps({"index": index, "outcome": dataclasses.asdict(outcome)}) + "\n")
            results.flush()


def _read_one(kinds, job, base, reference):
    kind = job.get("kind", "model")
    _reset_peak()
    before = _rss_mb("VmRSS")
    signal.alarm(LOAD_SECONDS)
    try:
        value = kinds.read(job, base)
    except _Timeout:
        return Outcome("timeout", rss_growth_mb=_rss_mb("VmHWM") - before)
    except ValueError as error:
        message = str(error)
        clean = "\n" not in message and job["path"] in message
        return Outcome("refused" if clean else "refused-badly", type(error).__name__, message[:500],
                       _rss_mb("VmHWM") - before)
    except BaseException as error:  # noqa: BLE001 - any other type is the failure recorded
        return Outcome("exception", type(error).__name__, " ".join(str(error).split())[:500],
                       _rss_mb("VmHWM") - before)
    finally:
        signal.alarm(0)
    growth = _rss_mb("VmHWM") - before
    if kinds.digest(kind, value) == reference:
        return Outcome("loaded-equal", rss_growth_mb=growth)
    use, use_message = kinds.use(kind, value, base)
    result = "unauthenticated" if job["signing"] in ("unsigned", "keyed") else "loaded-different"
    return Outcome(result, rss_growth_mb=growth, use=use, use_message=use_message)


if __name__ == "__main__":
    _worker(*sys.argv[1:3])
