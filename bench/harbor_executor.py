"""Wall time per trial: Harbor alone, maka-eval driving Harbor, maka-eval's own containers.

The same fixture task (tests/harbor/tasks/write-answer: FROM debian:bookworm-slim, the
oracle writes the answer, test.sh scores it) on the same engine (rootful Podman), one
trial at a time, N trials per mode, images built beforehand (a warm-up run, not timed):

* ``harbor``: ``harbor run -p TASK -a oracle -e podman --no-delete -n 1 -k N``, Harbor's
  own CLI in its own interpreter; N attempts of one task in one job.
* ``maka-harbor``: ``maka-eval run`` with ``executor.kind: harbor`` (environment podman,
  delete false), the oracle subject through the relay Agent, ``repetitions: N``,
  ``maxConcurrentTaskGroups: 1``.
* ``maka-local``: ``maka-eval run`` with ``executor.kind: local`` and the container
  backend (the task's image through Podman's Docker API), the same experiment.

Figures, per mode:

* ``wall/trial``: the command's whole wall time (process start, prerequisites, every
  trial, teardown) divided by N: what a user waits per trial.
* ``trial`` and the phase columns: means of Harbor's own timings (result.json) for the
  two Harbor modes: the trial lifecycle without process start-up, and where it goes.

The target (issue 10): ``maka-harbor`` adds no more than 1 s per trial over ``harbor``.
Run as root (rootful Podman), after hack/podman.sh up and hack/harbor.sh:

    .venv/bin/python bench/harbor_executor.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "tests" / "harbor" / "tasks" / "write-answer"
MAKA = REPO / ".venv" / "bin" / "maka-eval"
TARGET_SEC = 1.0


def harbor_python() -> str:
    proc = subprocess.run([str(REPO / "hack" / "harbor.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"hack/harbor.sh failed:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def docker_host() -> str:
    proc = subprocess.run(
        [str(REPO / "hack" / "podman.sh"), "service", "start"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"hack/podman.sh service start failed:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1].removeprefix("export DOCKER_HOST=")


PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")


def _span(timing: dict | None) -> float:
    if not timing or not timing.get("started_at") or not timing.get("finished_at"):
        return 0.0
    start = datetime.fromisoformat(timing["started_at"])
    return (datetime.fromisoformat(timing["finished_at"]) - start).total_seconds()


def trial_seconds(folder: Path) -> list[dict[str, float]]:
    """Harbor's own timings of every trial under `folder`: the whole trial
    (started_at..finished_at) and each phase; `teardown` is what is left after the
    verifier (stopping and removing the environment, writing the result)."""
    out = []
    for result in folder.rglob("result.json"):
        data = json.loads(result.read_text())
        if "trial_name" not in data or not data.get("finished_at"):
            continue
        row = {
            "trial": _span({"started_at": data["started_at"], "finished_at": data["finished_at"]})
        }
        row.update({phase: _span(data.get(phase)) for phase in PHASES})
        verifier_end = (data.get("verifier") or {}).get("finished_at")
        row["teardown"] = _span({"started_at": verifier_end, "finished_at": data["finished_at"]})
        out.append(row)
    return out


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float | None:
    """The command's wall time; None (and its output) when it failed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(
            f"FAILED ({proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout[-1500:]}{proc.stderr[-1500:]}",
            flush=True,
        )
        return None
    return wall


