"""The cluster's egress gateway: the only destination an attempt Pod's network allows.

Attempt Pods reach the outside world through their egress sidecar (mitmproxy with the
blocklist, audit, web-tool stripping and metering addons), and the sidecar reaches it
only through this gateway, a Deployment in the operator's namespace: the Pod's
NetworkPolicy allows egress to the gateway's Pods and nothing else, DNS included. A
NetworkPolicy cannot tell the sidecar from the subject (they share the Pod's network),
so the gateway asks for what only the sidecar holds: the attempt's credential
(`egress.credential`), mounted from a Secret into the sidecar alone. A subject that
unsets the proxy variables, speaks raw TCP or asks DNS reaches nothing; one that talks
to the gateway itself has no credential and is refused.

For a request with a valid credential the gateway
- resolves the destination itself and refuses it when ANY address it resolves to is
  loopback, private, link-local, shared, reserved or a cloud metadata address (IPv4
  inside IPv6 unwrapped), then connects to an address it checked -- never to the name
  again, so an answer that changes between the check and the connect (DNS rebinding)
  cannot slip through;
- forwards to the web's ports only: 80 and 443 unless `--allow-port` names others
  (a subject has no business reaching a mail server or a database through it);
- applies the contamination blocklist (`EgressPolicy.check_host`, and `check_url` for
  plain-HTTP requests) as a second line behind the sidecar's;
- writes every decision to stdout as one JSON object a line (the audit log).

Missing or forged credential: 407. Refused destination: 403 with the reason. CONNECT
tunnels carry TLS. Plain-HTTP requests (absolute-form) are read by h11 (`egress.http1`:
framing is decided there and nowhere else) and forwarded re-framed from its events, never
as the client's bytes, each over a connection of its own to the destination; the client
may keep its connection for more (pipelined too), each request checked as the first was.
Framing h11 or `http1.check_head` refuses (request smuggling's shapes: both
Content-Length and Transfer-Encoding, a bad chunk size...) is answered 400 (431, 501) and
the connection closed: nothing after it is read or forwarded. `GET /healthz`
(origin-form) answers 200 for the Deployment's probes.

Run: `python -m maka_eval.egress.gateway --key-file /etc/maka-eval/gateway/key`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import h11

from maka_eval.egress import credential, http1
from maka_eval.egress.policy import EgressPolicy, PolicyError, Verdict

DEFAULT_PORT = 3128
PortRange = tuple[int, int]
DEFAULT_ALLOWED_PORTS: tuple[PortRange, ...] = ((80, 80), (443, 443))
"""The destination ports forwarded to (HTTP and HTTPS); `--allow-port` replaces them."""


def port_ranges_text(ranges: Iterable[PortRange]) -> str:
    """`80, 443, 8000-8999`."""
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


HEAD_LIMIT = 64 * 1024
"""Largest request or response head (request line and headers) the gateway reads; also
the longest chunk-size line or trailer section (h11's max_incomplete_event_size)."""
REALM = "maka-eval egress gateway"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata and credentials
        "169.254.169.253",  # AWS VPC DNS
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::253",
        "100.100.100.200",  # Alibaba Cloud
    )
)
"""Refused even when an --allow-private range covers them."""
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.internal",
        "metadata.tencentyun.com",
    }
)
"""Cloud metadata names, refused before any DNS query."""
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",
    }
)
"""Headers never passed on (the framing headers neither: they are made anew)."""
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    407: "Proxy Authentication Required",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    504: "Gateway Timeout",
}


class Refusal(Exception):
    """A request the gateway answers with an error status and a reason; `check` and
    `rule` name what decided (the labels of the gateway's request counter)."""

    def __init__(self, status: int, reason: str, *, check: str = "", rule: str = "") -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason
        self.check = check or _CHECK_BY_STATUS.get(status, "request")
        self.rule = rule


_CHECK_BY_STATUS = {407: "credential", 403: "destination", 502: "upstream", 504: "upstream"}
"""The check a refusal without an explicit one comes from (400, 405, 431, 501: the
request itself)."""


