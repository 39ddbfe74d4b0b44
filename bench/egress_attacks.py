"""Every attack on a policed cell's network, in both sandbox backends: blocked or not.

The attacks include a root subject's ways out of the sandbox itself: a network namespace
of its own or another's (unshare, setns into every namespace file it can see), a user
namespace with a network of its own, remounting its read-only CA folder read-write, a
device node for the host's disk, open_by_handle_at on a filesystem's root, and any
capability that reaches around the policy or out (relay.gate.FORBIDDEN).

Runs tests/egress/attack_probe.py as the subject of a one-cell experiment with
`executor.config.egress: {mode: proxy}` through the local executor, once in the process
sandbox (bubblewrap) and once in the container sandbox (Podman), with a live bait on the
host side of the cell's veth and an allowed upstream on the host's loopback (see
tests/egress/attacks.py). Prints one row per attack, then what enforcement costs per
cell: the namespace (create + policy, and removal) timed over `--cycles` cells, and
the whole set-up with the proxy and its teardown from the attempt records.

Exit status: 0 when every attack was blocked and the allowed upstream was reached
through the proxy; 1 when any attack got through; 2 when the allowed path failed.
Needs root and nftables; the container backend needs Podman (hack/podman.sh up is run
if no engine answers, and its service stopped again afterwards).

    .venv/bin/python bench/egress_attacks.py
    .venv/bin/python bench/egress_attacks.py --backend process --cycles 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pytest  # noqa: E402 - MonkeyPatch, to put the baits on each cell's address
from tests.egress import attacks  # noqa: E402

from maka_eval.local import netns  # noqa: E402
from maka_eval.sandbox.container.engine import engine_info  # noqa: E402

BACKENDS = ("process", "container")


def podman() -> tuple[str, bool]:
    """DOCKER_HOST of an answering engine, and whether this script started it."""
    probe = engine_info()
    if probe.engine is not None:
        return probe.engine.url, False
    proc = subprocess.run(
        [str(REPO / "hack" / "podman.sh"), "up"], capture_output=True, text=True, check=False
    )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode != 0 or not last.startswith("export DOCKER_HOST="):
        raise SystemExit(f"hack/podman.sh up failed:\n{proc.stderr[-2000:]}")
    return last.removeprefix("export DOCKER_HOST="), True


def run_backend(backend: str, engine: str | None) -> tuple[list[dict[str, Any]], Any, list[str]]:
    with tempfile.TemporaryDirectory(prefix=f"egress-attacks-{backend}-") as tmp:
        root = Path(tmp)
        os.environ["MAKA_EVAL_WORK_DIR"] = str(root / "work")
        patch = pytest.MonkeyPatch()
        try:
            with attacks.host_side(patch) as side:
                cell = attacks.run_cell(root, side, container=backend == "container", engine=engine)
        finally:
            patch.undo()
        record = cell.record
        if not cell.results:
            raise SystemExit(
                f"{backend}: the probe reported nothing (attempt {record.result.status.value}: "
                f"{record.result.reason})"
            )
        return cell.results, record, side.bait_hits


def namespace_cycles(count: int) -> tuple[list[float], list[float]]:
    """Create + load the policy, and remove, for `count` cells (no proxy)."""
    setups, teardowns = [], []
    for i in range(count):
        t0 = time.perf_counter()
        network = netns.create("bench-egress-attacks", f"t{i}::1::s")
        try:
            network.enforce(3128)
            setups.append(time.perf_counter() - t0)
        finally:
            t1 = time.perf_counter()
            network.remove()
            teardowns.append(time.perf_counter() - t1)
    return setups, teardowns


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(values) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--cycles", type=int, default=20, help="namespaces timed (no proxy)")
    args = parser.parse_args()
    why = "this needs root" if os.geteuid() != 0 else netns.enforcement_unavailable()
    if why is not None:
        print(f"cannot police a cell here: {why}", file=sys.stderr)
        return 2
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    engine, started = (None, False)
    if "container" in backends:
        engine, started = podman()
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    records = {}
    hits: list[str] = []
    try:
        for backend in backends:
            results, record, bait = run_backend(backend, engine)
            records[backend] = record
            hits += [f"{backend}: {h}" for h in bait]
            for result in results:
                rows.setdefault(result["attack"], {})[backend] = result
    finally:
        if started:
            subprocess.run([str(REPO / "hack" / "podman.sh"), "service", "stop"], check=False)

    width = max(len(name) for name in rows) + 2
    print(f"{'attack':<{width}}" + "".join(f"{b:<14}" for b in backends))
    through = broken = 0
    for name, by_backend in rows.items():
        cells = []
        for backend in backends:
            result = by_backend.get(backend)
            if result is None:
                cells.append("n/a")  # the tool is not in this sandbox
            elif result["expect"] == "blocked":
                cells.append("blocked" if result["ok"] else "GOT THROUGH")
                through += not result["ok"]
            else:
                cells.append("allowed" if result["ok"] else "FAILED")
                broken += not result["ok"]
        print(f"{name:<{width}}" + "".join(f"{c:<14}" for c in cells))
    print()
    print(f"bait hits on the host side: {len(hits)}" + (f" ({'; '.join(hits)})" if hits else ""))
    for backend, record in records.items():
        t = record.timings
        print(
            f"{backend}: egress set-up {t['egressSetupSec'] * 1000:.0f} ms (namespace "
            f"{t['egressNamespaceSetupSec'] * 1000:.1f} ms, the rest is the proxy starting), "
            f"teardown {t['egressTeardownSec'] * 1000:.0f} ms (namespace "
            f"{t['egressNamespaceTeardownSec'] * 1000:.1f} ms)"
        )
    setups, teardowns = namespace_cycles(args.cycles)
    print(
        f"namespace + policy over {args.cycles} cells: set-up {ms(setups)}; "
        f"teardown {ms(teardowns)}"
    )
    if through:
        print(f"{through} attack(s) GOT THROUGH")
        return 1
    if broken:
        print(f"{broken} allowed path(s) FAILED")
        return 2
    print("every attack was blocked; the allowed upstream answered through the proxy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
