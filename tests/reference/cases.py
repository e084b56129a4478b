"""Reference cases: certificates, predictions and trained weights that a refactor must not change.

Each case trains (or not) a small estimator on the digits with fixed seeds
and returns its outputs as plain JSON values. ``python -m tests.reference.cases``
(from the repository root) writes them to ``certificates.json``, which
``tests/test_reference.py`` compares bit for bit. Regenerate the file only
for a change that is meant to change certificates, and say so in the commit.

The values are recorded per CPU kernel family (:func:`platform`): torch and
NumPy pick vector kernels by the CPU's instructions, and their float sums round
differently on each (training weights, the gradient sigma search's float32
sigma, the last bit of float64 radii), while integer counts of noisy samples
do not. Running the script records the running machine's family beside the
others; the test compares with that family's values and skips where it has none.
A case whose values the run changes on its own family changed by intent, so
the script drops it from the other families: their values are unknown until a
machine of that family records them (the test skips the case there).
"""

import json
from pathlib import Path

import numpy as np
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_digits_images
from smoothsk.models import DigitsCNN
from smoothsk.regions import MemoryAllocator, NoRegions, OnlineBallAllocator, TransductiveLPAllocator
from smoothsk.regions._store import weights_fingerprint
from smoothsk.sampling import FixedSampler, InputSpecificSampler, SequentialSampler
from smoothsk.sigma import (
    CertifiedSigmaSelector,
    FixedSigma,
    GradientSigmaSearch,
    GridSigmaSearch,
    MultiStartFGSS,
    SemiElasticSigma,
)
from smoothsk.training import (
    DataDependentTraining,
    FixedSigmaTraining,
    GaussianNoise,
    InstaRSTrain,
    Macer,
    PretrainFinetune,
    SmoothAdv,
)

PATH = Path(__file__).with_name("certificates.json")


def platform():
    """The CPU kernel family the values are computed with: torch's capability, e.g. "AVX2" or "AVX512"."""
    return torch.backends.cpu.get_cpu_capability()


SCHEDULES = {
    "fixed": FixedSigmaTraining(0.25),
    "pfat": PretrainFinetune(0.12, 0.5, pretrain_epochs=3, finetune_epochs=3,
                             assignment=GridSigmaSearch(0.12, 0.5, step=0.19, n=10)),
    "insta-rs": InstaRSTrain(max_level=2, update_every=1, num_noise=2, stage1_epochs=3, stage2_epochs=3,
                             stage1_objective=GaussianNoise(), stage2_objective=Macer(num_noise=2)),
    "ddrs-smoothadv": DataDependentTraining(lr=0.01, warmup_epochs=3, objective=SmoothAdv(steps=1, num_noise=1)),
}

#: name -> (sigma search, sampler, allocator), certified on the model trained with FixedSigmaTraining.
CERTIFY = {
    "fixed-fixed-none": (FixedSigma(0.25), FixedSampler(n=200, n0=20), NoRegions()),
    "fixed-iss-none": (FixedSigma(0.25), InputSpecificSampler(n_max=400, n0_fraction=0.1), NoRegions()),
    "fixed-sequential-none": (FixedSigma(0.25), SequentialSampler(n_max=400, first=50, n0=10), NoRegions()),
    "grid-fixed-online": (GridSigmaSearch(0.12, 0.5, step=0.19, n=20), FixedSampler(n=200, n0=20),
                          OnlineBallAllocator()),
    "fgss-fixed-lp": (MultiStartFGSS(max_level=3, n=20), FixedSampler(n=200, n0=20), TransductiveLPAllocator()),
    "gradient-fixed-memory": (GradientSigmaSearch(steps=2, lr=0.01), FixedSampler(n=200, n0=20),
                              MemoryAllocator()),
    "selector-fixed-none": (CertifiedSigmaSelector(levels=(0.12, 0.25, 0.5), n=50, n0=10, selector_epochs=1),
                            FixedSampler(n=200, n0=20), NoRegions()),
    "semi-elastic-fixed-none": (SemiElasticSigma(0.25, r=0.05, k=3), FixedSampler(n=200, n0=20), NoRegions()),
}

CERTIFICATE_FIELDS = ("prediction", "radius", "sigma", "p_lower", "n_samples", "search_steps", "region",
                      "radius_cap", "sigma_samples")


def _data():
    X, y = load_digits_images()
    return X[:400], y[:400], X[1000:1016]


def _estimator(training, **params):
    params = {"sampler": FixedSampler(n=200, n0=20), **params}
    return SampleWiseSmoothedClassifier(
        DigitsCNN, module__width=8, training=training, max_epochs=6, lr=0.05, optimizer__momentum=0.9,
        batch_size=32, certify_batch_size=128, random_state=0, **params)


def _certificates_json(details):
    out = {name: np.asarray(getattr(details, name)).tolist() for name in CERTIFICATE_FIELDS}
    out["guarantee"] = details.guarantee
    return out


def compute():
    """Every reference value, as a JSON-ready dict (takes about 20 s).

    Runs torch on one thread: training's float sums depend on the thread count.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compute()
    finally:
        torch.set_num_threads(threads)


def _compute():
    X_train, y_train, X_test = _data()
    cases = {}
    for name, schedule in SCHEDULES.items():
        clf = _estimator(schedule).fit(X_train, y_train)
        cases[f"train/{name}"] = {"weights": weights_fingerprint(clf.module_),
                                  "predict": clf.predict(X_test).tolist(),
                                  "predict_proba": clf.predict_proba(X_test).tolist()}
    fitted = _estimator(SCHEDULES["fixed"]).fit(X_train, y_train)
    for name, (search, sampler, allocator) in CERTIFY.items():
        clf = _estimator(SCHEDULES["fixed"], sigma_search=search, sampler=sampler, allocator=allocator)
        clf.set_params(max_epochs=0)
        clf.fit(X_train, y_train)  # fits the sigma function (e.g. the selector) on fresh weights...
        clf.module_.load_state_dict(fitted.module_.state_dict())  # ...then takes the trained classifier's
        clf.reset_regions()
        _, _, details = clf.certify(X_test, return_details=True)
        cases[f"certify/{name}"] = {**_certificates_json(details), "predict": clf.predict(X_test).tolist()}
    return cases


def rerecorded(recorded, family, values):
    """``recorded`` (family -> case -> values) with ``family``'s cases replaced by ``values``.

    Cases whose values changed on ``family``, or that it no longer computes,
    are dropped from every other family.
    """
    changed = {case for case, before in recorded.get(family, {}).items() if values.get(case) != before}
    others = {name: {case: value for case, value in cases.items() if case not in changed}
              for name, cases in recorded.items() if name != family}
    return {**others, family: values}


if __name__ == "__main__":
    by_platform = rerecorded(json.loads(PATH.read_text()) if PATH.exists() else {}, platform(), compute())
    blocks = []
    for name in sorted(by_platform):
        cases = by_platform[name]
        lines = [f"    {json.dumps(case)}: {json.dumps(cases[case], sort_keys=True)}" for case in sorted(cases)]
        blocks.append(f"  {json.dumps(name)}: {{\n" + ",\n".join(lines) + "\n  }")
    PATH.write_text("{\n" + ",\n".join(blocks) + "\n}\n")
    print(f"wrote {PATH} ({platform()})")
