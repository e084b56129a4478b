"""The registry of random streams: distinct seed salts, and certification samples on stages that never collide.

A certificate's bound must come from samples independent of those that
chose its class, its sigma or its sample size (Cohen et al.'s CERTIFY:
``n0`` selection samples, then ``n`` fresh ones). The engine makes "fresh"
mean "another stage"; these tests read the registry and record the stages
the library actually samples at.
"""

import itertools

import numpy as np
import pytest

from smoothsk import _stages
from smoothsk.engine import MonteCarloEngine, stage_key
from smoothsk.regions import MemoryAllocator, NoRegions, OnlineBallAllocator, TransductiveLPAllocator
from smoothsk.sampling import FixedSampler, InputSpecificSampler, SequentialSampler
from smoothsk.sampling._base import BaseSampler
from smoothsk.sigma import GridSigmaSearch


def _registry(suffix):
    return {name: value for name, value in vars(_stages).items() if name.isupper() and name.endswith(suffix)}


class TestSalts:
    def test_every_salt_has_its_own_value_but_the_declared_shared_pairs(self):
        salts = _registry("_SALT")
        assert len(salts) >= 11 and all(isinstance(value, int) and value >= 0 for value in salts.values())
        declared = {frozenset(pair) for pair in _stages.SHARED_SALTS}
        by_value = {}
        for name, value in salts.items():
            by_value.setdefault(value, set()).add(name)
        shared = {frozenset(names) for names in by_value.values() if len(names) > 1}
        assert shared == declared

    def test_a_salt_that_joins_another_is_found(self, monkeypatch):
        monkeypatch.setattr(_stages, "PREDICT_SALT", _stages.CERTIFY_SALT)
        salts = _registry("_SALT")
        assert len(set(salts.values())) < len(salts) - len(_stages.SHARED_SALTS)


class TestStages:
    def test_the_first_elements_of_the_stage_families_differ(self):
        firsts = [_stages.SEARCH_STAGE, _stages.FIRST_PASS, _stages.SECOND_PASS, _stages.PREDICT_STAGE[0],
                  _stages.CERTIFIED_SIGMA_STAGE, _stages.REACHABLE_LEVEL_STAGE]
        assert len(set(firsts)) == len(firsts)
        assert _stages.CERTIFY_STAGE == (_stages.FIRST_PASS,)

    def test_the_certified_sigma_stages_are_its_own_and_distinct(self):
        own = [_stages.CERTIFIED_SIGMA_SELECTION, _stages.CERTIFIED_SIGMA_ESTIMATION,
               _stages.CERTIFIED_SIGMA_PREDICTION]
        assert len(set(own)) == len(own)
        assert all(stage[0] == _stages.CERTIFIED_SIGMA_STAGE for stage in own)

    def test_selection_and_estimation_suffixes_differ(self):
        assert _stages.SELECTION != _stages.ESTIMATION

    def test_stages_that_are_prefixes_of_one_another_get_distinct_streams(self):
        # A sampler appends to its caller's stage: (1,), (1, 0) and (1, 0, 0) must be three streams.
        stages = [_stages.CERTIFY_STAGE, (*_stages.CERTIFY_STAGE, _stages.SELECTION),
                  (*_stages.CERTIFY_STAGE, _stages.SELECTION, 0)]
        keys = [stage_key(7, stage) for stage in stages]
        assert len(set(keys)) == len(keys)


@pytest.fixture
def recorded_stages(monkeypatch):
    """The engine stages sampled: ``search`` (outside any sampler call) and, per sampler call, its prefix and stages."""
    records = {"search": [], "sampler calls": []}
    certify, class_counts = BaseSampler.certify, MonteCarloEngine.class_counts
    open_calls = []

    def recording_certify(sampler, engine, X, sigma, alpha, stage=_stages.CERTIFY_STAGE):
        open_calls.append((tuple(stage), []))
        try:
            return certify(sampler, engine, X, sigma, alpha, stage)
        finally:
            records["sampler calls"].append(open_calls.pop())

    def recording_class_counts(engine, X, sigma, n_samples, stage):
        (open_calls[-1][1] if open_calls else records["search"]).append(tuple(stage))
        return class_counts(engine, X, sigma, n_samples, stage)

    monkeypatch.setattr(BaseSampler, "certify", recording_certify)
    monkeypatch.setattr(MonteCarloEngine, "class_counts", recording_class_counts)
    return records


SAMPLERS = {"fixed": FixedSampler(n=200, n0=20), "input-specific": InputSpecificSampler(n_max=400, n0_fraction=0.1),
            "sequential": SequentialSampler(n_max=400, first=50, n0=10)}
ALLOCATORS = {"none": NoRegions(), "online": OnlineBallAllocator(), "lp": TransductiveLPAllocator(),
              "memory": MemoryAllocator()}


@pytest.mark.parametrize(("sampler", "allocator"), itertools.product(SAMPLERS, ALLOCATORS))
def test_certify_bounds_with_samples_no_other_step_drew(make_linear_classifier, recorded_stages, sampler,
                                                        allocator):
    clf = make_linear_classifier((1.0, -1.0), sigma_search=GridSigmaSearch(0.12, 0.5, step=0.19, n=20),
                                 sampler=SAMPLERS[sampler], allocator=ALLOCATORS[allocator])
    X = np.random.default_rng(0).normal(scale=0.6, size=(12, 2)).astype(np.float32)
    # A stateful allocator certifies later calls against earlier regions: its second call draws fresh samples too.
    for _ in range(1 if allocator == "none" else 2):
        clf.certify(X)
    search = set(recorded_stages["search"])
    assert search and all(stage[0] == _stages.SEARCH_STAGE for stage in search)
    calls = recorded_stages["sampler calls"]
    prefixes = [prefix for prefix, _ in calls]
    assert calls and len(set(prefixes)) == len(prefixes)  # every certification pass on fresh samples
    assert all(prefix[0] in (_stages.FIRST_PASS, _stages.SECOND_PASS) for prefix in prefixes)
    selection, estimation = set(), set()
    for prefix, stages in calls:
        assert stages[0] == (*prefix, _stages.SELECTION)  # one selection draw, first
        assert all(stage[:len(prefix) + 1] == (*prefix, _stages.ESTIMATION) for stage in stages[1:])
        selection.add(stages[0])
        estimation.update(stages[1:])
    assert not (selection & estimation) and not (search & (selection | estimation))
