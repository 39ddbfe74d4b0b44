"""The status the operator writes, worked out from what it observed (no I/O, no clock).

As Tekton's reconciler keeps its `status.go` apart from the writes: every function here
takes the observation (k8s/observe.py), the spec's settings and `now` (the time stamp of
a condition that changes), and returns the status to write and the Events that go with
it, or None where the object already says so. The controller (k8s/controller.py) reads
the cluster, calls these, and carries out what they return. The rules a cell's state
follows (selection, retries) are the engine's; this module says how they are shown:
phases, counts and kstatus conditions (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.budget import BudgetState
from maka_eval.engine.expand import Cell
from maka_eval.engine.selection import CellState, cell_state, select_result
from maka_eval.engine.status import AttemptStatus, Trigger
from maka_eval.k8s import names
from maka_eval.k8s.events import EventReason, EventType
from maka_eval.k8s.observe import FinishedAttempt, Observation, SeenCell
from maka_eval.k8s.resources import (
    CellPhase,
    ConditionWish,
    ExperimentPhase,
    KStatus,
    Reason,
    kstatus,
    merge_conditions,
)


@dataclass(frozen=True)
class EventWish:
    """An Event to record about the object just written."""

    type: EventType
    reason: EventReason
    message: str


@dataclass(frozen=True)
class StatusWrite:
    """A status to write, and the Events to record once the write is accepted."""

    status: dict[str, Any]
    events: tuple[EventWish, ...] = ()


@dataclass(frozen=True)
class CellWrite:
    """One Cell's new status (by name) and its Events."""

    name: str
    write: StatusWrite


@dataclass(frozen=True)
class ExperimentState:
    """An Experiment's phase, counters and conditions before they are compared with
    what it says now; `cells_by_phase` is for the metrics (empty before any cell)."""

    phase: ExperimentPhase
    counters: Mapping[str, Any]
    conditions: tuple[ConditionWish, ...]
    cells_by_phase: Mapping[CellPhase, int]


def stamp(moment: datetime) -> str:
    """A time as Kubernetes writes it in a status (seconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def without_none(value: Any) -> Any:
    """JSON without its null members (a status omits what is unknown)."""
    if isinstance(value, Mapping):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value


def _unchanged(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return all(current.get(k) == v for k, v in desired.items())


# -- attempts --------------------------------------------------------------------------


def attempt_launched(attempt: Mapping[str, Any], now: str) -> StatusWrite:
    """An Attempt's status once its Pod exists (the launch record), and its Event."""
    meta = attempt["metadata"]
    spec = attempt.get("spec") or {}
    generation = int(meta.get("generation") or 1)
    message = (
        f"Pod {meta['name']} created for cell {spec.get('cellId')} (attempt "
        f"{spec.get('number')}, {spec.get('trigger')}); waiting for it to end"
    )
    conditions, _ = merge_conditions(
        (attempt.get("status") or {}).get("conditions"),
        kstatus(KStatus.RECONCILING, Reason.RUNNING, message),
        generation,
        now,
    )
    status = {
        "observedGeneration": generation,
        "phase": "Running",
        "podName": meta["name"],
        "conditions": conditions,
    }
    return StatusWrite(status, (EventWish(EventType.NORMAL, EventReason.STARTED, message),))


def attempt_finished(
    attempt: Mapping[str, Any],
    kernel: ResultKernel,
    started: datetime | None,
    finished: datetime,
    now: str,
) -> StatusWrite:
    """An Attempt's status with its result (written once), and its Event."""
    generation = int(attempt["metadata"].get("generation") or 1)
    true, reason, event_type, message = _attempt_end(kernel)
    conditions, _ = merge_conditions(
        (attempt.get("status") or {}).get("conditions"),
        kstatus(true, reason, message),
        generation,
        now,
    )
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": "Finished",
        "podName": attempt["metadata"]["name"],
        "finishedAt": stamp(finished),
        "result": without_none(kernel.to_dict()),
        "conditions": conditions,
    }
    if started is not None:
        status["startedAt"] = stamp(started)
    return StatusWrite(status, (EventWish(event_type, EventReason(reason.value), message),))


def attempt_started(
    number: int, trigger: Trigger, request: str | None, before: Sequence[FinishedAttempt]
) -> EventWish | None:
    """The Cell's Event for a new attempt: a retry or a rerun says why (a first does not)."""
    if trigger is Trigger.RETRY:
        last = before[-1] if before else None
        why = (
            f"attempt {last.number} ended {last.status.value}"
            + (f": {last.kernel.reason}" if last.kernel.reason else "")
            if last is not None
            else "the last attempt ended without a result"
        )
        return EventWish(EventType.WARNING, EventReason.RETRIED, f"attempt {number} started; {why}")
    if trigger is Trigger.MANUAL:
        return EventWish(
            EventType.NORMAL,
            EventReason.RERUN,
            f"attempt {number} started for the rerun request '{request}'",
        )
    return None


