"""Per-attempt overhead of the local executor, side by side with Inspect AI.

The workload is N cells that do nothing: one Harbor-format task repeated N times
against one external subject that runs ``true``, verified by a ``tests/test.sh``
that only writes a reward of 1.  It runs in-process through ``LocalRun`` once per
concurrency (``execution.maxConcurrentTaskGroups``), each into a fresh run
directory, and then, in the same invocation, the same workload runs through
Inspect AI (``bench/peers/inspect_noop.py``: ``sandbox="local"``,
``mockllm/model``, solver and scorer each exec ``true``, ``max_sandboxes``
unset) in Inspect's own virtual environment.

Definitions (maka-eval):

* ``wall_s``: wall time of ``LocalRun.run()`` alone (prerequisite checks,
  opening the run directory, every attempt, closing).  ``cells_per_s`` is
  ``cells / wall_s``.
* Per-attempt overhead, cycle-based (reported at concurrency 1): an event
  sink stamps ``time.perf_counter()`` at every ``AttemptFinished``, which the
  executor emits after the attempt's record has been durably committed
  (fsync'd file and directory).  With one attempt at a time the cycle of
  attempt i is the gap between stamps i-1 and i; it holds everything the
  executor does for one cell: scheduling, reserving the attempt slot,
  preparing the workspace, the subject, the verifier, cleanup, storing
  artifacts and committing the record.  Overhead_i is cycle_i minus
  ``subjectSec + verifierSec`` from attempt i's record.  The first attempt
  has no predecessor and is skipped.
* In-relay overhead (reported at every concurrency): ``totalSec - subjectSec
  - verifierSec`` from each record, i.e. prepare and cleanup time inside the
  attempt only; it leaves out scheduling, artifact storage and the record
  commit.  Above concurrency 1 cycles overlap, so only this figure and
  cells/s are reported, and like Inspect's per-sample figures it then
  measures latency under load (threads waiting for the GIL and the CPUs),
  not CPU cost.

Inspect's figures are defined in ``bench/peers/inspect_noop.py``: per-sample
overhead is the ``SampleInit`` to ``SampleEnd`` hook window minus the time
spent awaiting the two ``sandbox().exec`` calls; samples/s is samples over
the wall time of the ``eval()`` call.

Every maka-eval run is checked afterwards: the run directory must hold
exactly one durable record per cell (read back with ``read_run``), every one
``completed``, and no interrupted attempt; anything else is an error.  The
verdicts are printed, but the exit status is 0 whatever they say: this is a
benchmark, not a test.

    .venv/bin/python bench/local_overhead.py                  # 500 cells, 1 and 16
    .venv/bin/python bench/local_overhead.py --cells 100 --concurrency 4 --skip-inspect
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maka_eval import __version__ as MAKA_EVAL_VERSION
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.status import AttemptStatus
from maka_eval.executors.load import load_experiment_text
from maka_eval.local.events import AttemptFinished, Event
from maka_eval.local.executor import LocalRun
from maka_eval.spec.load import LoadedExperiment
from maka_eval.spec.task_directory import TaskDefinition, load_tasks
from maka_eval.store.run_store import read_run

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR / "peers"))
import inspect_env  # noqa: E402 - stdlib-only module next to the peer workload

INSPECT_VENV = BENCH_DIR / ".venv-inspect"
INSPECT_NOOP = BENCH_DIR / "peers" / "inspect_noop.py"

TASK_ID = "noop"
SUBJECT_ID = "noop"

# The verifier must write a reward: a verifier that exits without reward.json or
# reward.txt is "no reward", which the executor records as an infrastructure failure
# (and retries), never as a zero.  So the no-op verifier writes a constant 1.
TEST_SH = """#!/bin/sh
echo 1 > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"
"""

# Targets from the product requirement; Inspect is measured in the same run.
TARGET_THROUGHPUT_RATIO = 1.5
TARGET_CONCURRENCY = 16
OVERHEAD_CONCURRENCY = 1
MAX_SLOWDOWN = 0.10  # against the baseline ref, single-arm, measured side by side


# -- the workload -----------------------------------------------------------------------
def experiment_text(
    cells: int,
    concurrency: int,
    arms: int = 1,
    isolation: str = "none",
    subject: tuple[str, ...] = ("true",),
) -> str:
    """The bare-form experiment: 1 task x `cells / arms` repetitions x `arms` no-op
    subjects (every task group has `arms` arms; `cells` cells in all)."""
    document = {
        "schemaVersion": "maka.eval.v1",
        "id": f"local-overhead-a{arms}-c{concurrency}",
        "benchmark": {
            "id": "local-overhead",
            "version": "1",
            "kind": "directory",
            "config": {"path": "tasks"},
        },
        "tasks": [{"id": TASK_ID}],
        "subjects": [
            {
                "id": SUBJECT_ID if arms == 1 else f"{SUBJECT_ID}-{i}",
                "kind": "external",
                "config": {
                    "command": subject[0],
                    "args": list(subject[1:]),
                    "resultContract": "exit-code",
                },
            }
            for i in range(arms)
        ],
        "repetitions": cells // arms,
        "executor": {"kind": "local", "config": {"isolation": isolation}},
        "execution": {"maxConcurrentTaskGroups": concurrency},
        "verifier": {"kind": "harbor", "config": {"scoreKey": "reward"}},
    }
    return json.dumps(document, indent=2) + "\n"


def write_task(root: Path) -> None:
    """One Harbor-format task directory: an instruction and a verifier, no environment."""
    task = root / "tasks" / TASK_ID
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Do nothing.\n", encoding="utf-8")
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text(TEST_SH, encoding="utf-8")
    test_sh.chmod(0o755)


def load_workload(
    root: Path,
    cells: int,
    concurrency: int,
    arms: int = 1,
    isolation: str = "none",
    subject: tuple[str, ...] = ("true",),
) -> tuple[LoadedExperiment, dict[str, TaskDefinition]]:
    """Write the experiment next to the task folder and load both as `maka-eval run` would."""
    text = experiment_text(cells, concurrency, arms, isolation, subject)
    source = root / f"experiment-a{arms}-c{concurrency}.json"
    source.write_text(text, encoding="utf-8")
    loaded = load_experiment_text(text, str(source), root)
    return loaded, load_tasks(loaded.experiment, loaded.base_dir)


# -- measuring maka-eval ----------------------------------------------------------------
class FinishStamps:
    """Event sink: the perf_counter time of every AttemptFinished, with its record."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished: list[tuple[float, AttemptRecord, bool]] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, AttemptFinished):
            stamp = time.perf_counter()
            with self._lock:
                self.finished.append((stamp, event.record, event.will_retry))


