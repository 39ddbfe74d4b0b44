"""Per-cell results and per-subject summaries, computed from the attempt records alone.

Each cell's result is its earliest valid attempt; a cell without one is absent from the
results. Because attempt loss is not random (long, chatty runs die more), averaging each
subject's surviving cells is biased: the paired columns use only task groups in which
every subject has a result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from pathlib import Path
from typing import Any

from maka_eval.analysis.pairing import mean_and_sem, paired_difference, paired_scores
from maka_eval.analysis.source import AttemptSource, RunDirectorySource, WriterView
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.expand import Cell, Expansion, expand
from maka_eval.engine.selection import CellState, cell_state, select_result
from maka_eval.errors import Problem
from maka_eval.executors.load import experiment_from_data
from maka_eval.spec.experiment import Experiment
from maka_eval.store.attempts import collector_paused
from maka_eval.store.integrity import Integrity
from maka_eval.store.lock import LockInfo, LockState

_STATUS = attrgetter("result.status")
"""An attempt record's status, read in C (a summary counts 100,000s)."""


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
    records: tuple[AttemptRecord, ...] = ()
    """Every valid attempt record of the cell, in attempt order."""


@dataclass(frozen=True)
class PairedDifference:
    """A subject minus the baseline subject, per complete task group."""

    baseline: str
    n: int
    mean: float | None
    sem: float | None


@dataclass(frozen=True)
class SubjectSummary:
    """One subject across its cells. Scores, tokens, cost and time are those of the
    selected attempts (each cell's result); what every attempt spent is the budget's."""

    subject_id: str
    cells: int
    results: int
    completed: int
    subject_failed: int
    without_result: int
    mean_score: float | None
    sem: float | None
    """Standard error of the mean score, clustered by task."""
    paired_n: int
    paired_mean_score: float | None
    tokens: int | None
    """Total tokens of the selected attempts; None when none of them reported usage."""
    cost_usd: float | None
    """Cost of the selected attempts; None when none of them reported a cost."""
    mean_duration_sec: float | None
    paired_difference: PairedDifference | None = None
    """Against the first subject; None for the first subject itself."""


@dataclass(frozen=True)
class RunSummary:
    """Everything `status` and `results` show."""

    run_dir: str
    run_id: str
    experiment: Experiment
    expansion: Expansion
    cells: tuple[CellRow, ...]
    budget: BudgetState
    """The shared budget: what EVERY attempt spent (failed, retried, cancelled ones
    too), unlike the per-subject totals, which count selected attempts only."""
    lock: LockState
    lock_info: LockInfo | None
    attempts: int
    attempt_counts: Mapping[str, int]
    damaged: tuple[Problem, ...] = ()
    """What failed verification (each names its file): its records are left out."""
    has_writer_lock: bool = True
    """False where the store has no writer lock (a cluster: the operator writes)."""
    integrity: Integrity | None = None
    """What verifying the records' seals found (None: a store that does not seal)."""

    @cached_property
    def subjects(self) -> tuple[SubjectSummary, ...]:
        """Per-subject summaries, computed when first asked for (`report` never asks)."""
        return tuple(_subject_summaries(self.expansion, self.cells))

    @property
    def results(self) -> tuple[CellRow, ...]:
        """Cells that have a selected result (the result map)."""
        return tuple(row for row in self.cells if row.selected is not None)

    def count(self, state: CellState) -> int:
        return sum(1 for row in self.cells if row.state is state)


def _sum_reported(values: Sequence[float | int | None]) -> float | int | None:
    """The sum of the values that were reported; None when none was."""
    reported = [v for v in values if v is not None]
    return sum(reported) if reported else None