def experiment(folder: Path, executor: dict, trials: int) -> Path:
    doc = {
        "schemaVersion": "maka.eval.v1",
        "id": "harbor-bench",
        "benchmark": {
            "id": "bench",
            "version": "1",
            "kind": "directory",
            "config": {"path": "tasks"},
        },
        "executor": executor,
        "execution": {"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
        "subjects": [{"id": "oracle", "kind": "oracle"}],
        "tasks": [{"id": TASK.name}],
        "repetitions": trials,
    }
    path = folder / "experiment.json"
    path.write_text(json.dumps(doc))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3, help="trials per mode (default 3)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the trials run on rootful Podman")
    python = harbor_python()
    host = docker_host()
    harbor = str(Path(python).parent / "harbor")
    base = Path(tempfile.mkdtemp(prefix="maka-eval-harbor-bench-"))
    env = {
        **os.environ,
        "PATH": f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MAKA_EVAL_HARBOR_PYTHON": python,
        "DOCKER_HOST": host,
        "MAKA_EVAL_WORK_DIR": str(base / "work"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    (base / "tasks").mkdir()
    (base / "work").mkdir()
    shutil.copytree(TASK, base / "tasks" / TASK.name)
    task = base / "tasks" / TASK.name
    n = args.trials
    try:
        print(f"warm-up: building the task's image once ({TASK.name}) ...", flush=True)
        harbor_cmd = [
            harbor,
            "run",
            "-p",
            str(task),
            "-a",
            "oracle",
            "-e",
            "podman",
            "--no-delete",
            "-n",
            "1",
        ]
        timed([*harbor_cmd, "-o", str(base / "warm"), "-k", "1"], env, base)
        local = {"kind": "local", "config": {"sandbox": "container"}}
        timed(
            [
                str(MAKA),
                "run",
                str(experiment(base, local, 1)),
                "--out",
                str(base / "runs" / "warm"),
            ],
            env,
            base,
        )

        rows: list[tuple[str, float | None, list[dict[str, float]]]] = []
        wall = timed([*harbor_cmd, "-o", str(base / "jobs"), "-k", str(n)], env, base)
        rows.append(("harbor", wall, trial_seconds(base / "jobs")))
        print(f"harbor: {wall} s", flush=True)
        executor = {
            "kind": "harbor",
            "config": {"environment": {"type": "podman", "delete": False}},
        }
        wall = timed(
            [
                str(MAKA),
                "run",
                str(experiment(base, executor, n)),
                "--out",
                str(base / "runs" / "h"),
                "--keep-workspaces",
            ],
            env,
            base,
        )
        rows.append(("maka-harbor", wall, trial_seconds(base / "work")))
        print(f"maka-harbor: {wall} s", flush=True)
        wall = timed(
            [str(MAKA), "run", str(experiment(base, local, n)), "--out", str(base / "runs" / "l")],
            env,
            base,
        )
        rows.append(("maka-local", wall, []))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"\n{n} trial(s) per mode, one at a time, task {TASK.name}, oracle, Podman\n")
    columns = ("trial", *PHASES, "teardown")
    print(
        f"{'mode':<12} {'wall (s)':>9} {'wall/trial':>10}  "
        + " ".join(f"{c[:12]:>12}" for c in columns)
    )
    figures: dict[str, tuple[float, dict[str, float]]] = {}
    for mode, wall, trials in rows:
        means = {c: statistics.mean(t[c] for t in trials) for c in columns} if trials else {}
        cells = " ".join(f"{means[c]:>12.2f}" if means else f"{'-':>12}" for c in columns)
        if wall is None:
            print(f"{mode:<12} {'failed':>9} {'-':>10}  {cells}")
            continue
        figures[mode] = (wall / n, means)
        print(f"{mode:<12} {wall:>9.2f} {wall / n:>10.2f}  {cells}")
    print("(phase columns: means of Harbor's own result.json timings, seconds)")
    if "harbor" not in figures or "maka-harbor" not in figures:
        sys.exit("a Harbor mode failed: no comparison")
    added = figures["maka-harbor"][0] - figures["harbor"][0]
    verdict = "met" if added <= TARGET_SEC else "NOT met"
    print(
        f"\nmaka-eval kind harbor adds {added:+.2f} s per trial over harbor run (wall/trial); "
        f"target <= {TARGET_SEC:.0f} s: {verdict}"
    )
    inner_h, inner_m = figures["harbor"][1], figures["maka-harbor"][1]
    if inner_h and inner_m:
        inside = inner_m["trial"] - inner_h["trial"]
        print(f"inside Harbor's trial lifecycle: {inside:+.2f} s per trial")
    if "maka-local" in figures:
        print(f"maka-eval kind local (containers): {figures['maka-local'][0]:.2f} s per trial")


if __name__ == "__main__":
    main()
