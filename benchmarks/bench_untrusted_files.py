"""Fuzzing the files smoothsk reads from elsewhere: mutated model files, checkpoints, ``.npz`` and ``.npy`` inputs.

Valid files are mutated by the families of ``tests/untrusted_files_support.py``
and each is read in a worker process (a few hundred per process, under a
4 GiB address-space limit).

Model files (``SampleWiseSmoothedClassifier.load``): a fitted FlatMLP with
robust regions, the same saved with a key, a CertifiedSigmaSelector and a
SemiElasticSigma model (each under 7 KB). Mutated: the JSON document
(parameter names of skorch and smoothsk and made-up ones, values of every
JSON type: edge and huge integers, NaN and Infinity, long strings, deep
nesting, class names of code, components; labels' dtypes such as
``<U500000000``, ``|O`` and ``V8``; huge, negative and zero input shapes;
manifest entries), the tensors (cast, reshaped, renamed, swapped, dropped,
added, edge values), the JSON text as text, the safetensors header (length,
offsets, dtypes, shapes, duplicates), the raw bytes, a keyed file's
authentication entries (a digest and an HMAC both, non-ASCII, empty, another
key's) and planted payloads (compile options running a shell command,
``torch_load_kwargs``, ``os.system``, ``subprocess.Popen``, ``builtins.eval``
as classes) that leave a marker file if code from the file runs. Unkeyed
files are mostly re-signed as a forger can, so that the mutation reaches the
parser; some are left unsigned; keyed files are never re-signed.

Checkpoints (``certify(X, checkpoint=path)`` on the estimator and inputs of
the run that wrote it, a MemoryAllocator's), ``.npz`` inputs
(``smoothsk.cli.read_npz``, stored and deflated) and ``.npy`` inputs
(``smoothsk.cli.read_npy``, then every row read; C and Fortran order: the
header and data edits of an archive's members, and raw bytes). Mutated: the zip directory
(declared sizes, compression methods, encryption flags, member names,
duplicates, zip bombs, thousands of members), the ``.npy`` headers (huge,
negative or lying shapes, object and other dtypes, versions, header text,
a pickle that would touch a marker), array values, dtypes and shapes (a
checkpoint's region store re-digested as a forger can), a checkpoint's JSON
header, and the raw bytes.

Per file: read and equal to its base (a resumed run: the same certificates
and region store); read and different (a re-signed unkeyed model file, a
checkpoint or an ``.npz``, which hold no secret); refused with a one-line
ValueError naming the file. Anything else is a failure: another exception,
a crash or a timeout, a marker, an unsigned or keyed model file loading
other content, and on what was read and differs a ``certify`` (one input of
a model; the run's inputs again after a resumed checkpoint, whose region
store must hold the values of certificates) raising another exception than
ValueError or returning an invalid certificate. The peak RSS growth of each
read is measured (``VmHWM`` reset before each file); the bound is 200 MB for
files under 10 KB.

Run ``python benchmarks/bench_untrusted_files.py`` (``--quick`` for about
100 files, ``--seed`` for another draw); the same seed gives the same files.
"""

import collections
import sys
import tempfile
import time
from pathlib import Path

from _common import markdown_table, quick_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import untrusted_files_support as fuzz  # noqa: E402 - found through the line above

#: Mutated model files and mutated checkpoints, .npz and .npy files, of a full run and of a quick one.
FULL, QUICK = (1200, 600), (70, 30)
#: The kinds of files, as the tables name them.
KINDS = {"model": "model files", "checkpoint": "checkpoints", "npz": ".npz inputs", "npy": ".npy inputs"}
#: What a certify after a read may do without failing.
USE_PASSES = ("", "ok", "ValueError", "timeout", "skipped")


def failure_rows(made, outcomes, kinds):
    """One table row per failed file: its number, kind, base, family, mutation, outcome and message."""
    rows = []
    for index, ((base, mutation), outcome) in enumerate(zip(made, outcomes, strict=True)):
        if outcome.failed:
            what = outcome.result if not outcome.marker else f"{outcome.result}, MARKER"
            if outcome.use not in USE_PASSES:
                what += f", then {outcome.use}"
            detail = f"{outcome.error}: {outcome.message}" if outcome.error else outcome.use_message
            rows.append([str(index), KINDS[kinds[base]], base, mutation.family, _cell(mutation.description), what,
                         _cell(detail)])
    return rows


