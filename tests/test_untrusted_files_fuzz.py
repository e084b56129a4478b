"""Forty mutated model files in one worker process: each loads (equal to the file it was made from, or, re-signed
by a forger, different) or is refused in one line naming it; none runs code or grows the RSS past the bound.

The mutations and the worker are in ``untrusted_files_support``, which
``benchmarks/bench_untrusted_files.py`` runs over more than a thousand files.
"""

import numpy as np
import pytest

from smoothsk import SampleWiseSmoothedClassifier

from untrusted_files_support import (
    RSS_GROWTH_LIMIT_MB,
    SMALL_FILE_BYTES,
    base_archives,
    base_models,
    mutations,
    npy,
    prepare,
    read_archive,
    read_models,
    redigested,
    run_files,
    zipped,
)

#: Mutated files and the seed that draws them.
N_FILES, SEED = 40, 0


def test_mutated_model_files_load_alike_or_are_refused_in_one_line(tmp_path):
    bases = base_models(tmp_path, names=("regions", "keyed"))
    made = mutations(read_models(bases), N_FILES, SEED, tmp_path / "markers")
    outcomes = run_files(prepare(made, bases, tmp_path), bases, tmp_path, per_worker=N_FILES)
    failures = [f"{base} {mutation.family}: {mutation.description}: {outcome}"
                for (base, mutation), outcome in zip(made, outcomes, strict=True) if outcome.failed]
    assert not failures, "\n".join(failures)
    results = {outcome.result for outcome in outcomes}
    assert {"refused", "loaded-equal", "loaded-different"} <= results, results  # the mutations reach every outcome
    small = [outcome.rss_growth_mb for (_, mutation), outcome in zip(made, outcomes, strict=True)
             if len(mutation.data) < SMALL_FILE_BYTES]
    assert small and max(small) < RSS_GROWTH_LIMIT_MB, max(small)


def test_a_checkpoint_cannot_give_the_estimator_regions_no_certificate_holds(tmp_path):
    """A forged checkpoint's regions predict class 7 of 2; resumed, a MemoryAllocator's certify raised IndexError."""
    bases = base_archives(tmp_path, base_models(tmp_path, names=("regions",))["regions"]["path"])
    checkpoint = bases["checkpoint"]
    members, compressed = read_archive(checkpoint["path"])
    members["regions/predictions.npy"] = npy(np.full(6, 7))
    forged = tmp_path / "forged.npz"
    forged.write_bytes(zipped(redigested(list(members.items())), compressed))
    clf = SampleWiseSmoothedClassifier.load(checkpoint["model"])
    X = np.load(checkpoint["inputs"])
    with pytest.raises(ValueError, match=r"forged\.npz"):
        clf.certify(X, checkpoint=forged, checkpoint_every=checkpoint["every"], keep_checkpoint=True)
