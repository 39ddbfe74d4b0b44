"""Which task groups start next.

The executor keeps the set of cells that still need an attempt in this run (`work`) and
the groups running now; this decides, from those alone, what to start.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from maka_eval.engine.budget import BudgetState
from maka_eval.engine.expand import Cell, Expansion, TaskGroup


@dataclass(frozen=True)
class Launch:
    """One task group to start now, with the arms that need an attempt."""

    group: TaskGroup
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Plan:
    """What to start now, and how many waiting groups the budget holds back."""

    launches: tuple[Launch, ...]
    held_by_budget: int = 0


def waiting_groups(expansion: Expansion, work: Set[str], running: Set[str]) -> list[Launch]:
    """Groups, in order, that have cells in `work` and are not running."""
    waiting = []
    for group in expansion.groups:
        if group.id in running:
            continue
        cells = tuple(cell for cell in group.cells if cell.id in work)
        if cells:
            waiting.append(Launch(group, cells))
    return waiting


def plan_launches(
    expansion: Expansion,
    work: Set[str],
    running: Set[str],
    max_concurrent_groups: int,
    budget: BudgetState,
) -> Plan:
    """Start waiting groups up to the concurrency limit, none once the budget is spent."""
    waiting = waiting_groups(expansion, work, running)
    if budget.exhausted:
        return Plan((), len(waiting))
    free = max(0, max_concurrent_groups - len(running))
    return Plan(tuple(waiting[:free]))
