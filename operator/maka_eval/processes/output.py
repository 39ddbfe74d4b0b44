"""Capturing a process's output into a file, up to a cap, without a thread.

The process writes into a pipe; the relay reads it whenever it waits (the wait loop
selects on the pipes next to the process and the cancellation token), keeps the first
`limit` bytes and discards the rest, so a runaway subject can neither fill the disk nor
block on a full pipe. When the attempt is over, what is left in the pipe is drained and
a marker saying how much was cut ends the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from pathlib import Path

CHUNK = 1 << 16


def cut_marker(limit: int, dropped: int) -> bytes:
    """What ends an output file that was cut."""
    note = f"[maka-eval: output cut at {limit} bytes; {dropped} more bytes were discarded]"
    return f"\n{note}\n".encode()


class DiskFull(OSError):
    """Writing failed because the file system holding `path` is full."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.ENOSPC, "no space left on device", path)


class OutputCapture:
    """One output stream of one process: a pipe, and the file it is copied into."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.written = 0
        self.dropped = 0
        self.disk_full = False
        self._file = -1  # created on the first byte: a quiet stream leaves no file
        read, self.child_fd = os.pipe()
        os.set_blocking(read, False)
        self.read_fd: int | None = read

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def started(self) -> None:
        """The process has its end of the pipe; close ours."""
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1

    def pump(self) -> bool:
        """Copy what is in the pipe now; False once the writers are gone (EOF)."""
        if self.read_fd is None:
            return False
        while True:
            try:
                data = os.read(self.read_fd, CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                self._close_pipe()
                return False
            self._keep(data)

    def _keep(self, data: bytes) -> None:
        room = self.limit - self.written
        kept = data[: max(room, 0)] if not self.disk_full else b""
        self.dropped += len(data) - len(kept)
        if kept and self._file < 0:
            try:
                self._file = os.open(
                    self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
                )
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                self.disk_full = True
                self.dropped += len(kept)
                return
        while kept:
            try:
                n = os.write(self._file, kept)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                self.disk_full = True
                self.dropped += len(kept)
                return
            self.written += n
            kept = kept[n:]

    def _close_pipe(self) -> None:
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None

    def finish(self) -> None:
        """Drain what is left (the attempt's processes are gone), mark a cut, close."""
        self.started()
        self.pump()
        self._close_pipe()  # a writer that escaped the attempt gets EPIPE from now on
        try:
            if self.dropped and not self.disk_full and self._file >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._file, cut_marker(self.limit, self.dropped))
        finally:
            if self._file >= 0:
                os.close(self._file)
                self._file = -1
        if self.disk_full:
            raise DiskFull(str(self.path))


def pump_ready(captures: Iterable[OutputCapture], ready: Iterable[int]) -> None:
    """Service the captures whose pipes select() reported readable."""
    ready = set(ready)
    for capture in captures:
        if capture.read_fd is not None and capture.read_fd in ready:
            capture.pump()
