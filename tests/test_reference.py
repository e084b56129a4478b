"""Refactors keep every certificate: reference values recorded by ``tests/reference/cases.py``, compared bit for bit.

Certificates depend only on integer counts of noisy samples, the seeds and
the formulas that turn counts into bounds, so a change that moves code
without changing a stage, a seed or a formula leaves every value equal.
"""

import json

import pytest

from tests.reference import cases


@pytest.fixture(scope="module")
def computed():
    return cases.compute()


@pytest.fixture(scope="module")
def recorded():
    return json.loads(cases.PATH.read_text())


def test_reference_cases_are_the_recorded_ones(computed, recorded):
    assert sorted(computed) == sorted(recorded)


@pytest.mark.parametrize("case", sorted(json.loads(cases.PATH.read_text())))
def test_outputs_equal_the_recorded_ones(case, computed, recorded):
    assert computed[case] == recorded[case], f"{case} changed; regenerate only for an intended change"
