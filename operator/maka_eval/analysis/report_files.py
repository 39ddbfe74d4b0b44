"""Writing a report's files: summary.json, cells.csv and report.html.

Above both the report's data (`report`) and its page (`page`), which renders that data:
the writer needs both, and on Linux it shares the work with forked children.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import marshal
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from maka_eval.analysis import page
from maka_eval.analysis.observations import PASS_SCORE, CellObservation
from maka_eval.analysis.report import Report, build_report, report_json
from maka_eval.analysis.source import AttemptSource
from maka_eval.analysis.statistics import DEFAULT_RESAMPLES
from maka_eval.analysis.summary import RunSummary
from maka_eval.store.attempts import collector_paused

CELL_COLUMNS = (
    "run",
    "arm",
    "subject",
    "task",
    "repetition",
    "cell",
    "state",
    "status",
    "score",
    "passed",
    "inputTokens",
    "cachedInputTokens",
    "cacheWriteTokens",
    "outputTokens",
    "totalTokens",
    "costUsd",
    "durationSec",
    "selectedAttempt",
    "attempts",
    "infraFailed",
    "cancelled",
    "interrupted",
)


def cells_csv(report: Report) -> str:
    """cells.csv: one row per cell of every arm, with or without a result."""
    return _cells_csv(report.cells)


def _cells_csv(cells: Sequence[CellObservation]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CELL_COLUMNS)
    # Plain expressions only: this runs once per cell (100,000s), and a function call or
    # a property costs as much as the rest of the row. The writer writes None as an
    # empty field and a state (a str enum) as its value, so most fields pass as they are.
    writer.writerows(
        (
            c.run,
            c.arm,
            c.subject_id,
            c.task_id,
            c.repetition,
            c.cell_id,
            c.state,
            c.status,
            c.score,
            None if c.score is None else int(c.score >= PASS_SCORE),
            c.input_tokens,
            c.cached_input_tokens,
            c.cache_write_tokens,
            c.output_tokens,
            None if c.input_tokens is None else c.total_tokens,
            c.cost_usd,
            None if c.duration_sec is None else round(c.duration_sec, 4),
            c.selected_attempt,
            c.attempts,
            c.infra_failed,
            c.cancelled,
            c.interrupted,
        )
        for c in cells
    )
    return out.getvalue()


@dataclass(frozen=True)
class Written:
    """The files a report was written to."""

    html: Path | None
    csv: Path
    json: Path


def write_report(report: Report, out_dir: Path, *, html: bool = True) -> Written:
    """Write summary.json, cells.csv and (unless html=False) report.html into out_dir.

    On Linux two of the page's four plots (most of a large report's writing time) are
    rendered by a forked child while this process writes the other files and renders
    the other two; if the child fails in any way, this process renders its plots, so
    their errors are raised here."""
    with collector_paused():
        return _write(report, out_dir, html, csv_writer=None)


def build_and_write_report(
    sources: Sequence[AttemptSource],
    out_dir: Path,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    summaries: Sequence[RunSummary] | None = None,
    html: bool = True,
) -> tuple[Report, Written]:
    """`build_report`, then `write_report`; on Linux cells.csv (a row per cell: a large
    report's longest file to write) is written by a forked child while the arms are
    compared, since it needs only the per-cell observations, and the page's plots are
    shared with another child as in `write_report`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "cells.csv"
    started: list[int | None] = []

    def cells_known(cells: tuple[CellObservation, ...]) -> None:
        started.append(_alongside(lambda: _write_file(csv_path, lambda: _cells_csv(cells))))

    try:
        report = build_report(
            sources, resamples=resamples, seed=seed, summaries=summaries, on_cells=cells_known
        )
    except BaseException:
        if started and started[0] is not None:
            _wait_for(started[0])  # the analysis failed: reap the child, raise that
        raise
    with collector_paused():
        return report, _write(report, out_dir, html, csv_writer=started[0] if started else None)


def _write(report: Report, out_dir: Path, html: bool, *, csv_writer: int | None) -> Written:
    """Write the files; `csv_writer`: the forked child already writing cells.csv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path = out_dir / "report.html" if html else None
    csv_path = out_dir / "cells.csv"
    plots = _plots_alongside(report) if html_path is not None else None
    try:
        summary_path = out_dir / "summary.json"
        text = json.dumps(report_json(report), indent=2) + "\n"
        summary_path.write_text(text, encoding="utf-8")
        if csv_writer is None:
            _write_file(csv_path, lambda: cells_csv(report))
        if html_path is not None:
            rendered = page.render_plots(report, _PARENT_PLOTS)
            if plots is not None:
                rendered.update(plots.result())  # what the child did not deliver: here
            _write_file(html_path, lambda: page.render_page(report, rendered))
    finally:
        csv_written = csv_writer is not None and _wait_for(csv_writer)
        if plots is not None:
            plots.close()
    if csv_writer is not None and not csv_written:
        _write_file(csv_path, lambda: cells_csv(report))
    return Written(html_path, csv_path, summary_path)


_CHILD_PLOTS = ("Paired differences", "Duration per arm")
"""The page's plots a forked child renders while this process renders the others (about
0.5 s and 0.35 s of a large report's 0.8 s of plots here)."""
_PARENT_PLOTS = ("Score per arm", "Cost vs score")


class _ChildPlots:
    """A forked child rendering some of the page's plots, sending them back (marshal)."""

    def __init__(self, pid: int, read_fd: int) -> None:
        self.pid = pid
        self.read_fd = read_fd

    def result(self) -> dict[str, str]:
        """Its plots, by title; {} if it failed in any way."""
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := os.read(self.read_fd, 1 << 20):
                chunks.append(chunk)
        ok = _wait_for(self.pid)
        self.pid = -1
        if not ok:
            return {}
        try:
            plots = marshal.loads(b"".join(chunks))
        except (EOFError, ValueError, TypeError):
            return {}
        if not isinstance(plots, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in plots.items()
        ):
            return {}
        return plots

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.read_fd)
        if self.pid > 0:
            _wait_for(self.pid)
            self.pid = -1


