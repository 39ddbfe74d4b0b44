"""Reading the process table (Linux /proc): who is alive, whose child, which run's.

Standard library only: the relay imports this inside task containers, and the store
uses it to prove that no process of a run remains before a stale lock is removed.

A run's processes cannot be found by one marker alone: every attempt process carries
MAKA_EVAL_ATTEMPT_ID=<runId>/<cellId>/<n> (the subject also MAKA_EVAL_RUN_ID), but a
subject can start children with an empty environment (`env -i`) and let them be
re-parented to init. Such a child still descends from a marked process while its parent
lives, and it still works inside the run's work folder (its cwd or root) after.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from maka_eval import layout

HAS_PROC = os.path.isdir("/proc/self")
ATTEMPT_MARKER = layout.ATTEMPT_ID_ENV
RUN_MARKER = layout.RUN_ID_ENV
# A process stopped by a signal (SIGSTOP: a writer that died while quiescing) or by a
# tracer; either way it runs no more until continued, but it is not gone.
FROZEN_STATES = frozenset({"T", "t"})


@dataclass(frozen=True)
class ProcInfo:
    """One line of the process table: the parent, the state letter and the session of
    /proc/PID/stat."""

    ppid: int
    state: str
    session: int = 0


def read(path: str, limit: int = 4096) -> bytes | None:
    """Read a small /proc file without the cost of a buffered file object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_stat(raw: bytes) -> ProcInfo | None:
    """Parent, state and session from the content of /proc/PID/stat."""
    # The command name is in parentheses and may itself contain ') '.
    # After it: state ppid pgrp session ...
    fields = raw[raw.rfind(b")") + 2 :].split(maxsplit=4)
    if len(fields) < 2:
        return None
    session = int(fields[3]) if len(fields) >= 4 else 0
    return ProcInfo(int(fields[1]), fields[0].decode(), session)


def snapshot() -> dict[int, ProcInfo]:
    """Every visible process: pid -> (parent, state)."""
    table: dict[int, ProcInfo] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            raw = read(f"/proc/{name}/stat")
            info = parse_stat(raw) if raw else None
            if info is not None:
                table[int(name)] = info
    return table


def stat(pid: int) -> ProcInfo | None:
    """The process's parent and state, or None once it is gone."""
    raw = read(f"/proc/{pid}/stat")
    return parse_stat(raw) if raw else None


def environ(pid: int) -> list[bytes]:
    """The process's environment entries (`NAME=value`); empty if unreadable or gone."""
    raw = read(f"/proc/{pid}/environ", 1 << 20)
    return raw.split(b"\0") if raw else []


def carries(pid: int, marker: bytes) -> bool:
    """Whether the process's environment has exactly the entry `marker` (NAME=value)."""
    return marker in environ(pid)


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_marked(variable: str, value: str) -> list[int]:
    """Pids of live processes whose environment has `variable=value` (Linux /proc)."""
    if not HAS_PROC:
        return []
    marker = f"{variable}={value}".encode()
    return sorted(
        pid
        for pid, info in snapshot().items()
        if info.state != "Z" and pid != os.getpid() and carries(pid, marker)
    )


@dataclass(frozen=True)
class ProcessEntry:
    """A live process of a run, and why it counts as one."""

    pid: int
    state: str
    why: str

    @property
    def frozen(self) -> bool:
        """Stopped (SIGSTOP): it will not end by itself, and SIGTERM waits for SIGCONT."""
        return self.state in FROZEN_STATES


def _folder_link(pid: int, name: str) -> str | None:
    try:
        target = os.readlink(f"/proc/{pid}/{name}")
    except OSError:  # gone, or another user's process
        return None
    # The folder may have been removed under the process; it is still in there.
    return target.removesuffix(" (deleted)")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _ancestors(pid: int, table: Mapping[int, ProcInfo]) -> set[int]:
    """The pid and its parents up to init: the process asking, and its shells."""
    found: set[int] = set()
    while pid in table and pid not in found:
        found.add(pid)
        pid = table[pid].ppid
    return found


def run_processes(run_id: str, work_dir: Path | None = None) -> list[ProcessEntry]:
    """Live processes of the run, sorted by pid; [] where /proc is missing.

    A process counts when it carries MAKA_EVAL_RUN_ID=<runId> or an attempt marker
    MAKA_EVAL_ATTEMPT_ID=<runId>/..., descends from one that does, or has its cwd or
    root inside `work_dir` (the run's work folder). The caller and its ancestors never
    count: a shell sitting in a workspace is the user's, not the run's.
    """
    if not HAS_PROC:
        return []
    table = snapshot()
    exempt = _ancestors(os.getpid(), table)
    run_marker = f"{RUN_MARKER}={run_id}".encode()
    attempt_prefix = f"{ATTEMPT_MARKER}={run_id}/".encode()
    folder = os.path.realpath(work_dir) if work_dir is not None else None
    why: dict[int, str] = {}
    for pid, info in table.items():
        if info.state == "Z" or pid in exempt:
            continue
        for entry in environ(pid):
            if entry == run_marker:
                why[pid] = f"{RUN_MARKER}={run_id}"
                break
            if entry.startswith(attempt_prefix):
                why[pid] = entry.decode(errors="replace")
                break
        if pid in why or folder is None:
            continue
        for link in ("cwd", "root"):
            target = _folder_link(pid, link)
            if target is not None and _inside(target, folder):
                why[pid] = f"{link} {target}"
                break
        else:
            # A sandbox holder (bubblewrap) names the run's folders in its arguments;
            # its working directory and root tell nothing.
            command = read(f"/proc/{pid}/cmdline", 1 << 16) or b""
            if (folder + "/").encode() in command:
                program = command.split(b"\0", 1)[0].decode(errors="replace")
                why[pid] = f"sandbox of the run ({program})"
    children: defaultdict[int, list[int]] = defaultdict(list)
    for pid, info in table.items():
        children[info.ppid].append(pid)
    stack = [(child, pid) for pid in why for child in children.get(pid, ())]
    while stack:
        pid, parent = stack.pop()
        if pid in why or pid in exempt or table[pid].state == "Z":
            continue
        why[pid] = f"child of {parent}"
        stack.extend((child, pid) for child in children.get(pid, ()))
    return [ProcessEntry(pid, table[pid].state, why[pid]) for pid in sorted(why)]


def _signal_all(pids: Iterable[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def kill_all(
    find: Callable[[], Sequence[ProcessEntry]], timeout: float = 10.0
) -> tuple[list[int], list[int]]:
    """Freeze what `find` returns until it stops growing, then SIGKILL it and wait.

    Freezing first means a fork in flight cannot leave a child behind. `timeout` bounds
    each phase. Returns the pids killed and, of those, the ones still there at the end
    (zombies are dead and do not count): ([...], []) when all are gone.
    """
    deadline = time.monotonic() + timeout
    frozen: set[int] = set()
    while time.monotonic() < deadline:
        new = {entry.pid for entry in find()} - frozen
        if not new:
            break
        _signal_all(new, signal.SIGSTOP)
        frozen |= new
    # SIGKILL ends a stopped process too, without SIGCONT first.
    _signal_all(frozen, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    pending = set(frozen)
    while pending:
        for pid in list(pending):
            info = stat(pid)
            if info is None or info.state == "Z":  # a zombie is dead; its parent reaps it
                pending.discard(pid)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return sorted(frozen), sorted(pending)
