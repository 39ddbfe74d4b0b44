"""Be one program running in a container, for the relay: `python -m maka_eval.sandbox.exec`.

The relay waits for, times out, quiesces and captures the output of host processes. So
for each program the container sandbox runs in a container, it creates an exec instance
(Docker Engine API) and starts this helper as a host process: the helper starts the exec
over the engine's socket, copies its stdout and stderr to its own fds 1 and 2 as they
come, and exits with the exec's exit code. Standard library only (with maka_eval's
strict JSON reader): it starts in a fraction of the second the docker SDK takes to import.

    python -m maka_eval.sandbox.exec --engine URL --exec ID [--status FILE]

`--status FILE`, with MAKA_EVAL_EXEC_MARKER in the environment: stderr lines
`<marker> word ...` are the wrapper's reports to the relay; they go to FILE, not to
stderr. Only the wrapper and this helper know the marker.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import http.client

from maka_eval import strict_json

API = ""
"""Unversioned paths: the engine's own API version (Docker 29 refuses old ones)."""
CANNOT_START = 126
"""Exit code when the engine refused to start the exec (as `docker exec` reports it)."""
MARKER_VARIABLE = "MAKA_EVAL_EXEC_MARKER"
INSPECT_TIMEOUT = 30.0


def connect(engine: str, timeout: float | None) -> socket.socket:
    """A connected socket to the engine (unix:// or tcp://)."""
    parts = urlsplit(engine)
    if parts.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(parts.path)
        return sock
    if parts.scheme in ("tcp", "http"):
        return socket.create_connection(
            (parts.hostname or "localhost", parts.port or 2375), timeout
        )
    raise OSError(f"unsupported engine address {engine!r} (use unix:// or tcp://)")


def _connection(engine: str, timeout: float) -> http.client.HTTPConnection:
    import http.client  # not at import time: it is most of the helper's start-up

    class _Connection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = connect(engine, timeout)

    return _Connection("docker", timeout=timeout)


def request(
    engine: str, method: str, path: str, body: Any = None, timeout: float = INSPECT_TIMEOUT
) -> tuple[int, Any]:
    """One API call; the status and the decoded JSON body (None when empty)."""
    conn = _connection(engine, timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, API + path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, strict_json.loads(raw) if raw.strip() else None
        except ValueError:
            return resp.status, raw.decode(errors="replace")
    finally:
        conn.close()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except BrokenPipeError:
            return  # nobody reads any more (the relay is quiescing us)
        data = data[written:]


class _Reports:
    """Stderr with the wrapper's report lines taken out and appended to a file."""

    def __init__(self, marker: str, path: str) -> None:
        self.tag = f"\n{marker} ".encode()
        self.path = path
        self.pending = b""

    def feed(self, data: bytes) -> None:
        self.pending += data
        while True:
            start = self.pending.find(self.tag)
            if start < 0:
                keep = len(self.tag) - 1  # a tag may be arriving in pieces
                cut = max(0, len(self.pending) - keep)
                _write_all(2, self.pending[:cut])
                self.pending = self.pending[cut:]
                return
            end = self.pending.find(b"\n", start + len(self.tag))
            _write_all(2, self.pending[:start])
            if end < 0:
                self.pending = self.pending[start:]
                return
            line = self.pending[start + len(self.tag) : end]
            with open(self.path, "ab") as handle:
                handle.write(line + b"\n")
            self.pending = self.pending[end + 1 :]

    def close(self) -> None:
        _write_all(2, self.pending)
        self.pending = b""


def _read_headers(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """Status code, raw headers and what already arrived after them."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    return status, head, rest


def _error_message(head: bytes, rest: bytes, sock: socket.socket) -> str:
    body = rest
    with contextlib.suppress(OSError):
        sock.settimeout(5)
        while len(body) < 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    text = body.decode(errors="replace")
    for line in text.splitlines():  # a chunked body: the JSON is one of the lines
        with contextlib.suppress(ValueError, AttributeError):
            message = strict_json.loads(line).get("message")
            if message:
                return str(message)
    return text.strip()[:500] or head.decode(errors="replace").splitlines()[0]


def run_exec(engine: str, exec_id: str, reports: _Reports | None) -> int | None:
    """Start the exec, copy its output; its exit code, or None if it could not start."""
    sock = connect(engine, None)
    try:
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        sock.sendall(
            (
                f"POST {API}/exec/{exec_id}/start HTTP/1.1\r\nHost: docker\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
            ).encode()
            + body
        )
        status, head, buffer = _read_headers(sock)
        if status not in (101, 200):
            message = _error_message(head, buffer, sock)
            _write_all(
                2, f"maka-eval: the engine could not start the program: {message}\n".encode()
            )
            return None
        while True:
            while len(buffer) >= 8:
                kind, size = buffer[0], struct.unpack(">I", buffer[4:8])[0]
                if len(buffer) < 8 + size:
                    break
                payload, buffer = buffer[8 : 8 + size], buffer[8 + size :]
                if kind == 2 and reports is not None:
                    reports.feed(payload)
                else:
                    _write_all(2 if kind in (2, 3) else 1, payload)
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buffer += chunk
    finally:
        sock.close()
        if reports is not None:
            reports.close()
    return exit_code(engine, exec_id)


def _get(engine: str, path: str) -> tuple[int, Any]:
    """A GET as HTTP/1.0 over a bare socket (the engine answers unchunked, then closes):
    the status and the decoded JSON body; the helper need not load http.client."""
    sock = connect(engine, INSPECT_TIMEOUT)
    try:
        sock.sendall(f"GET {API}{path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        status, _, data = _read_headers(sock)
        while chunk := sock.recv(65536):
            data += chunk
    finally:
        sock.close()
    try:
        return status, strict_json.loads(data) if data.strip() else None
    except ValueError:
        return status, data.decode(errors="replace")


def exit_code(engine: str, exec_id: str) -> int:
    """The exec's exit code, once the engine has it."""
    deadline = time.monotonic() + INSPECT_TIMEOUT
    while True:
        status, info = _get(engine, f"/exec/{exec_id}/json")
        if status != 200 or not isinstance(info, dict):
            return 255
        if not info.get("Running") or time.monotonic() > deadline:
            code = info.get("ExitCode")
            return code if isinstance(code, int) else 255
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m maka_eval.sandbox.exec")
    parser.add_argument("--engine", required=True)
    parser.add_argument("--exec", dest="exec_id", required=True)
    parser.add_argument("--status", default=None)
    args = parser.parse_args(argv)
    marker = os.environ.get(MARKER_VARIABLE)
    reports = _Reports(marker, args.status) if marker and args.status else None
    try:
        code = run_exec(args.engine, args.exec_id, reports)
    except OSError as exc:
        _write_all(2, f"maka-eval: lost the container engine: {exc}\n".encode())
        return 255
    return CANNOT_START if code is None else code


if __name__ == "__main__":
    sys.exit(main())
