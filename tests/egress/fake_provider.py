"""A model provider on loopback that answers in the OpenAI and Anthropic shapes and
records exactly what reached it (to check what the proxy stripped and forwarded).

Plain HTTP, or HTTPS with a certificate from a throwaway CA (`make_tls`), so a proxy
can intercept a real TLS tunnel. Model names steer the answer: "overloaded" gets a 429,
"cut-stream" an Anthropic stream cut before its end, "paced" a stream whose every chunk
waits until the test has seen the previous one (nothing may be held back).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.metering.provider_payloads import (
    Reported,
    chat_body,
    chat_stream,
    messages_body,
    messages_stream,
    responses_body,
    responses_stream,
)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


@dataclass
class Pacing:
    """Lets a test release a paced stream one chunk at a time."""

    seen: list[threading.Event] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)


class FakeProvider:
    """A threaded HTTP(S) server; use as a context manager."""

    def __init__(self, reported: Reported | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.reported = reported or Reported()
        self.received: list[Received] = []
        self.pacing = Pacing()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                provider._record(self, b"")
                self._send(200, b"plain page\n", "text/plain")

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                provider._record(self, raw)
                provider._answer(self, json.loads(raw) if raw else {})

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.tls = tls
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def base(self, host: str = "127.0.0.1") -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _record(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        headers = {k.lower(): v for k, v in handler.headers.items()}
        self.received.append(Received(handler.command, handler.path, headers, raw))

    def _answer(self, h: Any, body: dict[str, Any]) -> None:
        path = h.path.split("?")[0]
        model = str(body.get("model", ""))
        r = self.reported
        if model == "overloaded":
            error = {"error": {"type": "rate_limit_error", "message": "slow down"}}
            h._send(429, json.dumps(error).encode(), "application/json")
            return
        stream = body.get("stream") is True
        if path.endswith("/chat/completions"):
            include = (body.get("stream_options") or {}).get("include_usage") is True
            chunks = chat_stream(model, r, include) if stream else None
            whole = chat_body(model, r)
        elif path.endswith("/responses"):
            chunks = responses_stream(model, r) if stream else None
            whole = responses_body(model, r)
        elif path.endswith("/messages"):
            cut = model == "cut-stream"
            chunks = messages_stream(model, r, cut=cut) if stream else None
            whole = messages_body(model, r)
        else:
            h._send(404, b'{"error": "no such endpoint"}', "application/json")
            return
        if chunks is None:
            h._send(200, json.dumps(whole).encode(), "application/json")
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream; charset=utf-8")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        paced = model == "paced"
        if paced:
            self.pacing.seen = [threading.Event() for _ in chunks]
        for i, chunk in enumerate(chunks):
            h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            h.wfile.flush()
            self.pacing.sent_at.append(time.monotonic())
            if paced and not self.pacing.seen[i].wait(10):
                return  # the client never saw this chunk: it was held back
        if model == "cut-stream":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)  # cut without the final chunk
            return
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()


@dataclass(frozen=True)
class TLSFiles:
    ca_cert: Path
    """The CA that signed the server certificate (what the proxy verifies it with)."""
    context: ssl.SSLContext
    """A server context for localhost and 127.0.0.1."""


def make_tls(folder: Path) -> TLSFiles:
    """A throwaway CA and a server certificate for localhost / 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake provider CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    ca_path = folder / "provider-ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path = folder / "provider.pem"
    key_path = folder / "provider.key"
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return TLSFiles(ca_path, context)
