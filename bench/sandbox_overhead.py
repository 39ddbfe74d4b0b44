"""What the process sandbox (namespaces) adds per attempt, against the bare process path.

The same no-op workload as ``local_overhead.py`` (one task, a subject that runs
``true``, a verifier that writes reward 1) runs in-process through ``LocalRun`` twice at
concurrency 1, once with ``executor.config.isolation: none`` and once with
``namespaces``, each into a fresh run directory, alternating in rounds so that machine
noise hits both alike. Per-attempt overhead is the cycle between consecutive durable
records minus the subject's and verifier's execution (see ``local_overhead.py``); the
sandbox's cost is the difference of the medians. For scale it also times the bare tool:
``bwrap --unshare-pid --unshare-net ... true`` against ``true``.

Target (issue "Real benchmark tasks in real sandboxes"): the sandbox adds no more than
6 ms per attempt. The container sandbox is measured against Harbor 0.26 itself, on the
same tasks and the same Podman, by ``sandbox_vs_harbor.py`` next to this file. The exit
status is 0 whatever the verdict: a benchmark, not a test.

    .venv/bin/python bench/sandbox_overhead.py              # 200 cells x 3 rounds
    .venv/bin/python bench/sandbox_overhead.py --cells 50 --rounds 1
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--subject-ms",
        type=int,
        default=0,
        help="the subject sleeps this long instead of running `true` (a real subject's run "
        "hides the making of the verifier's namespace)",
    )
    args = parser.parse_args()
    subject = ("sleep", f"{args.subject_ms / 1000:g}") if args.subject_ms else ("true",)
    why = namespaces_unavailable()
    if why is not None:
        raise SystemExit(f"sandbox-overhead: {why}")
    cycles: dict[str, list[float]] = {"none": [], "namespaces": []}
    phases: dict[str, dict[str, list[float]]] = {"none": {}, "namespaces": {}}
    with tempfile.TemporaryDirectory(prefix="maka-sandbox-overhead-") as tmp:
        root = Path(tmp)
        write_task(root)
        for r in range(args.rounds):
            for isolation in ("none", "namespaces"):
                print(f"sandbox-overhead: round {r + 1}, {isolation}", file=sys.stderr)
                result = run_maka(
                    root, args.cells, 1, 1, isolation, tag=f"-{isolation}-{r}", subject=subject
                )
                cycles[isolation] += result.cycle_overhead_s
                for name, values in result.phases_s.items():
                    phases[isolation].setdefault(name, []).extend(values)
    bare = time_command(["true"], 50)
    bwrap = time_command(list(BWRAP_PROBE), 50)
    none_ms = ms(statistics.median(cycles["none"]))
    ns_ms = ms(statistics.median(cycles["namespaces"]))
    added = round(ns_ms - none_ms, 3)
    what = f"subject `{' '.join(subject)}`"
    print(f"\nsandbox-overhead: {args.cells} cells x {args.rounds} rounds, {what}, concurrency 1\n")
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
    print(f"\n  the sandbox adds {added:.2f} ms per attempt (median cycle, namespaces - none)")
    print(f"  for scale: `true` {bare:.2f} ms, `bwrap ... true` {bwrap:.2f} ms (medians of 50)")
    verdict = "PASS" if added <= TARGET_MS else "MISS"
    print(f"  target: the process sandbox adds <= {TARGET_MS:g} ms per attempt: {verdict}")


if __name__ == "__main__":
    main()
