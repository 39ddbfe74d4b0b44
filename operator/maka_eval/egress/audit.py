"""The egress proxy's audit log: one JSON object per decision, bounded and rotated.

Every decision the proxy makes (a tunnel or request allowed or blocked, a raw-TCP
tunnel killed, a model request metered and what was stripped from it) is appended as
one line. The file is created 0600 in a folder made 0700 -- a folder the subject cannot
read -- and never grows past `max_bytes`: when the next line would not fit, the file is
renamed to `<name>.1` (the previous `.1` is dropped) and a new file is started, so the
log holds at most twice `max_bytes`. With `background=True` (the proxy) a decision made
on a running event loop is appended once the loop has finished its current turn, with
the others of that turn in one write: the request it is about has been forwarded by
then. (A writer thread did this before; waking it for every line cost the proxy more
CPU than the write, and the proxy is CPU-bound.) Outside an event loop, and on `close`,
lines are written at once. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
MIN_MAX_BYTES = 8 * 1024
FIELD_LIMIT = 1024
"""A string field is cut to this many characters (a URL can be arbitrarily long)."""
LINE_LIMIT = 4096


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= FIELD_LIMIT else value[:FIELD_LIMIT] + "..."
    if isinstance(value, Mapping):
        return {str(k)[:64]: _bounded(v) for k, v in list(value.items())[:32]}
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in list(value)[:32]]
    return value


class AuditLog:
    """Appends one JSON line per decision to a size-capped, rotated file."""

    def __init__(
        self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, background: bool = False
    ) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"the audit log's size cap must be at least {MIN_MAX_BYTES} bytes")
        self.path = Path(path)
        self.max_bytes = max_bytes
        if not self.path.parent.is_dir():
            self.path.parent.mkdir(mode=0o700, parents=True)
        os.chmod(self.path.parent, 0o700)
        self._fd = -1
        self._size = 0
        self._open()
        self._deferred = background
        self._pending: list[dict[str, Any]] = []

    @property
    def backup(self) -> Path:
        """Where the previous file goes on rotation."""
        return self.path.with_name(self.path.name + ".1")

    def _open(self) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(self.path, flags, 0o600)
        os.fchmod(self._fd, 0o600)
        self._size = os.fstat(self._fd).st_size

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one decision (a `ts` field is added: when it was decided)."""
        entry = {"ts": round(time.time(), 6), **record}
        if self._deferred:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                if not self._pending:
                    loop.call_soon(self.flush)
                self._pending.append(entry)
                return
        self._pending.append(entry)
        self.flush()

    def flush(self) -> None:
        """Append the lines not yet written, in order."""
        entries, self._pending = self._pending, []
        if not entries or self._fd < 0:
            return
        batch = bytearray()
        for entry in entries:
            line = self._line(entry)
            if self._size + len(batch) + len(line) > self.max_bytes:
                self._write(batch)
                batch.clear()
                self._rotate()
            batch += line
        self._write(batch)

    @staticmethod
    def _line(entry: dict[str, Any]) -> bytes:
        entry = _bounded(entry)
        line = json.dumps(entry, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
        if len(line) > LINE_LIMIT:
            keep = {k: entry[k] for k in ("ts", "event", "decision") if k in entry}
            line = json.dumps({**keep, "truncated": True}).encode() + b"\n"
        return line

    def _write(self, data: bytearray) -> None:
        if not data or self._fd < 0:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError:
            # The proxy keeps working if the disk fails; the timestamps show the gap.
            pass
        self._size += len(data)

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(OSError):
            os.replace(self.path, self.backup)
            self._open()

    def close(self) -> None:
        """Write what is pending, then close the file."""
        self.flush()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