@dataclass
class MakaResult:
    """One maka-eval run of the workload and what was measured."""

    cells: int
    concurrency: int
    wall_s: float
    run_dir: Path
    arms: int = 1
    cpu_s: float = 0.0
    cycle_overhead_s: list[float] = field(default_factory=list)
    relay_overhead_s: list[float] = field(default_factory=list)
    phases_s: dict[str, list[float]] = field(default_factory=dict)
    execution_s: list[float] = field(default_factory=list)

    @property
    def cells_per_s(self) -> float:
        return self.cells / self.wall_s


def _execution_sec(record: AttemptRecord) -> float:
    """The subject's and the verifier's time from the record."""
    return record.timings["subjectSec"] + record.timings["verifierSec"]


def check_durable(run_dir: Path, cells: int) -> None:
    """Read the run back from disk: one completed record per cell, nothing interrupted."""
    contents = read_run(run_dir)
    problems = [str(p) for p in contents.damaged]
    if len(contents.records) != cells:
        problems.append(f"{len(contents.records)} cells have records, expected {cells}")
    for cell_id, records in sorted(contents.records.items()):
        if len(records) != 1:
            problems.append(f"{cell_id}: {len(records)} records, expected 1")
        bad = [r for r in records if r.status is not AttemptStatus.COMPLETED]
        if bad:
            problems.append(
                f"{cell_id}: attempt {bad[0].attempt} is {bad[0].status.value} "
                f"({bad[0].result.reason})"
            )
    if contents.interrupted:
        problems.append(f"{len(contents.interrupted)} cells have interrupted attempts")
    if problems:
        shown = "\n  ".join(problems[:10])
        raise SystemExit(f"local-overhead: the run in {run_dir} is not what was asked:\n  {shown}")


