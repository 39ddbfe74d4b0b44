"""Terminal tables and machine-readable output for the maka-eval command.

Text a record holds goes to the terminal through `safe_text` only: a reason or a note may
quote what a subject wrote (setup output, a healthcheck's, frame keys), and neither a
control character nor rich markup of it may act on the terminal.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from maka_eval.analysis.summary import PairedDifference, RunSummary, SubjectSummary, result_rows
from maka_eval.cli.egress import egress_summary
from maka_eval.engine.expand import Expansion
from maka_eval.engine.selection import CellState
from maka_eval.printable import visible
from maka_eval.spec.load import LoadedExperiment
from maka_eval.spec.metering import prices_summary
from maka_eval.spec.subjects import ExternalSubject, MakaSubject
from maka_eval.store.integrity import SealState
from maka_eval.store.lock import LockState

STATUS_STYLE = {
    "completed": "green",
    "subject_failed": "yellow",
    "infra_failed": "red",
    "cancelled": "magenta",
}


def safe_text(text: str, style: str = "", limit: int | None = None) -> Text:
    """`text` for the terminal: unsafe characters escaped (maka_eval.printable.visible:
    ESC as `\\x1b`, a newline as `\\n`), at most `limit` characters of that, and never
    read as rich markup ("[red]" prints as it is)."""
    shown = visible(text)
    return Text(shown if limit is None else shown[:limit], style=style)


def fmt_score(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def fmt_cost(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def _score_bar(value: float | None, width: int = 10) -> Text:
    if value is None:
        return Text("")
    filled = max(0, min(width, round(value * width)))
    return Text("█" * filled + "·" * (width - filled), style="cyan")


def subject_kind(subject: Any) -> str:
    if isinstance(subject, ExternalSubject):
        return f"external, {subject.config.result_contract}"
    if isinstance(subject, MakaSubject):
        return f"maka, {subject.config.profile}"
    return str(subject.kind)


def expansion_view(loaded: LoadedExperiment, expansion: Expansion) -> RenderableType:
    """What `validate` prints: the experiment and what it expands into."""
    spec = loaded.experiment.spec
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("experiment", f"{loaded.experiment.id}  ({loaded.form} form)")
    table.add_row(
        "benchmark",
        f"{spec.benchmark.id} {spec.benchmark.version}  "
        + (
            f"(tasks in {spec.benchmark.config.path})"
            if spec.benchmark.source == "directory"
            else "(inline tasks)"
        ),
    )
    table.add_row("executor", spec.executor.kind)
    table.add_row(
        "subjects",
        f"{len(spec.subjects)}: " + ", ".join(f"{s.id} ({subject_kind(s)})" for s in spec.subjects),
    )
    table.add_row("tasks", f"{len(spec.tasks)}: " + ", ".join(t.id for t in spec.tasks))
    table.add_row("repetitions", str(spec.repetitions))
    table.add_row(
        "task groups",
        f"{len(expansion.groups)} ({len(spec.tasks)} tasks x {spec.repetitions} repetitions), "
        f"at most {spec.execution.max_concurrent_task_groups} at once",
    )
    table.add_row(
        "cells",
        f"{len(expansion)} ({len(expansion.groups)} groups x {len(spec.subjects)} subjects)",
    )
    limits = []
    if spec.budget.max_cost_usd is not None:
        limits.append(f"${spec.budget.max_cost_usd:g}")
    if spec.budget.max_tokens is not None:
        limits.append(f"{spec.budget.max_tokens:,} tokens")
    table.add_row("budget", ", ".join(limits) or "no limit")
    table.add_row("infra retries", f"up to {spec.execution.max_infra_retries} per cell")
    egress = egress_summary(spec.executor_egress)
    if egress is not None:
        table.add_row("egress", egress)
    prices = prices_summary(spec.metering)
    if prices is not None or egress is not None:
        table.add_row("prices", prices or "none: metered usage gets no cost (spec.metering.prices)")
    return table


def subjects_table(
    subjects: Sequence[SubjectSummary], title: str = "Subjects", *, bar: bool = True
) -> Table:
    """Per-subject summary; 'paired' uses only task groups where every subject has a result;
    tokens, cost and time are those of the selected attempts ('-': none reported)."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption="tokens, cost, time: of each cell's selected attempt (the budget counts all)",
        caption_justify="left",
    )
    table.add_column("subject", style="bold", no_wrap=True)
    for name in ("n", "ok/fail", "mean ± s.e."):
        table.add_column(name, justify="right", no_wrap=True)
    if bar:
        table.add_column("", no_wrap=True)
    for name in ("paired (n)", "tokens", "cost", "time"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in subjects:
        spread = f" ± {s.sem:.3f}" if s.sem is not None else ""
        cells: list[RenderableType] = [
            safe_text(s.subject_id),
            f"{s.results}/{s.cells}",
            f"{s.completed}/{s.subject_failed}",
            f"{fmt_score(s.mean_score)}{spread}",
        ]
        if bar:
            cells.append(_score_bar(s.mean_score))
        cells += [
            f"{fmt_score(s.paired_mean_score)} ({s.paired_n})",
            f"{s.tokens:,}" if s.tokens is not None else "-",
            fmt_cost(s.cost_usd),
            f"{s.mean_duration_sec:.2f}s" if s.mean_duration_sec is not None else "-",
        ]
        table.add_row(*cells)
    return table


def cells_table(summary: RunSummary) -> Table:
    """Per-cell state and selected result."""
    table = Table(title="Cells", title_justify="left", box=box.SIMPLE_HEAD)
    for name, justify in (
        ("cell", "left"),
        ("state", "left"),
        ("status", "left"),
        ("score", "right"),
        ("tokens", "right"),
        ("cost", "right"),
        ("time", "right"),
        ("attempt", "right"),
        ("note", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=name != "note")  # type: ignore[arg-type]
    for row in summary.cells:
        record = row.selected or row.last
        kernel = record.result if record else None
        status = kernel.status.value if kernel else "-"
        note = ""
        if row.selected is None and record is not None and record.result.reason:
            note = record.result.reason
        if row.interrupted:
            note = (note + "; " if note else "") + f"{row.interrupted} interrupted"
        table.add_row(
            safe_text(row.cell_id),
            row.state.value,
            Text(status, style=STATUS_STYLE.get(status, "")),
            fmt_score(kernel.score) if row.selected and kernel else "-",
            f"{kernel.usage.total_tokens:,}" if kernel and kernel.usage else "-",
            fmt_cost(kernel.cost_usd) if kernel else "-",
            f"{kernel.duration_sec:.2f}s" if kernel else "-",
            f"{row.selected.attempt}/{row.attempts}" if row.selected else f"-/{row.attempts}",
            safe_text(note, "dim", limit=80),
        )
    return table


def status_view(summary: RunSummary, *, bar: bool = True) -> RenderableType:
    """What `status` prints."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("run", safe_text(f"{summary.run_dir}  ({summary.run_id})"))
    head.add_row("experiment", safe_text(summary.experiment.id))
    writer: RenderableType
    if summary.lock is LockState.LIVE and summary.lock_info:
        writer = safe_text(f"running: {summary.lock_info.describe()}")
    elif summary.lock is LockState.STALE and summary.lock_info:
        writer = Text("stale lock", style="red")
        writer.append_text(
            safe_text(
                f" left by {summary.lock_info.describe()}; `maka-eval unlock "
                f"{summary.run_dir}` checks no writer remains and removes it"
            )
        )
    else:
        writer = "none (not running)"
    if summary.has_writer_lock:
        head.add_row("writer", writer)
    pending = summary.count(CellState.PENDING)
    exhausted = summary.count(CellState.EXHAUSTED)
    head.add_row(
        "cells",
        f"{len(summary.cells)} total, {len(summary.results)} with a result, "
        f"{pending} still to run, {exhausted} out of infrastructure retries",
    )
    counts = ", ".join(f"{n} {status}" for status, n in sorted(summary.attempt_counts.items()))
    interrupted = sum(r.interrupted for r in summary.cells)
    extra = f", {interrupted} interrupted (writer died)" if interrupted else ""
    head.add_row("attempts", f"{summary.attempts} recorded ({counts or 'none'}){extra}")
    head.add_row("records", records_line(summary))
    budget_line = summary.budget.describe()
    if summary.budget.exhausted and pending:
        budget_line += f"  [yellow]budget reached: {pending} cell(s) will not start[/yellow]"
    head.add_row("budget (all attempts)", budget_line)
    hints = []
    if exhausted and summary.has_writer_lock:
        hints.append(
            "cells out of infrastructure retries run again only when named: "
            "maka-eval run <experiment> --out <dir> --cell <id>"
        )
    elif exhausted:  # a cluster: the operator is the writer
        hints.append(
            "cells out of infrastructure retries run again only when asked: "
            "kubectl annotate cell <name> eval.maka.dev/rerun=<token>"
        )
    if summary.damaged and summary.has_writer_lock:
        hints.append(
            "records failed verification, so `maka-eval run` refuses to resume this run: "
            "run the experiment into a new --out directory"
        )
    elif (
        pending
        and summary.has_writer_lock
        and not summary.budget.exhausted
        and summary.lock is not LockState.LIVE
    ):
        hints.append("re-run the same `maka-eval run` command to resume")
    parts: list[RenderableType] = [
        head,
        subjects_table(summary.subjects, bar=bar),
        cells_table(summary),
    ]
    parts += [Text(h, style="dim") for h in hints]
    return Group(*parts)


def results_table(summary: RunSummary, *, bar: bool = True) -> RenderableType:
    """What `results --format table` prints."""
    table = Table(
        title="Results (earliest valid attempt per cell)", title_justify="left", box=box.SIMPLE_HEAD
    )
    columns = ("cell", "status", "score", "tokens", "cost", "time", "attempt")
    for name in columns:
        table.add_column(
            name, justify="left" if name in ("cell", "status") else "right", no_wrap=True
        )
    for row in result_rows(summary):
        table.add_row(
            safe_text(row["cell"]),
            Text(row["status"], style=STATUS_STYLE.get(row["status"], "")),
            fmt_score(row["score"]),
            f"{row['totalTokens']:,}" if row["totalTokens"] is not None else "-",
            fmt_cost(row["costUsd"]),
            f"{row['durationSec']:.2f}s",
            f"{row['attempt']}/{row['attempts']}",
        )
    missing = [r.cell_id for r in summary.cells if r.selected is None]
    parts: list[RenderableType] = [table, subjects_table(summary.subjects, bar=bar)]
    if summary.damaged or not verified(summary):
        parts.append(Text.from_markup(f"records: {records_line(summary)}"))
    if missing:
        parts.append(
            safe_text(
                f"{len(missing)} cell(s) without a result: "
                + ", ".join(missing[:10])
                + (" ..." if len(missing) > 10 else ""),
                style="yellow",
            )
        )
    return Group(*parts)


def verified(summary: RunSummary) -> bool:
    """Whether the run's records are sealed and verified (a cluster's are not sealed:
    the operator alone writes them)."""
    return summary.integrity is None or summary.integrity.state is SealState.VERIFIED


def records_line(summary: RunSummary) -> str:
    """What verifying the records found, in one line (rich markup)."""
    integrity = summary.integrity
    failed = (
        f"[red]{len(summary.damaged)} FAILED VERIFICATION, left out[/red] (each is named "
        "in the warning); "
        if summary.damaged
        else ""
    )
    if integrity is None:
        return failed + "not sealed: written by the operator alone (a cluster)"
    text = escape(integrity.describe())
    if integrity.state is SealState.VERIFIED:
        return f"[green]{text}[/green]"
    if integrity.state is SealState.FAILED:
        return failed + escape("; ".join([f"{integrity.verified} verified", *integrity.notes]))
    return failed + f"[yellow]{text}[/yellow]"


def _integrity_json(summary: RunSummary) -> dict[str, Any]:
    integrity = summary.integrity
    failures = [{"where": p.where, "problem": p.message} for p in summary.damaged]
    if integrity is None:
        return {"state": "not sealed", "failures": failures}
    return {
        "state": integrity.state.value,
        "keyId": integrity.key_id,
        "verifiedRecords": integrity.verified,
        "failures": failures,
        "notes": list(integrity.notes),
    }


def _difference_json(d: PairedDifference | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"baseline": d.baseline, "n": d.n, "mean": d.mean, "sem": d.sem}


def results_json(summary: RunSummary) -> str:
    """The result map, per-subject summaries and cells without a result, as JSON."""
    subjects = [
        {
            "subject": s.subject_id,
            "cells": s.cells,
            "results": s.results,
            "completed": s.completed,
            "subjectFailed": s.subject_failed,
            "withoutResult": s.without_result,
            "meanScore": s.mean_score,
            "sem": s.sem,
            "pairedN": s.paired_n,
            "pairedMeanScore": s.paired_mean_score,
            "pairedDifference": _difference_json(s.paired_difference),
            "tokens": s.tokens,
            "costUsd": s.cost_usd,
            "meanDurationSec": s.mean_duration_sec,
        }
        for s in summary.subjects
    ]
    body = {
        "experiment": summary.experiment.id,
        "runId": summary.run_id,
        "cells": result_rows(summary),
        "withoutResult": [
            {"cell": r.cell_id, "state": r.state.value, "attempts": r.attempts}
            for r in summary.cells
            if r.selected is None
        ],
        "subjects": subjects,
        # What every attempt spent (failed, retried, cancelled too): the shared budget.
        # Per-subject tokens and costUsd above count selected attempts only.
        "budget": {
            "counts": "every attempt",
            "maxCostUsd": summary.budget.max_cost_usd,
            "maxTokens": summary.budget.max_tokens,
            "spentCostUsd": summary.budget.spent_cost_usd,
            "spentTokens": summary.budget.spent_tokens,
            "exhausted": summary.budget.exhausted,
        },
        # What verifying the records found: failed ones are not in `cells`.
        "integrity": _integrity_json(summary),
    }
    return json.dumps(body, indent=2)


def results_csv(summary: RunSummary) -> str:
    """One CSV row per cell with a selected result."""
    rows = result_rows(summary)
    out = io.StringIO()
    fields = list(rows[0]) if rows else ["cell", "task", "repetition", "subject", "status", "score"]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
