"""Finding a run's processes in the real process table, and ending them, frozen or not."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_eval.processes.table import (
    ATTEMPT_MARKER,
    RUN_MARKER,
    ProcessEntry,
    find_marked,
    kill_all,
    run_processes,
    stat,
)
from tests.helpers import signal_pending

pytestmark = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")

RUN = "20260101T000000-abcd"
PATH = {"PATH": "/usr/bin:/bin"}


class Spawner:
    """Starts processes in their own sessions; kills every pid it knows at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []
        self.pids: list[int] = []

    def __call__(
        self, argv: list[str], *, env: dict[str, str], cwd: Path | str = "/"
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, start_new_session=True, text=True, stdout=subprocess.PIPE
        )
        self.started.append(proc)
        self.pids.append(proc.pid)
        return proc

    def orphan(self, script: str, *, env: dict[str, str], cwd: Path) -> int:
        """Run `script`, which starts a background process and prints its pid, then exits."""
        out = subprocess.run(
            ["sh", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=10
        ).stdout
        pid = int(out.split()[-1])
        self.pids.append(pid)
        return pid

    def __enter__(self) -> Spawner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.started:
            proc.wait(10)
            if proc.stdout:
                proc.stdout.close()
        for pid in self.pids:  # orphans re-parented to this process (when a subreaper)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


@pytest.fixture
def spawn() -> Iterator[Spawner]:
    with Spawner() as spawner:
        yield spawner


def running(pid: int, name: str) -> int:
    """Wait until the forked pid has exec'd `name` (until then it has its parent's env)."""
    deadline = time.monotonic() + 120  # only ends a hang
    while Path(f"/proc/{pid}/comm").read_text().strip() != name:
        assert time.monotonic() < deadline, f"{pid} never ran {name}"
        time.sleep(0.01)
    return pid


def gone(pid: int) -> bool:
    info = stat(pid)
    return info is None or info.state == "Z"


def by_pid(entries: list[ProcessEntry]) -> dict[int, ProcessEntry]:
    return {e.pid: e for e in entries}


def test_markers_of_the_run_count_and_other_runs_do_not(spawn, tmp_path):
    marks = {**PATH, RUN_MARKER: RUN, ATTEMPT_MARKER: f"{RUN}/c/1"}
    subject = spawn(["sleep", "60"], env=marks).pid
    verifier = spawn(["sleep", "60"], env={**PATH, ATTEMPT_MARKER: f"{RUN}/t::1::s/2"}).pid
    # Another run whose id starts with this one's: its attempts are not ours.
    other = spawn(["sleep", "60"], env={**PATH, ATTEMPT_MARKER: f"{RUN}0/t::1::s/1"}).pid
    found = by_pid(run_processes(RUN, tmp_path / "work" / RUN))
    assert subject in found and verifier in found and other not in found
    assert found[verifier].why == f"{ATTEMPT_MARKER}={RUN}/t::1::s/2"
    assert found[subject].state in ("S", "R") and not found[subject].frozen
    assert find_marked(RUN_MARKER, RUN) == [subject]


def test_children_without_any_marker_count_while_their_parent_lives(spawn):
    script = "env -i /bin/sleep 61 & echo $! ; wait"
    parent = spawn(["sh", "-c", script], env={**PATH, ATTEMPT_MARKER: f"{RUN}/c/1"})
    child = int(parent.stdout.readline())
    spawn.pids.append(child)
    running(child, "sleep")
    found = by_pid(run_processes(RUN, None))
    assert found[child].why == f"child of {parent.pid}"


def test_an_orphan_with_an_empty_environment_counts_by_its_working_folder(spawn, tmp_path):
    work = tmp_path / "work" / RUN
    workspace = work / "a1" / "workspace"
    workspace.mkdir(parents=True)
    env = {**PATH, RUN_MARKER: RUN, ATTEMPT_MARKER: f"{RUN}/c/1"}
    lost = spawn.orphan("env -i /bin/sleep 62 >/dev/null 2>&1 & echo $!", env=env, cwd=workspace)
    running(lost, "sleep")
    assert not any(b"MAKA_EVAL" in e for e in Path(f"/proc/{lost}/environ").read_bytes().split())
    found = by_pid(run_processes(RUN, work))
    assert found[lost].why == f"cwd {workspace.resolve()}"
    assert lost not in by_pid(run_processes(RUN, tmp_path / "work" / "another-run"))
    # The next run removes the work folder: a process still inside it is still the run's.
    shutil.rmtree(work)
    assert lost in by_pid(run_processes(RUN, work))


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_a_process_rooted_inside_the_work_folder_counts(spawn, tmp_path):
    jail = tmp_path / "work" / RUN / "a1" / "root"
    jail.mkdir(parents=True)
    code = "import os, sys, time; os.chroot(sys.argv[1]); print('in', flush=True); time.sleep(60)"
    proc = spawn([sys.executable, "-c", code, str(jail)], env={})
    assert proc.stdout.readline().strip() == "in"
    pid = proc.pid
    assert by_pid(run_processes(RUN, tmp_path / "work" / RUN))[pid].why == f"root {jail}"


def test_the_caller_and_its_shells_never_count(tmp_path):
    work = tmp_path / "work" / RUN
    work.mkdir(parents=True)
    code = (
        "import os; from pathlib import Path; from maka_eval.processes.table import run_processes;"
        f"print(os.getpid(), os.getppid(), [e.pid for e in run_processes({RUN!r}, Path.cwd())])"
    )
    out = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "{code}"; true'],
        cwd=work,
        env={**os.environ, RUN_MARKER: RUN},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.split(" ", 2)[2].strip() == "[]", out.stdout + out.stderr


def test_a_frozen_process_ignores_sigterm_and_kill_all_ends_it(spawn, tmp_path):
    # A process that handles SIGTERM, like most shells and servers.
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None);"
        "print('ready', flush=True); time.sleep(60)"
    )
    proc = spawn([sys.executable, "-c", code], env={**PATH, RUN_MARKER: RUN})
    assert proc.stdout.readline().strip() == "ready"
    pid = proc.pid
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 120  # only ends a hang
    while stat(pid).state != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    [entry] = [e for e in run_processes(RUN) if e.pid == pid]
    assert entry.frozen
    os.kill(pid, signal.SIGTERM)  # what a plain `kill` sends
    assert signal_pending(pid, signal.SIGTERM), "SIGTERM waits while the process is stopped"
    assert stat(pid).state == "T", "a stopped process does not die from SIGTERM"
    killed, remaining = kill_all(lambda: run_processes(RUN))
    assert pid in killed and remaining == []
    assert gone(pid)