def run_maka(
    root: Path,
    cells: int,
    concurrency: int,
    arms: int = 1,
    isolation: str = "none",
    tag: str = "",
    subject: tuple[str, ...] = ("true",),
) -> MakaResult:
    """Run the workload once into a fresh run directory under `root`."""
    loaded, tasks = load_workload(root, cells, concurrency, arms, isolation, subject)
    run_dir = root / f"run-a{arms}-c{concurrency}{tag}"
    sink = FinishStamps()
    cpu0 = time.process_time()
    started = time.perf_counter()
    report = LocalRun(loaded, tasks, run_dir, events=sink).run()
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu0

    if report.cancelled or report.attempts != cells or len(sink.finished) != cells:
        raise SystemExit(
            f"local-overhead: expected {cells} attempts, the run made {report.attempts} "
            f"({len(sink.finished)} AttemptFinished events, cancelled={report.cancelled})"
        )
    if any(again for _, _, again in sink.finished):
        raise SystemExit("local-overhead: an attempt asked for a retry (infrastructure failure)")
    check_durable(run_dir, cells)

    result = MakaResult(cells, concurrency, wall_s, run_dir, arms, cpu_s)
    finished = sorted(sink.finished, key=lambda item: item[0])
    if concurrency == 1:
        # One group at a time: a group's cycle runs from the previous group's last record
        # to its own last record; what it spends beyond its slowest arm's execution is
        # overhead, shared by its `arms` attempts.
        groups: dict[int, list[tuple[float, AttemptRecord]]] = {}
        for stamp, record, _ in finished:
            groups.setdefault(record.repetition, []).append((stamp, record))
        ends = sorted(
            (max(st for st, _ in members), max(_execution_sec(r) for _, r in members))
            for members in groups.values()
        )
        for (before, _), (end, slowest) in itertools.pairwise(ends):
            result.cycle_overhead_s.append(((end - before) - slowest) / arms)
    records = [record for _, record, _ in finished]
    result.relay_overhead_s = [r.timings["totalSec"] - _execution_sec(r) for r in records]
    result.execution_s = [_execution_sec(r) for r in records]
    for name in ("prepareSec", "subjectSec", "verifierSec", "cleanupSec", "totalSec"):
        result.phases_s[name] = [r.timings[name] for r in records]
    return result


