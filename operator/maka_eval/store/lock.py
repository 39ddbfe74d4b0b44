"""The writer lock: one writer per run directory.

`.writer.lock` is created exclusively and holds the writer's pid, host and start time;
the writer also holds an flock on it, which the kernel drops when the process dies.
A lock whose flock is held is live and refuses a second writer. A lock left behind by
a writer that died is stale: it is reported with how to prove no writer remains,
and removed only by `maka-eval unlock`, which checks that proof (the process table
reading is in maka_eval.processes.table, so the store does not load the relay).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from maka_eval import strict_json
from maka_eval.errors import Problem, StoreError
from maka_eval.processes.table import ProcessEntry, kill_all, run_processes

LOCK_NAME = ".writer.lock"


class LockState(StrEnum):
    """What a lock file says about writers."""

    FREE = "free"
    LIVE = "live"
    STALE = "stale"


@dataclass(frozen=True)
class LockInfo:
    """The content of a lock file."""

    pid: int | None
    host: str | None
    started_at: str | None
    command: str | None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} (since {self.started_at})"


def _read_info(path: Path) -> LockInfo:
    try:
        data = strict_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    pid = data.get("pid")
    return LockInfo(
        pid if isinstance(pid, int) else None,
        data.get("host") if isinstance(data.get("host"), str) else None,
        data.get("startedAt") if isinstance(data.get("startedAt"), str) else None,
        data.get("command") if isinstance(data.get("command"), str) else None,
    )


def _flock_held(path: Path) -> bool:
    """Whether some live process holds the lock's flock (reliable on one host)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def inspect_lock(run_dir: Path) -> tuple[LockState, LockInfo | None]:
    """The lock's state and content."""
    path = run_dir / LOCK_NAME
    if not path.exists():
        return LockState.FREE, None
    info = _read_info(path)
    if _flock_held(path):
        return LockState.LIVE, info
    if info.host not in (None, socket.gethostname()):
        # Another host's flock is invisible here: it may be a live writer.
        return LockState.LIVE if info.pid is not None else LockState.STALE, info
    return LockState.STALE, info


def stale_lock_problem(run_dir: Path, info: LockInfo) -> Problem:
    """How to prove that no writer remains, and how to remove the lock then."""
    lock = run_dir / LOCK_NAME
    return Problem(
        str(lock),
        f"left by {info.describe()}, which did not finish. Prove no writer remains: "
        f"on host {info.host}, `ps -p {info.pid}` must show no maka-eval process, and no "
        "process of that run (subject, verifier, or their children) may still be running. "
        f"`maka-eval unlock {run_dir}` checks both on this host and removes the lock; "
        "then run again to resume.",
    )