def _attempt_end(kernel: ResultKernel) -> tuple[KStatus, Reason, EventType, str]:
    """An ended attempt's kstatus condition, reason, Event type and message."""
    status = kernel.status
    text = status.value
    if kernel.score is not None:
        text += f", score {kernel.score:g}"
    text += f", in {kernel.duration_sec:.1f}s"
    if kernel.reason:
        text += f": {kernel.reason}"
    if status is AttemptStatus.COMPLETED:
        return KStatus.READY, Reason.COMPLETED, EventType.NORMAL, text
    if status is AttemptStatus.SUBJECT_FAILED:
        return KStatus.READY, Reason.SUBJECT_FAILED, EventType.NORMAL, text
    if status is AttemptStatus.CANCELLED:
        return KStatus.STALLED, Reason.CANCELLED, EventType.WARNING, text
    return (
        KStatus.STALLED,
        Reason.INFRA_FAILED,
        EventType.WARNING,
        text + " (no result: the cell gets a new attempt while its retries last)",
    )


# -- cells -----------------------------------------------------------------------------


def cell_writes(
    observation: Observation, max_infra_retries: int, *, budget_held: bool, now: str
) -> list[CellWrite]:
    """The Cells whose status changes, in the observation's order: every Cell with an
    ended attempt (one without any has nothing to show yet)."""
    writes = []
    for cell in observation.cells:
        attempts = observation.finished.get(cell.cell_id, ())
        if not attempts:
            continue
        write = cell_status(
            cell,
            attempts,
            max_infra_retries,
            held=budget_held and cell.cell_id not in observation.running,
            now=now,
        )
        if write is not None:
            writes.append(CellWrite(cell.name, write))
    return writes


def cell_status(
    cell: SeenCell,
    attempts: Sequence[FinishedAttempt],
    max_infra_retries: int,
    *,
    held: bool,
    now: str,
) -> StatusWrite | None:
    """A Cell's status from its ended attempts (at least one), or None if it holds it.

    A selected attempt stays selected (`status.selectedAttempt` is kept even if another
    would be chosen now); the Event is the phase's, when the phase changes. `held`: the
    budget keeps a new attempt from starting and none is running."""
    current = cell.status
    selected = select_result(attempts)
    state = cell_state([a.status for a in attempts], max_infra_retries)
    desired: dict[str, Any] = {
        "attempts": len(attempts),
        "phase": (
            CellPhase.DONE
            if state is CellState.DONE
            else CellPhase.FAILED
            if state is CellState.EXHAUSTED
            else CellPhase.PENDING
        ).value,
        "rerunTokens": sorted({a.request for a in attempts if a.request}),
    }
    if selected is not None:
        chosen = current.get("selectedAttempt") or selected.number
        pick = next((a for a in attempts if a.number == chosen), selected)
        desired["selectedAttempt"] = pick.number
        desired["status"] = pick.status.value
        if pick.kernel.score is not None:
            desired["score"] = pick.kernel.score
    true, reason, message = _cell_health(
        cell.name,
        attempts,
        desired["selectedAttempt"] if selected is not None else None,
        state,
        max_infra_retries,
        held=held,
    )
    desired["observedGeneration"] = cell.generation
    desired["conditions"], _ = merge_conditions(
        current.get("conditions"), kstatus(true, reason, message), cell.generation, now
    )
    if _unchanged(current, desired):
        return None
    events: tuple[EventWish, ...] = ()
    before = current.get("phase")
    if desired["phase"] != before and desired["phase"] == CellPhase.DONE.value:
        events = (EventWish(EventType.NORMAL, EventReason.RESULT_SELECTED, message),)
    elif desired["phase"] != before and desired["phase"] == CellPhase.FAILED.value:
        events = (EventWish(EventType.WARNING, EventReason.RETRIES_EXHAUSTED, message),)
    return StatusWrite(desired, events)


