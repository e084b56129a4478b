"""Refactors keep every certificate: reference values recorded by ``tests/reference/cases.py``, compared bit for bit.

Certificates depend only on integer counts of noisy samples, the seeds and
the formulas that turn counts into bounds, so a change that moves code
without changing a stage, a seed or a formula leaves every value equal on
the same CPU kernel family (values are recorded per family, see
``tests/reference/cases.py``).
"""

import json

import pytest

from tests.reference import cases

RECORDED = json.loads(cases.PATH.read_text())  # CPU kernel family -> case -> values
RECORDED_CASES = sorted(set().union(*RECORDED.values()))  # a case dropped from a family stays in the others


@pytest.fixture(scope="module")
def computed():
    return cases.compute()


@pytest.fixture(scope="module")
def recorded():
    if cases.platform() not in RECORDED:
        pytest.skip(f"no reference values recorded on a {cases.platform()} CPU (recorded: "
                    f"{', '.join(sorted(RECORDED))}); python -m tests.reference.cases records them")
    return RECORDED[cases.platform()]


def test_reference_cases_are_the_recorded_ones(computed):
    assert sorted(computed) == RECORDED_CASES


@pytest.mark.parametrize("case", RECORDED_CASES)
def test_outputs_equal_the_recorded_ones(case, computed, recorded):
    if case not in recorded:
        pytest.skip(f"{case} is not recorded on a {cases.platform()} CPU (new, or changed since); "
                    "python -m tests.reference.cases records it")
    assert computed[case] == recorded[case], f"{case} changed; regenerate only for an intended change"


def test_rerecording_drops_what_changed_from_the_other_families():
    recorded = {"A": {"same": 1, "moved": 2, "gone": 3}, "B": {"same": 1, "moved": 5, "gone": 6}}
    assert cases.rerecorded(recorded, "A", {"same": 1, "moved": 4, "new": 7}) == {
        "A": {"same": 1, "moved": 4, "new": 7}, "B": {"same": 1}}
    assert cases.rerecorded(recorded, "C", {"same": 0}) == {**recorded, "C": {"same": 0}}  # a new family: no change
