"""Live progress of `maka-eval run`: a bar and a per-subject table, updated as attempts end.

On a terminal it is a rich Live display; elsewhere (CI logs, pipes) one line per
finished attempt, counting the cells done (an attempt that will be retried or was
cancelled does not finish its cell). Everything goes to one console, so a Ctrl-C reads
in the order it happened: the stopping line, each cancelled attempt, then the summary
the command prints after the run. An executor may deliver a cancelled attempt before
its Cancelling event (they come from different threads); such lines wait for it.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from maka_eval.cli.render import STATUS_STYLE, fmt_score, safe_text
from maka_eval.engine.status import AttemptStatus
from maka_eval.local.events import (
    AttemptFinished,
    AttemptStarted,
    BudgetReached,
    Cancelling,
    Event,
    RunStarted,
)


@dataclass
class _SubjectProgress:
    running: int = 0
    done: int = 0
    failed: int = 0
    scores: list[float] = field(default_factory=list)


class RunProgress:
    """An event sink that shows progress on a console."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()
        self._subjects: dict[str, _SubjectProgress] = {}
        self._progress = Progress(
            TextColumn("[bold]cells"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task("cells", total=0)
        self._live: Live | None = None
        self._messages: list[Text] = []
        self._started = time.monotonic()
        self._finished_cells = 0
        self._total = 0
        self._cancelling = False
        self._early_cancelled: list[Text] = []

    def __enter__(self) -> RunProgress:
        if self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=8)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._flush_cancelled()  # no Cancelling event came: keep the lines anyway
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(None, None, None)
            self._live = None

    def _render(self) -> RenderableType:
        table = Table(box=None, pad_edge=False)
        for name in ("subject", "done", "running", "failed", "score so far"):
            table.add_column(name, justify="left" if name == "subject" else "right")
        for subject, p in self._subjects.items():
            mean = statistics.fmean(p.scores) if p.scores else None
            table.add_row(
                safe_text(subject), str(p.done), str(p.running), str(p.failed), fmt_score(mean)
            )
        return Group(*self._messages, self._progress, table)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _say(self, text: Text) -> None:
        if self._live is not None:
            self._messages.append(text)
        else:
            self.console.print(text)

    def _flush_cancelled(self) -> None:
        for line in self._early_cancelled:
            self._say(line)
        self._early_cancelled.clear()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._handle(event)
            self._refresh()

    def _handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._subjects = {s: _SubjectProgress() for s in event.subjects}
            self._total = event.cells_to_run
            self._progress.update(self._task, total=event.cells_to_run)
            what = "resuming" if event.resumed else "starting"
            self._say(
                Text(
                    f"{what} {event.run_dir}: {event.cells_to_run} cell(s) in "
                    f"{event.groups_to_run} task group(s) to run, at most "
                    f"{event.max_concurrent_groups} group(s) at once"
                    + (
                        f"; {event.cells_with_results} cell(s) already have results"
                        if event.cells_with_results
                        else ""
                    ),
                    style="bold",
                )
            )
        elif isinstance(event, AttemptStarted):
            self._subjects[event.subject_id].running += 1
        elif isinstance(event, AttemptFinished):
            record = event.record
            p = self._subjects[record.subject_id]
            p.running -= 1
            status = record.result.status
            cancelled = status is AttemptStatus.CANCELLED
            if not event.will_retry and not cancelled:
                self._finished_cells += 1
                self._progress.advance(self._task)
                if status.is_result:
                    p.done += 1
                    if record.result.score is not None:
                        p.scores.append(record.result.score)
                if status is not AttemptStatus.COMPLETED:
                    p.failed += 1
            line = self._attempt_line(event)
            if cancelled and not self._cancelling:
                self._early_cancelled.append(line)
            elif cancelled:
                self._say(line)  # on a terminal too: the run's end is told line by line
            elif self._live is None:
                self.console.print(line)
        elif isinstance(event, BudgetReached):
            self._say(
                Text(
                    f"budget reached ({event.budget.describe()}): no new task group starts; "
                    f"{event.held_groups} group(s) held back, running groups finish",
                    style="yellow",
                )
            )
        elif isinstance(event, Cancelling):
            self._cancelling = True
            self._say(
                Text(
                    f"stopping: quiescing {event.running_attempts} running attempt(s) and "
                    "recording them as cancelled...",
                    style="magenta",
                )
            )
            self._flush_cancelled()

    def _attempt_line(self, event: AttemptFinished) -> Text:
        """`[2/24 cells done] task::1::subject #1 completed score=1.000 0.52s`."""
        record = event.record
        status = record.result.status.value
        retry = " (retrying)" if event.will_retry else ""
        line = Text(
            f"[{self._finished_cells}/{self._total} cells done] {record.cell_id} #{record.attempt} "
        )
        line.append(status, style=STATUS_STYLE.get(status, ""))
        line.append(
            f" score={fmt_score(record.result.score)} {record.result.duration_sec:.2f}s{retry}"
        )
        if record.result.reason and not record.status.is_result:
            line.append("  ")
            line.append(safe_text(record.result.reason, "dim"))
        return line
