"""The container sandbox against Harbor 0.26 itself: same tasks, same Podman, same oracle.

Six Harbor-format fixture tasks (tests/fixtures/harbor and tests/harbor/tasks, images
``FROM debian:bookworm-slim`` or a prebuilt ``docker_image``; some without network) run
with the oracle agent (tests/fixtures/harbor/sum-numbers is left out: Harbor 0.26 does not
create its ``workdir`` and fails it), images built beforehand (a warm-up job of each
tool, not timed):

* ``harbor``: ``harbor run -p TASKS -a oracle -e <podman> --no-delete -n C``, Harbor's own
  CLI in its own Python 3.12 environment (hack/harbor.sh). The environment is Harbor's
  ``PodmanEnvironment`` through maka-eval's small subclass that applies Harbor's own
  ``network_mode: none`` overlay to no-network tasks (stock Harbor needs a sidecar image
  that cannot be pulled offline); every other task runs exactly as stock.
* ``maka``: ``maka-eval run`` with ``executor.kind: local``, ``sandbox: container`` (the
  task's image through Podman's Docker API), ``maxConcurrentTaskGroups: C``.

Both at concurrency C = 1 and 4. Figures, per tool and concurrency:

* ``wall/job``: the command's whole wall time (process start to exit) for the six trials;
* ``overhead/trial``: median over trials of the trial's span minus its agent (subject)
  and verifier execution; Harbor's from its result.json (``started_at..finished_at``
  minus ``agent_execution`` and ``verifier``), maka-eval's from its records
  (``totalSec - subjectSec - verifierSec``). Harbor's verifier phase includes its test
  upload, so its overhead is if anything understated;
* the rewards per task, which must be equal;
* the engine floor: ``podman run --rm IMG true``, median of 5.

Targets (issue "Real benchmark tasks in real sandboxes"): maka-eval's per-trial overhead
is at least 10x lower than Harbor's, and no more than the engine floor + 100 ms.
Run as root (rootful Podman), after hack/podman.sh up; hack/harbor.sh is run for you.
The exit status is 0 whatever the verdict: a benchmark, not a test.

    .venv/bin/python bench/sandbox_vs_harbor.py                  # C = 1 and 4
    .venv/bin/python bench/sandbox_vs_harbor.py --concurrency 1 --skip-harbor
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harbor_executor import MAKA, REPO, _span, docker_host, harbor_python
from maka_eval.harbor.config import OFFLINE_PODMAN
from maka_eval.harbor.worker import stage_bridge
from maka_eval.store.run_store import read_run

TASKS = (
    REPO / "tests" / "fixtures" / "harbor" / "fix-greeting",
    REPO / "tests" / "fixtures" / "harbor" / "users-and-rewards",
    REPO / "tests" / "fixtures" / "harbor" / "plain-image",
    REPO / "tests" / "harbor" / "tasks" / "write-answer",
    REPO / "tests" / "harbor" / "tasks" / "offline",
    REPO / "tests" / "harbor" / "tasks" / "slow-agent",
)
FLOOR_IMAGE = "docker.io/library/debian:bookworm-slim"
RATIO_TARGET = 10.0
FLOOR_MARGIN_SEC = 0.100


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return wall


def harbor_trials(folder: Path) -> dict[str, dict[str, Any]]:
    """Per task: reward and in-trial overhead from Harbor's result.json files."""
    out: dict[str, dict[str, Any]] = {}
    for result in folder.rglob("result.json"):
        data = json.loads(result.read_text())
        if "trial_name" not in data or not data.get("finished_at"):
            continue
        span = _span({"started_at": data["started_at"], "finished_at": data["finished_at"]})
        execution = _span(data.get("agent_execution")) + _span(data.get("verifier"))
        rewards = (data.get("verifier_result") or {}).get("rewards") or {}
        name = str(data.get("task_name") or data["trial_name"]).rsplit("/", 1)[-1]
        out[name] = {
            "reward": rewards.get("reward"),
            "span": span,
            "overhead": span - execution,
            "error": (data.get("exception_info") or {}).get("exception_type"),
        }
    return out