def run_baseline(ref: str, cells: int, concurrencies: list[int]) -> dict[str, Any]:
    """Run REF's own benchmark (single-arm, maka-eval only) from a git worktree, in this
    invocation, and return its JSON summary: the before of a before/after comparison."""
    repo = BENCH_DIR.parent
    tree = Path(tempfile.mkdtemp(prefix="maka-baseline-"))
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(tree), ref],
        check=True,
    )
    try:
        env = {**os.environ, "PYTHONPATH": str(tree / "operator")}
        proc = subprocess.run(
            [
                sys.executable,
                str(tree / "bench" / "local_overhead.py"),
                "--skip-inspect",
                "--json",
                "--cells",
                str(cells),
                "--concurrency",
                ",".join(map(str, concurrencies)),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"local-overhead: the baseline {ref} failed:\n{proc.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(lines[-1])
        result["ref"] = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", ref],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return result
    finally:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False
        )


# -- measuring Inspect AI ---------------------------------------------------------------
def run_inspect(python: Path, samples: int, concurrency: int) -> dict[str, Any]:
    """Run the Inspect peer workload in its own interpreter and return its result line."""
    proc = subprocess.run(
        [
            str(python),
            str(INSPECT_NOOP),
            "--samples",
            str(samples),
            "--concurrency",
            str(concurrency),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise SystemExit(
            f"local-overhead: the Inspect peer failed (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# -- reporting --------------------------------------------------------------------------
def p95(values: list[float]) -> float:
    """The 95th percentile (interpolated, inclusive), as inspect_noop.py computes it."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _dist_ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": ms(statistics.median(values)), "p95": ms(p95(values))}


def summary(
    cells: int,
    maka: dict[tuple[int, int], MakaResult],
    inspect: dict[int, dict[str, Any]],
    baseline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The machine-readable result: figures per (arms, concurrency) and the verdicts.

    Inspect has no task groups; it is compared at the same total cell count and the same
    number of executions in flight (groups x arms).
    """
    rows = []
    for (arms, c), m in maka.items():
        peer = inspect.get(c * arms)
        row: dict[str, Any] = {
            "arms": arms,
            "concurrency": c,
            "in_flight": c * arms,
            "maka_eval": {
                "wall_s": round(m.wall_s, 4),
                "cpu_s": round(m.cpu_s, 3),
                "cpu_ms_per_cell": round(1e3 * m.cpu_s / m.cells, 3),
                "cells_per_s": round(m.cells_per_s, 2),
                "cycle_overhead_ms": _dist_ms(m.cycle_overhead_s),
                "in_relay_overhead_ms": _dist_ms(m.relay_overhead_s),
                "phase_median_ms": {k: ms(statistics.median(v)) for k, v in m.phases_s.items()},
            },
            "inspect_ai": peer,
            "throughput_ratio": (round(m.cells_per_s / peer["samples_per_s"], 3) if peer else None),
        }
        rows.append(row)
        if c == 1 and arms == 1:
            # Like-for-like at concurrency 1: wall per cell minus the median exec time.
            row["maka_eval"]["amortised_overhead_ms"] = ms(
                m.wall_s / m.cells - statistics.median(m.execution_s)
            )
            if peer:
                peer["amortised_overhead_ms"] = round(
                    1e3 / peer["samples_per_s"] - peer["exec_ms_median"], 3
                )

    def verdict(passed: bool | None) -> str:
        return "n/a" if passed is None else ("PASS" if passed else "MISS")

    verdicts: dict[str, Any] = {}
    for arms in sorted({a for a, _ in maka}):
        # (a) per-attempt overhead at concurrency 1 below Inspect's per-sample median.
        a_maka = maka.get((arms, OVERHEAD_CONCURRENCY))
        a_peer = inspect.get(OVERHEAD_CONCURRENCY * arms)
        a_value = (
            ms(statistics.median(a_maka.cycle_overhead_s))
            if a_maka is not None and a_maka.cycle_overhead_s
            else None
        )
        a_pass = a_value < a_peer["overhead_ms_median"] if a_value is not None and a_peer else None
        verdicts[f"overhead_a{arms}_c1"] = {
            "target": f"{arms}-arm groups: median overhead per attempt at concurrency "
            f"{OVERHEAD_CONCURRENCY} < Inspect's median per sample",
            "maka_eval_ms": a_value,
            "inspect_ms": a_peer["overhead_ms_median"] if a_peer else None,
            "verdict": verdict(a_pass),
        }
        # (b) cells/s at concurrency 16 at least 1.5x Inspect's samples/s.
        b_maka = maka.get((arms, TARGET_CONCURRENCY))
        b_peer = inspect.get(TARGET_CONCURRENCY * arms)
        b_ratio = (
            round(b_maka.cells_per_s / b_peer["samples_per_s"], 3) if b_maka and b_peer else None
        )
        verdicts[f"throughput_a{arms}_c16"] = {
            "target": f"{arms}-arm groups: cells/s at {TARGET_CONCURRENCY} groups >= "
            f"{TARGET_THROUGHPUT_RATIO}x Inspect's samples/s at {TARGET_CONCURRENCY * arms} "
            "samples in flight",
            "ratio": b_ratio,
            "verdict": verdict(b_ratio >= TARGET_THROUGHPUT_RATIO if b_ratio else None),
        }
    comparison = []
    if baseline is not None:
        for old in baseline["rows"]:
            now = maka.get((1, old["concurrency"]))
            if now is None:
                continue
            ratio = now.cells_per_s / old["maka_eval"]["cells_per_s"]
            comparison.append(
                {
                    "concurrency": old["concurrency"],
                    "baseline_cells_per_s": old["maka_eval"]["cells_per_s"],
                    "cells_per_s": round(now.cells_per_s, 2),
                    "ratio": round(ratio, 3),
                    "baseline_cycle_ms": (old["maka_eval"]["cycle_overhead_ms"] or {}).get(
                        "median"
                    ),
                    "cycle_ms": (_dist_ms(now.cycle_overhead_s) or {}).get("median"),
                    "verdict": verdict(ratio >= 1 - MAX_SLOWDOWN),
                }
            )
    return {
        "cells": cells,
        "maka_eval_version": MAKA_EVAL_VERSION,
        "inspect_ai_version": next(iter(inspect.values()))["version"] if inspect else None,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "rows": rows,
        "verdicts": verdicts,
        "baseline": {"ref": baseline["ref"], "rows": comparison} if baseline else None,
    }


def _fmt(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def print_report(result: dict[str, Any]) -> None:
    """The human-readable tables."""
    out = sys.stdout
    print(
        f"\nlocal-overhead: {result['cells']} no-op cells per run; maka-eval "
        f"{result['maka_eval_version']}, inspect-ai {result['inspect_ai_version'] or '(skipped)'}, "
        f"Python {result['python']}, {result['cpus']} CPUs\n",
        file=out,
    )
    print("Throughput (cells or samples / wall time of the run call), side by side", file=out)
    print(
        f"{'arms':>4} {'groups':>6} {'in flight':>9}  {'maka-eval cells/s':>17}  "
        f"{'CPU ms/cell':>11}  {'Inspect samples/s':>17}  {'ratio':>6}",
        file=out,
    )
    for row in result["rows"]:
        peer = row["inspect_ai"]
        m = row["maka_eval"]
        print(
            f"{row['arms']:>4} {row['concurrency']:>6} {row['in_flight']:>9}  "
            f"{m['cells_per_s']:>17.2f}  {m['cpu_ms_per_cell']:>11.2f}  "
            f"{_fmt(peer['samples_per_s'] if peer else None):>17}  "
            f"{_fmt(row['throughput_ratio'], 'x'):>6}",
            file=out,
        )

    def pair(dist: dict[str, float] | None) -> str:
        return "-" if dist is None else f"{dist['median']:.2f} / {dist['p95']:.2f}"

    print("\nPer-attempt overhead, ms (median / p95)", file=out)
    print(
        f"{'arms':>4} {'groups':>6}  {'maka-eval cycle':>17}  {'maka-eval in-relay':>18}  "
        f"{'Inspect per-sample':>18}",
        file=out,
    )
    for row in result["rows"]:
        maka, peer = row["maka_eval"], row["inspect_ai"]
        inspect_pair = (
            f"{peer['overhead_ms_median']:.2f} / {peer['overhead_ms_p95']:.2f}" if peer else "-"
        )
        print(
            f"{row['arms']:>4} {row['concurrency']:>6}  {pair(maka['cycle_overhead_ms']):>17}  "
            f"{pair(maka['in_relay_overhead_ms']):>18}  {inspect_pair:>18}",
            file=out,
        )
    print(
        "  maka-eval cycle:    one group at a time: the gap between the last records of\n"
        "                      consecutive groups (each fsync'd) minus the slowest arm's\n"
        "                      subjectSec + verifierSec, divided by the arms; first group skipped\n"
        "  maka-eval in-relay: totalSec - subjectSec - verifierSec (prepare, cleanup and the\n"
        "                      relay's artifact storing; no scheduling or record commit)\n"
        "  Inspect per-sample: SampleInit..SampleEnd hook window minus time awaiting the two\n"
        "                      sandbox().exec calls, at the same samples in flight\n"
        "  Above one execution in flight the per-attempt figures are latency under load.",
        file=out,
    )
    for row in result["rows"]:
        if "amortised_overhead_ms" not in row["maka_eval"]:
            continue
        peer = row["inspect_ai"]
        print(
            "  Like-for-like, 1 arm at concurrency 1: wall time / cells minus the median exec\n"
            "  time, both tools: "
            f"maka-eval {row['maka_eval']['amortised_overhead_ms']:.2f} ms, Inspect "
            f"{_fmt(peer['amortised_overhead_ms'] if peer else None, ' ms')} (not a target)",
            file=out,
        )

    print("\nmaka-eval phase medians from the records, ms", file=out)
    names = ("prepareSec", "subjectSec", "verifierSec", "cleanupSec", "totalSec")
    print(f"{'arms':>4} {'groups':>6}  " + "  ".join(f"{n:>11}" for n in names), file=out)
    for row in result["rows"]:
        phases = row["maka_eval"]["phase_median_ms"]
        print(
            f"{row['arms']:>4} {row['concurrency']:>6}  "
            + "  ".join(f"{phases[n]:>11.2f}" for n in names),
            file=out,
        )

    if result["baseline"]:
        base = result["baseline"]
        print(f"\nBefore and after, measured in this run (1 arm; baseline {base['ref']})", file=out)
        print(
            f"{'groups':>6}  {'baseline cells/s':>16}  {'now cells/s':>11}  {'ratio':>6}  "
            f"{'baseline cycle ms':>17}  {'now cycle ms':>12}  verdict (<= "
            f"{MAX_SLOWDOWN:.0%} slower)",
            file=out,
        )
        for row in base["rows"]:
            print(
                f"{row['concurrency']:>6}  {row['baseline_cells_per_s']:>16.2f}  "
                f"{row['cells_per_s']:>11.2f}  {row['ratio']:>6.3f}  "
                f"{_fmt(row['baseline_cycle_ms']):>17}  {_fmt(row['cycle_ms']):>12}  "
                f"{row['verdict']}",
                file=out,
            )

    print("\nTargets", file=out)
    for name, v in result["verdicts"].items():
        figure = (
            f"{_fmt(v['maka_eval_ms'], ' ms')} vs {_fmt(v['inspect_ms'], ' ms')}"
            if name.startswith("overhead")
            else _fmt(v["ratio"], "x")
        )
        print(f"  {v['target']}: {figure}  {v['verdict']}", file=out)
    print(
        "  every maka-eval attempt record was read back from disk: one per cell, all completed",
        file=out,
    )


# -- driver -----------------------------------------------------------------------------
def _note(message: str) -> None:
    """Progress goes to stderr; stdout holds only the report."""
    print(f"local-overhead: {message}", file=sys.stderr, flush=True)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _concurrencies(text: str) -> list[int]:
    try:
        values = [_positive_int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers: {exc}") from None
    if not values:
        raise argparse.ArgumentTypeError("give at least one concurrency")
    return list(dict.fromkeys(values))


@contextlib.contextmanager
def _work_dir(run_root: str | None, keep: bool) -> Iterator[Path]:
    base = Path(run_root) if run_root else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="maka-local-overhead-", dir=base))
    try:
        yield path
    finally:
        if keep:
            _note(f"kept the run directories in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=_positive_int, default=500, help="cells per run (500)")
    parser.add_argument(
        "--concurrency", type=_concurrencies, default=[1, 16], help='comma-separated ("1,16")'
    )
    parser.add_argument(
        "--arms", type=_concurrencies, default=[1, 2, 4], help='subjects per group ("1,2,4")'
    )
    parser.add_argument("--skip-inspect", action="store_true", help="run maka-eval only")
    parser.add_argument(
        "--isolation",
        choices=("none", "namespaces"),
        default="none",
        help="executor.config.isolation of the workload (none: the bare process path)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run REF's own benchmark (a git commit) in this invocation, side by side",
    )
    parser.add_argument(
        "--run-root", help="folder for the workload and run directories (default: the temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--json", action="store_true", help="also print a JSON summary line")
    args = parser.parse_args()
    for arms in args.arms:
        if args.cells % arms:
            parser.error(f"--cells {args.cells} is not a multiple of --arms {arms}")

    python = None
    if not args.skip_inspect:
        _note(f"preparing Inspect AI in {INSPECT_VENV}")
        python = inspect_env.ensure_inspect_python(INSPECT_VENV)

    baseline = None
    if args.baseline:
        _note(f"baseline {args.baseline}: its own benchmark, 1 arm, {args.cells} cells")
        baseline = run_baseline(args.baseline, args.cells, args.concurrency)
    maka: dict[tuple[int, int], MakaResult] = {}
    inspect: dict[int, dict[str, Any]] = {}
    with _work_dir(args.run_root, args.keep) as root:
        write_task(root)
        for arms in args.arms:
            for c in args.concurrency:
                _note(f"maka-eval, {args.cells} cells, {arms} arm(s) per group, {c} group(s)")
                maka[(arms, c)] = run_maka(root, args.cells, c, arms, args.isolation)
                if python is not None and c * arms not in inspect:
                    _note(f"Inspect AI, {args.cells} samples, {c * arms} in flight")
                    inspect[c * arms] = run_inspect(python, args.cells, c * arms)
    result = summary(args.cells, maka, inspect, baseline)
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
