"""What the process sandbox (namespaces) adds per attempt, against the bare process path.

Two workloads: the no-op of ``local_overhead.py`` (one task, a subject that runs
``true``, a verifier that writes reward 1), and the same with a subject that sleeps
50 ms (any real agent runs far longer). Each runs in-process through ``LocalRun`` twice at
concurrency 1, once with ``executor.config.isolation: none`` and once with
``namespaces``, each into a fresh run directory, alternating in rounds so that machine
noise hits both alike. Per-attempt overhead is the cycle between consecutive durable
records minus the subject's and verifier's execution (see ``local_overhead.py``); the
sandbox's cost is the difference of the medians. For scale it also times the bare tool:
``bwrap --unshare-pid --unshare-net ... true`` against ``true``.

The sandbox's namespaces are made ahead, while earlier attempts' subjects run
(sandbox.holders.NamespacePool). A no-op subject back to back leaves no time for that:
there an attempt often makes its own, and both workloads are printed for that reason.

Target (issue "Real benchmark tasks in real sandboxes"): the sandbox adds no more than
6 ms per attempt. The container sandbox is measured against Harbor 0.26 itself, on the
same tasks and the same Podman, by ``sandbox_vs_harbor.py`` next to this file. The exit
status is 0 whatever the verdict: a benchmark, not a test.

    .venv/bin/python bench/sandbox_overhead.py              # 200 cells x 3 rounds, x 2
    .venv/bin/python bench/sandbox_overhead.py --cells 50 --rounds 1 --subject-ms 0
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import ms, p95, run_maka, write_task
from maka_eval.sandbox.process import BWRAP_PROBE, namespaces_unavailable

TARGET_MS = 6.0


def time_command(argv: list[str], runs: int) -> float:
    """Median wall time of running `argv`, in ms."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append(time.perf_counter() - t0)
    return ms(statistics.median(times))


def measure(root: Path, cells: int, rounds: int, subject_ms: int) -> float:
    """Print one workload's table; the sandbox's added ms per attempt."""
    subject = ("sleep", f"{subject_ms / 1000:g}") if subject_ms else ("true",)
    cycles: dict[str, list[float]] = {"none": [], "namespaces": []}
    phases: dict[str, dict[str, list[float]]] = {"none": {}, "namespaces": {}}
    for r in range(rounds):
        for isolation in ("none", "namespaces"):
            print(f"sandbox-overhead: {subject_ms} ms, round {r + 1}, {isolation}", file=sys.stderr)
            tag = f"-{isolation}-{subject_ms}-{r}"
            result = run_maka(root, cells, 1, 1, isolation, tag=tag, subject=subject)
            cycles[isolation] += result.cycle_overhead_s
            for name, values in result.phases_s.items():
                phases[isolation].setdefault(name, []).extend(values)
    what = f"subject `{' '.join(subject)}`"
    print(f"\nsandbox-overhead: {cells} cells x {rounds} rounds, {what}, concurrency 1\n")
    print(f"{'isolation':>11}  {'cycle overhead median':>22}  {'p95':>8}  phase medians (ms)")
    for isolation in ("none", "namespaces"):
        med = ms(statistics.median(cycles[isolation]))
        high = ms(p95(cycles[isolation]))
        parts = "  ".join(
            f"{k.removesuffix('Sec')} {ms(statistics.median(v)):.2f}"
            for k, v in phases[isolation].items()
            if k != "totalSec"
        )
        print(f"{isolation:>11}  {med:>19.2f} ms  {high:>5.2f} ms  {parts}")
    none_ms = ms(statistics.median(cycles["none"]))
    added = round(ms(statistics.median(cycles["namespaces"])) - none_ms, 3)
    print(f"\n  the sandbox adds {added:.2f} ms per attempt (median cycle, namespaces - none)")
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--subject-ms",
        type=int,
        nargs="+",
        default=[0, 50],
        help="workloads: the subject sleeps this long (0: it runs `true`). Namespaces are "
        "made ahead while subjects run; a no-op subject back to back leaves no time for it",
    )
    args = parser.parse_args()
    why = namespaces_unavailable()
    if why is not None:
        raise SystemExit(f"sandbox-overhead: {why}")
    added: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="maka-sandbox-overhead-") as tmp:
        root = Path(tmp)
        write_task(root)
        for subject_ms in args.subject_ms:
            added[subject_ms] = measure(root, args.cells, args.rounds, subject_ms)
    bare = time_command(["true"], 50)
    bwrap = time_command(list(BWRAP_PROBE), 50)
    print(f"\n  for scale: `true` {bare:.2f} ms, `bwrap ... true` {bwrap:.2f} ms (medians of 50)")
    for subject_ms, value in added.items():
        verdict = "PASS" if value <= TARGET_MS else "MISS"
        what = f"a subject of {subject_ms} ms" if subject_ms else "a no-op subject"
        print(
            f"  target: the process sandbox adds <= {TARGET_MS:g} ms per attempt, "
            f"{what}: {value:.2f} ms, {verdict}"
        )


if __name__ == "__main__":
    main()
