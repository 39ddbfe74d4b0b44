"""What a reconcile pass sees of one experiment's Cells and Attempts, as plain values.

Read from the store's view (filled by watch events, never by a LIST): once before the
engine decides what to start, and once after the pass's own writes to attempts, so the
status rules (k8s/status.py) work on values and never on the objects being written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.status import AttemptStatus, Trigger
from maka_eval.k8s import names
from maka_eval.k8s.resources import REQUEST_MAX_LENGTH
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
