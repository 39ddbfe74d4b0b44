"""Host mounts that reach namespaces made before them (mount propagation).

A sandbox made ahead of its attempt cannot bind the attempt's folders: they do not exist
yet. It binds empty mount points of a *slot* instead, under a folder this process makes
a shared mount; bubblewrap makes its copies slaves of it, so a folder this process later
binds onto a mount point on the host appears at once inside every sandbox made over that
slot, and in no other. Unmounting it on the host takes it out of them too.

Linux, root. Plain mount(2) calls (microseconds, no process started); a failure is an
OSError and the caller makes its sandbox the slow way.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import threading
from pathlib import Path

from maka_eval import layout

MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_PRIVATE = 0x40000
MS_SHARED = 0x100000
MNT_DETACH = 0x2
SLOTS_ROOT = layout.HOST_SLOTS_DIR
"""Each tree of slots lives in SLOTS_ROOT/<pid>.<n>; /run is never shown to a sandbox."""

_libc = ctypes.CDLL(None, use_errno=True)
_trees = itertools.count(1)


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    if _libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source or ''} on {target}: {os.strerror(errno)}")


def detach(target: str) -> None:
    """Unmount `target` lazily (whatever still uses it keeps it until done); nothing
    when nothing is mounted there."""
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        if errno not in (22, 2):  # EINVAL: not a mount point; ENOENT: gone
            raise OSError(errno, f"umount {target}: {os.strerror(errno)}")


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo (space, tab, newline, backslash are octal)."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def mounts_under(folder: str) -> list[str]:
    """Mount points at or under `folder`, deepest first."""
    prefix = folder.rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            point = _unescape(line.split(" ", 5)[4])
            if point == folder or point.startswith(prefix):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def _owner_alive(name: str) -> bool:
    pid = name.split(".", 1)[0]
    return pid.isdigit() and os.path.exists(f"/proc/{pid}")


def sweep_stale(root: str = SLOTS_ROOT) -> None:
    """Take down what a process that died (even by SIGKILL) left mounted in its slots."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(root):
            if _owner_alive(name):
                continue
            folder = os.path.join(root, name)
            for point in mounts_under(folder):
                with contextlib.suppress(OSError):
                    detach(point)
            shutil.rmtree(folder, ignore_errors=True)


class SlotTree:
    """Slots of this process: SLOTS_ROOT/<pid>.<n>/slots/<m>, under one shared mount.

    `attach` binds a host folder or file onto a slot's mount point, read-only if asked
    (bound in a private staging mount first and made read-only there, then moved in:
    the copies a move propagates carry its flags, where a later remount would not reach
    them).
    """

    def __init__(self, root: str = SLOTS_ROOT) -> None:
        sweep_stale(root)
        self.base = os.path.join(root, f"{os.getpid()}.{next(_trees)}")
        self._stage = os.path.join(self.base, "stage")
        self.shared = os.path.join(self.base, "slots")
        self._lock = threading.Lock()
        for folder in (self.shared, self._stage):
            os.makedirs(folder, mode=0o700, exist_ok=True)
        try:
            _mount(self.shared, self.shared, MS_BIND)
            _mount(None, self.shared, MS_SHARED)
            _mount(self._stage, self._stage, MS_BIND)
            _mount(None, self._stage, MS_PRIVATE)
        except OSError:
            self.close()
            raise
        Path(self._stage, "file").touch()
        os.makedirs(os.path.join(self._stage, "dir"), exist_ok=True)
        self._next = 0

    def new_slot(self) -> str:
        """A new, empty slot folder (its mount points are the caller's to make)."""
        with self._lock:
            self._next += 1
            folder = os.path.join(self.shared, str(self._next))
        os.mkdir(folder, 0o700)
        return folder

    def attach(self, source: str, point: str, *, read_only: bool = False) -> None:
        """Show `source` at the mount point `point` of a slot (and in its sandboxes)."""
        if not read_only:
            _mount(source, point, MS_BIND)
            return
        stage = os.path.join(self._stage, "dir" if os.path.isdir(source) else "file")
        with self._lock:
            _mount(source, stage, MS_BIND)
            try:
                _mount(None, stage, MS_REMOUNT | MS_BIND | MS_RDONLY)
                _mount(stage, point, MS_MOVE)
            except OSError:
                detach(stage)
                raise

    @staticmethod
    def clear(slot: str) -> None:
        """Unmount whatever was attached under `slot` (the slot itself stays)."""
        for point in mounts_under(slot):
            if point != slot:
                detach(point)

    def close(self) -> None:
        """Unmount everything of this process's slots and remove them."""
        for point in mounts_under(self.base):
            with contextlib.suppress(OSError):
                detach(point)
        shutil.rmtree(self.base, ignore_errors=True)


__all__ = ["SLOTS_ROOT", "SlotTree", "detach", "mounts_under", "sweep_stale"]
