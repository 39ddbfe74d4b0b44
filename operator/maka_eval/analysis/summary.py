"""Per-cell results and per-subject summaries, computed from the attempt records alone.

Each cell's result is its earliest valid attempt; a cell without one is absent from the
results. Because attempt loss is not random (long, chatty runs die more), averaging each
subject's surviving cells is biased: the paired columns use only task groups in which
every subject has a result.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.expand import Expansion, expand
from maka_eval.engine.selection import CellState, cell_state, select_result
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.load import experiment_from_data
from maka_eval.store.lock import LockInfo, LockState, inspect_lock
from maka_eval.store.run_store import RunContents, read_run


@dataclass(frozen=True)
class CellRow:
    """One cell: its state, attempts, and selected result (if any)."""

    cell_id: str
    task_id: str
    repetition: int
    subject_id: str
    state: CellState
    attempts: int
    interrupted: int
    selected: AttemptRecord | None
    last: AttemptRecord | None


@dataclass(frozen=True)
class SubjectSummary:
    """One subject across its cells."""

    subject_id: str
    cells: int
    results: int
    completed: int
    subject_failed: int
    without_result: int
    mean_score: float | None
    stderr: float | None
    paired_n: int
    paired_mean_score: float | None
    tokens: int
    cost_usd: float
    mean_duration_sec: float | None


@dataclass(frozen=True)
class RunSummary:
    """Everything `status` and `results` show."""

    run_dir: str
    run_id: str
    experiment: Experiment
    expansion: Expansion
    cells: tuple[CellRow, ...]
    subjects: tuple[SubjectSummary, ...]
    budget: BudgetState
    lock: LockState
    lock_info: LockInfo | None
    attempts: int
    attempt_counts: Mapping[str, int]

    @property
    def results(self) -> tuple[CellRow, ...]:
        """Cells that have a selected result (the result map)."""
        return tuple(row for row in self.cells if row.selected is not None)

    def count(self, state: CellState) -> int:
        return sum(1 for row in self.cells if row.state is state)


def _mean_and_stderr(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def _subject_summaries(
    expansion: Expansion, rows: list[CellRow], records: Mapping[str, list[AttemptRecord]]
) -> list[SubjectSummary]:
    by_cell = {row.cell_id: row for row in rows}
    complete_groups = [
        group
        for group in expansion.groups
        if all(by_cell[c.id].selected is not None for c in group.cells)
    ]
    summaries = []
    for subject in expansion.subject_ids:
        mine = [row for row in rows if row.subject_id == subject]
        selected = [row.selected for row in mine if row.selected is not None]
        scores = [r.result.score for r in selected if r.result.score is not None]
        mean, stderr = _mean_and_stderr(scores)
        paired = []
        for group in complete_groups:
            record = next(by_cell[c.id].selected for c in group.cells if c.subject_id == subject)
            if record is not None and record.result.score is not None:
                paired.append(record.result.score)
        every = [r for row in mine for r in records.get(row.cell_id, [])]
        tokens = sum(r.result.usage.total_tokens for r in every if r.result.usage)
        cost = sum(r.result.cost_usd or 0.0 for r in every)
        durations = [r.result.duration_sec for r in selected]
        summaries.append(
            SubjectSummary(
                subject_id=subject,
                cells=len(mine),
                results=len(selected),
                completed=sum(1 for r in selected if r.status.value == "completed"),
                subject_failed=sum(1 for r in selected if r.status.value == "subject_failed"),
                without_result=len(mine) - len(selected),
                mean_score=mean,
                stderr=stderr,
                paired_n=len(paired),
                paired_mean_score=statistics.fmean(paired) if paired else None,
                tokens=tokens,
                cost_usd=cost,
                mean_duration_sec=statistics.fmean(durations) if durations else None,
            )
        )
    return summaries


def summarize_contents(contents: RunContents) -> RunSummary:
    """Summarize what `read_run` returned."""
    experiment, _ = experiment_from_data(
        contents.experiment, str(contents.run_dir / "experiment.json")
    )
    expansion = expand(experiment)
    cap = experiment.spec.execution.max_infra_retries
    rows = []
    for cell in expansion.cells:
        attempts = contents.attempts(cell.id)
        rows.append(
            CellRow(
                cell_id=cell.id,
                task_id=cell.task_id,
                repetition=cell.repetition,
                subject_id=cell.subject_id,
                state=cell_state([a.status for a in attempts], cap),
                attempts=len(attempts),
                interrupted=len(contents.interrupted.get(cell.id, [])),
                selected=select_result(attempts),
                last=attempts[-1] if attempts else None,
            )
        )
    every = [r for records in contents.records.values() for r in records]
    budget = experiment.spec.budget
    lock, info = inspect_lock(contents.run_dir)
    return RunSummary(
        run_dir=str(contents.run_dir),
        run_id=contents.run_id,
        experiment=experiment,
        expansion=expansion,
        cells=tuple(rows),
        subjects=tuple(_subject_summaries(expansion, rows, contents.records)),
        budget=budget_state(budget.max_cost_usd, budget.max_tokens, (r.spending() for r in every)),
        lock=lock,
        lock_info=info,
        attempts=len(every),
        attempt_counts=dict(Counter(r.status.value for r in every)),
    )


def summarize(run_dir: str) -> RunSummary:
    """Read a run directory and summarize it."""
    return summarize_contents(read_run(Path(run_dir)))


def result_rows(summary: RunSummary) -> list[dict[str, Any]]:
    """The result map as flat rows (one per cell with a selected result)."""
    rows = []
    for row in summary.results:
        record = row.selected
        assert record is not None
        kernel = record.result
        rows.append(
            {
                "cell": row.cell_id,
                "task": row.task_id,
                "repetition": row.repetition,
                "subject": row.subject_id,
                "status": kernel.status.value,
                "score": kernel.score,
                "inputTokens": kernel.usage.input_tokens if kernel.usage else None,
                "cachedInputTokens": kernel.usage.cached_input_tokens if kernel.usage else None,
                "outputTokens": kernel.usage.output_tokens if kernel.usage else None,
                "totalTokens": kernel.usage.total_tokens if kernel.usage else None,
                "costUsd": kernel.cost_usd,
                "durationSec": round(kernel.duration_sec, 4),
                "attempt": record.attempt,
                "attempts": row.attempts,
            }
        )
    return rows