def _cell_health(
    name: str,
    attempts: Sequence[FinishedAttempt],
    selected: int | None,
    state: CellState,
    retries: int,
    *,
    held: bool,
) -> tuple[KStatus, Reason, str]:
    """A cell's kstatus condition, reason and message, from its ended attempts. The
    message depends only on them (and the budget hold), so it never costs a write."""
    if selected is not None:
        pick = next(a for a in attempts if a.number == selected)
        text = f"attempt {pick.number} is the cell's result: {pick.status.value}"
        if pick.kernel.score is not None:
            text += f", score {pick.kernel.score:g}"
        return KStatus.READY, Reason.RESULT_SELECTED, text
    last = attempts[-1]
    why = f"attempt {last.number} ended {last.status.value}" + (
        f" ({last.kernel.reason})" if last.kernel.reason else ""
    )
    if state is CellState.EXHAUSTED:
        return (
            KStatus.STALLED,
            Reason.RETRIES_EXHAUSTED,
            f"{why}; no result after {len(attempts)} attempt(s), the infrastructure "
            f"retries ({retries}) are used up. After fixing the cause: kubectl annotate "
            f"cell {name} {names.RERUN_ANNOTATION}=<token>",
        )
    if held:
        return (
            KStatus.STALLED,
            Reason.BUDGET_EXHAUSTED,
            f"{why}; the experiment's budget is reached, so no new attempt starts",
        )
    return (
        KStatus.RECONCILING,
        Reason.RETRYING,
        f"{why}; a new attempt runs or will start (at most {retries} retries)",
    )


# -- the experiment --------------------------------------------------------------------


def invalid_spec(message: str) -> ExperimentState:
    """An Experiment whose spec does not validate: Failed, and nothing is created."""
    return ExperimentState(
        ExperimentPhase.FAILED,
        {},
        (
            *kstatus(KStatus.STALLED, Reason.INVALID_SPEC, message),
            ("Validated", False, "InvalidSpec", message),
            ("Failed", True, "InvalidSpec", "the spec is not valid; no cell was created"),
        ),
        {},
    )


def prerequisites_missing(missing: str, recheck_sec: float) -> ExperimentState:
    """An Experiment waiting for its Secrets (`missing`: what to create), looked for
    again every `recheck_sec`."""
    return ExperimentState(
        ExperimentPhase.PENDING,
        {},
        (
            *kstatus(
                KStatus.RECONCILING,
                Reason.PREREQUISITES_MISSING,
                f"{missing} (looked for again every {recheck_sec:g}s)",
            ),
            ("Validated", True, "Valid", "the spec is valid"),
            ("PrerequisitesMet", False, "Missing", missing),
        ),
        {},
    )


def experiment_progress(
    cells: Sequence[Cell],
    subject_ids: Iterable[str],
    observation: Observation,
    max_infra_retries: int,
    budget: BudgetState,
    *,
    idle: bool,
    held: bool,
) -> ExperimentState:
    """A running experiment's state: counts, per-subject scores and spending, phase and
    conditions. `idle`: nothing runs or may start; `held`: the budget keeps a group from
    starting."""
    finished, running = observation.finished, observation.running
    done = failed = 0
    cells_by_phase = dict.fromkeys(CellPhase, 0)
    per_subject: dict[str, dict[str, Any]] = {
        s: {"subjectId": s, "n": 0, "scores": [], "cost": None, "tokens": 0} for s in subject_ids
    }
    for cell in cells:
        attempts = finished.get(cell.id, ())
        summary = per_subject[cell.subject_id]
        for a in attempts:
            if a.kernel.cost_usd is not None:
                summary["cost"] = (summary["cost"] or 0.0) + a.kernel.cost_usd
            if a.kernel.usage is not None:
                summary["tokens"] += a.kernel.usage.total_tokens
        state = cell_state([a.status for a in attempts], max_infra_retries)
        if state is CellState.DONE:
            done += 1
            cells_by_phase[CellPhase.DONE] += 1
            selected = select_result(attempts)
            if selected is not None and selected.kernel.score is not None:
                summary["n"] += 1
                summary["scores"].append(selected.kernel.score)
        elif cell.id in running:
            cells_by_phase[CellPhase.RUNNING] += 1
        elif state is CellState.EXHAUSTED:
            failed += 1
            cells_by_phase[CellPhase.FAILED] += 1
        else:
            cells_by_phase[CellPhase.PENDING] += 1
    subjects = []
    for s in per_subject.values():
        scores = s["scores"]
        subjects.append(
            without_none(
                {
                    "subjectId": s["subjectId"],
                    "n": s["n"],
                    "meanScore": round(sum(scores) / len(scores), 6) if scores else None,
                    "costUsd": round(s["cost"], 6) if s["cost"] is not None else None,
                    "tokens": s["tokens"],
                }
            )
        )
    total = len(cells)
    if idle and held:
        phase = ExperimentPhase.BUDGET_EXHAUSTED
    elif idle:
        phase = ExperimentPhase.COMPLETE
    else:
        phase = ExperimentPhase.RUNNING
    conditions = (
        *kstatus(*_experiment_health(idle, held, done, failed, total, len(running), budget)),
        ("Validated", True, "Valid", "the spec is valid"),
        ("PrerequisitesMet", True, "Found", "every declared credential's Secret exists"),
        (
            "Running",
            not idle,
            "AttemptsRunning" if not idle else "Idle",
            f"{len(running)} attempt(s) running" if not idle else "nothing is running",
        ),
        (
            "Complete",
            idle and not held,
            "AllCellsSettled" if idle and not held else "CellsPending",
            f"{done} of {total} cells have a result, {failed} failed",
        ),
        (
            "BudgetExhausted",
            budget.exhausted,
            "BudgetReached" if budget.exhausted else "WithinBudget",
            budget.describe(),
        ),
        (
            "Failed",
            failed > 0 and idle,
            "CellsFailed" if failed > 0 and idle else "NoFailure",
            f"{failed} cell(s) used up their infrastructure retries without a result"
            if failed
            else "no cell failed",
        ),
    )
    counters = {
        "cellsTotal": total,
        "cellsDone": done,
        "cellsFailed": failed,
        "cellsRunning": len(running),
        "attempts": observation.attempts,
        "attemptsRunning": len(running),
        "subjects": subjects,
        "budget": {
            "costUsd": round(budget.spent_cost_usd, 6),
            "tokens": budget.spent_tokens,
            "held": budget.exhausted,
        },
    }
    return ExperimentState(phase, counters, conditions, cells_by_phase)


