"""Where a run stands (complete or not) and what differs between two runs.

A run is complete when no cell is still to run and no writer holds or left the lock; a
run in progress, interrupted or stopped by its budget is partial, and every figure of
its report is about the cells that have a result so far.

Two runs are two occasions, never a paired design: their arms did not start together,
so anything that changed between them (the benchmark, the execution policy, a subject's
configuration, the maka-eval version, the date) is confounded with the comparison. The
frozen experiment documents say what changed; each difference is named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from maka_eval.analysis.source import AttemptSource, RunDirectorySource
from maka_eval.analysis.summary import RunSummary
from maka_eval.engine.selection import CellState
from maka_eval.errors import Problem
from maka_eval.store.integrity import Integrity
from maka_eval.store.lock import LockState


class RunState(StrEnum):
    """How far a run got."""

    COMPLETE = "complete"
    RUNNING = "in progress"
    INTERRUPTED = "interrupted"
    STOPPED_BY_BUDGET = "stopped by its budget"


@dataclass(frozen=True)
class RunInfo:
    """One run as the report describes it."""

    label: str
    location: str
    run_id: str
    experiment_id: str
    state: RunState
    detail: str
    """One sentence saying why the run is in that state and what to do."""
    cells: int
    with_result: int
    pending: int
    exhausted: int
    damaged: int
    started_at: datetime | None
    """When the run was created (its run document), else its earliest attempt."""
    versions: tuple[str, ...]
    """maka-eval versions that wrote the run (its run document and its records)."""
    document: Mapping[str, Any]
    """The frozen canonical experiment."""
    task_digests: Mapping[str, str]
    """Task content digests, where the store keeps them (a run directory)."""
    integrity: Integrity | None = None
    """What verifying the records' seals found (None: a store that does not seal)."""
    problems: tuple[Problem, ...] = ()
    """What failed verification, each naming its file (`damaged` counts them)."""

    @property
    def partial(self) -> bool:
        return self.state is not RunState.COMPLETE


def run_info(source: AttemptSource, summary: RunSummary, label: str = "") -> RunInfo:
    """Describe a run from its source and its summary."""
    pending = summary.count(CellState.PENDING)
    exhausted = summary.count(CellState.EXHAUSTED)
    with_result = len(summary.results)
    if summary.lock is LockState.LIVE:
        who = summary.lock_info.describe() if summary.lock_info else "a writer"
        state, detail = RunState.RUNNING, f"a writer is running ({who}); results are partial"
    elif summary.lock is LockState.STALE:
        state, detail = (
            RunState.INTERRUPTED,
            f"its writer died (stale lock); {pending} cell(s) still to run: "
            f"`maka-eval unlock {summary.run_dir}`, then run again to resume",
        )
    elif pending and summary.budget.exhausted:
        state, detail = (
            RunState.STOPPED_BY_BUDGET,
            f"the budget is reached ({summary.budget.describe()}); {pending} cell(s) will not run",
        )
    elif pending and not summary.has_writer_lock:
        state, detail = (
            RunState.RUNNING,
            f"the operator is still running it: {pending} cell(s) without a result yet",
        )
    elif pending and summary.damaged and summary.has_writer_lock:
        state, detail = (
            RunState.INTERRUPTED,
            f"{pending} cell(s) without a result; its records failed verification, so it "
            "cannot be resumed: run the experiment into a new --out directory",
        )
    elif pending:
        state, detail = (
            RunState.INTERRUPTED,
            f"{pending} cell(s) still to run; re-run the same `maka-eval run` command to resume",
        )
    else:
        state, detail = RunState.COMPLETE, "every cell has a result or is out of retries"
    document: Mapping[str, Any] = {}
    created: datetime | None = None
    versions: set[str] = set()
    if isinstance(source, RunDirectorySource):
        document = source.document
        created = _timestamp(document.get("createdAt"))
        if isinstance(document.get("makaEvalVersion"), str):
            versions.add(document["makaEvalVersion"])
    records = [r for row in summary.cells for r in row.records]
    versions |= {r.maka_eval_version for r in records if r.maka_eval_version}
    if created is None and records:
        created = min(r.started_at for r in records)
    digests = document.get("taskDigests")
    return RunInfo(
        label=label,
        location=summary.run_dir,
        run_id=summary.run_id,
        experiment_id=summary.experiment.id,
        state=state,
        detail=detail,
        cells=len(summary.cells),
        with_result=with_result,
        pending=pending,
        exhausted=exhausted,
        damaged=len(summary.damaged),
        started_at=created,
        versions=tuple(sorted(versions)),
        document=summary.experiment.canonical(),
        task_digests=dict(digests) if isinstance(digests, Mapping) else {},
        integrity=summary.integrity,
        problems=summary.damaged,
    )


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _changes(old: Any, new: Any, path: str) -> Iterator[str]:
    """'path: old -> new' for every leaf that differs (lists compared whole)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                yield f"{sub}: only in B ({_short(new[key])})"
            elif key not in new:
                yield f"{sub}: only in A ({_short(old[key])})"
            else:
                yield from _changes(old[key], new[key], sub)
    elif old != new:
        yield f"{path}: {_short(old)} -> {_short(new)}"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_differences(a: RunInfo, b: RunInfo) -> list[str]:
    """What differs between two runs' frozen experiments, versions and dates (A -> B)."""
    found: list[str] = []
    for part in ("benchmark", "executor", "execution", "verifier", "budget", "repetitions"):
        found += _changes(a.document.get(part), b.document.get(part), part)
    subjects_a = {s["id"]: s for s in a.document.get("subjects", ())}
    subjects_b = {s["id"]: s for s in b.document.get("subjects", ())}
    for subject in subjects_a.keys() & subjects_b.keys():
        found += _changes(subjects_a[subject], subjects_b[subject], f"subjects.{subject}")
    tasks_a = [t["id"] for t in a.document.get("tasks", ())]
    tasks_b = [t["id"] for t in b.document.get("tasks", ())]
    only_a = [t for t in tasks_a if t not in set(tasks_b)]
    only_b = [t for t in tasks_b if t not in set(tasks_a)]
    if only_a or only_b:
        found.append(
            f"tasks: {len(only_a)} only in A ({_names(only_a)}), "
            f"{len(only_b)} only in B ({_names(only_b)}); they cannot be paired"
        )
    changed = sorted(
        t
        for t in set(a.task_digests) & set(b.task_digests)
        if a.task_digests[t] != b.task_digests[t]
    )
    if changed:
        found.append(f"task content: {len(changed)} task(s) changed ({_names(changed)})")
    if a.versions != b.versions:
        found.append(
            f"maka-eval version: {', '.join(a.versions) or 'unknown'} -> "
            f"{', '.join(b.versions) or 'unknown'}"
        )
    if a.started_at and b.started_at and a.started_at.date() != b.started_at.date():
        found.append(
            f"start date: {a.started_at.date().isoformat()} -> {b.started_at.date().isoformat()}"
        )
    return found


def _names(items: list[str], limit: int = 5) -> str:
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
