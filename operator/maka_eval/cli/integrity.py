"""What the commands say about attempt records that fail verification.

Records that fail verification are named on stderr and left out of what is printed,
and the command then exits 3 (`VERIFICATION_FAILED`); a run whose records cannot be
verified here is said to be so. Shared by `status`, `results`, `report` and `plan`.
"""

from __future__ import annotations

import typer
from rich.markup import escape

from maka_eval.analysis.source import AttemptSource
from maka_eval.analysis.summary import RunSummary, summarize_source
from maka_eval.cli.console import err
from maka_eval.store.integrity import SealState

VERIFICATION_FAILED = 3
"""The exit code when attempt records failed verification (see the module's doc)."""

DIRECTORY_DAMAGE = (
    "maka-eval never rewrites a record: they were tampered with after they were "
    "written, and a writer refuses to resume this run"
)


def summarize(source: AttemptSource, why: str) -> RunSummary:
    """Summarize a source; records that fail verification are warned about (stderr,
    each named, with `why`) and left out; an unverifiable run is said to be so."""
    summary = summarize_source(source)
    integrity = summary.integrity
    if summary.damaged:
        err.print(
            f"[red]warning:[/red] {len(summary.damaged)} attempt record(s) in "
            f"{summary.run_dir} FAILED VERIFICATION and are left out of these results "
            f"({why}):",
            highlight=False,
            soft_wrap=True,
        )
        for problem in summary.damaged:
            err.print(f"  - {problem}", highlight=False, markup=False, soft_wrap=True)
    if integrity is not None and integrity.state in (SealState.UNVERIFIED, SealState.UNSIGNED):
        err.print(
            f"[yellow]warning:[/yellow] {escape(summary.run_dir)}: {escape(integrity.describe())}",
            highlight=False,
            soft_wrap=True,
        )
    return summary


def exit_if_failed(*summaries: RunSummary) -> None:
    """Exit 3 (after everything else is printed) when records failed verification."""
    if any(summary.damaged for summary in summaries):
        raise typer.Exit(VERIFICATION_FAILED)


CLUSTER_DAMAGE = (
    "their Attempt's spec or status.result does not parse, or its Cell disagrees; "
    "`kubectl get attempt -n NAMESPACE NAME -o yaml` shows one"
)
