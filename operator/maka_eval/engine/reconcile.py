"""The reconciler: from what is observed to what to do next.

`decide` is the one place the scheduling policies live; the local executor and the
operator call it after every change they observe and carry out what it returns:

- **Task groups.** All arms of a task group that need an attempt start together (a
  `GroupLaunch` with `together=True`); at most `max_concurrent_groups` groups have an
  attempt in flight; groups start in execution order.
- **Retries.** A cell whose latest attempt failed on infrastructure gets a
  replacement attempt (trigger `retry`) until it has failed `max_infra_retries + 1`
  times; then it is exhausted and only a manual request runs it again. A manual
  attempt is never retried automatically. A retry joins its group at once while the
  group still has an attempt in flight, and otherwise takes the next free slot ahead
  of any group that has not started.
- **Budget.** Once the shared budget is spent no new group starts; groups already in
  flight finish, and retries (replacements, not new samples) are not held.
- **Manual requests.** A request (`--cell`, or a rerun token on a cluster) appends
  exactly one attempt to its cell, once; requests are checked by `check_requests`
  (unknown cells, cells that have a result without `force`). With `schedule=False`
  only requested cells run.
- **Cancellation.** Cancelled attempts are not results and not failures: the cell is
  simply pending again.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from maka_eval.engine.budget import BudgetState
from maka_eval.engine.expand import Cell, Expansion, TaskGroup
from maka_eval.engine.selection import CellState, cell_state
from maka_eval.engine.status import AttemptStatus, Trigger
from maka_eval.errors import Problem

GROUP_START_TIMEOUT_SEC = 600.0
"""How long the arms of a group wait for each other before starting. Preparing an arm
copies the task's environment into its workspace; ten minutes bounds a stuck copy, after
which the waiting arms fail as infrastructure (and are retried) rather than start
unpaired."""


class AttemptView(Protocol):
    """What the reconciler needs of a finished attempt."""

    @property
    def number(self) -> int: ...

    @property
    def status(self) -> AttemptStatus: ...

    @property
    def trigger(self) -> Trigger: ...

    @property
    def request(self) -> str | None: ...


@dataclass(frozen=True)
class Policy:
    """The experiment's frozen scheduling settings."""

    max_concurrent_groups: int
    max_infra_retries: int
    schedule: bool = True
    """Run every cell that needs an attempt; False: only the requested cells."""


@dataclass(frozen=True)
class Request:
    """A manual request for one more attempt of a cell, identified by its token."""

    cell_id: str
    token: str


@dataclass(frozen=True)
class Start:
    """One attempt to start."""

    cell: Cell
    trigger: Trigger
    request: str | None = None


@dataclass(frozen=True)
class GroupLaunch:
    """Attempts of one task group to start now."""

    group: TaskGroup
    arms: tuple[Start, ...]
    together: bool
    """The arms start at the same moment (a barrier); False when they join a group that
    is already running, or there is only one."""


@dataclass(frozen=True)
class Decision:
    """What to do now."""

    launches: tuple[GroupLaunch, ...]
    held_by_budget: int
    """Groups that need an attempt but may not start because the budget is spent."""
    exhausted: tuple[str, ...]
    """Cells out of infrastructure retries, among the groups examined."""
    running_groups: int
    """Groups with an attempt in flight before these launches."""
    settled: int
    """Groups [0, settled) need nothing more without a manual request: pass it back as
    `settled` next time to skip them (they stay settled: results are never removed)."""

    @property
    def idle(self) -> bool:
        """Nothing is in flight and nothing may start: the run is over (or held)."""
        return not self.launches and self.running_groups == 0


def retry_due(attempts: Sequence[AttemptView], max_infra_retries: int) -> bool:
    """Whether the cell gets an automatic replacement attempt now."""
    if not attempts:
        return False
    last = attempts[-1]
    return (
        last.status is AttemptStatus.INFRA_FAILED
        and last.trigger is not Trigger.MANUAL
        and cell_state([a.status for a in attempts], max_infra_retries) is CellState.PENDING
    )


def _scheduled_start(
    cell: Cell, attempts: Sequence[AttemptView], policy: Policy
) -> tuple[Start | None, CellState]:
    state = cell_state([a.status for a in attempts], policy.max_infra_retries)
    if state is not CellState.PENDING or not policy.schedule:
        return None, state
    if retry_due(attempts, policy.max_infra_retries):
        return Start(cell, Trigger.RETRY), state
    return Start(cell, Trigger.SCHEDULED), state


