"""The stage plan: where a fit call resumes the stages a schedule declares."""

import pytest

from smoothsk.training import GaussianNoise, Stage
from smoothsk.training._stage import completed_epochs, current_plan, resume

PLAN = [Stage("first", 3, GaussianNoise()), Stage("second", 2, GaussianNoise(), lr=0.01)]


def rows(*stages):
    """History rows of epochs of the given stages."""
    return [{"epoch": epoch, "training_stage": stage} for epoch, stage in enumerate(stages, start=1)]


def steps(plan, history):
    return [(stage.name, done, epochs) for stage, done, epochs in resume(plan, history)]


@pytest.mark.parametrize("history, expected", [
    ((), [("first", 0, 3), ("second", 0, 2)]),
    (rows("first", "first"), [("first", 2, 1), ("second", 0, 2)]),
    (rows("first", "first", "first"), [("second", 0, 2)]),
    (rows("first", "second"), [("second", 1, 1)]),  # a stage begun ends the ones before it
    (rows("first", "first", "first", "second", "second"), [("second", 2, 2)]),  # finished: the last again
], ids=["fresh", "in first", "first done", "in second", "finished"])
def test_resume_continues_the_last_stage_begun(history, expected):
    assert steps(PLAN, history) == expected


def test_stage_without_epochs_is_skipped_unless_last():
    plan = [Stage("first", 0, GaussianNoise()), Stage("second", 0, GaussianNoise())]
    assert steps(plan, ()) == [("second", 0, 0)]


def test_stage_of_max_epochs_never_finishes():
    plan = [Stage("only", None, GaussianNoise())]
    assert steps(plan, rows("only", "only")) == [("only", 2, None)]


def test_completed_epochs_counts_rows_of_the_named_stages():
    history = rows("a", "b", "a", "c") + [{"epoch": 5}]
    assert completed_epochs(history, "a") == 2
    assert completed_epochs(history, "a", "c") == 3
    assert completed_epochs(history, "d") == 0


def test_current_plan_is_the_last_rows_plan():
    # A plan started over at the third epoch: its rows are the current plan; a history without the
    # column (written before it existed) is one plan.
    history = rows("first", "second", "first", "first")
    for row, start in zip(history, (0, 0, 2, 2), strict=True):
        row["plan_start"] = start
    assert current_plan(history) == history[2:]
    assert steps(PLAN, current_plan(history)) == [("first", 2, 1), ("second", 0, 2)]
    assert current_plan(rows("first", "second")) == rows("first", "second")
    assert current_plan(()) == []
