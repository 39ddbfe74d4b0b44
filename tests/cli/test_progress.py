"""The progress lines of `maka-eval run` outside a terminal: what the counter counts, and
a Ctrl-C told in the order it happened."""

from __future__ import annotations

import io

from rich.console import Console

from maka_eval.cli.progress import RunProgress
from maka_eval.engine.budget import BudgetState
from maka_eval.engine.status import AttemptStatus
from maka_eval.local.events import AttemptFinished, AttemptStarted, Cancelling, RunStarted
from tests.analysis.records import attempt

OK, INFRA, CANCEL = AttemptStatus.COMPLETED, AttemptStatus.INFRA_FAILED, AttemptStatus.CANCELLED


def started(cells: int) -> RunStarted:
    return RunStarted(
        run_dir="runs/x",
        run_id="run-test",
        resumed=False,
        total_cells=cells,
        cells_with_results=0,
        cells_to_run=cells,
        groups_to_run=cells,
        max_concurrent_groups=2,
        subjects=("x", "y"),
        budget=BudgetState(None, None),
    )


def finished(cell: str, number: int, status: AttemptStatus, retry: bool = False):
    score = 1.0 if status.is_result else None
    return AttemptFinished(attempt(cell, number, status, score), will_retry=retry)


def play(*events) -> list[str]:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False, color_system=None)
    with RunProgress(console) as progress:
        for event in events:
            if isinstance(event, AttemptFinished):
                record = event.record
                progress(AttemptStarted(record.cell_id, record.subject_id, record.attempt))
            progress(event)
    return [line for line in buffer.getvalue().splitlines() if line.strip()]


def test_the_counter_counts_cells_done_and_stays_put_on_a_retry():
    lines = play(
        started(3),
        finished("a::1::x", 1, OK),
        finished("a::1::y", 1, INFRA, retry=True),
        finished("a::1::y", 2, OK),
    )
    assert lines[1].startswith("[1/3 cells done] a::1::x #1 completed")
    assert lines[2].startswith("[1/3 cells done] a::1::y #1 infra_failed")
    assert "(retrying)" in lines[2]
    assert lines[3].startswith("[2/3 cells done] a::1::y #2 completed")


def test_ctrl_c_is_told_in_order_even_when_events_race():
    # The executor may deliver a cancelled attempt before its Cancelling event.
    lines = play(
        started(3),
        finished("a::1::x", 1, OK),
        finished("a::1::y", 1, CANCEL),
        Cancelling(running_attempts=2),
        finished("b::1::x", 1, CANCEL),
    )
    text = "\n".join(lines)
    stopping = text.index("stopping")
    assert text.index("a::1::x #1 completed") < stopping
    assert stopping < text.index("a::1::y #1 cancelled") < text.index("b::1::x #1 cancelled")
    # Cancelled cells are not done: the counter does not move for them.
    assert "[1/3 cells done] a::1::y #1 cancelled" in text


def test_cancelled_lines_are_not_lost_without_a_cancelling_event():
    lines = play(started(1), finished("a::1::x", 1, CANCEL))
    assert any("a::1::x #1 cancelled" in line for line in lines)
