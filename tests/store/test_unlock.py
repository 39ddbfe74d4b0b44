"""`maka-eval unlock`: a stale lock goes only once no process of the run remains.

Real processes throughout: verifiers (attempt marker only), `env -i` orphans working in
the run's folder, processes left frozen by a writer that died while quiescing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from maka_eval.errors import StoreError
from maka_eval.processes.table import ATTEMPT_MARKER, RUN_MARKER, stat
from maka_eval.store.lock import LOCK_NAME, LockState, inspect_lock, unlock
from maka_eval.store.run_store import RunWriter
from tests.helpers import signal_pending
from tests.store.test_run_store import IDENTITY
from tests.test_process_table import Spawner, gone, running

pytestmark = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")

PATH = {"PATH": "/usr/bin:/bin"}
# Handles SIGTERM, as shells and servers do: then a plain `kill` cannot end it stopped.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None);"
    "print('ready', flush=True); time.sleep(120)"
)


@dataclass
class DeadRun:
    dir: Path
    run_id: str
    work: Path  # <work root>/<runId>, where the run's attempt workspaces live

    @property
    def workspace(self) -> Path:
        folder = self.work / "a1" / "workspace"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def unlock(self, **kw: object):
        return unlock(self.dir, self.run_id, work_dir=self.work, **kw)  # type: ignore[arg-type]


@pytest.fixture
def spawn() -> Iterator[Spawner]:
    with Spawner() as spawner:
        yield spawner


@pytest.fixture
def dead(tmp_path, _work_dir) -> DeadRun:
    """A run directory whose writer died: the lock file is there, its flock is not."""
    run = tmp_path / "run"
    writer = RunWriter.open(run, IDENTITY, "0")
    run_id = writer.run_id
    writer.close()
    (run / LOCK_NAME).write_text(
        json.dumps({"pid": 999_999, "host": socket.gethostname(), "startedAt": "then"})
    )
    return DeadRun(run, run_id, _work_dir / run_id)


def frozen(spawn: Spawner, env: dict[str, str], cwd: Path | str = "/") -> int:
    proc = spawn([sys.executable, "-c", STUBBORN], env=env, cwd=cwd)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 120  # only ends a hang
    while stat(proc.pid).state != "T":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc.pid


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "maka_eval.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_the_store_does_not_load_the_relay():
    code = (
        "import sys, maka_eval.store.lock, maka_eval.store.run_store;"
        "loaded = [m for m in sys.modules if m.startswith('maka_eval.relay')];"
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_running_verifier_keeps_the_lock(dead, spawn):
    # The verifier carries the attempt's marker only, not MAKA_EVAL_RUN_ID.
    verifier = spawn(
        ["sleep", "60"], env={**PATH, ATTEMPT_MARKER: f"{dead.run_id}/t::1::s/1"}, cwd="/"
    ).pid
    with pytest.raises(StoreError, match=f"pids {verifier}") as info:
        dead.unlock()
    assert f"pid {verifier}: {ATTEMPT_MARKER}={dead.run_id}/t::1::s/1" in info.value.render()
    assert (dead.dir / LOCK_NAME).exists()
    os.kill(verifier, signal.SIGKILL)
    spawn.started[0].wait(10)
    assert dead.unlock().killed == ()
    assert not (dead.dir / LOCK_NAME).exists()


def test_an_orphan_with_an_empty_environment_keeps_the_lock(dead, spawn):
    env = {**PATH, RUN_MARKER: dead.run_id, ATTEMPT_MARKER: f"{dead.run_id}/t::1::s/1"}
    # The subject starts a child without any environment and exits: init adopts it.
    lost = spawn.orphan(
        "env -i /bin/sleep 60 >/dev/null 2>&1 & echo $!", env=env, cwd=dead.workspace
    )
    running(lost, "sleep")
    with pytest.raises(StoreError, match=f"pids {lost}") as info:
        dead.unlock()
    assert f"cwd {dead.workspace.resolve()}" in info.value.render()
    os.kill(lost, signal.SIGKILL)
    deadline = time.monotonic() + 120  # only ends a hang
    while not gone(lost):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    dead.unlock()
    assert not (dead.dir / LOCK_NAME).exists()


def test_frozen_leftovers_are_named_and_the_advised_command_works(dead, spawn):
    pid = frozen(spawn, {**PATH, ATTEMPT_MARKER: f"{dead.run_id}/t::1::s/2"})
    with pytest.raises(StoreError) as info:
        dead.unlock()
    text = info.value.render()
    assert "1 of them frozen" in info.value.summary
    assert f"pid {pid}: frozen (stopped)" in text and "--force" in text
    # A plain `kill` leaves a stopped process as it is: unlock still refuses.
    subprocess.run(["sh", "-c", f"kill {pid}"], check=True)
    assert signal_pending(pid, signal.SIGTERM)
    with pytest.raises(StoreError, match="frozen"):
        dead.unlock()
    # The command the message gives does end it.
    [advice] = re.findall(r"`(kill -KILL [0-9 ]+)`", text)
    subprocess.run(["sh", "-c", advice], check=True)
    spawn.started[0].wait(10)
    dead.unlock()
    assert not (dead.dir / LOCK_NAME).exists()


def test_force_asks_then_kills_frozen_running_and_orphaned_processes(dead, spawn):
    stopped = frozen(spawn, {**PATH, RUN_MARKER: dead.run_id}, cwd=dead.workspace)
    verifier = spawn(["sleep", "60"], env={**PATH, ATTEMPT_MARKER: f"{dead.run_id}/c/1"}).pid
    lost = spawn.orphan("env -i /bin/sleep 60 >/dev/null 2>&1 & echo $!", env={}, cwd=dead.work)
    running(lost, "sleep")
    asked: list[list[int]] = []

    def refuse(entries):
        asked.append([e.pid for e in entries])
        return False

    with pytest.raises(StoreError, match="nothing was killed"):
        dead.unlock(force=True, confirm=refuse)
    assert asked == [sorted([stopped, verifier, lost])]
    assert not any(gone(pid) for pid in (stopped, verifier, lost))
    assert (dead.dir / LOCK_NAME).exists()

    done = dead.unlock(force=True, confirm=lambda entries: True)
    assert set(done.killed) == {stopped, verifier, lost}
    assert all(gone(pid) for pid in (stopped, verifier, lost))
    assert not (dead.dir / LOCK_NAME).exists()


def test_force_still_means_checked_on_the_other_host(dead, spawn):
    (dead.dir / LOCK_NAME).write_text(json.dumps({"pid": 7, "host": "elsewhere.example"}))
    with pytest.raises(StoreError, match=r"left by host elsewhere\.example"):
        dead.unlock()
    assert dead.unlock(force=True, confirm=lambda entries: False).killed == ()
    assert not (dead.dir / LOCK_NAME).exists()


WRITER = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
from maka_eval.store.run_store import RunWriter
from tests.store.test_run_store import IDENTITY

writer = RunWriter.open(Path(sys.argv[1]), IDENTITY, "0")
workspace = Path(sys.argv[2]) / writer.run_id / "a1" / "workspace"
workspace.mkdir(parents=True)
env = {"PATH": "/usr/bin:/bin", "MAKA_EVAL_ATTEMPT_ID": writer.run_id + "/t::1::s/1"}
# One process that ignores TERM (exec keeps the ignored signal): a loop of `sleep 1`
# would leave a child running for up to a second after the shell is stopped, a second
# process of the run that the checks below would count or not by timing.
verifier = subprocess.Popen(
    ["sh", "-c", "trap '' TERM; exec sleep 1000"],
    env=env, cwd=workspace, start_new_session=True,
)
time.sleep(0.2)
os.kill(verifier.pid, signal.SIGSTOP)  # quiescing began; then the writer died
print(verifier.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_writer_killed_while_quiescing_can_be_unlocked_from_the_command_line(
    tmp_path, _work_dir, spawn
):
    run = tmp_path / "run"
    writer = spawn(
        [sys.executable, "-c", WRITER, str(run), str(_work_dir)],
        env={**os.environ},
        cwd=Path(__file__).resolve().parents[2],
    )
    verifier = int(writer.stdout.readline())
    spawn.pids.append(verifier)
    writer.kill()
    writer.wait(10)
    assert inspect_lock(run)[0] is LockState.STALE

    refused = cli("unlock", str(run))
    assert refused.returncode == 2
    assert f"pid {verifier}: frozen (stopped)" in refused.stderr
    assert f"kill -KILL {verifier}" in refused.stderr

    declined = cli("unlock", str(run), "--force", stdin="n\n")
    assert declined.returncode != 0
    assert f"pid {verifier} (frozen)" in declined.stdout and "Kill these 1" in declined.stdout
    assert not gone(verifier) and inspect_lock(run)[0] is LockState.STALE

    forced = cli("unlock", str(run), "--force", "--yes")
    assert forced.returncode == 0, forced.stderr
    assert f"killed 1 leftover processes of the run: {verifier}" in forced.stdout
    assert gone(verifier) and inspect_lock(run)[0] is LockState.FREE
    RunWriter.open(run, IDENTITY, "0").close()


def test_the_command_line_options(dead):
    assert cli("unlock", str(dead.dir), "--yes").returncode == 2
    help_text = " ".join(cli("unlock", "--help").stdout.split())
    assert "another host" in help_text and "On this host" in help_text
    assert "--yes" in help_text