class GatewayMetrics:
    """The gateway's Prometheus counters, on a registry of its own (`serve` exposes it).
    prometheus-client is imported only when metrics are asked for."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter

        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "maka_eval_gateway_requests",
            "Requests by decision (allow, deny, error) and the check that decided "
            "(rule: the blocklist entry that matched)",
            ["decision", "check", "rule"],
            registry=self.registry,
        )
        self.bytes = Counter(
            "maka_eval_gateway_bytes",
            "Bytes moved for allowed requests: sent to the destination, received from it",
            ["direction"],
            registry=self.registry,
        )

    def decided(self, decision: str, check: str, rule: str) -> None:
        self.requests.labels(decision, check, rule).inc()

    def ended(self, sent: int, received: int) -> None:
        self.bytes.labels("sent").inc(sent)
        self.bytes.labels("received").inc(received)

    def serve(self, port: int, address: str = "0.0.0.0") -> Any:
        """Serve /metrics on address:port from a thread of its own; the server."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        return server


def _policy_refusal(verdict: Verdict) -> str | None:
    """The reason of a blocking verdict, None for an allowing one."""
    return verdict.reason if verdict.blocked else None


# -- destinations ------------------------------------------------------------------------


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, NAT64, 6to4), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def address_refusal(address: str | IPAddress, allow: Sequence[IPNetwork] = ()) -> str | None:
    """Why the gateway must not connect to `address`, or None. Only public (global
    unicast) addresses pass, and those in `allow`; cloud metadata addresses never do."""
    if isinstance(address, str):
        try:
            address = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"{address!r} is not an IP address"
    inner = unwrap(address)
    shown = str(address) if inner == address else f"{address} ({inner})"
    if address in METADATA_ADDRESSES or inner in METADATA_ADDRESSES:
        return f"{shown} is a cloud metadata address"
    if any(inner.version == net.version and inner in net for net in allow):
        return None
    if inner.is_unspecified:
        return f"{shown} is the unspecified address"
    if inner.is_loopback:
        return f"{shown} is a loopback address"
    if inner.is_link_local:
        return f"{shown} is a link-local address"
    if inner.is_multicast:
        return f"{shown} is a multicast address"
    if inner.is_reserved:
        return f"{shown} is a reserved address"
    if inner.is_private or (isinstance(inner, ipaddress.IPv4Address) and inner in _SHARED):
        return f"{shown} is a private address"
    if not inner.is_global:
        return f"{shown} is a reserved address"
    return None


def host_refusal(host: str) -> str | None:
    """Why a destination name is refused before it is resolved, or None."""
    if host in METADATA_HOSTS:
        return f"{host} is a cloud metadata name"
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} names this machine"
    return None