def _cell(text, limit=160):
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit] + "..."


def summary(made, outcomes):
    """The rows of the last table: each measure for the files of one kind (a list of (mutation, outcome))."""
    counts = collections.Counter(outcome.result for _, outcome in zip(made, outcomes, strict=True))
    growth = [(outcome.rss_growth_mb, len(mutation.data)) for mutation, outcome in zip(made, outcomes, strict=True)]
    small = [mb for mb, size in growth if size < fuzz.SMALL_FILE_BYTES]
    largest, largest_size = max(growth)
    bound = fuzz.RSS_GROWTH_LIMIT_MB
    return [
        str(len(made)), str(counts["loaded-equal"]), str(counts["loaded-different"]), str(counts["refused"]),
        str(counts["exception"] + counts["refused-badly"]), str(counts["crash"] + counts["timeout"]),
        str(counts["unauthenticated"]), str(sum(outcome.use not in USE_PASSES for outcome in outcomes)),
        str(sum(outcome.marker for outcome in outcomes)), f"{largest:.1f} MB ({largest_size:,} B)",
        f"{max(small):.1f} MB over {len(small)}: {'within' if max(small) < bound else 'OVER'} {bound} MB"
        if small else "none"]


def main():
    parser = quick_parser(__doc__, f"{sum(QUICK)} files instead of {sum(FULL)} (a smoke run)")
    parser.add_argument("--seed", type=int, default=0, help="draws the mutations (default 0)")
    args = parser.parse_args()
    n_models, n_archives = QUICK if args.quick else FULL
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        bases = fuzz.base_models(folder)
        bases.update(fuzz.base_archives(folder, bases["regions"]["path"]))
        made = (fuzz.mutations(fuzz.read_models({name: base for name, base in bases.items()
                                                 if base["kind"] == "model"}),
                               n_models, args.seed, Path(folder) / "markers")
                + fuzz.archive_mutations({name: base for name, base in bases.items() if base["kind"] != "model"},
                                         n_archives, args.seed, Path(folder) / "markers"))
        outcomes = fuzz.run_files(fuzz.prepare(made, bases, folder), bases, folder)
    kinds = {name: base["kind"] for name, base in bases.items()}
    print(f"{len(made)} mutated files (seed {args.seed}) from {len(bases)} valid ones, "
          f"{time.perf_counter() - start:.0f} s in all\n")

    results = ("loaded-equal", "loaded-different", "refused")
    by_family = collections.defaultdict(collections.Counter)
    for (base, mutation), outcome in zip(made, outcomes, strict=True):
        family = (KINDS[kinds[base]], mutation.family)
        by_family[family]["failed" if outcome.failed else outcome.result] += 1
        by_family[family]["files"] += 1
    markdown_table(["files", "family", "mutated", "read, equal", "read, different", "refused", "failures"],
                   [[*family, *(str(counts[column]) for column in ("files", *results, "failed"))]
                    for family, counts in sorted(by_family.items())])

    failures = failure_rows(made, outcomes, kinds)
    print(f"\n{len(failures)} failures" + (":\n" if failures else ".\n"))
    if failures:
        markdown_table(["file", "files", "base", "family", "mutation", "outcome", "message"], failures)
        print()

    columns = {kind: summary(*zip(*[(mutation, outcome) for (base, mutation), outcome in
                                    zip(made, outcomes, strict=True) if kinds[base] == kind], strict=True))
               for kind in KINDS}
    measures = ["files", "read, equal to the valid file (resumed: same certificates and store)",
                "read, different (re-signed model files, checkpoints, .npz, .npy: no secret)",
                "refused in one line naming the file",
                "other exceptions, or ValueErrors over several lines or not naming the file",
                "crashes and timeouts", "unsigned or keyed model files that loaded other content",
                "read and different, then certify failed otherwise than by a ValueError (or an invalid store)",
                "markers (code from a file ran)", "max peak-RSS growth of a read (the file's size)",
                f"max peak-RSS growth, files under {fuzz.SMALL_FILE_BYTES:,} bytes"]
    markdown_table(["measure", *KINDS.values()], [[measure, *(columns[kind][row] for kind in KINDS)]
                                                   for row, measure in enumerate(measures)])


if __name__ == "__main__":
    main()
