"""One observation per cell: its selected result and what was lost on the way to it.

The report works on these rows only. They come from a RunSummary (one per run), so
result selection and cell states are the engine's, exactly as `status` and `results`
show them; a row whose cell has no selected result keeps its score None.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from maka_eval.analysis.summary import RunSummary
from maka_eval.engine.selection import CellState
from maka_eval.engine.status import AttemptStatus

PASS_SCORE = 1.0
"""A result passes (for pass@k) when its score reaches full marks."""


class CellObservation(NamedTuple):
    """One cell of one arm: its selected result (if any) and its attempts' fates.

    A named tuple: a report holds one per cell (100,000s), so it is built cheaply."""

    run: str
    """The run's label in the report ('' for a single run, else 'A' or 'B')."""
    arm: str
    subject_id: str
    task_id: str
    repetition: int
    cell_id: str
    state: CellState
    attempts: int
    infra_failed: int
    cancelled: int
    interrupted: int
    """Attempts started whose writer died before it recorded them."""
    status: str | None
    """The selected attempt's status; None without a result."""
    score: float | None
    input_tokens: int | None
    cached_input_tokens: int | None
    cache_write_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    duration_sec: float | None
    selected_attempt: int | None
    all_attempts_cost_usd: float
    """What every recorded attempt of the cell cost, as far as it is known."""
    all_attempts_cost_unknown: int
    """Recorded attempts of the cell whose cost is unknown."""

    @property
    def has_result(self) -> bool:
        return self.score is not None

    @property
    def started(self) -> bool:
        """Whether any attempt of the cell began (recorded or interrupted)."""
        return self.attempts > 0 or self.interrupted > 0

    @property
    def lost_attempts(self) -> int:
        """Attempts that produced no result because of the infrastructure or a stop."""
        return self.infra_failed + self.cancelled + self.interrupted

    @property
    def total_tokens(self) -> int | None:
        if self.input_tokens is None:
            return None
        return (
            self.input_tokens
            + (self.cached_input_tokens or 0)
            + (self.cache_write_tokens or 0)
            + (self.output_tokens or 0)
        )

    @property
    def passed(self) -> bool | None:
        return None if self.score is None else self.score >= PASS_SCORE


def arm_label(run: str, subject_id: str) -> str:
    """How an arm is named: its subject, prefixed by the run's label when there are two."""
    return f"{run}:{subject_id}" if run else subject_id


def observations(summary: RunSummary, run: str = "") -> Iterator[CellObservation]:
    """Every cell of the run as an observation, in expansion order."""
    infra, cancelled = AttemptStatus.INFRA_FAILED, AttemptStatus.CANCELLED
    arms: dict[str, str] = {}
    make = CellObservation._make  # positional, in field order: cheaper than keywords
    for row in summary.cells:
        failed = stopped = unknown = 0
        cost = 0.0
        for record in row.records:
            kernel = record.result
            if kernel.status is infra:
                failed += 1
            elif kernel.status is cancelled:
                stopped += 1
            if kernel.cost_usd is None:
                unknown += 1
            else:
                cost += kernel.cost_usd
        arm = arms.get(row.subject_id)
        if arm is None:
            arm = arms[row.subject_id] = arm_label(run, row.subject_id)
        selected = row.selected
        if selected is None:
            yield make(
                (
                    run, arm, row.subject_id, row.task_id, row.repetition, row.cell_id,
                    row.state, row.attempts, failed, stopped, row.interrupted,
                    None, None, None, None, None, None, None, None, None,
                    cost, unknown,
                )
            )  # fmt: skip
            continue
        result = selected.result
        usage = result.usage
        yield make(
            (
                run, arm, row.subject_id, row.task_id, row.repetition, row.cell_id,
                row.state, row.attempts, failed, stopped, row.interrupted,
                str(result.status),  # its value (`.value` is a Python property)
                result.score,
                usage.input_tokens if usage is not None else None,
                usage.cached_input_tokens if usage is not None else None,
                usage.cache_write_tokens if usage is not None else None,
                usage.output_tokens if usage is not None else None,
                result.cost_usd, result.duration_sec, selected.attempt,
                cost, unknown,
            )
        )  # fmt: skip