def normalize_host(host: str) -> str:
    """Lowercase, without the trailing dot or IPv6 brackets; Refusal(400) if malformed."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        try:
            return str(ipaddress.IPv6Address(text))
        except ValueError:
            raise Refusal(400, f"{host!r} is not an IPv6 address") from None
    text = text.lower().rstrip(".")
    if not text or len(text) > 253 or not set(text) <= _HOST_CHARS:
        raise Refusal(400, f"{host!r} is not a host name")
    return text


def split_authority(authority: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) of a CONNECT request."""
    head, sep, port_text = authority.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refusal(400, f"CONNECT target {authority!r} is not host:port")
    if ":" in head and not head.startswith("["):
        raise Refusal(400, f"CONNECT target {authority!r}: put an IPv6 address in brackets")
    return normalize_host(head), int(port_text)


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host`, in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# -- requests --------------------------------------------------------------------------


def _response(status: int, reason: str, extra: Mapping[str, str] | None = None) -> bytes:
    body = (reason + "\n").encode()
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (extra or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Destination:
    """Where a request goes: host as asked, port, and (plain HTTP) the forwarded parts."""

    host: str
    port: int
    url: str
    path: str = ""
    """The origin-form target of a plain-HTTP request (empty for CONNECT)."""


def destination_of(method: str, target: str) -> Destination:
    """The destination of a CONNECT or an absolute-form request; Refusal(400) otherwise."""
    if method == "CONNECT":
        host, port = split_authority(target)
        shown = f"[{host}]" if ":" in host else host
        return Destination(host, port, f"https://{shown}:{port}")
    parts = urlsplit(target)
    if parts.scheme.lower() != "http" or not parts.netloc:
        if parts.scheme.lower() == "https":
            raise Refusal(400, "send https:// requests through CONNECT")
        raise Refusal(400, f"not a proxy request: {target[:200]!r}")
    if "@" in parts.netloc:
        raise Refusal(400, "user information in the request URL is refused")
    try:
        port = parts.port or 80
    except ValueError:
        raise Refusal(400, f"bad port in {target[:200]!r}") from None
    hostname = parts.hostname or ""
    host = normalize_host(f"[{hostname}]" if ":" in hostname else hostname)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Destination(host, port, target, path)


# -- the gateway ---------------------------------------------------------------------------


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_lines(stream: TextIO) -> Callable[[Mapping[str, Any]], None]:
    """An audit sink writing one JSON object a line to `stream`, flushed at once."""

    def write(event: Mapping[str, Any]) -> None:
        stream.write(json.dumps(event, separators=(",", ":"), sort_keys=True) + "\n")
        stream.flush()

    return write


@dataclass(frozen=True)
class Settings:
    """What the gateway enforces."""

    keys: tuple[bytes, ...]
    policy: EgressPolicy | None = None
    allow_private: tuple[IPNetwork, ...] = ()
    """Ranges let through although not public: for tests' loopback upstreams only."""
    allowed_ports: tuple[PortRange, ...] = DEFAULT_ALLOWED_PORTS
    """Destination ports forwarded to; any other is refused (403) before any lookup."""
    connect_timeout: float = 10.0
    head_timeout: float = 30.0
    idle_timeout: float = 900.0
    """A tunnel or forward with no byte in either direction this long is closed."""


@dataclass
class _Exchange:
    """One client connection, for the audit line."""

    client: str
    identity: str | None = None
    method: str = ""
    destination: Destination | None = None
    address: str | None = None
    sent: int = 0
    received: int = 0
    check: str = "none"
    """What decided a refusal (Refusal.check); "none" for an allowed request."""
    rule: str = ""
    responded: bool = False
    """Whether the client has the head of an answer (no refusal can follow then)."""
    started: float = field(default_factory=time.monotonic)
    active: float = field(default_factory=time.monotonic)
    """When a byte last moved, in either direction (the idle timeout's clock)."""


class Gateway:
    """Serves proxy requests; `serve()` starts listening."""

    def __init__(
        self,
        settings: Settings,
        *,
        resolve: Resolver = system_resolve,
        audit: Callable[[Mapping[str, Any]], None] | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        if not settings.keys:
            raise ValueError("the gateway needs at least one key")
        self.settings = settings
        self.resolve = resolve
        self.audit = audit or json_lines(sys.stdout)
        self.metrics = metrics

    async def serve(self, host: str | None, port: int) -> asyncio.Server:
        """Listen on host:port (all interfaces for None)."""
        return await asyncio.start_server(
            self._handle, host, port, limit=HEAD_LIMIT, reuse_address=True
        )

    # -- one connection ------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = http1.Peer(h11.SERVER, reader, writer, head_limit=HEAD_LIMIT)
        try:
            while await self._exchange(client, str(peer[0]) if peer else "?"):
                client.start_next_cycle()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _exchange(self, client: http1.Peer, address: str) -> bool:
        """One request on a client connection, from its head to the end of its response
        or tunnel; True when the connection may carry another request."""
        exchange = _Exchange(client=address)
        upstream: asyncio.StreamWriter | None = None
        try:
            request = await self._next_request(client)
            if request is None:
                return False
            exchange.method = method = request.method.decode("ascii")
            target = request.target.decode("ascii")
            if target.startswith("/"):
                if method == "GET" and target == "/healthz":
                    client.writer.write(_response(200, "ok"))
                    await client.drain()
                    return False
                raise Refusal(400, "this is a proxy: send CONNECT or an absolute URL")
            authorization = http1.values(request.headers, b"proxy-authorization")
            header = authorization[0].decode("iso-8859-1") if authorization else None
            exchange.identity = credential.verify(self.settings.keys, header)
            if exchange.identity is None:
                missing = header is None
                why = "no attempt credential" if missing else "the attempt credential is not valid"
                raise Refusal(407, why)
            body = http1.request_body(request)
            if method == "CONNECT" and body.framing is not http1.Framing.NONE:
                raise Refusal(400, "a CONNECT request has no body")
            exchange.destination = destination = destination_of(method, target)
            addresses = await self._check(destination, plain=method != "CONNECT")
            up_reader, upstream, exchange.address = await self._connect(addresses, destination.port)
            self._audit(exchange, "allow", 200)
            if method == "CONNECT":
                await self._open_tunnel(exchange, client, up_reader, upstream)
                more = False
            else:
                more = await self._forward(exchange, request, body, client, up_reader, upstream)
            self._audit(exchange, "end", None)
            return more
        except (Refusal, http1.FramingError) as error:
            refusal = (
                error
                if isinstance(error, Refusal)
                else Refusal(error.status, error.reason, check="request")
            )
            decision = "deny" if refusal.status < 500 else "error"
            exchange.check, exchange.rule = refusal.check, refusal.rule
            self._audit(exchange, decision, refusal.status, refusal.reason)
            if not exchange.responded:  # else the client sees its response cut short
                extra = (
                    {"Proxy-Authenticate": f'Basic realm="{REALM}"'}
                    if refusal.status == 407
                    else None
                )
                with contextlib.suppress(ConnectionError):
                    client.writer.write(_response(refusal.status, refusal.reason, extra))
                    await client.drain()
                await _linger(client)
        except (ConnectionError, TimeoutError) as exc:
            if exchange.destination is not None:
                self._audit(exchange, "end", None, f"connection ended: {type(exc).__name__}")
        except Exception as exc:  # one connection's failure never stops the gateway
            exchange.check = "internal"
            self._audit(exchange, "error", None, f"{type(exc).__name__}: {exc}"[:500])
        finally:
            if upstream is not None:
                upstream.close()
                with contextlib.suppress(Exception):
                    await upstream.wait_closed()
        return False

    async def _next_request(self, client: http1.Peer) -> h11.Request | None:
        """The next request's head, whole within the head timeout (also how long a kept
        connection may idle); None when the client closes or is too slow."""
        try:
            event = await asyncio.wait_for(client.receive(None), self.settings.head_timeout)
        except (TimeoutError, ConnectionError):
            return None
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):  # pragma: no cover - h11's state machine
            raise RuntimeError(f"a request was expected, not {event!r}")
        return event

    async def _check(self, destination: Destination, *, plain: bool) -> list[str]:
        """The addresses to connect to; Refusal(403) when the destination is refused."""
        host, port = destination.host, destination.port
        if not any(lo <= port <= hi for lo, hi in self.settings.allowed_ports):
            allowed = port_ranges_text(self.settings.allowed_ports)
            raise Refusal(403, f"port {port} is not forwarded (allowed: {allowed})", check="port")
        reason = host_refusal(host)
        if reason:
            raise Refusal(403, reason, check="destination")
        policy = self.settings.policy
        if policy is not None:
            verdict = policy.check_host(host, port)
            if not verdict.blocked and plain:
                verdict = policy.check_url(destination.url)
            reason = _policy_refusal(verdict)
            if reason:
                raise Refusal(
                    403, f"{host} is blocked: {reason}", check="blocklist", rule=verdict.rule or ""
                )
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                addresses = await asyncio.wait_for(
                    self.resolve(host, port), self.settings.connect_timeout
                )
            except (OSError, TimeoutError) as exc:
                raise Refusal(502, f"cannot resolve {host}: {exc}") from None
            if not addresses:
                raise Refusal(502, f"{host} resolves to no address")
        for address in addresses:
            reason = address_refusal(address, self.settings.allow_private)
            if reason:
                shown = "" if literal is not None else f"{host} resolves to "
                raise Refusal(403, f"{shown}{reason}", check="address")
        return addresses

    async def _connect(
        self, addresses: Sequence[str], port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
        """A connection to the first checked address that answers (by address, never
        by name: what was checked is what is reached)."""
        errors = []
        for address in addresses:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=HEAD_LIMIT),
                    self.settings.connect_timeout,
                )
            except (OSError, TimeoutError) as exc:
                errors.append(f"{address}: {exc or type(exc).__name__}")
                continue
            return reader, writer, address
        raise Refusal(502, f"cannot connect to port {port}: " + "; ".join(errors))

    # -- moving bytes -------------------------------------------------------------------
    async def _pipe(
        self,
        exchange: _Exchange,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        count: Callable[[int], None],
    ) -> None:
        idle = self.settings.idle_timeout
        while True:
            try:
                data = await asyncio.wait_for(source.read(65536), idle)
            except TimeoutError:
                # Idle means idle both ways: a long download with a silent client is not.
                if time.monotonic() - exchange.active < idle:
                    continue
                raise
            if not data:
                break
            exchange.active = time.monotonic()
            sink.write(data)
            count(len(data))
            await sink.drain()
        if sink.can_write_eof():
            with contextlib.suppress(OSError):
                sink.write_eof()

    async def _tunnel(
        self,
        exchange: _Exchange,
        client_reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
    ) -> None:
        def sent(n: int) -> None:
            exchange.sent += n

        def received(n: int) -> None:
            exchange.received += n

        # Each direction ends on its own (a half-close is passed on); an error in one
        # ends the other.
        pipes = [
            asyncio.create_task(self._pipe(exchange, client_reader, upstream, sent)),
            asyncio.create_task(self._pipe(exchange, up_reader, client, received)),
        ]
        try:
            await asyncio.gather(*pipes)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _open_tunnel(
        self,
        exchange: _Exchange,
        client: http1.Peer,
        up_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
    ) -> None:
        """Answer the CONNECT, then carry bytes both ways: those the client sent early
        (after its CONNECT, before the answer) first."""
        end = await client.receive(self.settings.head_timeout)
        if not isinstance(end, h11.EndOfMessage):  # pragma: no cover - no body was checked
            raise RuntimeError(f"the CONNECT's end was expected, not {end!r}")
        client.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
        exchange.responded = True
        await client.drain()
        early = client.leftover()
        if early:
            upstream.write(early)
            exchange.sent += len(early)
            await upstream.drain()
        await self._tunnel(exchange, client.reader, client.writer, up_reader, upstream)

    async def _forward(
        self,
        exchange: _Exchange,
        request: h11.Request,
        body: http1.Body,
        client: http1.Peer,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> bool:
        """One plain-HTTP request, made anew from h11's events (the credential and hop-by-hop
        headers dropped, the body re-framed), then its response, re-framed the same way;
        True when the client's connection may carry another request."""
        destination = exchange.destination
        assert destination is not None
        upstream = http1.Peer(h11.CLIENT, up_reader, up_writer, head_limit=HEAD_LIMIT)
        netloc = f"[{destination.host}]" if ":" in destination.host else destination.host
        if destination.port != 80:
            netloc += f":{destination.port}"
        headers = [(b"Host", netloc.encode("ascii"))]
        headers += _end_to_end(request.headers, (b"host", *http1.FRAMING_HEADERS))
        headers += [*body.headers(), (b"Connection", b"close")]
        upstream.send(
            h11.Request(
                method=request.method, target=destination.path.encode("ascii"), headers=headers
            )
        )
        if body.framing is not http1.Framing.NONE and client.conn.they_are_waiting_for_100_continue:
            client.send(h11.InformationalResponse(status_code=100, headers=[]))
            await client.drain()
        idle = self.settings.idle_timeout
        while True:
            event = await client.receive(idle)
            if isinstance(event, h11.Data):
                upstream.send(event)
                exchange.sent += len(event.data)
                await upstream.drain()
            elif isinstance(event, h11.EndOfMessage):
                upstream.send(h11.EndOfMessage())  # trailers are not passed on
                break
            else:  # pragma: no cover - h11 raises on a body cut short
                raise RuntimeError(f"a request body was expected, not {event!r}")
        await upstream.drain()

        while True:
            head = await _from_upstream(upstream, idle)
            if isinstance(head, h11.InformationalResponse):
                if head.status_code == 101:
                    raise Refusal(502, "protocol upgrades are not forwarded")
                # Interim responses (103 Early Hints) pass on.
                client.send(
                    h11.InformationalResponse(
                        status_code=head.status_code,
                        headers=_end_to_end(head.headers, ()),
                        reason=head.reason,
                    )
                )
                continue
            if not isinstance(head, h11.Response):
                raise Refusal(502, "the upstream closed without a response")
            break
        # The upstream's framing headers go on (h11 frames the client's copy by them,
        # chunked for a body of unknown length); a Content-Length next to
        # Transfer-Encoding does not.
        chunked = bool(http1.values(head.headers, b"transfer-encoding"))
        client.send(
            h11.Response(
                status_code=head.status_code,
                headers=_end_to_end(head.headers, (b"content-length",) if chunked else ()),
                reason=head.reason,
            )
        )
        exchange.responded = True
        while True:
            event = await _from_upstream(upstream, idle)
            if isinstance(event, h11.Data):
                client.send(event)
                exchange.received += len(event.data)
                await client.drain()
            elif isinstance(event, h11.EndOfMessage):
                client.send(h11.EndOfMessage())  # trailers are not passed on
                break
            else:  # pragma: no cover - h11 raises on a body cut short
                raise Refusal(502, "the upstream's response ended early")
        await client.drain()
        return client.reusable

    def _audit(
        self, exchange: _Exchange, decision: str, status: int | None, reason: str = ""
    ) -> None:
        if self.metrics is not None:
            if decision == "end":
                self.metrics.ended(exchange.sent, exchange.received)
            else:
                self.metrics.decided(decision, exchange.check, exchange.rule)
        destination = exchange.destination
        event: dict[str, Any] = {
            "time": _stamp(),
            "event": "egress",
            "decision": decision,
            "client": exchange.client,
            "identity": exchange.identity,
            "method": exchange.method or None,
        }
        if destination is not None:
            event.update(host=destination.host, port=destination.port)
            if destination.path:
                event["url"] = destination.url[:2000]
        if exchange.address is not None:
            event["address"] = exchange.address
        if status is not None:
            event["status"] = status
        if reason:
            event["reason"] = reason
        if decision == "end":
            event.update(
                sent=exchange.sent,
                received=exchange.received,
                seconds=round(time.monotonic() - exchange.started, 3),
            )
        self.audit(event)


LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * 1024


async def _linger(client: http1.Peer) -> None:
    """After a refusal: end the answer (half-close), then read and drop what the client
    still sends, briefly and up to a bound. Closing with unread bytes would reset the
    connection, and a client may then lose the answer it has not read yet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_SECONDS
    dropped = 0
    with contextlib.suppress(OSError, TimeoutError):
        if client.writer.can_write_eof():
            client.writer.write_eof()
        while dropped < LINGER_BYTES and (left := deadline - loop.time()) > 0:
            data = await asyncio.wait_for(client.reader.read(65536), left)
            if not data:
                break
            dropped += len(data)


def _end_to_end(headers: Any, drop: Iterable[bytes]) -> list[tuple[bytes, bytes]]:
    """The headers a hop passes on: without hop-by-hop ones, those `Connection` names,
    and `drop` (lower-case names)."""
    listed = {
        token.strip()
        for value in http1.values(headers, b"connection")
        for token in value.lower().split(b",")
        if token.strip()
    }
    skip = _HOP_BY_HOP | listed | set(drop)
    return [(name, value) for name, value in headers.raw_items() if name.lower() not in skip]


async def _from_upstream(upstream: http1.Peer, timeout: float) -> h11.Event:
    """The upstream's next event; Refusal(502) for a response h11 refuses."""
    try:
        return await upstream.receive(timeout)
    except http1.FramingError as error:
        raise Refusal(502, f"the upstream's response is malformed: {error.reason}") from None
    except http1.PeerClosed as error:
        raise Refusal(502, f"the upstream closed in the middle of its response: {error}") from None


# -- the program ---------------------------------------------------------------------------


def read_keys(paths: Iterable[Path]) -> tuple[bytes, ...]:
    """The keys in these files (the first signs nothing here; all verify)."""
    return tuple(credential.load_key(Path(p).read_bytes()) for p in paths)


def _networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(v, strict=False) for v in values)


def _ports(values: Sequence[str]) -> tuple[PortRange, ...]:
    """`--allow-port` values as ranges; ValueError names a bad one."""
    ranges = []
    for value in values:
        low, dash, high = value.partition("-")
        high = high if dash else low
        if not (low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) < 65536):
            raise ValueError(f"--allow-port {value!r} is not a TCP port or range (1 to 65535)")
        ranges.append((int(low), int(high)))
    return tuple(sorted(set(ranges))) or DEFAULT_ALLOWED_PORTS


def _load_policy(path: Path | None, preset: str) -> EgressPolicy:
    return EgressPolicy.from_file(path) if path is not None else EgressPolicy(preset)


def parser() -> argparse.ArgumentParser:
    """The gateway's command line."""
    p = argparse.ArgumentParser(
        prog="python -m maka_eval.egress.gateway",
        description="maka-eval's egress gateway: forwards only requests carrying a valid "
        "attempt credential, to public addresses only, and audits every decision on stdout.",
    )
    p.add_argument("--host", default=None, help="address to listen on (default: all)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument(
        "--key-file",
        action="append",
        type=Path,
        required=True,
        help="file holding the gateway key (repeat during a key rotation: any key verifies)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="EgressPolicy JSON file whose host blocklist is applied too",
    )
    p.add_argument(
        "--preset",
        default="terminal-bench",
        help="the blocklist preset applied when no --policy is given (default "
        "terminal-bench; 'none' for no blocklist)",
    )
    p.add_argument(
        "--allow-private",
        action="append",
        default=[],
        metavar="CIDR",
        help="let through this non-public range (tests: a loopback upstream); cloud "
        "metadata addresses stay refused",
    )
    p.add_argument(
        "--allow-port",
        action="append",
        default=[],
        metavar="PORT[-PORT]",
        help="forward to this destination port or range (repeat; replaces the default: 80 and 443)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics (requests allowed and refused by check and rule) "
        "on this port, path /metrics (default: none)",
    )
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--idle-timeout", type=float, default=900.0)
    return p


async def _serve(args: argparse.Namespace) -> None:
    settings = Settings(
        keys=read_keys(args.key_file),
        policy=_load_policy(args.policy, args.preset),
        allow_private=_networks(args.allow_private),
        allowed_ports=_ports(args.allow_port),
        connect_timeout=args.connect_timeout,
        idle_timeout=args.idle_timeout,
    )
    metrics = GatewayMetrics() if args.metrics_port is not None else None
    gateway = Gateway(settings, metrics=metrics)
    if metrics is not None:
        metrics.serve(args.metrics_port)
    server = await gateway.serve(args.host, args.port)
    ports = sorted({int(s.getsockname()[1]) for s in server.sockets})
    gateway.audit({"time": _stamp(), "event": "listening", "ports": ports})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gateway until SIGTERM."""
    args = parser().parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except (OSError, ValueError, PolicyError) as exc:
        print(f"egress gateway: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
