"""Expansion: an experiment becomes cells (task x repetition x subject) and task groups.

Deterministic and complete before anything runs. Groups are ordered repetition-major
(every task's first repetition before any second one), so a run stopped by its budget
has covered as many tasks as it could; cells within a group follow the subject order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


def cell_id(task_id: str, repetition: int, subject_id: str) -> str:
    """`<taskId>::<repetition>::<subjectId>`."""
    return f"{task_id}::{repetition}::{subject_id}"


def parse_cell_id(value: str) -> tuple[str, int, str] | None:
    """Split a cell id into (task, repetition, subject), or None if it is malformed."""
    parts = value.split("::")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[0] or not parts[2]:
        return None
    if int(parts[1]) < 1 or cell_id(parts[0], int(parts[1]), parts[2]) != value:
        return None
    return parts[0], int(parts[1]), parts[2]


def group_id(task_id: str, repetition: int) -> str:
    """`<taskId>::<repetition>`: all subject arms of one task repetition."""
    return f"{task_id}::{repetition}"


@dataclass(frozen=True)
class Cell:
    """One task x repetition x subject."""

    id: str
    task_id: str
    repetition: int
    subject_id: str

    @property
    def group_id(self) -> str:
        return group_id(self.task_id, self.repetition)


@dataclass(frozen=True)
class TaskGroup:
    """All subject arms of one task repetition; they start together."""

    id: str
    task_id: str
    repetition: int
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Expansion:
    """Every cell and group of an experiment, in execution order."""

    groups: tuple[TaskGroup, ...]
    task_ids: tuple[str, ...]
    subject_ids: tuple[str, ...]
    repetitions: int
    _cells: Mapping[str, Cell] = field(default_factory=dict, repr=False, compare=False)
    _group_index: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(cell for group in self.groups for cell in group.cells)

    def cell(self, cell_id: str) -> Cell:
        """The cell with this id (KeyError if none)."""
        return self._cells[cell_id]

    def group_index(self, cell_id: str) -> int:
        """Position of the cell's task group in execution order (KeyError if none)."""
        return self._group_index[self._cells[cell_id].group_id]

    def __contains__(self, cell_id: object) -> bool:
        return cell_id in self._cells

    def __iter__(self) -> Iterator[Cell]:
        return iter(self.cells)

    def __len__(self) -> int:
        return len(self._cells)


def expand_ids(
    task_ids: tuple[str, ...], subject_ids: tuple[str, ...], repetitions: int
) -> Expansion:
    """Expand from ids alone (the rule itself; `expand` feeds it an experiment)."""
    groups = []
    for repetition in range(1, repetitions + 1):
        for task in task_ids:
            cells = tuple([_cell(task, repetition, subject) for subject in subject_ids])
            groups.append(TaskGroup(group_id(task, repetition), task, repetition, cells))
    by_id = {cell.id: cell for group in groups for cell in group.cells}
    index = {group.id: i for i, group in enumerate(groups)}
    return Expansion(tuple(groups), task_ids, subject_ids, repetitions, by_id, index)


def _cell(task_id: str, repetition: int, subject_id: str) -> Cell:
    """Cell(cell_id(...), task_id, repetition, subject_id) without the frozen dataclass's
    __init__ (an object.__setattr__ per field), which costs more than the rest of an
    expansion: a report expands 100,000s of cells. Every field is set, in field order,
    so the instance's dict shares its keys with every other cell's, as constructed."""
    cell = object.__new__(Cell)
    fields = cell.__dict__
    fields["id"] = cell_id(task_id, repetition, subject_id)
    fields["task_id"] = task_id
    fields["repetition"] = repetition
    fields["subject_id"] = subject_id
    return cell


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


class _ExpandedSpec(Protocol):
    @property
    def tasks(self) -> Sequence[_Identified]: ...
    @property
    def subjects(self) -> Sequence[_Identified]: ...
    @property
    def repetitions(self) -> int: ...


class Expandable(Protocol):
    """What expansion reads of an experiment (spec.experiment.Experiment): the engine
    sits below the spec and takes its values, not its models."""

    @property
    def spec(self) -> _ExpandedSpec: ...


def expand(experiment: Expandable) -> Expansion:
    """All cells and task groups of an experiment."""
    spec = experiment.spec
    return expand_ids(
        tuple(task.id for task in spec.tasks),
        tuple(subject.id for subject in spec.subjects),
        spec.repetitions,
    )