def experiment_status(
    current: Mapping[str, Any], generation: int, state: ExperimentState, now: str
) -> StatusWrite | None:
    """The Experiment's status for `state` and its Events, or None if it holds it."""
    conditions, transitions = merge_conditions(
        current.get("conditions"), state.conditions, generation, now
    )
    desired = {
        "observedGeneration": generation,
        "phase": state.phase.value,
        "conditions": conditions,
        **state.counters,
    }
    if _unchanged(current, desired):
        return None
    events = _experiment_events(current.get("phase"), state.phase, transitions, state.counters)
    return StatusWrite(desired, tuple(events))


def _experiment_health(
    idle: bool,
    held: bool,
    done: int,
    failed: int,
    total: int,
    running: int,
    budget: BudgetState,
) -> tuple[KStatus, Reason, str]:
    """An experiment's kstatus condition, reason and message (see docs/operations.md)."""
    progress = f"{done} of {total} cells have a result"
    if not idle:
        text = f"{progress}, {running} attempt(s) running"
        if budget.exhausted:
            text += f"; the budget is reached ({budget.describe()}): no new task group starts"
        return KStatus.RECONCILING, Reason.RUNNING, text
    if held:
        return (
            KStatus.STALLED,
            Reason.BUDGET_EXHAUSTED,
            f"the budget is reached ({budget.describe()}): {progress}, the others do not "
            "start; run a new experiment with a larger spec.budget for them",
        )
    if failed:
        return (
            KStatus.STALLED,
            Reason.CELLS_FAILED,
            f"{progress}; {failed} used up their infrastructure retries without a result "
            f"(rerun one with the {names.RERUN_ANNOTATION} annotation)",
        )
    return KStatus.READY, Reason.COMPLETE, progress


def _experiment_events(
    before: str | None,
    phase: ExperimentPhase,
    transitions: Sequence[ConditionWish],
    counters: Mapping[str, Any],
) -> list[EventWish]:
    """The Events of an Experiment status write: its phase changes and the conditions
    a user looks for (an invalid spec, a missing prerequisite, the budget hold)."""
    events: list[EventWish] = []
    for type_, truth, _reason, message in transitions:
        if type_ == "Validated" and not truth:
            events.append(EventWish(EventType.WARNING, EventReason.INVALID_SPEC, message))
        elif type_ == "PrerequisitesMet" and not truth:
            events.append(EventWish(EventType.WARNING, EventReason.PREREQUISITES_MISSING, message))
        elif type_ == "BudgetExhausted" and truth:
            events.append(
                EventWish(
                    EventType.WARNING,
                    EventReason.BUDGET_EXHAUSTED,
                    f"the budget is reached ({message}): no new task group starts",
                )
            )
    if phase.value == before:
        return events
    total, done, failed = (
        counters.get("cellsTotal", 0),
        counters.get("cellsDone", 0),
        counters.get("cellsFailed", 0),
    )
    progress = f"{done} of {total} cells have a result"
    if phase is ExperimentPhase.RUNNING:
        events.append(EventWish(EventType.NORMAL, EventReason.STARTED, f"{total} cells"))
    elif phase is ExperimentPhase.COMPLETE and failed:
        events.append(
            EventWish(
                EventType.WARNING,
                EventReason.COMPLETED_WITH_FAILURES,
                f"{progress}; {failed} used up their infrastructure retries",
            )
        )
    elif phase is ExperimentPhase.COMPLETE:
        events.append(EventWish(EventType.NORMAL, EventReason.COMPLETED, progress))
    elif phase is ExperimentPhase.BUDGET_EXHAUSTED:
        events.append(
            EventWish(
                EventType.WARNING,
                EventReason.STOPPED_BY_BUDGET,
                f"{progress}; the budget holds the others",
            )
        )
    return events