def _subject_summaries(expansion: Expansion, rows: Sequence[CellRow]) -> list[SubjectSummary]:
    scores = {
        row.cell_id: row.selected.result.score if row.selected is not None else None for row in rows
    }
    paired = paired_scores(expansion, scores)
    baseline = expansion.subject_ids[0] if expansion.subject_ids else None
    summaries = []
    for subject in expansion.subject_ids:
        mine = [row for row in rows if row.subject_id == subject]
        selected = [row.selected for row in mine if row.selected is not None]
        scored = [r for r in selected if r.result.score is not None]
        stats = mean_and_sem(
            [r.result.score for r in scored if r.result.score is not None],
            [r.task_id for r in scored],
        )
        ours = mean_and_sem(paired[subject])
        difference = None
        if baseline is not None and subject != baseline:
            d = paired_difference(expansion, scores, subject, baseline)
            difference = PairedDifference(baseline, d.n, d.mean, d.sem)
        tokens = _sum_reported(
            [r.result.usage.total_tokens if r.result.usage else None for r in selected]
        )
        cost = _sum_reported([r.result.cost_usd for r in selected])
        durations = mean_and_sem([r.result.duration_sec for r in selected])
        summaries.append(
            SubjectSummary(
                subject_id=subject,
                cells=len(mine),
                results=len(selected),
                completed=sum(1 for r in selected if r.status.value == "completed"),
                subject_failed=sum(1 for r in selected if r.status.value == "subject_failed"),
                without_result=len(mine) - len(selected),
                mean_score=stats.mean,
                sem=stats.sem,
                paired_n=ours.n,
                paired_mean_score=ours.mean,
                tokens=None if tokens is None else int(tokens),
                cost_usd=None if cost is None else float(cost),
                mean_duration_sec=durations.mean,
                paired_difference=difference,
            )
        )
    return summaries


def summarize_source(source: AttemptSource) -> RunSummary:
    """Summarize a run from its attempt source (damaged records are listed, not used)."""
    # A run's frozen experiment: readable where its executor plug-in is not installed.
    experiment, _ = experiment_from_data(
        source.experiment_document(), source.experiment_origin, frozen=True
    )
    cap = experiment.spec.execution.max_infra_retries
    records = source.records()
    interrupted = source.interrupted()
    with collector_paused():  # a cell each, then 100,000s of rows, no cycles
        expansion = expand(experiment)
        rows: list[CellRow] = []
        append = rows.append
        for cell in expansion.cells:
            attempts = tuple(records.get(cell.id, ()))
            append(
                _cell_row(
                    cell,
                    cell_state([a.result.status for a in attempts], cap),
                    attempts,
                    len(interrupted.get(cell.id, ())),
                )
            )
        every = [r for cell_records in records.values() for r in cell_records]
        budget = experiment.spec.budget
        spent = budget_state(
            budget.max_cost_usd, budget.max_tokens, map(AttemptRecord.spending, every)
        )
        # str() of a status is its value, computed in C (`.value` is a Python property).
        counts = dict(Counter(map(str, map(_STATUS, every))))
    writer: WriterView | None = source.writer()
    return RunSummary(
        run_dir=source.location,
        run_id=source.run_id,
        experiment=experiment,
        expansion=expansion,
        cells=tuple(rows),
        budget=spent,
        lock=writer.state if writer else LockState.FREE,
        lock_info=writer.info if writer else None,
        attempts=len(every),
        attempt_counts=counts,
        damaged=tuple(source.damaged()),
        has_writer_lock=writer is not None,
        integrity=source.integrity(),
    )


def _cell_row(
    cell: Cell, state: CellState, attempts: tuple[AttemptRecord, ...], interrupted: int
) -> CellRow:
    """CellRow(...) for one cell, at a fraction of the constructor's cost (a report
    builds one per cell): every field is set, in field order, as the constructor would
    (so the instance's dict shares its keys with every other row's, as
    `contract.record.plain_record` makes records)."""
    row = object.__new__(CellRow)
    own = row.__dict__
    own["cell_id"] = cell.id
    own["task_id"] = cell.task_id
    own["repetition"] = cell.repetition
    own["subject_id"] = cell.subject_id
    own["state"] = state
    own["attempts"] = len(attempts)
    own["interrupted"] = interrupted
    own["selected"] = select_result(attempts)
    own["last"] = attempts[-1] if attempts else None
    own["records"] = attempts
    return row


def summarize(run_dir: str | Path) -> RunSummary:
    """Read a run directory and summarize it."""
    return summarize_source(RunDirectorySource(run_dir))


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
