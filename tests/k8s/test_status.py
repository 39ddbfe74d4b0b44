"""The status rules of k8s/status.py as data: an observation in, the status and Events out.

Pure: no API server, no clock (the time stamp is an argument). Each table row is one
scenario and what a user reading `kubectl get` / `kubectl describe` must see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.budget import BudgetState
from maka_eval.engine.expand import Cell
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage
from maka_eval.k8s import names
from maka_eval.k8s.egress import SIDECAR_CONTAINER
from maka_eval.k8s.events import EventReason, EventType
from maka_eval.k8s.observe import FinishedAttempt, Observation, SeenCell, endings, observe
from maka_eval.k8s.resources import CellPhase, ExperimentPhase
from maka_eval.k8s.results import EndCause
from maka_eval.k8s.status import (
    EventWish,
    attempt_finished,
    attempt_launched,
    attempt_started,
    cell_status,
    cell_writes,
    experiment_progress,
    experiment_status,
    invalid_spec,
    prerequisites_missing,
)
from maka_eval.k8s.store import ExperimentView

NOW = "2026-12-02T12:00:00Z"
LATER = "2026-12-02T13:00:00Z"

C = AttemptStatus.COMPLETED
S = AttemptStatus.SUBJECT_FAILED
I = AttemptStatus.INFRA_FAILED  # noqa: E741 (a status letter, as in the tables below)
X = AttemptStatus.CANCELLED


def kernel(
    status: AttemptStatus,
    score: float | None = None,
    *,
    reason: str | None = None,
    tokens: int | None = None,
    cost: float | None = None,
) -> ResultKernel:
    return ResultKernel(
        status=status,
        score=score,
        usage=Usage(input_tokens=tokens) if tokens is not None else None,
        cost_usd=cost,
        duration_sec=2.0,
        artifacts=(),
        status_source=StatusSource.FRAME,
        reason=reason,
    )


def attempt(
    number: int,
    status: AttemptStatus,
    score: float | None = None,
    *,
    reason: str | None = None,
    request: str | None = None,
    tokens: int | None = None,
    cost: float | None = None,
) -> FinishedAttempt:
    trigger = Trigger.MANUAL if request else Trigger.SCHEDULED if number == 1 else Trigger.RETRY
    return FinishedAttempt(
        f"a{number}",
        number,
        status,
        trigger,
        request,
        kernel(status, score, reason=reason, tokens=tokens, cost=cost),
    )


def seen(
    cell_id: str = "t::0::s", status: Mapping[str, Any] | None = None, name: str = "cell-x"
) -> SeenCell:
    return SeenCell(name, cell_id, 1, status or {}, None)


def kstatus_of(status: Mapping[str, Any]) -> tuple[str, str, str]:
    """(the kstatus condition that is True, its reason, its message)."""
    true = [
        c
        for c in status["conditions"]
        if c["type"] in ("Ready", "Reconciling", "Stalled") and c["status"] == "True"
    ]
    assert len(true) == 1, status["conditions"]
    return true[0]["type"], true[0]["reason"], true[0]["message"]


def condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


# -- cells ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CellRow:
    attempts: Sequence[FinishedAttempt]
    phase: CellPhase
    kstatus: tuple[str, str]
    says: str
    """A part of the kstatus message."""
    event: EventReason | None
    selected: int | None = None
    result: str | None = None
    score: float | None = None
    retries: int = 2
    held: bool = False
    current: Mapping[str, Any] = field(default_factory=dict)
    tokens: tuple[str, ...] = ()


CELL_ROWS = {
    "completed at once": CellRow(
        [attempt(1, C, 1.0)],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "attempt 1 is the cell's result: completed, score 1",
        EventReason.RESULT_SELECTED,
        selected=1,
        result="completed",
        score=1.0,
    ),
    "the subject failed: a result too": CellRow(
        [attempt(1, S, 0.0)],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "attempt 1 is the cell's result: subject_failed, score 0",
        EventReason.RESULT_SELECTED,
        selected=1,
        result="subject_failed",
        score=0.0,
    ),
    "an infrastructure failure with retries left": CellRow(
        [attempt(1, I, reason="node lost")],
        CellPhase.PENDING,
        ("Reconciling", "Retrying"),
        "attempt 1 ended infra_failed (node lost); a new attempt runs or will start "
        "(at most 2 retries)",
        None,
    ),
    "infrastructure failures beyond the retries": CellRow(
        [attempt(1, I), attempt(2, I), attempt(3, I)],
        CellPhase.FAILED,
        ("Stalled", "RetriesExhausted"),
        "no result after 3 attempt(s), the infrastructure retries (2) are used up",
        EventReason.RETRIES_EXHAUSTED,
    ),
    "no retries at all: one failure exhausts": CellRow(
        [attempt(1, I)],
        CellPhase.FAILED,
        ("Stalled", "RetriesExhausted"),
        f"kubectl annotate cell cell-x {names.RERUN_ANNOTATION}=<token>",
        EventReason.RETRIES_EXHAUSTED,
        retries=0,
    ),
    "one failure, one retry allowed: still pending": CellRow(
        [attempt(1, I)],
        CellPhase.PENDING,
        ("Reconciling", "Retrying"),
        "attempt 1 ended infra_failed; a new attempt runs or will start (at most 1 retries)",
        None,
        retries=1,
    ),
    "cancelled attempts do not use retries": CellRow(
        [attempt(1, X), attempt(2, X), attempt(3, X)],
        CellPhase.PENDING,
        ("Reconciling", "Retrying"),
        "attempt 3 ended cancelled",
        None,
        retries=0,
    ),
    "held by the budget": CellRow(
        [attempt(1, I)],
        CellPhase.PENDING,
        ("Stalled", "BudgetExhausted"),
        "the experiment's budget is reached, so no new attempt starts",
        None,
        held=True,
    ),
    "exhausted wins over the budget hold": CellRow(
        [attempt(1, I)],
        CellPhase.FAILED,
        ("Stalled", "RetriesExhausted"),
        "are used up",
        EventReason.RETRIES_EXHAUSTED,
        retries=0,
        held=True,
    ),
    "a result wins over the budget hold": CellRow(
        [attempt(1, C, 0.5)],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "score 0.5",
        EventReason.RESULT_SELECTED,
        selected=1,
        result="completed",
        score=0.5,
        held=True,
    ),
    "a retry that completed": CellRow(
        [attempt(1, I), attempt(2, C, 1.0)],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "attempt 2 is the cell's result",
        EventReason.RESULT_SELECTED,
        selected=2,
        result="completed",
        score=1.0,
    ),
    "a rerun after exhaustion completes": CellRow(
        [attempt(1, I), attempt(2, C, 1.0, request="fixed")],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "attempt 2 is the cell's result",
        EventReason.RESULT_SELECTED,
        selected=2,
        result="completed",
        score=1.0,
        retries=0,
        current={"phase": "Failed"},
        tokens=("fixed",),
    ),
    "the earliest result is selected": CellRow(
        [attempt(1, S, 0.0), attempt(2, C, 1.0, request="again")],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "attempt 1 is the cell's result: subject_failed",
        EventReason.RESULT_SELECTED,
        selected=1,
        result="subject_failed",
        score=0.0,
        tokens=("again",),
    ),
    "a selection once made is kept": CellRow(
        [attempt(1, C, 0.0), attempt(2, C, 1.0, request="again")],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "attempt 2 is the cell's result",
        None,  # the phase was Done already
        selected=2,
        result="completed",
        score=1.0,
        current={"phase": "Done", "selectedAttempt": 2},
        tokens=("again",),
    ),
    "a selection of an attempt not observed falls back": CellRow(
        [attempt(1, C, 0.5)],
        CellPhase.DONE,
        ("Ready", "ResultSelected"),
        "attempt 1 is the cell's result",
        None,
        selected=1,
        result="completed",
        score=0.5,
        current={"phase": "Done", "selectedAttempt": 7},
    ),
    "rerun tokens sorted and once each": CellRow(
        [attempt(1, I), attempt(2, I, request="b"), attempt(3, I, request="a")],
        CellPhase.PENDING,
        ("Reconciling", "Retrying"),
        "attempt 3 ended infra_failed",
        None,
        retries=5,
        tokens=("a", "b"),
    ),
}


@pytest.mark.parametrize("row", CELL_ROWS.values(), ids=CELL_ROWS.keys())
def test_cell_status(row: CellRow) -> None:
    write = cell_status(seen(status=row.current), row.attempts, row.retries, held=row.held, now=NOW)
    assert write is not None
    status = write.status
    assert status["phase"] == row.phase.value
    assert status["attempts"] == len(row.attempts)
    assert status["rerunTokens"] == list(row.tokens)
    assert status.get("selectedAttempt") == row.selected
    assert status.get("status") == row.result
    assert status.get("score") == row.score
    assert status["observedGeneration"] == 1
    true, reason, message = kstatus_of(status)
    assert (true, reason) == row.kstatus
    assert row.says in message
    assert [e.reason for e in write.events] == ([row.event] if row.event else [])
    for event in write.events:
        assert event.message == message
        expected = EventType.WARNING if row.phase is CellPhase.FAILED else EventType.NORMAL
        assert event.type is expected


def test_a_cell_that_already_says_it_is_not_written_again() -> None:
    attempts = [attempt(1, I), attempt(2, C, 1.0)]
    first = cell_status(seen(), attempts, 2, held=False, now=NOW)
    assert first is not None
    # The next pass, an hour later, observes the status it wrote: nothing to write,
    # and the time stamp of a condition that did not change never forces a write.
    assert cell_status(seen(status=first.status), attempts, 2, held=False, now=LATER) is None


def test_a_cell_condition_keeps_its_transition_time_until_it_flips() -> None:
    one = [attempt(1, I)]
    retrying = cell_status(seen(), one, 2, held=False, now=NOW)
    assert retrying is not None
    held = cell_status(seen(status=retrying.status), one, 2, held=True, now=LATER)
    assert held is not None and held.events == ()  # same phase: no Event
    assert condition(held.status, "Stalled")["lastTransitionTime"] == LATER
    assert condition(held.status, "Ready")["lastTransitionTime"] == NOW


def observation(
    finished: Mapping[str, Sequence[FinishedAttempt]] | None = None,
    *,
    running: Sequence[str] = (),
    cells: Sequence[SeenCell] = (),
    attempts: int | None = None,
) -> Observation:
    finished = dict(finished or {})
    count = sum(len(a) for a in finished.values()) + len(running)
    return Observation(
        finished,
        frozenset(running),
        count if attempts is None else attempts,
        tuple(cells),
        frozenset(),
    )


def test_cell_writes_skip_cells_without_an_ended_attempt_and_hold_only_idle_cells() -> None:
    cells = [seen("a", name="cell-a"), seen("b", name="cell-b"), seen("c", name="cell-c")]
    obs = observation({"a": [attempt(1, I)], "b": [attempt(1, I)]}, running=["b", "c"], cells=cells)
    writes = cell_writes(obs, 2, budget_held=True, now=NOW)
    assert [w.name for w in writes] == ["cell-a", "cell-b"]  # cell-c: nothing ended yet
    assert kstatus_of(writes[0].write.status)[1] == "BudgetExhausted"
    assert kstatus_of(writes[1].write.status)[1] == "Retrying"  # its retry runs
    assert cell_writes(observation(), 2, budget_held=False, now=NOW) == []


# -- the experiment --------------------------------------------------------------------


def cells(*specs: str) -> list[Cell]:
    """Cells named '<task>:<subject>' (repetition 0)."""
    out = []
    for spec in specs:
        task, subject = spec.split(":")
        out.append(Cell(f"{task}::0::{subject}", task, 0, subject))
    return out


NO_LIMIT = BudgetState(None, None)
SPENT = BudgetState(1.0, None, 1.25, 0)


@dataclass(frozen=True)
class ExperimentRow:
    cells: Sequence[Cell]
    finished: Mapping[str, Sequence[FinishedAttempt]]
    idle: bool
    phase: ExperimentPhase
    kstatus: tuple[str, str]
    says: str
    counts: tuple[int, int, int]
    """cellsTotal, cellsDone, cellsFailed."""
    events: Sequence[EventReason]
    """The Events of the first write (from an empty status)."""
    running: Sequence[str] = ()
    held: bool = False
    budget: BudgetState = NO_LIMIT
    retries: int = 2
    conditions: Mapping[str, bool] = field(default_factory=dict)
    """Other conditions that must have this truth."""


TWO = cells("t1:a", "t1:b")
EXPERIMENT_ROWS = {
    "no cells at all": ExperimentRow(
        [],
        {},
        True,
        ExperimentPhase.COMPLETE,
        ("Ready", "Complete"),
        "0 of 0 cells have a result",
        (0, 0, 0),
        [EventReason.COMPLETED],
        conditions={"Complete": True, "Running": False, "Failed": False},
    ),
    "just started: nothing ended": ExperimentRow(
        TWO,
        {},
        False,
        ExperimentPhase.RUNNING,
        ("Reconciling", "Running"),
        "0 of 2 cells have a result, 2 attempt(s) running",
        (2, 0, 0),
        [EventReason.STARTED],
        running=["t1::0::a", "t1::0::b"],
        conditions={"Running": True, "Complete": False},
    ),
    "partial results": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, C, 1.0)]},
        False,
        ExperimentPhase.RUNNING,
        ("Reconciling", "Running"),
        "1 of 2 cells have a result, 1 attempt(s) running",
        (2, 1, 0),
        [EventReason.STARTED],
        running=["t1::0::b"],
    ),
    "all settled": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, C, 1.0)], "t1::0::b": [attempt(1, I), attempt(2, S, 0.0)]},
        True,
        ExperimentPhase.COMPLETE,
        ("Ready", "Complete"),
        "2 of 2 cells have a result",
        (2, 2, 0),
        [EventReason.COMPLETED],
        conditions={"Complete": True, "Failed": False, "BudgetExhausted": False},
    ),
    "settled with a failed cell": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, C, 1.0)], "t1::0::b": [attempt(1, I), attempt(2, I)]},
        True,
        ExperimentPhase.COMPLETE,
        ("Stalled", "CellsFailed"),
        f"1 of 2 cells have a result; 1 used up their infrastructure retries without a "
        f"result (rerun one with the {names.RERUN_ANNOTATION} annotation)",
        (2, 1, 1),
        [EventReason.COMPLETED_WITH_FAILURES],
        retries=1,
        conditions={"Complete": True, "Failed": True},
    ),
    "infra retries under way": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, I)], "t1::0::b": [attempt(1, I)]},
        False,
        ExperimentPhase.RUNNING,
        ("Reconciling", "Running"),
        "0 of 2 cells have a result, 2 attempt(s) running",
        (2, 0, 0),
        [EventReason.STARTED],
        running=["t1::0::a", "t1::0::b"],
        conditions={"Failed": False},
    ),
    "a failed cell while others run is not yet Failed": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, I)]},
        False,
        ExperimentPhase.RUNNING,
        ("Reconciling", "Running"),
        "0 of 2 cells have a result, 1 attempt(s) running",
        (2, 0, 1),
        [EventReason.STARTED],
        running=["t1::0::b"],
        retries=0,
        conditions={"Failed": False},
    ),
    "budget exhausted and idle": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, C, 1.0, cost=1.25)]},
        True,
        ExperimentPhase.BUDGET_EXHAUSTED,
        ("Stalled", "BudgetExhausted"),
        "the budget is reached ($1.2500 of $1, 0 tokens (no token limit)): 1 of 2 cells "
        "have a result, the others do not start",
        (2, 1, 0),
        [EventReason.BUDGET_EXHAUSTED, EventReason.STOPPED_BY_BUDGET],
        held=True,
        budget=SPENT,
        conditions={"BudgetExhausted": True, "Complete": False},
    ),
    "budget reached while the last groups run": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, C, 1.0, cost=1.25)]},
        False,
        ExperimentPhase.RUNNING,
        ("Reconciling", "Running"),
        "; the budget is reached ($1.2500 of $1, 0 tokens (no token limit)): no new task "
        "group starts",
        (2, 1, 0),
        [EventReason.BUDGET_EXHAUSTED, EventReason.STARTED],
        running=["t1::0::b"],
        budget=SPENT,
    ),
    "budget holds a group while another runs": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, I, cost=1.25)]},
        False,
        ExperimentPhase.RUNNING,
        ("Reconciling", "Running"),
        "0 of 2 cells have a result, 1 attempt(s) running",
        (2, 0, 0),
        [EventReason.BUDGET_EXHAUSTED, EventReason.STARTED],
        running=["t1::0::b"],
        held=True,
        budget=SPENT,
        conditions={"Running": True, "Complete": False, "BudgetExhausted": True},
    ),
    "budget reached but nothing held: complete": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, C, 1.0, cost=1.0)], "t1::0::b": [attempt(1, C, 0.0)]},
        True,
        ExperimentPhase.COMPLETE,
        ("Ready", "Complete"),
        "2 of 2 cells have a result",
        (2, 2, 0),
        [EventReason.BUDGET_EXHAUSTED, EventReason.COMPLETED],
        budget=BudgetState(1.0, None, 1.0, 0),
        conditions={"BudgetExhausted": True, "Complete": True},
    ),
    "only cancelled attempts, idle": ExperimentRow(
        TWO,
        {"t1::0::a": [attempt(1, X)], "t1::0::b": [attempt(1, X)]},
        True,
        ExperimentPhase.COMPLETE,
        ("Ready", "Complete"),
        "0 of 2 cells have a result",
        (2, 0, 0),
        [EventReason.COMPLETED],
    ),
}


@pytest.mark.parametrize("row", EXPERIMENT_ROWS.values(), ids=EXPERIMENT_ROWS.keys())
def test_experiment_status(row: ExperimentRow) -> None:
    obs = observation(row.finished, running=row.running)
    subjects = sorted({c.subject_id for c in row.cells})
    state = experiment_progress(
        row.cells, subjects, obs, row.retries, row.budget, idle=row.idle, held=row.held
    )
    assert state.phase is row.phase
    write = experiment_status({}, 3, state, NOW)
    assert write is not None
    status = write.status
    assert status["phase"] == row.phase.value
    assert status["observedGeneration"] == 3
    assert (status["cellsTotal"], status["cellsDone"], status["cellsFailed"]) == row.counts
    assert status["cellsRunning"] == status["attemptsRunning"] == len(row.running)
    true, reason, message = kstatus_of(status)
    assert (true, reason) == row.kstatus
    assert row.says in message
    for type_, truth in row.conditions.items():
        assert condition(status, type_)["status"] == ("True" if truth else "False"), type_
    assert all(c["lastTransitionTime"] == NOW for c in status["conditions"])
    assert [e.reason for e in write.events] == list(row.events)
    # The metrics' count by phase adds up to every cell.
    assert sum(state.cells_by_phase.values()) == len(row.cells)
    assert state.cells_by_phase[CellPhase.DONE] == row.counts[1]
    # Observed again with nothing new: no second write, and no Event twice.
    assert experiment_status(status, 3, state, LATER) is None


def test_per_subject_scores_spending_and_tokens() -> None:
    grid = cells("t1:a", "t2:a", "t3:a", "t1:b")
    obs = observation(
        {
            # a: two results (1 and 0) and a cell with only an infra failure; the
            # failed attempt's spending counts too, but never its score.
            "t1::0::a": [attempt(1, I, cost=0.1, tokens=100), attempt(2, C, 1.0, cost=0.2)],
            "t2::0::a": [attempt(1, S, 0.0, tokens=50)],
            "t3::0::a": [attempt(1, I, tokens=10)],
            # b: only a cancelled attempt, so no score; its cost counts.
            "t1::0::b": [attempt(1, X, cost=0.05)],
        }
    )
    state = experiment_progress(
        grid, ["a", "b", "c"], obs, 2, BudgetState(None, None, 0.3, 160), idle=False, held=False
    )
    subjects = state.counters["subjects"]
    assert subjects == [
        {"subjectId": "a", "n": 2, "meanScore": 0.5, "costUsd": 0.3, "tokens": 160},
        {"subjectId": "b", "n": 0, "costUsd": 0.05, "tokens": 0},
        {"subjectId": "c", "n": 0, "tokens": 0},  # declared, no cell: still listed
    ]
    assert state.counters["budget"] == {"costUsd": 0.3, "tokens": 160, "held": False}
    assert state.counters["attempts"] == 5
    assert state.cells_by_phase == {
        CellPhase.DONE: 2,
        CellPhase.PENDING: 2,
        CellPhase.RUNNING: 0,
        CellPhase.FAILED: 0,
    }


def test_experiment_events_follow_transitions_not_passes() -> None:
    grid = cells("t1:a")
    running = experiment_progress(
        grid, ["a"], observation(running=["t1::0::a"]), 2, NO_LIMIT, idle=False, held=False
    )
    first = experiment_status({}, 1, running, NOW)
    assert first is not None and [e.reason for e in first.events] == [EventReason.STARTED]
    # A count changes, the phase does not: a write without an Event.
    more = experiment_progress(
        grid,
        ["a"],
        observation({"t1::0::a": [attempt(1, I)]}, running=["t1::0::a"]),
        2,
        NO_LIMIT,
        idle=False,
        held=False,
    )
    second = experiment_status(first.status, 1, more, LATER)
    assert second is not None and second.events == ()
    assert second.status["attempts"] == 2
    assert condition(second.status, "Running")["lastTransitionTime"] == NOW
    # A new generation is a write even when nothing else changed.
    assert experiment_status(second.status, 2, more, LATER) is not None


def test_an_invalid_spec() -> None:
    state = invalid_spec("spec.tasks: add at least one task")
    write = experiment_status({}, 1, state, NOW)
    assert write is not None
    assert write.status["phase"] == "Failed"
    assert kstatus_of(write.status) == (
        "Stalled",
        "InvalidSpec",
        "spec.tasks: add at least one task",
    )
    assert condition(write.status, "Validated")["status"] == "False"
    assert "cellsTotal" not in write.status and state.cells_by_phase == {}
    assert write.events == (
        EventWish(EventType.WARNING, EventReason.INVALID_SPEC, "spec.tasks: add at least one task"),
    )
    assert experiment_status(write.status, 1, state, LATER) is None


def test_missing_prerequisites_then_found() -> None:
    waiting = prerequisites_missing("Secret 'key' does not exist", 15.0)
    write = experiment_status({}, 1, waiting, NOW)
    assert write is not None
    assert write.status["phase"] == "Pending"
    assert kstatus_of(write.status) == (
        "Reconciling",
        "PrerequisitesMissing",
        "Secret 'key' does not exist (looked for again every 15s)",
    )
    assert [e.reason for e in write.events] == [EventReason.PREREQUISITES_MISSING]
    # The Secret appears: the experiment starts, PrerequisitesMet flips (no Event for it).
    started = experiment_progress(
        cells("t1:a"), ["a"], observation(running=["t1::0::a"]), 2, NO_LIMIT, idle=False, held=False
    )
    after = experiment_status(write.status, 1, started, LATER)
    assert after is not None
    assert [e.reason for e in after.events] == [EventReason.STARTED]
    met = condition(after.status, "PrerequisitesMet")
    assert met["status"] == "True" and met["lastTransitionTime"] == LATER
    assert condition(after.status, "Validated")["lastTransitionTime"] == NOW


# -- attempts --------------------------------------------------------------------------


def attempt_object(status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "att-1", "namespace": "ns", "generation": 1},
        "spec": {"cellId": "t1::0::a", "number": 1, "trigger": "scheduled"},
        "status": dict(status or {}),
    }


def test_an_attempt_launched_then_finished() -> None:
    launched = attempt_launched(attempt_object(), NOW)
    assert launched.status["phase"] == "Running" and launched.status["podName"] == "att-1"
    assert kstatus_of(launched.status) == (
        "Reconciling",
        "Running",
        "Pod att-1 created for cell t1::0::a (attempt 1, scheduled); waiting for it to end",
    )
    assert [e.reason for e in launched.events] == [EventReason.STARTED]

    started = datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC)
    ended = datetime(2026, 12, 2, 12, 0, 7, tzinfo=UTC)
    done = attempt_finished(attempt_object(launched.status), kernel(C, 1.0), started, ended, LATER)
    assert done.status["phase"] == "Finished"
    assert done.status["startedAt"] == "2026-12-02T12:00:05Z"
    assert done.status["finishedAt"] == "2026-12-02T12:00:07Z"
    assert done.status["result"]["status"] == "completed" and done.status["result"]["score"] == 1.0
    assert None not in done.status["result"].values()
    assert kstatus_of(done.status) == ("Ready", "Completed", "completed, score 1, in 2.0s")
    assert condition(done.status, "Ready")["lastTransitionTime"] == LATER
    assert done.events == (
        EventWish(EventType.NORMAL, EventReason.COMPLETED, "completed, score 1, in 2.0s"),
    )


ATTEMPT_END_ROWS = [
    (kernel(S, 0.0), "Ready", "SubjectFailed", EventType.NORMAL, "subject_failed, score 0"),
    (kernel(X, reason="stopped"), "Stalled", "Cancelled", EventType.WARNING, "cancelled"),
    (
        kernel(I, reason="Evicted"),
        "Stalled",
        "InfraFailed",
        EventType.WARNING,
        "infra_failed, in 2.0s: Evicted (no result: the cell gets a new attempt while its "
        "retries last)",
    ),
]


@pytest.mark.parametrize(("kern", "true", "reason", "event_type", "says"), ATTEMPT_END_ROWS)
def test_an_attempt_end(
    kern: ResultKernel, true: str, reason: str, event_type: EventType, says: str
) -> None:
    done = attempt_finished(attempt_object(), kern, None, datetime(2026, 12, 2, tzinfo=UTC), NOW)
    assert "startedAt" not in done.status
    got_true, got_reason, message = kstatus_of(done.status)
    assert (got_true, got_reason) == (true, reason) and says in message
    assert [(e.type, e.reason.value) for e in done.events] == [(event_type, reason)]


def test_the_event_of_a_new_attempt() -> None:
    assert attempt_started(1, Trigger.SCHEDULED, None, ()) is None
    retry = attempt_started(2, Trigger.RETRY, None, [attempt(1, I, reason="OOMKilled")])
    assert retry == EventWish(
        EventType.WARNING,
        EventReason.RETRIED,
        "attempt 2 started; attempt 1 ended infra_failed: OOMKilled",
    )
    blind = attempt_started(3, Trigger.RETRY, None, ())
    assert blind is not None and blind.message.endswith("the last attempt ended without a result")
    rerun = attempt_started(4, Trigger.MANUAL, "fix-1", [attempt(1, I)])
    assert rerun == EventWish(
        EventType.NORMAL, EventReason.RERUN, "attempt 4 started for the rerun request 'fix-1'"
    )


# -- observing -------------------------------------------------------------------------


def test_observe_reads_attempts_cells_and_rerun_requests() -> None:
    def obj(name: str, cell: str, number: int, result: Any = None, **spec: Any) -> Any:
        status = {"result": result} if result is not None else {}
        return {
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"cellId": cell, "number": number, "trigger": "scheduled", **spec},
            "status": status,
        }

    view = ExperimentView()
    view.attempts.update(
        {
            "x2": obj("x2", "x", 2, {"ok": 1}, trigger="retry"),
            "x1": obj("x1", "x", 1, {"ok": 1}),
            "y1": obj("y1", "y", 1),  # running
            "z1": obj("z1", "z", 1, {"unreadable": 1}),  # neither finished nor running
            "w1": obj("w1", "w", 1, request="tok"),
        }
    )
    view.cells.update(
        {
            "cell-x": {
                "metadata": {
                    "name": "cell-x",
                    "generation": 4,
                    "annotations": {names.RERUN_ANNOTATION: "r" * 300},
                },
                "spec": {"cellId": "x"},
                "status": {"phase": "Done"},
            },
            "cell-y": {"metadata": {"name": "cell-y"}, "spec": {"cellId": "y"}},
        }
    )
    kernels = {"x1": kernel(I), "x2": kernel(C, 1.0)}
    seen_ = observe(view, lambda a: kernels.get(a["metadata"]["name"]))
    assert [a.number for a in seen_.finished["x"]] == [1, 2]  # sorted by number
    assert seen_.finished["x"][1].trigger is Trigger.RETRY
    assert set(seen_.finished) == {"x"}
    assert seen_.running == {"y", "w"}
    assert seen_.attempts == 5
    assert seen_.answered == {"tok"}
    assert seen_.cells == (
        SeenCell("cell-x", "x", 4, {"phase": "Done"}, "r" * 256),
        SeenCell("cell-y", "y", 1, {}, None),
    )


def pod_status(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "att-1", "creationTimestamp": "2026-12-02T12:00:00Z"},
        "status": status,
    }


PULLING = pod_status(
    phase="Pending",
    containerStatuses=[{"name": "subject", "state": {"waiting": {"reason": "ErrImagePull"}}}],
)
SIDECAR_STUCK = pod_status(
    phase="Pending",
    startTime="2026-12-02T12:00:00Z",
    initContainerStatuses=[
        {"name": SIDECAR_CONTAINER, "restartCount": 1, "state": {"waiting": {}}}
    ],
)
EXITED = pod_status(
    phase="Failed",
    startTime="2026-12-02T12:00:00Z",
    containerStatuses=[
        {"name": "subject", "state": {"terminated": {"exitCode": 139, "reason": "Error"}}}
    ],
)
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

# (pod or None, was the launch recorded, seconds since T0) -> (cause, delete, wake)
ENDING_ROWS = {
    "a running Pod": (pod_status(phase="Running"), True, 10, None, None, None),
    "never created: resumed, not ended": (None, False, 10, None, None, None),
    "created and gone": (None, True, 10, EndCause.POD_GONE, False, None),
    "ended without a kernel": (EXITED, True, 10, EndCause.NO_RESULT, False, None),
    "image not pulled yet": (PULLING, True, 20, None, None, 40.0),
    "image not pulled by the deadline": (PULLING, True, 60, EndCause.IMAGE_PULL, True, None),
    "sidecar still starting": (SIDECAR_STUCK, True, 100, None, None, 80.0),
    "sidecar never started": (SIDECAR_STUCK, True, 180, EndCause.INIT_CONTAINER, True, None),
}


@pytest.mark.parametrize(
    ("pod", "launch", "after", "cause", "delete", "wake"),
    ENDING_ROWS.values(),
    ids=ENDING_ROWS.keys(),
)
def test_endings(
    pod: dict[str, Any] | None,
    launch: bool,
    after: float,
    cause: EndCause | None,
    delete: bool | None,
    wake: float | None,
) -> None:
    view = ExperimentView()
    view.attempts["att-1"] = attempt_object({"podName": "att-1"} if launch else {})
    view.attempts["done"] = {**attempt_object({"result": {"status": "completed"}})}
    if pod is not None:
        view.pods["att-1"] = pod
    ended, due = endings(view, 60.0, T0 + timedelta(seconds=after))
    assert due == wake
    assert [(e.cause, e.delete_pod) for e in ended] == ([(cause, delete)] if cause else [])
    for end in ended:
        assert end.attempt is view.attempts["att-1"]  # an attempt with a result never ends
        assert end.kernel.status is AttemptStatus.INFRA_FAILED


def test_a_pod_past_both_deadlines_ends_its_attempt_twice_and_the_first_stands() -> None:
    """As before the split: the second result write is refused by the API server."""
    both = pod_status(
        **SIDECAR_STUCK["status"], containerStatuses=PULLING["status"]["containerStatuses"]
    )
    view = ExperimentView()
    view.attempts["att-1"] = attempt_object({"podName": "att-1"})
    view.pods["att-1"] = both
    ended, due = endings(view, 60.0, T0 + timedelta(seconds=200))
    assert [e.cause for e in ended] == [EndCause.IMAGE_PULL, EndCause.INIT_CONTAINER]
    assert due is None
