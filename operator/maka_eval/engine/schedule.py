"""Which task groups start next.

The executor keeps the waiting groups in execution order (each with the arms that need
an attempt) and the count of running ones; this decides, from those alone, what to
start. Deciding costs O(launches), not O(groups), so large experiments stay cheap.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Set
from dataclasses import dataclass

from maka_eval.engine.budget import BudgetState
from maka_eval.engine.expand import Cell, Expansion, TaskGroup


@dataclass(frozen=True)
class Launch:
    """One task group to start, with the arms that need an attempt."""

    group: TaskGroup
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Plan:
    """What to start now, and how many waiting groups the budget holds back."""

    launches: tuple[Launch, ...]
    held_by_budget: int = 0


def waiting_groups(expansion: Expansion, work: Set[str]) -> list[Launch]:
    """Groups, in execution order, that have cells in `work`."""
    waiting = []
    for group in expansion.groups:
        cells = tuple(cell for cell in group.cells if cell.id in work)
        if cells:
            waiting.append(Launch(group, cells))
    return waiting


def plan_launches(
    waiting: Collection[Launch],
    running: int,
    max_concurrent_groups: int,
    budget: BudgetState,
) -> Plan:
    """Start the first waiting groups up to the limit; none once the budget is spent."""
    if budget.exhausted:
        return Plan((), len(waiting))
    free = max(0, max_concurrent_groups - running)
    return Plan(tuple(itertools.islice(waiting, free)))