class WriterLock:
    """Held by the one process writing attempts into a run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise StoreError saying who holds it and what to do."""
        run_dir = self.path.parent
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            state, info = inspect_lock(run_dir)
            assert info is not None
            if state is LockState.LIVE:
                raise StoreError(
                    f"{run_dir} is being written by another maka-eval run:",
                    [
                        Problem(
                            str(self.path),
                            f"held by {info.describe()}; wait for it to "
                            "finish or stop it (Ctrl-C) before running again",
                        )
                    ],
                ) from None
            raise StoreError(
                f"{run_dir} has a stale writer lock:", [stale_lock_problem(run_dir, info)]
            ) from None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        content = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "startedAt": datetime.now(tz=UTC).isoformat(),
            "command": " ".join(sys.argv)[:500],
        }
        os.write(fd, json.dumps(content).encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Remove the lock (the writer finished, cleanly or by cancellation)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None


@dataclass(frozen=True)
class Unlocked:
    """What `unlock` did: whose lock it removed, and which leftover processes it killed."""

    info: LockInfo
    killed: tuple[int, ...] = ()


Confirm = Callable[[Sequence[ProcessEntry]], bool]

_LISTED = 20  # pids named in a message; more are counted, not listed


def _pids(pids: Sequence[int]) -> str:
    listed = " ".join(map(str, pids[:_LISTED]))
    return listed + (f" (and {len(pids) - _LISTED} more)" if len(pids) > _LISTED else "")


def _leftovers_problem(run_dir: Path, entries: Sequence[ProcessEntry]) -> StoreError:
    path = run_dir / LOCK_NAME
    pids = [e.pid for e in entries]
    frozen = [e.pid for e in entries if e.frozen]
    problems = [
        Problem(f"pid {e.pid}", f"{'frozen (stopped), ' if e.frozen else ''}{e.why}")
        for e in entries[:_LISTED]
    ]
    # A stopped process keeps a plain SIGTERM pending until SIGCONT; SIGKILL ends it.
    # Every pid is in the command, however many: it is meant to be pasted.
    kill = f"kill -KILL {' '.join(map(str, pids))}"
    why_frozen = (
        (f"pid {frozen[0]} is" if len(frozen) == 1 else f"pids {_pids(frozen)} are")
        + " frozen (stopped with SIGSTOP, as a writer does while quiescing), so a plain "
        "`kill` does not end them before `kill -CONT`; "
        if frozen
        else ""
    )
    problems.append(
        Problem(
            str(path),
            f"{why_frozen}end them with `{kill}` and unlock again, or run "
            f"`maka-eval unlock --force {run_dir}`, which lists them, asks, kills them "
            "and removes the lock",
        )
    )
    listed = ", ".join(map(str, pids[:_LISTED])) + (" ..." if len(pids) > _LISTED else "")
    summary = f"{len(pids)} processes of this run are still running (pids {listed})"
    if frozen:
        summary += f", {len(frozen)} of them frozen"
    return StoreError(summary + ":", problems)


def unlock(
    run_dir: Path,
    run_id: str,
    *,
    work_dir: Path | None = None,
    force: bool = False,
    confirm: Confirm | None = None,
) -> Unlocked:
    """Remove a stale lock after proving no writer and no process of the run remains.

    On the lock's own host the proof is: nobody holds the flock (the writer held it for
    its whole life, so it is dead) and `run_processes` finds no subject, verifier or
    child of the run (by marker, by descent, or by working inside `work_dir`, the run's
    work folder). With `force`, such leftovers are killed first, once `confirm` (when
    given) agrees. For a lock from another host that proof cannot be made here; `force`
    says the user made it there.
    """
    state, info = inspect_lock(run_dir)
    path = run_dir / LOCK_NAME
    if state is LockState.FREE or info is None:
        raise StoreError(f"{run_dir} has no writer lock; nothing to do")
    if _flock_held(path):
        raise StoreError(
            f"{run_dir} is being written right now:",
            [Problem(str(path), f"held by {info.describe()}; stop that run (Ctrl-C) instead")],
        )
    here = socket.gethostname()
    if info.host not in (None, here):
        if not force:
            raise StoreError(
                f"{path} was left by host {info.host}; this is {here}:",
                [
                    Problem(
                        str(path),
                        f"on {info.host}, check `ps -p {info.pid}` shows no maka-eval "
                        "process and no process of the run remains, then run unlock with "
                        "--force",
                    )
                ],
            )
        path.unlink()
        return Unlocked(info)
    killed: tuple[int, ...] = ()
    leftovers = run_processes(run_id, work_dir)
    if leftovers:
        if not force:
            raise _leftovers_problem(run_dir, leftovers)
        if confirm is not None and not confirm(leftovers):
            raise StoreError(f"nothing was killed and the lock of {run_dir} is kept")
        ended, remaining = kill_all(lambda: run_processes(run_id, work_dir))
        if remaining:
            raise StoreError(
                f"processes of this run did not end after SIGKILL (pids {_pids(remaining)}):",
                [
                    Problem(
                        str(path),
                        "they may belong to another user or be stuck in the kernel (state D "
                        "in `ps`); the lock is kept until they are gone",
                    )
                ],
            )
        killed = tuple(ended)
    path.unlink()
    return Unlocked(info, killed)
