"""Real processes around the egress gateway for tests: the gateway program itself (or
its `Gateway` in this process), upstream servers (an HTTP(S) one with a throwaway CA; a
raw one that records every byte, read back by a strict canonical reader), raw proxy
requests and answers."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from maka_eval.egress import credential

KEY = b"0123456789abcdef0123456789abcdef"


def write_key(path: Path, key: bytes = KEY) -> Path:
    path.write_bytes(key + b"\n")  # as `kubectl create secret --from-file` would
    return path


def auth_header(value: str) -> str:
    return credential.proxy_authorization(value)


def valid_credential(identity: str = "ns1/attempt-1", key: bytes = KEY) -> str:
    return credential.credential(key, identity)


# -- a recording upstream ------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Upstream:
    """An HTTP(S) server that answers `upstream says hello <path>` and keeps every
    request it got."""

    host: str = "127.0.0.1"
    tls: tuple[Path, Path] | None = None
    """(certificate chain, key) to serve HTTPS."""
    seen: list[Seen] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def start(self) -> Upstream:
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = _read_chunked(self.rfile)
                seen.append(Seen(self.command, self.path, dict(self.headers.items()), body))
                reply = f"upstream says hello {self.path} ({len(body)} bytes)".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _read_chunked(stream: Any) -> bytes:
    body = b""
    while True:
        size = int(stream.readline().split(b";")[0].strip(), 16)
        if size == 0:
            while stream.readline() not in (b"\r\n", b"\n", b""):
                pass
            return body
        body += stream.read(size)
        stream.readline()


def make_tls(directory: Path, names: Sequence[str] = ("127.0.0.1",)) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for `names` (IPs or DNS names):
    (CA certificate, server certificate, server key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "maka-eval test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_path = directory / "ca.pem"
    cert_path = directory / "server.pem"
    key_path = directory / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


# -- the gateway program ---------------------------------------------------------------------


class GatewayProcess:
    """`python -m maka_eval.egress.gateway` on loopback; its audit lines are collected."""

    def __init__(
        self,
        key_file: Path,
        *,
        allow_private: Sequence[str] = ("127.0.0.1/32",),
        allow_ports: Sequence[str] = ("80", "443", "1024-65535"),
        extra: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> None:
        self.argv = [
            *prefix,
            sys.executable,
            "-m",
            "maka_eval.egress.gateway",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--key-file",
            str(key_file),
            *(a for cidr in allow_private for a in ("--allow-private", cidr)),
            # Tests' upstreams listen on ephemeral ports (the default: only 80 and 443).
            *(a for ports in allow_ports for a in ("--allow-port", ports)),
            *extra,
        ]
        self.audit: list[dict[str, Any]] = []
        self.port = 0
        self.process: subprocess.Popen[str] | None = None
        self._lines: list[str] = []

    def start(self, timeout: float = 20.0) -> GatewayProcess:
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            # Its own process group: stop() ends a wrapper (bwrap) and the gateway alike.
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self.port:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the gateway did not start:\n{''.join(self._lines)}")
            time.sleep(0.02)
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "listening":
                self.port = int(event["ports"][0])
            else:
                self.audit.append(event)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """The first audit event matching `predicate` (waiting for it to be written)."""
        deadline = time.monotonic() + timeout
        while True:
            for event in list(self.audit):
                if predicate(event):
                    return event
            if time.monotonic() > deadline:
                raise AssertionError(f"no such audit event in {self.audit}")
            time.sleep(0.02)

    def output(self) -> str:
        return "".join(self._lines)

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# -- raw proxy requests ----------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def read_answer(sock: socket.socket, *, until_close: bool = True) -> Answer:
    """Read one response head (and the body until the connection closes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("iso-8859-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines and lines[0] else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    while until_close:
        if length is not None and len(body) >= int(length):
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Answer(status, headers, body)


def send(port: int, request: bytes, timeout: float = 10.0) -> Answer:
    """Send raw bytes to the proxy on loopback; read its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        return read_answer(sock)


def connect(
    port: int, target: str, authorization: str | None, timeout: float = 10.0
) -> tuple[Answer, socket.socket]:
    """CONNECT through the proxy; the socket stays open when the answer is 200."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    answer = read_answer(sock, until_close=False)
    if answer.status != 200:
        rest = read_answer_body(sock, answer)
        sock.close()
        return rest, sock
    return answer, sock


def read_answer_body(sock: socket.socket, answer: Answer) -> Answer:
    body = answer.body
    length = int(answer.headers.get("content-length") or 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Answer(answer.status, answer.headers, body)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- what the gateway may send upstream, read strictly ------------------------------------------

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_REQUEST_LINE = re.compile(rb"(" + _TOKEN.pattern + rb") (/[\x21-\x7e]*) HTTP/1\.1")
_HEADER_LINE = re.compile(rb"(" + _TOKEN.pattern + rb"): ([^\x00\r\n]*)")
_CHUNK_SIZE = re.compile(rb"[1-9a-f][0-9a-f]*")


@dataclass
class Forwarded:
    """One request as an upstream received it."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class Canonical:
    """What `read_canonical` made of an upstream connection's bytes."""

    request: Forwarded | None
    """The complete request, if the bytes hold one."""
    rest: bytes = b""
    """The bytes after it (none, for a gateway that sends one request a connection)."""
    error: str = ""
    """Why the bytes are not (a prefix of) a canonical request; empty when they are."""

    @property
    def incomplete(self) -> bool:
        """A canonical prefix, cut short (the client's request was refused or ended
        in the middle of its body)."""
        return self.request is None and not self.error


class _Short(Exception):
    pass


class _Bad(Exception):
    pass


def read_canonical(data: bytes) -> Canonical:
    """Read one request strictly as h11 serializes it (the gateway's only way of
    writing one): CRLF lines, a single space after each colon, exactly one Host, at most
    one framing header, `Transfer-Encoding: chunked` exactly, a Content-Length without
    leading zeros, lower-case hex chunk sizes without extensions or leading zeros, no
    trailers. Independent of h11 on purpose: it is the reference the gateway is held to."""
    position = 0

    def line() -> bytes:
        nonlocal position
        end = data.find(b"\r\n", position)
        if end < 0:
            tail = data[position:]
            if b"\n" in tail or b"\r" in tail[:-1]:
                raise _Bad(f"a bare CR or LF in {tail[:80]!r}")
            raise _Short
        text = data[position:end]
        if b"\n" in text or b"\r" in text:
            raise _Bad(f"a bare CR or LF in {text[:80]!r}")
        position = end + 2
        return text

    def take(count: int) -> bytes:
        nonlocal position
        if len(data) - position < count:
            raise _Short
        chunk = data[position : position + count]
        position += count
        return chunk

    try:
        first = line()
        match = _REQUEST_LINE.fullmatch(first)
        if not match:
            raise _Bad(f"request line {first[:100]!r}")
        headers: list[tuple[str, str]] = []
        while True:
            text = line()
            if not text:
                break
            header = _HEADER_LINE.fullmatch(text)
            if not header or header.group(2) != header.group(2).strip(b" \t"):
                raise _Bad(f"header line {text[:100]!r}")
            headers.append((header.group(1).decode(), header.group(2).decode("latin-1")))
        names = [name.lower() for name, _ in headers]
        if names.count("host") != 1:
            raise _Bad(f"{names.count('host')} Host headers")
        if any(name.startswith("proxy-") for name in names):
            raise _Bad("a Proxy-* header went upstream")
        framing = [n for n in names if n in ("content-length", "transfer-encoding")]
        if len(framing) > 1:
            raise _Bad(f"framing headers {framing}")
        values = dict((n.lower(), v) for n, v in headers)
        body = b""
        if framing == ["content-length"]:
            length = values["content-length"]
            if not re.fullmatch(r"0|[1-9][0-9]*", length):
                raise _Bad(f"Content-Length {length!r}")
            body = take(int(length))
        elif framing == ["transfer-encoding"]:
            if values["transfer-encoding"] != "chunked":
                raise _Bad(f"Transfer-Encoding {values['transfer-encoding']!r}")
            parts = []
            while True:
                size = line()
                if size == b"0":
                    if line() != b"":
                        raise _Bad("trailers or no final CRLF")
                    break
                if not _CHUNK_SIZE.fullmatch(size):
                    raise _Bad(f"chunk size line {size[:80]!r}")
                parts.append(take(int(size, 16)))
                if take(2) != b"\r\n":
                    raise _Bad("chunk data not followed by CRLF")
            body = b"".join(parts)
        request = Forwarded(match.group(1).decode(), match.group(2).decode(), headers, body)
        return Canonical(request, data[position:])
    except _Short:
        return Canonical(None)
    except _Bad as bad:
        return Canonical(None, error=str(bad))


@dataclass
class Recorded:
    """One connection an upstream accepted: every byte it carried."""

    data: bytearray = field(default_factory=bytearray)
    closed: bool = False


class RecordingUpstream:
    """A raw TCP upstream that keeps every byte of every connection, in the order it
    accepted them. Once a connection's bytes make a complete canonical request it answers
    200 (`upstream says hello <target> (<n> bytes)`, Connection: close) and half-closes,
    but goes on recording until the gateway closes: a byte sent after a request is seen."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.reply: bytes | None = None
        """Raw bytes to answer instead (a response the test writes, malformed or not)."""
        self.connections: list[Recorded] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, 0))
        self._stopped = False

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> RecordingUpstream:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            record = Recorded()
            with self._lock:
                self.connections.append(record)
            threading.Thread(target=self._serve, args=(conn, record), daemon=True).start()

    def _serve(self, conn: socket.socket, record: Recorded) -> None:
        answered = False
        conn.settimeout(60)
        try:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                record.data += data
                if answered:
                    continue
                seen = read_canonical(bytes(record.data))
                if seen.request is not None:
                    answered = True
                    body = (
                        f"upstream says hello {seen.request.target} "
                        f"({len(seen.request.body)} bytes)"
                    ).encode()
                    head = (
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                    )
                    reply = self.reply if self.reply is not None else head.encode() + body
                    with contextlib.suppress(OSError):
                        conn.sendall(reply)
                        conn.shutdown(socket.SHUT_WR)
        finally:
            conn.close()
            record.closed = True

    def take(self, count: int, timeout: float = 60.0) -> list[bytes]:
        """The bytes of every connection so far, once at least `count` were accepted
        (the kernel completes a connection before this server accepts it) and each has
        been closed by the gateway; then forgets them."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.connections) >= count and all(r.closed for r in self.connections):
                    taken = [bytes(r.data) for r in self.connections]
                    self.connections.clear()
                    return taken
            if time.monotonic() > deadline:
                raise AssertionError("the gateway left an upstream connection open")
            time.sleep(0.005)

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()


# -- the gateway in this process, on loopback ------------------------------------------------


class InProcessGateway:
    """The gateway's own `Gateway` serving on loopback from an event loop in a thread of
    this process: its audit events land in `audit` before it closes a connection, so a
    client that has read to the end can look at them at once."""

    def __init__(self, settings: Any) -> None:
        import asyncio

        from maka_eval.egress.gateway import Gateway

        self.audit: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self._gateway = Gateway(settings, audit=self.audit.append)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: Any = None

    def start(self) -> InProcessGateway:
        import asyncio

        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._gateway.serve("127.0.0.1", 0), self.loop)
        self._server = future.result(timeout=30)
        return self

    @property
    def port(self) -> int:
        return int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        import asyncio

        async def close() -> None:
            self._server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:  # connections still lingering after a refusal
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)


def exchange_raw(
    port: int, pieces: Sequence[bytes], *, pause: float = 0.0, timeout: float = 60.0
) -> bytes:
    """Write `pieces` to the gateway as separate TCP writes (`pause` between them), end
    the sending side, and read everything it answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):  # the gateway may close on a refusal first
            for index, piece in enumerate(pieces):
                if index and pause:
                    time.sleep(pause)
                sock.sendall(piece)
            sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            received += data
        return bytes(received)


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def read_replies(data: bytes, *, head: bool = False) -> list[Reply]:
    """The gateway's answers on one connection, in order (interim 1xx ones included);
    AssertionError if they are not well framed (every final one has a Content-Length,
    as the upstream's and the gateway's own refusals do) or bytes are left over. `head`:
    the requests were HEAD, whose answers have no body whatever their length says."""
    replies = []
    position = 0
    while position < len(data):
        end = data.find(b"\r\n\r\n", position)
        assert end >= 0, f"a cut answer head: {data[position:][:200]!r}"
        lines = data[position:end].decode("latin-1").split("\r\n")
        position = end + 4
        version, status, *_ = lines[0].split(" ", 2)
        assert version == "HTTP/1.1" and status.isdigit(), lines[0]
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            assert sep and name == name.strip(), line
            headers.append((name.lower(), value.strip()))
        names = [n for n, _ in headers]
        assert "transfer-encoding" not in names, headers
        body = b""
        if int(status) >= 200 and not head:
            (length,) = [v for n, v in headers if n == "content-length"]
            body = data[position : position + int(length)]
            assert len(body) == int(length), f"a cut answer body: {body!r}"
            position += int(length)
        replies.append(Reply(int(status), headers, body))
    return replies
