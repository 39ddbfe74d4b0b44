"""What the local executor reports while it runs (the CLI turns these into progress)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.budget import BudgetState


@dataclass(frozen=True)
class RunStarted:
    run_dir: str
    run_id: str
    resumed: bool
    total_cells: int
    cells_with_results: int
    cells_to_run: int
    groups_to_run: int
    max_concurrent_groups: int
    subjects: tuple[str, ...]
    budget: BudgetState


@dataclass(frozen=True)
class AttemptStarted:
    cell_id: str
    subject_id: str
    attempt: int


@dataclass(frozen=True)
class AttemptFinished:
    record: AttemptRecord
    will_retry: bool


@dataclass(frozen=True)
class BudgetReached:
    budget: BudgetState
    held_groups: int


@dataclass(frozen=True)
class Cancelling:
    running_attempts: int


Event = RunStarted | AttemptStarted | AttemptFinished | BudgetReached | Cancelling
EventSink = Callable[[Event], None]


def ignore(_: Event) -> None:
    """An event sink that discards everything."""
