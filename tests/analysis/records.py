"""Attempt records and an in-memory AttemptSource for analysis tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from maka_eval.analysis.source import WriterView
from maka_eval.contract.kernel import ResultKernel
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.expand import cell_id
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage
from maka_eval.errors import Problem
from maka_eval.executors.load import experiment_from_data
from maka_eval.store.integrity import Integrity
from maka_eval.store.run_store import RunIdentity, RunWriter
from tests.helpers import spec

_SOURCE = {
    AttemptStatus.COMPLETED: StatusSource.FRAME,
    AttemptStatus.SUBJECT_FAILED: StatusSource.FRAME,
    AttemptStatus.INFRA_FAILED: StatusSource.INFRASTRUCTURE,
    AttemptStatus.CANCELLED: StatusSource.CANCELLATION,
}
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def attempt(
    cell: str,
    number: int,
    status: AttemptStatus,
    score: float | None = None,
    *,
    tokens: int | None = None,
    cost: float | None = None,
    duration: float = 1.0,
    run_id: str = "run-test",
) -> AttemptRecord:
    """One attempt record; `tokens` become output tokens."""
    task, rep, subject = cell.split("::")
    return AttemptRecord(
        run_id=run_id,
        experiment_id="exp",
        cell_id=cell_id(task, int(rep), subject),
        task_id=task,
        repetition=int(rep),
        subject_id=subject,
        attempt=number,
        attempt_id=f"{run_id}/{cell}/{number}",
        trigger=Trigger.SCHEDULED,
        started_at=T0,
        subject_started_at=T0,
        finished_at=T0,
        result=ResultKernel(
            status=status,
            score=score,
            usage=Usage(output_tokens=tokens) if tokens is not None else None,
            cost_usd=cost,
            duration_sec=duration,
            artifacts=(),
            status_source=_SOURCE[status],
        ),
        host="test",
        maka_eval_version="0",
    )


@dataclass
class FakeSource:
    """An AttemptSource held in memory (what a cluster source would return)."""

    document: Mapping[str, Any]
    attempts: Sequence[AttemptRecord]
    interrupted_attempts: Mapping[str, Sequence[int]] = field(default_factory=dict)
    damaged_records: Sequence[Problem] = ()
    writer_view: WriterView | None = None
    integrity_view: Integrity | None = None

    def __post_init__(self) -> None:
        experiment_from_data(self.document, "fake")  # fail early on a bad test document

    @property
    def location(self) -> str:
        return "memory"

    @property
    def run_id(self) -> str:
        return "run-test"

    @property
    def experiment_origin(self) -> str:
        return "memory/experiment"

    def experiment_document(self) -> Mapping[str, Any]:
        return self.document

    def records(self) -> Mapping[str, Sequence[AttemptRecord]]:
        by_cell: dict[str, list[AttemptRecord]] = {}
        for record in sorted(self.attempts, key=lambda r: r.attempt):
            by_cell.setdefault(record.cell_id, []).append(record)
        return by_cell

    def interrupted(self) -> Mapping[str, Sequence[int]]:
        return self.interrupted_attempts

    def damaged(self) -> Sequence[Problem]:
        return self.damaged_records

    def writer(self) -> WriterView | None:
        return self.writer_view

    def integrity(self) -> Integrity | None:
        return self.integrity_view


TWO_SUBJECTS = [{"id": s, "kind": "external", "config": {"command": "true"}} for s in ("x", "y")]


def identity() -> RunIdentity:
    """The identity of a one-task, two-subject (x, y) experiment."""
    experiment, _ = experiment_from_data(spec(subjects=TWO_SUBJECTS), "test")
    return RunIdentity(experiment.canonical(), {"t1": "sha256:aa"})


def make_run(run_dir: Path) -> dict[str, Path]:
    """A run with one completed attempt per cell; returns each cell's record path."""
    writer = RunWriter.open(run_dir, identity(), "0")
    paths = {}
    try:
        for subject, score in (("x", 1.0), ("y", 0.0)):
            slot = writer.reserve("t1", 1, subject)
            record = attempt(f"t1::1::{subject}", slot.number, AttemptStatus.COMPLETED, score)
            writer.commit(slot, replace(record, run_id=writer.run_id))
            paths[subject] = slot.record_path
    finally:
        writer.close()
    return paths
