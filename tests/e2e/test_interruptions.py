"""Stopping the writer for real: Ctrl-C quiesces and records; SIGKILL corrupts nothing."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from maka_eval.analysis.summary import summarize
from maka_eval.engine.selection import CellState
from maka_eval.store.lock import LOCK_NAME, LockState, inspect_lock
from maka_eval.store.run_store import read_run
from tests.helpers import PLAIN_PROCESSES, make_task, spec, write_experiment

pytestmark = pytest.mark.slow


def start(experiment: Path, run_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "maka_eval.cli.main", "run", str(experiment), "--out", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # like a terminal: Ctrl-C goes to this process group
    )


def group_gone(pgid: int, timeout: float = 10.0) -> None:
    """Wait until no process of the process group `pgid` is left (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    while True:
        members = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    members.append(stat.parent.name)
        if not members:
            return
        assert time.monotonic() < deadline, f"killed, but still running: {members}"
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_quiesces_records_cancelled_and_resume_completes(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    gate = tmp_path / "release"
    script = (
        f"setsid sleep 1020 & echo $! > {pids}/$MAKA_EVAL_TASK_ID; "
        f"[ -f {gate} ] || sleep 1000; touch done.txt"
    )
    subject = {
        "id": "slow",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", script]},
    }
    for task in ("a", "b", "c"):
        make_task(tmp_path / "tasks", task)
    experiment = write_experiment(
        tmp_path,
        spec(
            executor=PLAIN_PROCESSES,
            subjects=[subject],
            tasks=[{"id": t} for t in "abc"],
            execution={"maxConcurrentTaskGroups": 2},
        ),
    )
    run_dir = tmp_path / "run"
    env = dict(os.environ)
    proc = start(experiment, run_dir, env)
    deadline = time.monotonic() + 30
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = {p.name: int(p.read_text()) for p in pids.iterdir()}
    assert len(started) == 2 and all(alive(pid) for pid in started.values())
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Re-run the same command to resume" in out
    assert [t for t, pid in started.items() if alive(pid)] == []  # quiesced, escapees too
    assert not (run_dir / LOCK_NAME).exists()
    contents = read_run(run_dir)
    assert sorted(r.status.value for rs in contents.records.values() for r in rs) == [
        "cancelled",
        "cancelled",
    ]

    gate.touch()
    proc = start(experiment, run_dir, env)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = summarize(str(run_dir))
    assert len(summary.results) == 3
    assert {r.cell_id: r.attempts for r in summary.cells} == {
        "a::1::slow": 2,
        "b::1::slow": 2,
        "c::1::slow": 1,
    }


def test_killing_the_writer_at_any_moment_leaves_no_corrupt_record(tmp_path):
    tasks = [f"t{i}" for i in range(8)]
    for task in tasks:
        make_task(tmp_path / "tasks", task)
    quick = {
        "id": "quick",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", "sleep 0.03; touch done.txt"]},
    }
    experiment = write_experiment(
        tmp_path,
        spec(
            subjects=[quick, {**quick, "id": "other"}],
            tasks=[{"id": t} for t in tasks],
            repetitions=5,
            execution={"maxConcurrentTaskGroups": 4},
        ),
    )
    run_dir = tmp_path / "run"
    env = dict(os.environ)
    rng = random.Random(20261202)
    kills = 0
    for _ in range(8):
        proc = start(experiment, run_dir, env)
        # Kill it at a random moment of its work (once it has opened the run directory:
        # how long Python takes to start is not what is under test).
        deadline = time.monotonic() + 30
        while not (run_dir / LOCK_NAME).exists() and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.0))
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # The writer's children still in its group (one between fork and exec holds a
        # copy of the lock's descriptor) die with it, but after it: wait for the group.
        group_gone(proc.pid)
        kills += 1
        # Every record on disk is whole and valid.
        contents = read_run(run_dir)
        assert contents.damaged == []
        for records in contents.records.values():
            for record in records:
                json.loads(record.to_json_bytes())
        state, _ = inspect_lock(run_dir)
        assert state in (LockState.STALE, LockState.FREE)
        if state is LockState.STALE:
            refused = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "maka_eval.cli.main",
                    "run",
                    str(experiment),
                    "--out",
                    str(run_dir),
                ],
                capture_output=True,
                text=True,
                env=env,
            )
            assert refused.returncode == 2 and "stale writer lock" in refused.stderr
            # Subjects of the dead writer finish on their own (they are quick), unless it
            # died while quiescing them: frozen, they wait for `unlock --force`.
            deadline = time.monotonic() + 120  # only ends a hang
            unlock = [sys.executable, "-m", "maka_eval.cli.main", "unlock", str(run_dir)]
            while True:
                result = subprocess.run(unlock, capture_output=True, text=True, env=env)
                if result.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if result.returncode != 0:
                assert "kill -KILL" in result.stderr, result.stderr
                result = subprocess.run(
                    [*unlock, "--force", "--yes"], capture_output=True, text=True, env=env
                )
            assert result.returncode == 0, result.stderr
    assert kills >= 3
    proc = start(experiment, run_dir, env)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = summarize(str(run_dir))
    assert len(summary.results) == len(tasks) * 5 * 2
    assert summary.count(CellState.DONE) == len(summary.cells)
    assert any(row.interrupted for row in summary.cells) or kills == 0
