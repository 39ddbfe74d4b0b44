"""Starting subjects and quiescing whole process trees.

A process group or session is not a handle on a subject's processes: a subject can
`setsid` or double-fork out of both. So every process of an attempt carries the
attempt's marker in its environment (MAKA_EVAL_ATTEMPT_ID, inherited by descendants),
and the supervisor is a child subreaper (PR_SET_CHILD_SUBREAPER), so an orphaned
descendant is re-parented to it instead of to init. An attempt's members are then its
live roots, the supervisor's adopted children carrying the marker, and every
descendant of those. In a pod the relay is PID 1 and adopts every orphan anyway.

Quiescing freezes the members with SIGSTOP until the set stops growing (a fork in
flight cannot escape), then SIGKILLs them and reaps what was re-parented to us.
On natural exit nothing is torn down until the verifier has run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import IO

from maka_eval.processes.output import OutputCapture, pump_ready
from maka_eval.processes.table import ATTEMPT_MARKER, HAS_PROC
from maka_eval.processes.table import ProcInfo as _ProcInfo
from maka_eval.processes.table import alive as _alive
from maka_eval.processes.table import carries as _carries
from maka_eval.processes.table import environ as _environ
from maka_eval.processes.table import read as _read
from maka_eval.processes.table import snapshot as _snapshot
from maka_eval.processes.table import stat as _stat

MARKER_VARIABLE = ATTEMPT_MARKER
_PR_SET_CHILD_SUBREAPER = 36
_HAS_PROC = HAS_PROC


class WaitEnd(StrEnum):
    """Why waiting for a process stopped."""

    EXITED = "exited"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class CancelToken:
    """A cancellation flag that can also be waited on with select() (a pipe)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._event = threading.Event()
        self._listeners: list[Callable[[], None]] = []

    def on_cancel(self, listener: Callable[[], None]) -> None:
        """Call `listener` when cancelled; it must be safe in a signal handler (e.g. a
        queue.SimpleQueue put)."""
        self._listeners.append(listener)

    def cancel(self) -> None:
        """Set the flag; safe from a signal handler and from any thread."""
        if not self._event.is_set():
            self._event.set()
            with contextlib.suppress(OSError):
                os.write(self._write, b"x")
            for listener in list(self._listeners):
                listener()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking when cancelled; whether it was."""
        return self._event.wait(timeout)

    def fileno(self) -> int:
        """Readable once cancelled (the byte is never drained, so it stays readable)."""
        return self._read

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


_PR_SET_DUMPABLE = 4


def hide_environment() -> bool:
    """Make this process non-dumpable (Linux): its /proc entries (environ, cmdline, mem,
    fds) then belong to root, so processes of the same user -- subjects run without
    namespaces -- cannot read the credentials in its environment. False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class ProcessSupervisor:
    """Starts attempt processes and finds, freezes and kills their whole trees.

    One per process (the relay program, or the local executor serving many attempts).
    `exclusive` says this process serves a single attempt (the relay program, PID 1 of
    a task container): then every orphan it adopted belongs to that attempt, even one
    that dropped the marker from its environment.
    """

    def __init__(self, *, exclusive: bool = False) -> None:
        self.pid = os.getpid()
        self.exclusive = exclusive
        self.subreaper = become_subreaper()
        # This process holds every subject's credentials (the executor, or the relay):
        # subjects that run as plain processes of the same user must not read them.
        self.environment_hidden = hide_environment()
        self._lock = threading.Lock()
        self._managed: set[int] = set()
        # Every program spawn() started leads its own session; an orphan still in one of
        # these sessions came from an attempt even if it dropped the marker (env -i).
        self._sessions: set[int] = set()

    # -- starting and waiting -------------------------------------------------------
    def spawn(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
    ) -> subprocess.Popen[bytes]:
        """Start a process in a new session (the terminal's Ctrl-C does not reach it)."""
        with self._lock:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                close_fds=True,
            )
            self._managed.add(proc.pid)
            self._sessions.add(proc.pid)
        return proc

    def wait(
        self,
        proc: subprocess.Popen[bytes],
        timeout: float,
        cancel: CancelToken,
        captures: Sequence[OutputCapture] = (),
    ) -> WaitEnd:
        """Wait for exit, the timeout, or cancellation, whichever comes first, copying
        the captured output pipes meanwhile."""
        deadline = time.monotonic() + timeout
        pidfd = -1
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(proc.pid)
        try:
            while True:
                if proc.poll() is not None:
                    return WaitEnd.EXITED
                if cancel.is_set():
                    return WaitEnd.CANCELLED
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return WaitEnd.TIMED_OUT
                fds = [cancel.fileno()] + ([pidfd] if pidfd >= 0 else [])
                fds += [c.read_fd for c in captures if c.read_fd is not None]
                ready, _, _ = select.select(
                    fds, [], [], remaining if pidfd >= 0 else min(remaining, 0.05)
                )
                if captures and ready:
                    pump_ready(captures, ready)
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def manage(self, pid: int) -> None:
        """A child this process started outside `spawn` (a sandbox's holder): it is no
        adopted orphan, and its Popen reaps it."""
        with self._lock:
            self._managed.add(pid)

    def forget(self, pid: int) -> None:
        """A child passed to `manage` was reaped."""
        with self._lock:
            self._managed.discard(pid)

    def release(self, proc: subprocess.Popen[bytes]) -> int:
        """Reap a process that has ended (or been killed) and forget it."""
        code = proc.wait()
        with self._lock:
            self._managed.discard(proc.pid)
        return code

    # -- membership -----------------------------------------------------------------
    def members(
        self,
        roots: Iterable[int],
        attempt_id: str,
        table: Mapping[int, _ProcInfo] | None = None,
    ) -> set[int]:
        """Live processes of the attempt: roots, marked adoptees, and all descendants."""
        if not _HAS_PROC:
            return {pid for pid in roots if _alive(pid)}
        marker = f"{MARKER_VARIABLE}={attempt_id}".encode()
        if table is None:
            table = _snapshot()
        children: defaultdict[int, list[int]] = defaultdict(list)
        for pid, info in table.items():
            children[info.ppid].append(pid)
        seeds = {pid for pid in roots if pid in table and table[pid].state != "Z"}
        # Orphans of the attempt were adopted by us (subreaper) or, without subreaper
        # support, by init: look for the marker where they can end up.
        adopters = [self.pid] if self.subreaper else [self.pid, 1]
        for adopter in adopters:
            for pid in children.get(adopter, ()):
                if pid in seeds or table[pid].state == "Z":
                    continue
                adopted_here = adopter == self.pid and self.subreaper
                if (self.exclusive and adopted_here and pid not in self._managed) or _carries(
                    pid, marker
                ):
                    seeds.add(pid)
        found: set[int] = set()
        stack = list(seeds)
        while stack:
            pid = stack.pop()
            if pid in found or pid == self.pid:
                continue
            found.add(pid)
            stack.extend(children.get(pid, ()))
        return {pid for pid in found if table[pid].state != "Z"}

    def quiesce(
        self,
        roots: Iterable[int],
        attempt_id: str,
        timeout: float = 10.0,
        table: Mapping[int, _ProcInfo] | None = None,
    ) -> int:
        """Freeze then kill every process of the attempt; return how many were killed."""
        roots = list(roots)
        if not _HAS_PROC:
            for pid in roots:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            return len(roots)
        frozen: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = self.members(roots, attempt_id, table) - frozen
            table = None  # a given snapshot serves the first round only
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            frozen |= new
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reap(frozen, deadline)
        return len(frozen)

    def _reap(self, pids: set[int], deadline: float) -> None:
        """Wait until the killed processes are gone, reaping those re-parented to us."""
        with self._lock:
            managed = set(self._managed)
        pending = set(pids)
        while pending and time.monotonic() < deadline:
            for pid in list(pending):
                info = _stat(pid)
                if info is None:
                    pending.discard(pid)
                elif info.state == "Z" and info.ppid == self.pid and pid not in managed:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                elif info.state == "Z" and info.ppid != self.pid:
                    pending.discard(pid)  # another parent (a managed Popen's owner) reaps it
                elif pid in managed and info.state == "Z":
                    pending.discard(pid)  # release() reaps it
            if pending:
                time.sleep(0.002)

    def end_attempt(self, attempt_id: str) -> int:
        """The attempt is over: kill what is left of it and reap adopted zombies.

        One /proc scan serves both (the common case finds nothing to kill). The scan is
        skipped when we adopted nothing: with the attempt's programs ended, any process
        left of it heads a chain whose top was re-parented to us (the subreaper).
        """
        if not _HAS_PROC:
            return 0
        if self.subreaper and not self._unmanaged_children():
            return 0
        table = _snapshot()
        killed = 0
        if self.members([], attempt_id, table):
            killed = self.quiesce([], attempt_id, table=table)
        self._reap_zombies(table)
        return killed

    def _unmanaged_children(self) -> bool:
        """Whether any child of this process (of any of its threads) is not a program
        we started: an adopted orphan, or a zombie to reap."""
        with self._lock:
            managed = set(self._managed)
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return True
        for tid in tasks:
            raw = _read(f"/proc/{self.pid}/task/{tid}/children", 1 << 16)
            if raw is None:
                return True  # cannot tell: look properly
            if any(int(child) not in managed for child in raw.split()):
                return True
        return False

    def quiesce_adopted(self, timeout: float = 10.0) -> int:
        """Kill every orphan of an attempt we adopted that no running attempt owns (end
        of a run): one in a session an attempt's program began, or carrying an attempt
        marker. Other orphans are left alone: a program that embeds the local executor
        may adopt its own (a service a script started in the background), and those are
        not the run's to kill."""
        if not (_HAS_PROC and self.subreaper):
            return 0
        with self._lock:
            managed = set(self._managed)
            sessions = set(self._sessions)
        table = _snapshot()
        prefix = f"{MARKER_VARIABLE}=".encode()
        roots = [
            pid
            for pid, info in table.items()
            if info.ppid == self.pid
            and pid not in managed
            and info.state != "Z"
            and (
                info.session in sessions or any(entry.startswith(prefix) for entry in _environ(pid))
            )
        ]
        killed = self.quiesce(roots, attempt_id="\0none", timeout=timeout) if roots else 0
        self.reap_orphans()
        return killed

    def reap_orphans(self) -> int:
        """Reap adopted children that exited on their own (zombies nobody else waits for)."""
        if not (_HAS_PROC and self.subreaper):
            return 0
        return self._reap_zombies(_snapshot())

    def _reap_zombies(self, table: Mapping[int, _ProcInfo]) -> int:
        # A zombie's pid is not reused until it is reaped, so a zombie seen in the
        # snapshot that no Popen of ours owns can be reaped safely later, under the lock.
        zombies = [p for p, i in table.items() if i.ppid == self.pid and i.state == "Z"]
        if not (zombies and self.subreaper):
            return 0
        reaped = 0
        with self._lock:
            for pid in zombies:
                if pid in self._managed:
                    continue
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        reaped += 1
        return reaped
