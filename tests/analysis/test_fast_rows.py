"""The per-cell objects a report builds without their dataclass constructors (cells of
an expansion, a summary's rows) equal the constructed ones, field by field and key by
key, so a field added to either class cannot be silently left unset."""

from __future__ import annotations

from dataclasses import fields

from maka_eval.analysis.summary import CellRow, summarize_source
from maka_eval.engine.expand import Cell, cell_id, expand_ids
from maka_eval.engine.selection import select_result
from tests.analysis.records import FakeSource
from tests.analysis.test_summary import ATTEMPTS, DOCUMENT


def _field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def test_expanded_cells_equal_constructed_cells():
    expansion = expand_ids(("a", "b"), ("x", "y"), 2)
    for cell in expansion.cells:
        built = Cell(
            cell_id(cell.task_id, cell.repetition, cell.subject_id),
            cell.task_id,
            cell.repetition,
            cell.subject_id,
        )
        assert cell == built
        assert hash(cell) == hash(built)
        assert list(vars(cell)) == list(vars(built)) == _field_names(Cell)


def test_summary_rows_equal_constructed_rows():
    summary = summarize_source(
        FakeSource(DOCUMENT, ATTEMPTS, interrupted_attempts={"b::2::x": [1]})
    )
    assert summary.cells
    for row in summary.cells:
        built = CellRow(
            cell_id=row.cell_id,
            task_id=row.task_id,
            repetition=row.repetition,
            subject_id=row.subject_id,
            state=row.state,
            attempts=len(row.records),
            interrupted=row.interrupted,
            selected=select_result(row.records),
            last=row.records[-1] if row.records else None,
            records=row.records,
        )
        assert row == built
        assert list(vars(row)) == list(vars(built)) == _field_names(CellRow)
