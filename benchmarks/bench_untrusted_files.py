"""Fuzzing the files smoothsk reads from elsewhere: mutated model files, each loaded in a worker process.

Valid model files (a fitted FlatMLP with robust regions, the same saved with
a key, a CertifiedSigmaSelector and a SemiElasticSigma model; each under
7 KB) are mutated by the families of ``tests/untrusted_files_support.py``:
the JSON document (parameter names of skorch and smoothsk and made-up ones,
values of every JSON type: edge and huge integers, NaN and Infinity, long
strings, deep nesting, class names of code, components; labels' dtypes such
as ``<U500000000``, ``|O`` and ``V8``; huge, negative and zero input shapes;
manifest entries), the tensors (cast, reshaped, renamed, swapped, dropped,
added, filled with edge values), the JSON text as text, the safetensors
header (length, offsets, dtypes, shapes, duplicates), the raw bytes (flips,
truncation), a keyed file's authentication entries (both a digest and an
HMAC, non-ASCII, empty, another key's) and planted payloads (compile options
running a shell command, ``torch_load_kwargs``, ``os.system``,
``subprocess.Popen``, ``builtins.eval`` as classes) that leave a marker
file if any code from the file runs. Unkeyed files are mostly re-signed as a
forger can, so that the mutation reaches the parser; some are left unsigned;
keyed files are never re-signed.

Workers load a few hundred files each, under a 4 GiB address-space limit.
Per file: loaded and equal to its base model; loaded and different (only a
re-signed unkeyed file may); refused with a one-line ValueError naming the
file; anything else is a failure: another exception, a crash or a timeout, a
marker, an unsigned or keyed file loading other content, or a loaded file
whose ``certify`` of one input raises another exception than ValueError or
returns an invalid certificate. The peak RSS growth of each load is
measured (``VmHWM`` reset before each file); the bound is 200 MB for files
under 10 KB.

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

#: Mutated files of a full run and of a quick one.
FULL, QUICK = 1200, 100


def failure_rows(made, outcomes):
    """One table row per failed file: its number, base, family, mutation, outcome and message."""
    rows = []
    for index, ((base, mutation), outcome) in enumerate(zip(made, outcomes, strict=True)):
        if outcome.failed:
            what = outcome.result if not outcome.marker else f"{outcome.result}, MARKER"
            detail = outcome.message or outcome.use_message
            if outcome.use not in ("", "ok", "ValueError", "timeout", "skipped"):
                what += f", certify: {outcome.use}"
            rows.append([str(index), base, mutation.family, _cell(mutation.description), what,
                         _cell(f"{outcome.error}: {detail}" if outcome.error else detail)])
    return rows


def _cell(text, limit=160):
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit] + "..."


def main():
    parser = quick_parser(__doc__, f"{QUICK} files instead of {FULL} (a smoke run)")
    parser.add_argument("--seed", type=int, default=0, help="draws the mutations (default 0)")
    args = parser.parse_args()
    count = QUICK if args.quick else FULL
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        bases = fuzz.base_models(folder)
        models = {name: fuzz.read_model(path, key) for name, (path, key) in bases.items()}
        made = fuzz.mutations(models, count, args.seed, Path(folder) / "markers")
        jobs, references = fuzz.prepare(made, bases, folder)
        outcomes = fuzz.run_files(jobs, references, folder)
    seconds = time.perf_counter() - start
    print(f"{count} mutated model files (seed {args.seed}) from {len(bases)} base models, "
          f"{seconds:.0f} s in all\n")

    results = ("loaded-equal", "loaded-different", "refused")
    by_family = collections.defaultdict(collections.Counter)
    for (_, mutation), outcome in zip(made, outcomes, strict=True):
        by_family[mutation.family]["failed" if outcome.failed else outcome.result] += 1
        by_family[mutation.family]["files"] += 1
    markdown_table(["family", "files", *results, "failures"],
                   [[family, *(str(counts[column]) for column in ("files", *results, "failed"))]
                    for family, counts in sorted(by_family.items())])

    failures = failure_rows(made, outcomes)
    print(f"\n{len(failures)} failures" + (":\n" if failures else ".\n"))
    if failures:
        markdown_table(["file", "base", "family", "mutation", "outcome", "message"], failures)
        print()

    counts = collections.Counter(outcome.result for outcome in outcomes)
    growth = [(outcome.rss_growth_mb, len(mutation.data)) for (_, mutation), outcome in zip(made, outcomes,
                                                                                              strict=True)]
    small = [mb for mb, size in growth if size < fuzz.SMALL_FILE_BYTES]
    largest, largest_size = max(growth)
    use_failures = sum(outcome.use not in ("", "ok", "ValueError", "timeout", "skipped") for outcome in outcomes)
    bound = fuzz.RSS_GROWTH_LIMIT_MB
    markdown_table(["measure", "value"], [
        ["files", str(count)],
        ["loaded, equal to the base", str(counts["loaded-equal"])],
        ["loaded, different (re-signed unkeyed files)", str(counts["loaded-different"])],
        ["refused in one line naming the file", str(counts["refused"])],
        ["other exceptions (or ValueErrors over several lines, not naming the file)",
         str(counts["exception"] + counts["refused-badly"])],
        ["crashes and timeouts", str(counts["crash"] + counts["timeout"])],
        ["unsigned or keyed files that loaded other content", str(counts["unauthenticated"])],
        ["loaded files whose certify failed otherwise than by a ValueError", str(use_failures)],
        ["markers (code from a file ran)", str(sum(outcome.marker for outcome in outcomes))],
        ["max peak-RSS growth of a load", f"{largest:.1f} MB (a file of {largest_size:,} bytes)"],
        [f"max peak-RSS growth, files under {fuzz.SMALL_FILE_BYTES:,} bytes ({len(small)})",
         f"{max(small):.1f} MB: {'within' if max(small) < bound else 'OVER'} the {bound} MB bound"],
    ])


if __name__ == "__main__":
    main()
