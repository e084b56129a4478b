"""The stages a training schedule declares, and where a later fit call resumes them.

Every epoch row of ``net.history`` names the stage it belongs to (column
``"training_stage"``); counting these rows is how ``partial_fit`` (or
``warm_start``) continues a schedule's plan. A run may also start the
plan over (Insta-RS on a training set of new samples), so every epoch row
also says where its plan began (column ``"plan_start"``: the position in
the history of the plan's first epoch), and a later call counts only the
rows of the last row's plan (:func:`current_plan`): an interrupted new plan
resumes its own epochs, not those of the plan before it.
"""

from collections.abc import Callable
from dataclasses import dataclass

#: History column naming the stage of each epoch.
STAGE_KEY = "training_stage"
#: History column giving the position of the first epoch of each epoch's plan.
PLAN_START_KEY = "plan_start"


@dataclass(frozen=True)
class Stage:
    """One stage of a training schedule.

    Attributes
    ----------
    name : str
        Written in the history's ``"training_stage"`` column of its epochs.
    epochs : int or None
        Epochs of the stage over all fit calls; None means the estimator's
        ``max_epochs`` at every call (skorch's own loop, nothing resumed).
    objective : BaseObjective
        Batch loss of the stage.
    lr : float or None, default=None
        Learning rate of the live optimizer from this stage on (all
        parameter groups); None keeps the optimizer's.
    before : callable or None, default=None
        ``before(net, X, y, fresh)``, run when a fit call enters the stage,
        before its first epoch there; ``fresh`` says whether the stage
        starts from its first epoch (no epoch of it in the history).
    """

    name: str
    epochs: int | None
    objective: object
    lr: float | None = None
    before: Callable | None = None


def completed_epochs(history, *names):
    """Epoch rows of ``history`` that belong to any of the stages ``names`` (int)."""
    return sum(1 for row in history if row.get(STAGE_KEY) in names)


def current_plan(history):
    """The epoch rows of ``history`` that belong to the plan of its last row.

    Rows from the last row's ``"plan_start"`` on; all of them where it has
    none (a history written before the column existed).

    Parameters
    ----------
    history : sequence of dict

    Returns
    -------
    list of dict
    """
    rows = list(history)
    return rows[rows[-1].get(PLAN_START_KEY, 0):] if rows else rows


def resume(plan, history):
    """The stages a fit call trains, given the epochs the history already has.

    The call continues the last stage of ``plan`` with epochs in the history
    (the first stage if none): the rest of it, then every later stage in
    full; earlier stages are not revisited. A stage with no epochs left is
    skipped, except the last, which then trains all its epochs once more
    (a finished run trains its last stage again).

    Parameters
    ----------
    plan : list of Stage
    history : sequence of dict
        Epoch rows (skorch's ``net.history``, or ``()`` to start the plan over).

    Returns
    -------
    steps : list of (Stage, int, int or None)
        Each stage to enter, the epochs of it already done, and the epochs
        to train now (None: the estimator's ``max_epochs``).
    """
    done = [completed_epochs(history, stage.name) for stage in plan]
    current = max((index for index, epochs in enumerate(done) if epochs), default=0)
    steps = []
    for index in range(current, len(plan)):
        stage, last = plan[index], index == len(plan) - 1
        if stage.epochs is None:
            steps.append((stage, done[index], None))
        elif done[index] < stage.epochs:
            steps.append((stage, done[index], stage.epochs - done[index]))
        elif last:
            steps.append((stage, done[index], stage.epochs))
    return steps
