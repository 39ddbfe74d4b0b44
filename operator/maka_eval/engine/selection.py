"""Result selection and per-cell progress, from a cell's attempts alone."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol, TypeVar

from maka_eval.engine.status import RESULT_STATUSES, AttemptStatus


class AttemptLike(Protocol):
    """What selection needs of an attempt record."""

    @property
    def number(self) -> int: ...

    @property
    def status(self) -> AttemptStatus: ...


A = TypeVar("A", bound=AttemptLike)


_RESULTS = tuple(RESULT_STATUSES)
"""Tested with `in` on a tuple, which compares by identity first: an enum member's hash
is computed in Python, and a report tests 100,000 statuses."""


def select_result(attempts: Sequence[A]) -> A | None:
    """The earliest valid attempt (completed or subject_failed), or None."""
    selected = None
    for attempt in attempts:
        if attempt.status in _RESULTS and (selected is None or attempt.number < selected.number):
            selected = attempt
    return selected


class CellState(StrEnum):
    """Where a cell stands, judged from its attempts."""

    PENDING = "pending"
    """No result yet and not out of infrastructure retries: it should run."""
    DONE = "done"
    """It has a selectable result."""
    EXHAUSTED = "exhausted"
    """Every automatic attempt failed on infrastructure; only `--cell` runs it again."""


def infra_failures(statuses: Sequence[AttemptStatus]) -> int:
    """How many attempts failed on infrastructure."""
    return sum(1 for s in statuses if s is AttemptStatus.INFRA_FAILED)


def cell_state(statuses: Sequence[AttemptStatus], max_infra_retries: int) -> CellState:
    """A cell's state from its attempts' statuses (cancelled attempts do not count)."""
    failures = 0
    for status in statuses:
        if status in _RESULTS:
            return CellState.DONE
        if status is AttemptStatus.INFRA_FAILED:
            failures += 1
    return CellState.EXHAUSTED if failures > max_infra_retries else CellState.PENDING


def needs_retry(statuses: Sequence[AttemptStatus], max_infra_retries: int) -> bool:
    """After an attempt: does the cell get an automatic replacement attempt now?"""
    return (
        bool(statuses)
        and statuses[-1] is AttemptStatus.INFRA_FAILED
        and cell_state(statuses, max_infra_retries) is CellState.PENDING
    )
