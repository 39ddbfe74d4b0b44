"""`maka-eval report` at scale: 100,000 attempt records, read back through the store.

The run directory is synthesized in the store's own format: experiment.json is written
by the store's writer (`RunWriter.open`), and every attempt is an `AttemptRecord` sealed
as the writer seals it (`store.seal.seal_record`) at the path the writer reserves
(`cells/<task>/<rep>/<subject>/attempts/NNNN.json`, next to its attempt folder), created
exclusively and read-only as the writer creates it, and listed in the run's ledger (its
head in the key folder) by the writer's own `LedgerWriter`. The one thing skipped is the
writer's fsync per record and per ledger line, which only makes the synthesis slow, not
the files different. The seal key is made in `<dir>-keys` next to the run (never the
user's key folder), and the measuring process is given it with MAKA_EVAL_KEY_DIR: the
read verifies every seal and the whole ledger, as `maka-eval report` does.

The experiment: 2,000 tasks x 15 repetitions x 3 subjects = 90,000 cells. 8,000 cells
lose one attempt to the infrastructure, 700 lose two, and 300 lose three and are out of
retries (maxInfraRetries 2): 90,000 + 8,000 + 1,400 + 600 = 100,000 attempts. Loss is
made likelier for long attempts (as it is in practice), so the report's loss warning
has something to say. Scores: alpha and beta 0/1 (task difficulty shared), gamma graded
in quarters; gamma's cost is unknown on a tenth of its attempts.

The report is then built in a fresh process (so its peak memory is its own), through
`RunDirectorySource` (the store's reader, `read_run`), `summarize_source`, and
`build_report` with the default 10,000 bootstrap resamples (each interval resamples
the 2,000 tasks: the arms' mean scores, the pairs' differences, and pass@k for k = 1, 2,
5, 10 and 15 of each arm), and written: summary.json
and cells.csv, then report.html with its four plots, timed separately. Printed: wall
time per phase, the total with and without the page, and peak memory (ru_maxrss), of
the report's process and of the reader's helper process (a large run is read by two).
Targets: < 10 s and < 1 GB.

    .venv/bin/python bench/report_scale.py                      # synthesize in a temp dir
    .venv/bin/python bench/report_scale.py --dir /tmp/scale     # keep it; reused next time
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from maka_eval import __version__
from maka_eval.contract.kernel import ResultKernel
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage
from maka_eval.executors.load import experiment_from_data
from maka_eval.store.ledger import LedgerWriter
from maka_eval.store.run_store import AttemptSlot, RunIdentity, RunWriter, cell_path, read_run
from maka_eval.store.seal import KEY_DIR_ENV, heads_dir, key_dir, seal_record, signing_key

TASKS = 2_000
REPETITIONS = 15
SUBJECTS = ("alpha", "beta", "gamma")
LOSSES = {1: 8_000, 2: 700, 3: 300}  # infra failures per cell -> how many cells
TARGET_SEC = 10.0
TARGET_MB = 1024.0
MARKER = ".bench-report-scale.json"


def experiment_document() -> dict[str, object]:
    return {
        "schemaVersion": "maka.eval.v1",
        "id": "report-scale",
        "benchmark": {"id": "synthetic", "version": "1", "kind": "directory"}
        | {"config": {"path": "tasks"}},
        "executor": {"kind": "local"},
        "execution": {"maxConcurrentTaskGroups": 16, "maxInfraRetries": 2},
        "subjects": [
            {"id": s, "kind": "external", "config": {"command": "true"}} for s in SUBJECTS
        ],
        "tasks": [{"id": f"task-{i:04d}"} for i in range(TASKS)],
        "repetitions": REPETITIONS,
        "budget": {},
        "verifier": {"kind": "harbor"},
    }


def _write_exclusive(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def synthesize(run_dir: Path, seed: int = 7) -> int:
    """Write the run directory; returns the number of attempt records."""
    experiment, _ = experiment_from_data(experiment_document(), "bench")
    digests = {t.id: "sha256:00" for t in experiment.spec.tasks}
    identity = RunIdentity(experiment.canonical(), digests)
    writer = RunWriter.open(run_dir, identity, __version__)  # experiment.json, the ledger
    run_id = writer.run_id
    writer.close()
    key = signing_key(key_dir())
    # The writer's own ledger writer, on the ledger RunWriter.open started, without the
    # fsync per line (as the records below are written without theirs).
    state = read_run(run_dir).ledger
    assert state is not None
    ledger = LedgerWriter.reopen(run_dir, run_id, key, state, heads_dir(key_dir()), durable=False)
    rng = random.Random(seed)
    difficulty = [rng.random() for _ in range(TASKS)]
    cells = [(t, r, s) for r in range(1, REPETITIONS + 1) for t in range(TASKS) for s in SUBJECTS]
    durations = {
        cell: rng.lognormvariate(4.0 + (0.4 if cell[2] == "gamma" else 0.0), 0.8) for cell in cells
    }
    # Weighted sampling without replacement: longer attempts are likelier to be lost.
    ranked = sorted(cells, key=lambda c: rng.random() ** (1.0 / durations[c]), reverse=True)
    failures: dict[tuple[int, int, str], int] = {}
    position = 0
    for count, how_many in LOSSES.items():
        for cell in ranked[position : position + how_many]:
            failures[cell] = count
        position += how_many
    start = datetime(2026, 1, 5, 9, tzinfo=UTC)
    written = 0
    for task, rep, subject in cells:
        task_id = f"task-{task:04d}"
        cell_dir = run_dir / cell_path(task_id, rep, subject)
        (cell_dir / "attempts").mkdir(parents=True)
        lost = failures.get((task, rep, subject), 0)
        numbers = lost + (1 if lost < 3 else 0)
        for number in range(1, numbers + 1):
            infra = number <= lost
            duration = durations[task, rep, subject] * (0.5 if infra else 1.0)
            record = _record(
                run_id, task_id, rep, subject, number, infra, duration, difficulty[task], rng
            )
            began = start + timedelta(seconds=written)
            record = replace(
                record, started_at=began, finished_at=began + timedelta(seconds=duration)
            )
            slot = AttemptSlot(cell_dir, number)
            slot.artifacts_dir.mkdir()
            data, seal = seal_record(key, record)
            _write_exclusive(slot.record_path, data)
            ledger.append(record.cell_id, record.attempt, seal)
            written += 1
    ledger.close()
    marker = {"records": written, "seed": seed, "sealed": True}
    (run_dir / MARKER).write_text(json.dumps(marker))
    return written


def _record(
    run_id: str,
    task_id: str,
    rep: int,
    subject: str,
    number: int,
    infra: bool,
    duration: float,
    difficulty: float,
    rng: random.Random,
) -> AttemptRecord:
    input_tokens = int(duration * rng.uniform(200, 400))
    usage = Usage(
        input_tokens=input_tokens,
        cached_input_tokens=int(input_tokens * rng.uniform(0.5, 3.0)),
        cache_write_tokens=int(input_tokens * 0.1),
        output_tokens=int(duration * rng.uniform(20, 60)),
    )
    cost: float | None = round(usage.input_tokens * 3e-7 + usage.output_tokens * 1.2e-6, 8)
    if subject == "gamma" and rng.random() < 0.1:
        cost = None
    if infra:
        status, score, source = AttemptStatus.INFRA_FAILED, None, StatusSource.INFRASTRUCTURE
    else:
        skill = {"alpha": 0.15, "beta": 0.0, "gamma": 0.05}[subject]
        solved = rng.random() < min(0.98, max(0.02, 1.0 - difficulty + skill))
        if subject == "gamma":
            score = round(min(1.0, max(0.0, (1.0 - difficulty) + rng.gauss(0, 0.25))) * 4) / 4
        else:
            score = 1.0 if solved else 0.0
        status = AttemptStatus.COMPLETED if score >= 0.5 else AttemptStatus.SUBJECT_FAILED
        source = StatusSource.FRAME
    return AttemptRecord(
        run_id=run_id,
        experiment_id="report-scale",
        cell_id=f"{task_id}::{rep}::{subject}",
        task_id=task_id,
        repetition=rep,
        subject_id=subject,
        attempt=number,
        attempt_id=f"{run_id}/{task_id}/{rep}/{subject}/{number}",
        trigger=Trigger.SCHEDULED if number == 1 else Trigger.RETRY,
        started_at=datetime(2026, 1, 5, tzinfo=UTC),
        subject_started_at=None,
        finished_at=datetime(2026, 1, 5, tzinfo=UTC),
        result=ResultKernel(
            status=status,
            score=score,
            usage=usage,
            cost_usd=cost,
            duration_sec=round(duration, 3),
            artifacts=(),
            status_source=source,
        ),
        timings={"subjectSec": round(duration * 0.9, 3)},
        host="bench",
        maka_eval_version=__version__,
    )


def measure(run_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Build and write the report, timing each phase (run in a fresh process)."""
    from maka_eval.analysis.page import render_page
    from maka_eval.analysis.report_files import build_and_write_report
    from maka_eval.analysis.source import RunDirectorySource
    from maka_eval.analysis.summary import summarize_source

    figures: dict[str, Any] = {}
    clock: list[tuple[float, float]] = [(time.perf_counter(), time.process_time())]

    def lap(name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        figures[name] = wall - clock[-1][0]
        figures[name + "_cpu"] = cpu - clock[-1][1]
        clock.append((wall, cpu))

    source = RunDirectorySource(run_dir)
    lap("read")
    helper = resource.getrusage(resource.RUSAGE_CHILDREN)  # the reader's helper process
    figures["read_helper_cpu"] = helper.ru_utime + helper.ru_stime
    figures["helper_peak_mb"] = helper.ru_maxrss / 1024  # the only child so far
    summary = summarize_source(source)
    lap("summarize")
    # As `maka-eval report` does: cells.csv is written by a forked child while the arms
    # are compared, then the page by another while this process writes summary.json
    # (the children's CPU time is read from RUSAGE_CHILDREN).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    report, written = build_and_write_report([source], out_dir, summaries=[summary])
    lap("analyse_write")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures["write_child_cpu"] = (after.ru_utime + after.ru_stime) - (
        before.ru_utime + before.ru_stime
    )
    page = written.html.read_text(encoding="utf-8") if written.html else ""
    started = time.perf_counter(), time.process_time()
    render_page(report)  # alone, untimed in the total: what the page costs by itself
    figures["page_alone"] = time.perf_counter() - started[0]
    figures["page_alone_cpu"] = time.process_time() - started[1]
    figures["records"] = sum(len(r) for r in source.records().values())
    integrity = source.integrity()
    assert integrity is not None and integrity.state.value == "verified", integrity
    figures["integrity"] = f"{integrity.verified:,} verified, key {integrity.key_id}"
    figures["html_bytes"] = len(page.encode())
    figures["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # The largest child's peak: a writing child if it outgrew the helper (its resident
    # set counts the pages it shares with this process, copy-on-write).
    figures["children_peak_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    figures["arms"] = len(report.arms)
    figures["pairs"] = len(report.pairs)
    figures["loss_warnings"] = len(report.loss_warnings)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, help="keep the synthetic run here (reused)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # the child: measure only, print JSON
        print(json.dumps(measure(args.measure, args.out)))
        return
    temporary = None
    if args.dir is None:
        temporary = Path(tempfile.mkdtemp(prefix="report-scale-"))
        run_dir = temporary / "run"
    else:
        run_dir = args.dir
    # The run's own key folder, next to it: the measuring child inherits it.
    os.environ[KEY_DIR_ENV] = str(run_dir.parent / (run_dir.name + "-keys"))
    try:
        if (run_dir / MARKER).is_file():
            marker = json.loads((run_dir / MARKER).read_text())
            if not marker.get("sealed"):
                sys.exit(f"{run_dir} holds unsealed records (an older synthesis); remove it")
            records = marker["records"]
            print(f"reusing {run_dir}: {records:,} sealed attempt records")
        else:
            if run_dir.exists():
                sys.exit(f"{run_dir} exists and is not a synthesized run; name another --dir")
            t = time.perf_counter()
            records = synthesize(run_dir)
            print(f"synthesized {records:,} attempt records in {time.perf_counter() - t:.1f} s")
        out_dir = run_dir.parent / (run_dir.name + "-report")
        shutil.rmtree(out_dir, ignore_errors=True)
        child = subprocess.run(
            [sys.executable, __file__, "--measure", str(run_dir), "--out", str(out_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode != 0:
            sys.exit(child.stderr)
        f = json.loads(child.stdout.strip().splitlines()[-1])
        phases = ("read", "summarize", "analyse_write")
        total = sum(f[p] for p in phases)
        total_cpu = sum(f[p + "_cpu"] for p in phases) + f["read_helper_cpu"]
        total_cpu += f["write_child_cpu"]

        def row(label: str, key: str) -> str:
            return f"{label:<48}{f[key]:7.2f} s wall {f[key + '_cpu']:7.2f} s CPU"

        print(f"records read back: {int(f['records']):,} ({f['integrity']})")
        print(
            row("read and verify (RunDirectorySource)", "read")
            + f" + {f['read_helper_cpu']:.2f} s CPU in its helper"
        )
        print(row("summarize (selection, cell states)", "summarize"))
        arms_pairs = f"{int(f['arms'])}+{int(f['pairs'])}"
        print(
            row(f"analyse (bootstrap 10,000 x {arms_pairs} + pass@k), write", "analyse_write")
            + f" + {f['write_child_cpu']:.2f} s CPU in 2 children"
        )
        print(
            f"  (summary.json; cells.csv and report.html ({f['html_bytes'] / 1024:.0f} KiB) "
            "by forked children)"
        )
        print(row("  (the page with its 4 plots alone, not in total)", "page_alone"))
        verdict_time = "PASS" if total < TARGET_SEC else "MISS"
        print(
            f"{'total':<48}{total:7.2f} s wall {total_cpu:7.2f} s CPU"
            f"  (target < {TARGET_SEC:.0f} s: {verdict_time})"
        )
        # An upper bound: the report's peak plus its largest child's (the helper and the
        # page's child never run at once), as if both peaks fell at the same moment.
        peak_mb = f["peak_mb"] + max(f["helper_peak_mb"], f["children_peak_mb"])
        verdict_memory = "PASS" if peak_mb < TARGET_MB else "MISS"
        print(
            f"{'peak memory (ru_maxrss): report + largest child':<48}{peak_mb:7.0f} MB"
            f"  = {f['peak_mb']:.0f} + max(helper {f['helper_peak_mb']:.0f}, "
            f"writing child {f['children_peak_mb']:.0f})"
            f"  (target < {TARGET_MB:.0f} MB: {verdict_memory})"
        )
        print(f"{'loss warnings raised':<48}{int(f['loss_warnings']):7d}")
        print(
            f"{'machine load (1-min average)':<48}{os.getloadavg()[0]:7.2f} "
            f"on {os.cpu_count()} CPUs"
        )
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    main()
