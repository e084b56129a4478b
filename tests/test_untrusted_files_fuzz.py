"""Forty mutated model files in one worker process: each loads (equal to the file it was made from, or, re-signed
by a forger, different) or is refused in one line naming it; none runs code or grows the RSS past the bound.

The mutations and the worker are in ``untrusted_files_support``, which
``benchmarks/bench_untrusted_files.py`` runs over more than a thousand files.
"""

from untrusted_files_support import (RSS_GROWTH_LIMIT_MB, SMALL_FILE_BYTES, base_models, mutations, prepare,
                                     read_model, run_files)

#: Mutated files and the seed that draws them.
N_FILES, SEED = 40, 0


def test_mutated_model_files_load_alike_or_are_refused_in_one_line(tmp_path):
    bases = base_models(tmp_path, names=("regions", "keyed"))
    models = {name: read_model(path, key) for name, (path, key) in bases.items()}
    made = mutations(models, N_FILES, SEED, tmp_path / "markers")
    jobs, references = prepare(made, bases, tmp_path)
    outcomes = run_files(jobs, references, tmp_path, per_worker=N_FILES)
    failures = [f"{base} {mutation.family}: {mutation.description}: {outcome}"
                for (base, mutation), outcome in zip(made, outcomes, strict=True) if outcome.failed]
    assert not failures, "\n".join(failures)
    results = {outcome.result for outcome in outcomes}
    assert {"refused", "loaded-equal", "loaded-different"} <= results, results  # the mutations reach every outcome
    small = [outcome.rss_growth_mb for (_, mutation), outcome in zip(made, outcomes, strict=True)
             if len(mutation.data) < SMALL_FILE_BYTES]
    assert small and max(small) < RSS_GROWTH_LIMIT_MB, max(small)