def _plots_alongside(report: Report) -> _ChildPlots | None:
    """Fork a child that renders _CHILD_PLOTS and sends them back; None where it
    cannot (not Linux, no fork, no pipe)."""
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        return None

    def send() -> None:
        os.close(read_fd)
        data = marshal.dumps(page.render_plots(report, _CHILD_PLOTS))
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view) :]

    pid = _alongside(send)
    os.close(write_fd)
    if pid is None:
        os.close(read_fd)
        return None
    return _ChildPlots(pid, read_fd)


def _write_file(path: Path, render: Callable[[], str]) -> None:
    """Write what `render` makes; never a half-written file under its name."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(render(), encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _alongside(write: Callable[[], None]) -> int | None:
    """Fork a child that calls `write` and exits: its pid, or None (not Linux, or no
    fork). Whether it wrote is `_wait_for`'s answer."""
    # Pays only with a second CPU free: the children take 0.65 s CPU off this process
    # (bench/README.md: cells.csv 1.0 s, the page 0.75 s). With load 8 on 2 CPUs they
    # did not: analyse 4.7 s wall with them, 3.7 s without (bench/report_scale.py,
    # medians of 6 interleaved runs, forks switched off by a patch).
    if not sys.platform.startswith("linux"):
        return None  # elsewhere forking a process that has loaded numpy is not safe
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: write and leave at once (no atexit, no flushes)
        code = 1
        try:
            write()
            code = 0
        finally:
            os._exit(code)
    return pid


def _wait_for(pid: int) -> bool:
    """Whether the forked child wrote its file."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped elsewhere: whether it wrote is unknown
            return False
        return os.waitstatus_to_exitcode(status) == 0