def maka_trials(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Per task: score and in-trial overhead from maka-eval's records."""
    out: dict[str, dict[str, Any]] = {}
    for records in read_run(run_dir).records.values():
        r = records[-1]
        t = r.timings
        out[r.task_id] = {
            "reward": r.result.score,
            "span": t["totalSec"],
            "overhead": t["totalSec"] - t["subjectSec"] - t["verifierSec"],
            "error": None if r.result.reason is None else r.result.reason[:80],
            "phases": {k: t[k] for k in ("prepareSec", "cleanupSec") if k in t},
        }
    return out


def experiment(folder: Path, concurrency: int, name: str) -> Path:
    doc = {
        "schemaVersion": "maka.eval.v1",
        "id": "sandbox-vs-harbor",
        "benchmark": {
            "id": "bench",
            "version": "1",
            "kind": "directory",
            "config": {"path": "tasks"},
        },
        "executor": {"kind": "local", "config": {"sandbox": "container"}},
        "execution": {"maxConcurrentTaskGroups": concurrency, "maxInfraRetries": 0},
        "subjects": [{"id": "oracle", "kind": "oracle"}],
        "tasks": [{"id": t.name} for t in TASKS],
        "repetitions": 1,
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def engine_floor(concurrency: int, runs: int = 5) -> float:
    """Median wall time of `podman run --rm IMG true`, `concurrency` of them at once."""
    subprocess.run(["podman", "run", "--rm", FLOOR_IMAGE, "true"], check=True)
    times: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(["podman", "run", "--rm", FLOOR_IMAGE, "true"])
            for _ in range(concurrency)
        ]
        for proc in procs:
            if proc.wait() != 0:
                sys.exit("podman run --rm failed")
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--skip-harbor", action="store_true", help="maka-eval only")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the trials run on rootful Podman")
    host = docker_host()
    base = Path(tempfile.mkdtemp(prefix="maka-eval-sandbox-vs-harbor-"))
    env = {**os.environ, "DOCKER_HOST": host, "MAKA_EVAL_WORK_DIR": str(base / "work")}
    harbor_env = dict(env)
    harbor_cmd: list[str] = []
    if not args.skip_harbor:
        python = harbor_python()
        harbor_env.update(
            PATH=f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONPATH=str(stage_bridge(base / "bridge")),
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        harbor_cmd = [str(Path(python).parent / "harbor"), "run", "-p", str(base / "tasks")]
        harbor_cmd += ["-a", "oracle", "-e", OFFLINE_PODMAN]
        harbor_cmd += ["--no-delete", "-y"]
    (base / "tasks").mkdir()
    (base / "work").mkdir()
    for task in TASKS:
        shutil.copytree(task, base / "tasks" / task.name)
    rows: list[tuple[str, int, float, dict[str, dict[str, Any]]]] = []
    try:
        print("warm-up: building every task's image once (not timed) ...", file=sys.stderr)
        if harbor_cmd:
            timed([*harbor_cmd, "-n", "4", "-o", str(base / "warm")], harbor_env, base)
        timed(
            [str(MAKA), "run", str(experiment(base, 4, "warm")), "--out", str(base / "rw")],
            env,
            base,
        )
        for c in args.concurrency:
            if harbor_cmd:
                print(f"harbor, concurrency {c} ...", file=sys.stderr)
                out = base / f"jobs-{c}"
                wall = timed([*harbor_cmd, "-n", str(c), "-o", str(out)], harbor_env, base)
                rows.append(("harbor", c, wall, harbor_trials(out)))
            print(f"maka-eval, concurrency {c} ...", file=sys.stderr)
            run_dir = base / f"run-{c}"
            cmd = [str(MAKA), "run", str(experiment(base, c, f"e{c}")), "--out", str(run_dir)]
            wall = timed(cmd, env, base)
            rows.append(("maka", c, wall, maka_trials(run_dir)))
        floors = {c: engine_floor(c) for c in args.concurrency}
    finally:
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    report(rows, floors)


def report(
    rows: list[tuple[str, int, float, dict[str, dict[str, Any]]]], floors: dict[int, float]
) -> None:
    names = [t.name for t in TASKS]
    print(f"\nsandbox-vs-harbor: {len(names)} tasks, oracle, Podman, images prebuilt\n")
    print(
        f"{'tool':<7} {'C':>2} {'wall/job':>9} {'trial span':>11} "
        f"{'overhead/trial':>15} {'max':>7}  rewards"
    )
    medians: dict[tuple[str, int], float] = {}
    rewards: dict[tuple[str, int], list[Any]] = {}
    for tool, c, wall, trials in rows:
        over = [trials[n]["overhead"] for n in names if n in trials]
        span = [trials[n]["span"] for n in names if n in trials]
        med = statistics.median(over) if over else float("nan")
        medians[(tool, c)] = med
        rewards[(tool, c)] = [trials.get(n, {}).get("reward") for n in names]
        shown = " ".join("-" if r is None else f"{r:g}" for r in rewards[(tool, c)])
        print(
            f"{tool:<7} {c:>2} {wall:>8.2f}s {statistics.median(span or [0]):>10.3f}s "
            f"{med:>14.3f}s {max(over or [0]):>6.2f}s  {shown}"
        )
        for n in names:
            if n not in trials:
                print(f"          {n}: no trial result")
            elif trials[n]["error"]:
                print(f"          {n}: {trials[n]['error']}")
    print(f"(tasks: {', '.join(names)}; spans and overheads are medians over the trials)")
    print(f"\nengine floor `podman run --rm {FLOOR_IMAGE} true`, C at once, median of 5 rounds:")
    print("  " + ", ".join(f"C={c}: {f:.3f} s" for c, f in sorted(floors.items())))
    for c in sorted({c for _, c, _, _ in rows}):
        maka = medians.get(("maka", c))
        if maka is None:
            continue
        cap = floors[c] + FLOOR_MARGIN_SEC
        ok = "PASS" if maka <= cap else "MISS"
        print(f"C={c}: maka-eval overhead {maka:.3f} s vs floor + 100 ms {cap:.3f} s: {ok}")
        harbor = medians.get(("harbor", c))
        if harbor is not None:
            ratio = harbor / maka if maka > 0 else float("inf")
            ok = "PASS" if ratio >= RATIO_TARGET else "MISS"
            differ = [
                n
                for n, a, b in zip(names, rewards[("harbor", c)], rewards[("maka", c)], strict=True)
                if a != b
            ]
            print(
                f"C={c}: Harbor overhead {harbor:.3f} s = {ratio:.1f}x maka-eval's "
                f"(target >= {RATIO_TARGET:g}x): {ok}; rewards equal: "
                + ("yes" if not differ else f"NO ({', '.join(differ)})")
            )


if __name__ == "__main__":
    main()