def decide(
    expansion: Expansion,
    attempts_by_cell: Mapping[str, Sequence[AttemptView]],
    running: Collection[str],
    budget: BudgetState,
    policy: Policy,
    requests: Iterable[Request] = (),
    settled: int = 0,
) -> Decision:
    """What to start now, given every finished attempt, the cells with an attempt in
    flight (`running`), the budget and the open manual requests."""
    groups = expansion.groups
    no_attempts: Sequence[AttemptView] = ()
    active = {expansion.group_index(c) for c in running}

    requested: dict[int, list[Start]] = {}
    for req in requests:
        if req.cell_id in running:
            continue
        attempts = attempts_by_cell.get(req.cell_id, no_attempts)
        if any(a.request == req.token for a in attempts):
            continue  # answered
        cell = expansion.cell(req.cell_id)
        arms = requested.setdefault(expansion.group_index(cell.id), [])
        if all(s.cell.id != cell.id for s in arms):
            arms.append(Start(cell, Trigger.MANUAL, req.token))

    free = policy.max_concurrent_groups - len(active)
    launches: list[GroupLaunch] = []
    exhausted: list[str] = []
    held = 0

    def consider(index: int, arms: list[Start]) -> bool:
        """Launch or hold one group's arms; False once nothing further can start."""
        nonlocal free, held
        group = groups[index]
        if index in active:
            launches.append(GroupLaunch(group, tuple(arms), together=False))
            return True
        if budget.exhausted and not all(a.trigger is Trigger.RETRY for a in arms):
            held += 1
            return True
        if free <= 0:
            return budget.exhausted  # keep counting what the budget holds
        free -= 1
        launches.append(GroupLaunch(group, tuple(arms), together=len(arms) > 1))
        return True

    # Groups already running get their retries at once: they hold a slot already.
    for index in sorted(active):
        arms = []
        for cell in groups[index].cells:
            if cell.id in running:
                continue
            start, _ = _scheduled_start(cell, attempts_by_cell.get(cell.id, no_attempts), policy)
            if start is not None:
                arms.append(start)
        arms += [s for s in requested.pop(index, []) if all(a.cell != s.cell for a in arms)]
        if arms:
            consider(index, arms)

    new_settled = settled

    def candidates() -> Iterator[tuple[int, list[Start]]]:
        """Groups that need attempts, in execution order (requests in settled groups
        first); advances `new_settled` over the leading groups that need nothing."""
        nonlocal new_settled
        for index in sorted(i for i in requested if i < settled):
            yield index, requested.pop(index)
        for index in range(settled, len(groups)):
            if index in active:
                continue
            arms = []
            for cell in groups[index].cells:
                attempts = attempts_by_cell.get(cell.id, no_attempts)
                start, state = _scheduled_start(cell, attempts, policy)
                if state is CellState.EXHAUSTED:
                    exhausted.append(cell.id)
                if start is not None:
                    arms.append(start)
            if not arms and index == new_settled:
                new_settled = index + 1
            arms += [s for s in requested.pop(index, []) if all(a.cell != s.cell for a in arms)]
            if arms:
                yield index, arms

    for index, arms in candidates():
        if not consider(index, arms):
            break
    return Decision(tuple(launches), held, tuple(exhausted), len(active), new_settled)


def check_requests(
    expansion: Expansion,
    attempts_by_cell: Mapping[str, Sequence[AttemptView]],
    cell_ids: Sequence[str],
    *,
    force: bool,
    where: str = "--cell",
) -> list[Problem]:
    """Why requested cells may not get an attempt: unknown ids, or a cell that already
    has a valid result (without `force`, since selection would keep the earlier one)."""
    problems = []
    for value in dict.fromkeys(cell_ids):
        if value not in expansion:
            close = difflib.get_close_matches(value, [c.id for c in expansion.cells], n=1)
            hint = (
                f"; did you mean '{close[0]}'?"
                if close
                else "; cell ids are <taskId>::<repetition>::<subjectId>"
            )
            problems.append(Problem(f"{where} {value}", f"no such cell in this experiment{hint}"))
            continue
        if force:
            continue
        results = [a for a in attempts_by_cell.get(value, ()) if a.status.is_result]
        if results:
            first = min(results, key=lambda a: a.number)
            problems.append(
                Problem(
                    f"{where} {value}",
                    f"already has a valid result (attempt {first.number}, "
                    f"{first.status.value}); --force appends another attempt, but result "
                    "selection keeps the earliest valid one",
                )
            )
    return problems
