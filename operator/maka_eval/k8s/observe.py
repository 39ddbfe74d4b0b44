"""What a reconcile pass sees of one experiment's Cells, Attempts and Pods, as values.

Read from the store's view (filled by watch events, never by a LIST): the attempts whose
Pod says how they ended (`endings`), and the Cells and Attempts (`observe`) once before
the engine decides what to start and once after the pass's own writes to attempts, so
the status rules (k8s/status.py) work on values and never on the objects being written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from maka_eval.contract.kernel import ResultKernel, infra_failure
from maka_eval.engine.status import AttemptStatus, Trigger
from maka_eval.k8s import names
from maka_eval.k8s.egress import (
    SIDECAR_STARTUP_DEADLINE_SEC,
    sidecar_not_started_reason,
    sidecar_waiting_since,
)
from maka_eval.k8s.resources import REQUEST_MAX_LENGTH
from maka_eval.k8s.results import (
    EndCause,
    image_pull_failed,
    image_pull_waiting_since,
    pod_end,
    pod_gone,
)
from maka_eval.k8s.store import ExperimentView


@dataclass(frozen=True)
class FinishedAttempt:
    """An attempt with its result, as decide() and selection see it."""

    name: str
    number: int
    status: AttemptStatus
    trigger: Trigger
    request: str | None
    kernel: ResultKernel


@dataclass(frozen=True)
class SeenCell:
    """A Cell as the status rules need it: which cell, its generation and its status."""

    name: str
    cell_id: str
    generation: int
    status: Mapping[str, Any]
    """The status the Cell has now (what a new status is compared with)."""
    rerun: str | None
    """The rerun annotation's token, cut to what an Attempt's spec.request holds."""


@dataclass(frozen=True)
class Observation:
    """One experiment's Cells and Attempts at one moment of a pass."""

    finished: Mapping[str, Sequence[FinishedAttempt]]
    """Attempts with a readable result, by cell id, in attempt number order."""
    running: frozenset[str]
    """Cell ids with an attempt that has no result yet."""
    attempts: int
    """Every Attempt object, with or without a result (an unreadable result counts)."""
    cells: tuple[SeenCell, ...]
    """Every Cell object, in the view's order."""
    answered: frozenset[str]
    """Rerun tokens an Attempt was already started for."""


KernelReader = Callable[[Mapping[str, Any]], ResultKernel | None]
"""An Attempt object's result kernel, or None (no result yet, or an unreadable one)."""


def observe(view: ExperimentView, kernel_of: KernelReader) -> Observation:
    """The Cells and Attempts of `view` as an Observation."""
    finished: dict[str, list[FinishedAttempt]] = {}
    running: set[str] = set()
    answered: set[str] = set()
    for name, attempt in view.attempts.items():
        spec = attempt.get("spec") or {}
        if spec.get("request"):
            answered.add(spec["request"])
        kernel = kernel_of(attempt)
        if kernel is None:
            if not (attempt.get("status") or {}).get("result"):
                running.add(spec["cellId"])
            continue
        # Built in the view's order: the budget sums costs in this order, and a float
        # sum depends on it.
        finished.setdefault(spec["cellId"], []).append(
            FinishedAttempt(
                name,
                int(spec["number"]),
                kernel.status,
                Trigger(spec["trigger"]),
                spec.get("request"),
                kernel,
            )
        )
    for attempts in finished.values():
        attempts.sort(key=lambda a: a.number)
    cells = []
    for name, cell in view.cells.items():
        meta = cell.get("metadata") or {}
        token = (meta.get("annotations") or {}).get(names.RERUN_ANNOTATION)
        cells.append(
            SeenCell(
                name,
                cell["spec"]["cellId"],
                int(meta.get("generation") or 1),
                cell.get("status") or {},
                token[:REQUEST_MAX_LENGTH] if token else None,
            )
        )
    return Observation(
        finished, frozenset(running), len(view.attempts), tuple(cells), frozenset(answered)
    )


def launched(attempt: Mapping[str, Any]) -> bool:
    """Whether the Attempt's status records that its Pod was created."""
    return bool((attempt.get("status") or {}).get("podName"))


@dataclass(frozen=True)
class Ending:
    """An attempt without a result whose Pod says how it ended: the result to write."""

    attempt: Mapping[str, Any]
    kernel: ResultKernel
    started: datetime | None
    finished: datetime
    cause: str
    """An EndCause, or (the relay's kernel) its status source."""
    delete_pod: bool
    """The Pod is there and would never end on its own (its image cannot be pulled, its
    egress sidecar never started): it is deleted before the result is written."""


def endings(
    view: ExperimentView, image_pull_deadline_sec: float, now: datetime
) -> tuple[list[Ending], float | None]:
    """The attempts whose Pod ended, is gone or is past a deadline, in the view's order;
    and the seconds until the nearest deadline of a Pod that may still start (None:
    no deadline is pending). A Pod past both deadlines ends its attempt twice: the
    API server keeps the first result."""
    wake: float | None = None
    ended: list[Ending] = []
    for name, attempt in view.attempts.items():
        if (attempt.get("status") or {}).get("result"):
            continue
        pod = view.pods.get(name)
        if pod is None:
            # Never created (resumed by the pass) unless its launch was recorded.
            if launched(attempt):
                ended.append(Ending(attempt, pod_gone(), None, now, EndCause.POD_GONE, False))
            continue
        end = pod_end(pod, now)
        if end is not None:
            ended.append(
                Ending(attempt, end.kernel, end.started_at, end.finished_at, end.cause, False)
            )
            continue
        waiting = image_pull_waiting_since(pod)
        if waiting is not None:
            waited = (now - waiting).total_seconds()
            if waited >= image_pull_deadline_sec:
                failure = image_pull_failed(waited)
                ended.append(Ending(attempt, failure, None, now, EndCause.IMAGE_PULL, True))
            else:
                due = image_pull_deadline_sec - waited
                wake = due if wake is None else min(wake, due)
        starting = sidecar_waiting_since(pod)
        if starting is not None:
            waited = (now - starting).total_seconds()
            if waited >= SIDECAR_STARTUP_DEADLINE_SEC:
                failure = infra_failure(sidecar_not_started_reason(waited), waited)
                ended.append(Ending(attempt, failure, None, now, EndCause.INIT_CONTAINER, True))
            else:
                due = SIDECAR_STARTUP_DEADLINE_SEC - waited
                wake = due if wake is None else min(wake, due)
    return ended, wake
