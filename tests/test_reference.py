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


@pytest.fixture(scope="module")
def computed():
    return cases.compute()


@pytest.fixture(scope="module")
def recorded():
    if cases.platform() not in RECORDED:
        pytest.skip(f"no reference values recorded on a {cases.platform()} CPU (recorded: "
                    f"{', '.join(sorted(RECORDED))}); python -m tests.reference.cases records them")
    return RECORDED[cases.platform()]


def test_every_cpu_family_records_the_same_cases():
    assert len({tuple(sorted(values)) for values in RECORDED.values()}) == 1


def test_reference_cases_are_the_recorded_ones(computed, recorded):
    assert sorted(computed) == sorted(recorded)


@pytest.mark.parametrize("case", sorted(next(iter(RECORDED.values()))))
def test_outputs_equal_the_recorded_ones(case, computed, recorded):
    assert computed[case] == recorded[case], f"{case} changed; regenerate only for an intended change"
