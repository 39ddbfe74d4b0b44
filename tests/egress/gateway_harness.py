"""Real processes around the egress gateway for tests: the gateway program itself, a
recording upstream server (plain or TLS, with a throwaway CA), raw proxy requests."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import os
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
