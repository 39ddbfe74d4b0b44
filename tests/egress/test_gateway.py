"""The cluster's egress gateway, for real on loopback.

The gateway program runs as its own process; a recording upstream server stands for the
outside world (allowed through `--allow-private 127.0.0.1/32`, so that the refusal of
every other private, loopback and metadata address is still exercised). The chain tests
put the real sidecar in front: mitmdump with the egress addons in upstream mode
(`egress.proxy.start_proxy(upstream=..., upstream_auth=...)`), as an attempt Pod runs it.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_eval.egress import credential
from maka_eval.egress.gateway import Gateway, Settings, _ports, address_refusal, unwrap
from maka_eval.egress.policy import EgressPolicy
from maka_eval.egress.proxy import ProxyHandle, start_proxy
from tests.egress.gateway_harness import (
    KEY,
    GatewayProcess,
    RecordingUpstream,
    Upstream,
    auth_header,
    basic,
    connect,
    exchange_raw,
    make_tls,
    read_answer,
    read_canonical,
    read_replies,
    send,
    valid_credential,
    write_key,
)

OTHER_KEY = b"fedcba9876543210fedcba9876543210"

ANY_PORT = ((1, 65535),)
"""The in-process gateways' upstreams listen on ephemeral ports."""


# -- credentials -----------------------------------------------------------------------------


def test_a_credential_proves_its_identity_under_its_key_only() -> None:
    value = credential.credential(KEY, "ns1/attempt-1")
    identity, _, password = value.partition(":")
    assert identity == "ns1/attempt-1" and len(password) == 64
    header = credential.proxy_authorization(value)
    assert credential.verify([KEY], header) == "ns1/attempt-1"
    # Another key, another identity with this password, a changed digit: all refused.
    assert credential.verify([OTHER_KEY], header) is None
    assert credential.verify([KEY], basic("ns1/attempt-2", password)) is None
    flipped = password[:-1] + ("0" if password[-1] != "0" else "1")
    assert credential.verify([KEY], basic("ns1/attempt-1", flipped)) is None
    # A rotation: either key verifies.
    assert credential.verify([OTHER_KEY, KEY], header) == "ns1/attempt-1"
    for garbage in (None, "", "Basic", "Basic !!!", "Bearer abc", basic("no-slash", password)):
        assert credential.verify([KEY], garbage) is None


def test_the_key_is_the_secret_without_surrounding_whitespace_and_not_short() -> None:
    assert credential.load_key(KEY + b"\n") == KEY == credential.load_key(b"  " + KEY)
    with pytest.raises(credential.InvalidKey, match="openssl rand"):
        credential.load_key(b"short\n")
    with pytest.raises(ValueError):
        credential.attempt_identity("ns1", "Not_A_Name")


# -- destinations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("169.254.169.254", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"),
        ("100.100.100.200", "cloud metadata"),
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.96.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd12:3456::1", "private"),
        ("64:ff9b::a9fe:a9fe", "cloud metadata"),  # NAT64 of 169.254.169.254
        ("2002:a00:1::", "private"),  # 6to4 of 10.0.0.1
        ("169.254.10.10", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
    ],
)
def test_only_public_addresses_pass(address: str, why: str) -> None:
    reason = address_refusal(address)
    assert reason is not None and why in reason


def test_public_addresses_and_allowed_ranges_pass_but_metadata_never_does() -> None:
    assert address_refusal("93.184.216.34") is None
    assert address_refusal("2606:2800:220:1:248:1893:25c8:1946") is None
    loopback = [ipaddress.ip_network("127.0.0.1/32")]
    assert address_refusal("127.0.0.1", loopback) is None
    assert address_refusal("::ffff:127.0.0.1", loopback) is None
    assert "loopback" in (address_refusal("127.0.0.2", loopback) or "")
    everything = [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
    assert "metadata" in (address_refusal("169.254.169.254", everything) or "")
    assert unwrap(ipaddress.ip_address("::ffff:10.0.0.1")) == ipaddress.ip_address("10.0.0.1")


# -- the gateway program, directly -------------------------------------------------------------


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    # On every loopback address: a request the gateway let through to 127.0.0.2 would
    # be seen here, so "refused" means refused, not "nothing listened".
    server = Upstream(host="0.0.0.0").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(write_key(tmp_path / "key")).start()
    try:
        yield process
    finally:
        process.stop()


def _get(url: str, authorization: str | None, extra: str = "", body: bytes = b"") -> bytes:
    lines = [f"GET {url} HTTP/1.1", "Host: ignored.example", "Proxy-Connection: keep-alive"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode() + body


def test_the_gateway_answers_its_health_check_without_a_credential(
    gateway: GatewayProcess,
) -> None:
    answer = send(gateway.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.status == 200 and answer.body == b"ok\n"


def test_without_a_credential_nothing_is_forwarded(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    answer, _ = connect(gateway.port, f"127.0.0.1:{upstream.port}", None)
    assert answer.status == 407
    assert answer.headers["proxy-authenticate"].startswith("Basic realm=")
    answer = send(gateway.port, _get(f"http://127.0.0.1:{upstream.port}/x", None))
    assert answer.status == 407
    event = gateway.wait_for(lambda e: e.get("status") == 407)
    assert event["decision"] == "deny" and event["identity"] is None
    assert event["reason"] == "no attempt credential"
    assert upstream.seen == []


@pytest.mark.parametrize(
    "authorization",
    [
        auth_header(credential.credential(OTHER_KEY, "ns1/attempt-1")),  # another key
        basic("ns1/attempt-2", valid_credential("ns1/attempt-1").partition(":")[2]),
        basic("ns1/attempt-1", "0" * 64),
        "Basic bm90IGJhc2U2NA",  # not even user:password
        "Bearer " + valid_credential(),
    ],
    ids=["other-key", "borrowed-password", "zeros", "malformed", "wrong-scheme"],
)
def test_a_forged_credential_is_refused(
    gateway: GatewayProcess, upstream: Upstream, authorization: str
) -> None:
    answer, _ = connect(gateway.port, f"127.0.0.1:{upstream.port}", authorization)
    assert answer.status == 407
    event = gateway.wait_for(lambda e: e.get("status") == 407)
    assert event["reason"] == "the attempt credential is not valid"
    assert upstream.seen == []


def test_a_valid_credential_reaches_the_upstream_and_is_not_passed_on(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    auth = auth_header(valid_credential("ns1/attempt-1"))
    # A tunnel (what HTTPS uses)...
    answer, sock = connect(gateway.port, f"127.0.0.1:{upstream.port}", auth)
    assert answer.status == 200
    with sock:
        sock.sendall(b"GET /through-tunnel HTTP/1.1\r\nHost: up\r\nConnection: close\r\n\r\n")
        inner = read_answer(sock)
    assert inner.status == 200 and b"hello /through-tunnel" in inner.body
    # ...and a plain-HTTP request, re-serialized, its body forwarded (chunked too).
    answer = send(gateway.port, _get(f"http://127.0.0.1:{upstream.port}/plain?q=1", auth))
    assert answer.status == 200 and b"hello /plain?q=1" in answer.body
    assert "connection" not in answer.headers  # kept for another request (HTTP/1.1)
    chunked = _get(
        f"http://127.0.0.1:{upstream.port}/upload",
        auth,
        extra="Transfer-Encoding: chunked\r\n",
        body=b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    ).replace(b"GET ", b"POST ", 1)
    answer = send(gateway.port, chunked)
    assert answer.status == 200 and b"(11 bytes)" in answer.body
    by_path = {s.path: s for s in upstream.seen}
    assert set(by_path) == {"/through-tunnel", "/plain?q=1", "/upload"}
    assert by_path["/upload"].body == b"hello world"
    for seen in by_path.values():
        assert not any(h.lower().startswith("proxy-") for h in seen.headers)
    assert by_path["/plain?q=1"].headers["Host"] == f"127.0.0.1:{upstream.port}"
    allowed = gateway.wait_for(lambda e: e["decision"] == "allow" and e["method"] == "CONNECT")
    assert allowed["identity"] == "ns1/attempt-1" and allowed["address"] == "127.0.0.1"
    ended = gateway.wait_for(lambda e: e["decision"] == "end" and e["method"] == "CONNECT")
    assert ended["sent"] > 0 and ended["received"] > 0


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("169.254.169.254:80", "cloud metadata address"),
        ("[fd00:ec2::254]:80", "cloud metadata address"),
        ("metadata.google.internal:80", "cloud metadata name"),
        ("10.1.2.3:443", "private address"),
        ("127.0.0.2:{port}", "loopback address"),
        ("[::ffff:127.0.0.2]:{port}", "loopback address"),
        ("[::1]:{port}", "loopback address"),
        ("localhost:{port}", "names this machine"),
    ],
)
def test_private_and_metadata_destinations_are_refused_with_a_valid_credential(
    gateway: GatewayProcess, upstream: Upstream, target: str, why: str
) -> None:
    auth = auth_header(valid_credential())
    address = target.format(port=upstream.port)
    answer, _ = connect(gateway.port, address, auth)
    assert answer.status == 403 and why in answer.body.decode()
    url = f"http://{address}/latest/meta-data/"
    answer = send(gateway.port, _get(url, auth))
    assert answer.status == 403 and why in answer.body.decode()
    event = gateway.wait_for(lambda e: e["decision"] == "deny")
    assert why in event["reason"] and event["identity"] == "ns1/attempt-1"
    assert upstream.seen == []


def test_a_blocklisted_destination_is_refused_with_the_reason(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    auth = auth_header(valid_credential())
    answer, _ = connect(gateway.port, "tbench.ai:443", auth)  # refused before any DNS query
    assert answer.status == 403 and "tbench.ai" in answer.body.decode()
    # A plain-HTTP request is checked by its whole URL: an allowed host, a blocked path.
    path = f"http://127.0.0.1:{upstream.port}/mirror/terminal-bench/tasks"
    answer = send(gateway.port, _get(path, auth))
    assert answer.status == 403 and "terminal-bench" in answer.body.decode()
    assert upstream.seen == []


def test_framing_that_two_parsers_could_read_differently_is_refused(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    auth = auth_header(valid_credential())
    smuggle = _get(
        f"http://127.0.0.1:{upstream.port}/a",
        auth,
        extra="Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        body=b"0\r\n\r\n",
    )
    assert send(gateway.port, smuggle).status == 400
    assert upstream.seen == []


def test_a_bad_key_file_stops_the_gateway(tmp_path: Path) -> None:
    short = tmp_path / "key"
    short.write_bytes(b"too short")
    with pytest.raises(AssertionError, match="at least 16 are needed"):
        GatewayProcess(short).start(timeout=10)


# -- DNS: every answer checked, the checked address connected to ----------------------------------


def _in_process(
    resolve: dict[str, list[list[str]]], calls: list[str], allow: str | None
) -> Gateway:
    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        answers = resolve[host]
        return answers[min(len(calls), len(answers)) - 1]

    settings = Settings(
        keys=(KEY,),
        policy=EgressPolicy(),
        allow_private=(ipaddress.ip_network(allow),) if allow else (),
        allowed_ports=ANY_PORT,
    )
    return Gateway(settings, resolve=resolver, audit=lambda event: None)


async def _ask(gateway: Gateway, request: bytes) -> bytes:
    server = await gateway.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        writer.write_eof()  # no other request: the gateway closes after its answer
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return answer
    finally:
        server.close()
        await server.wait_closed()


def test_a_name_with_any_private_address_is_refused(upstream: Upstream) -> None:
    calls: list[str] = []
    gateway = _in_process(
        {"mixed.example": [["93.184.216.34", "127.0.0.1"]], "meta.example": [["169.254.169.254"]]},
        calls,
        allow=None,
    )
    auth = auth_header(valid_credential())
    answer = asyncio.run(_ask(gateway, _get(f"http://mixed.example:{upstream.port}/", auth)))
    assert answer.startswith(b"HTTP/1.1 403") and b"mixed.example resolves to 127.0.0.1" in answer
    answer = asyncio.run(_ask(gateway, _get("http://meta.example/", auth)))
    assert answer.startswith(b"HTTP/1.1 403") and b"cloud metadata address" in answer
    assert upstream.seen == []


def test_the_gateway_connects_to_the_address_it_checked_not_to_the_name_again(
    upstream: Upstream,
) -> None:
    # The first answer is checked and allowed; any later answer would be a private one
    # (a rebinding attack). The gateway asks once and connects to what it checked.
    calls: list[str] = []
    gateway = _in_process(
        {"rebind.example": [["127.0.0.1"], ["10.0.0.1"]]}, calls, allow="127.0.0.1/32"
    )
    auth = auth_header(valid_credential())
    answer = asyncio.run(_ask(gateway, _get(f"http://rebind.example:{upstream.port}/r", auth)))
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert calls == ["rebind.example"]
    assert upstream.seen[0].headers["Host"] == f"rebind.example:{upstream.port}"


def test_a_tunnel_ends_when_idle_both_ways_not_while_one_way_streams() -> None:
    events: list[dict[str, object]] = []

    async def scenario() -> tuple[bytes, bytes, float]:
        async def streaming(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(6):  # 1.2 s of output, the client silent all along
                writer.write(b"tick\n")
                await writer.drain()
                await asyncio.sleep(0.2)
            writer.close()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()

        talker = await asyncio.start_server(streaming, "127.0.0.1", 0)
        mute = await asyncio.start_server(silent, "127.0.0.1", 0)
        settings = Settings(
            keys=(KEY,),
            allow_private=(ipaddress.ip_network("127.0.0.1/32"),),
            allowed_ports=ANY_PORT,
            idle_timeout=0.5,
        )
        server = await Gateway(settings, audit=events.append).serve("127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        auth = auth_header(valid_credential())

        async def tunnel(target: int) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = (
                f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: 127.0.0.1:{target}\r\n"
                f"Proxy-Authorization: {auth}\r\n\r\n"
            )
            writer.write(head.encode())
            await writer.drain()
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            data = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return data

        try:
            streamed = await tunnel(talker.sockets[0].getsockname()[1])
            started = asyncio.get_running_loop().time()
            idle = await tunnel(mute.sockets[0].getsockname()[1])
            return streamed, idle, asyncio.get_running_loop().time() - started
        finally:
            for s in (server, talker, mute):
                s.close()

    streamed, idle, waited = asyncio.run(scenario())
    assert streamed == b"tick\n" * 6
    assert idle == b"" and waited < 5
    assert any(e.get("reason") == "connection ended: TimeoutError" for e in events)


# -- the chain: sidecar (mitmdump + egress addons, upstream mode) -> gateway -> upstream ----------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sidecar(
    tmp_path: Path,
    gateway: GatewayProcess,
    auth: str | None,
    *,
    policy: EgressPolicy | None = None,
    trusted: Path | None = None,
) -> ProxyHandle:
    return start_proxy(
        state_dir=tmp_path / "sidecar-state",
        publish_dir=tmp_path / "sidecar-ca",
        policy=policy or EgressPolicy(),
        checkpoint_path=tmp_path / "provider-usage.json",
        result_token="token-for-tests",
        upstream=gateway.url,
        upstream_auth=auth,
        upstream_trusted_ca=trusted,
    )


def _via(proxy: ProxyHandle, url: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=20)
    try:
        conn.request("GET", url)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.slow
def test_the_chain_reaches_an_allowed_upstream_over_http_and_https(
    tmp_path: Path, gateway: GatewayProcess
) -> None:
    ca, cert, key = make_tls(tmp_path / "tls")
    plain = Upstream().start()
    secure = Upstream(tls=(cert, key)).start()
    try:
        with _sidecar(tmp_path, gateway, valid_credential("ns1/attempt-7"), trusted=ca) as proxy:
            status, body = _via(proxy, f"http://127.0.0.1:{plain.port}/plain")
            assert (status, body) == (200, b"upstream says hello /plain (0 bytes)")
            # HTTPS: the client trusts only the sidecar's CA (what the subject mounts).
            context = ssl.create_default_context(cafile=str(proxy.ca_cert_path))
            conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=20, context=context)
            conn.set_tunnel("127.0.0.1", secure.port)
            try:
                conn.request("GET", "/secure")
                response = conn.getresponse()
                assert response.status == 200
                assert response.read() == b"upstream says hello /secure (0 bytes)"
            finally:
                conn.close()
        for server in (plain, secure):
            (seen,) = server.seen
            assert not any(h.lower().startswith("proxy-") for h in seen.headers)
        tunnel = gateway.wait_for(lambda e: e["decision"] == "allow" and e["method"] == "CONNECT")
        assert tunnel["identity"] == "ns1/attempt-7" and tunnel["port"] == secure.port
        request = gateway.wait_for(lambda e: e["decision"] == "allow" and e["method"] == "GET")
        assert request["url"] == f"http://127.0.0.1:{plain.port}/plain"
    finally:
        plain.stop()
        secure.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "auth",
    [None, credential.credential(OTHER_KEY, "ns1/attempt-1")],
    ids=["missing", "forged"],
)
def test_the_chain_without_a_valid_credential_reaches_nothing(
    tmp_path: Path, gateway: GatewayProcess, upstream: Upstream, auth: str | None
) -> None:
    with _sidecar(tmp_path, gateway, auth) as proxy:
        status, _ = _via(proxy, f"http://127.0.0.1:{upstream.port}/x")
    assert status >= 400
    event = gateway.wait_for(lambda e: e.get("status") == 407)
    assert event["decision"] == "deny"
    assert upstream.seen == []


@pytest.mark.slow
def test_the_chain_refuses_metadata_and_private_destinations(
    tmp_path: Path, gateway: GatewayProcess, upstream: Upstream
) -> None:
    with _sidecar(tmp_path, gateway, valid_credential()) as proxy:
        status, body = _via(proxy, "http://169.254.169.254/latest/meta-data/")
        assert status == 403 and b"cloud metadata address" in body
        status, _ = _via(proxy, f"http://127.0.0.2:{upstream.port}/")
        assert status == 403
    reasons = [e["reason"] for e in gateway.audit if e["decision"] == "deny"]
    assert any("169.254.169.254 is a cloud metadata address" in r for r in reasons)
    assert any("127.0.0.2 is a loopback address" in r for r in reasons)
    assert upstream.seen == []


@pytest.mark.slow
def test_the_gateway_blocklist_backs_up_a_sidecar_that_lets_a_host_through(
    tmp_path: Path, gateway: GatewayProcess
) -> None:
    # A sidecar with no preset passes tbench.ai on; the gateway's preset refuses it
    # (before any DNS query, so this needs no network).
    with _sidecar(tmp_path, gateway, valid_credential(), policy=EgressPolicy("none")) as proxy:
        status, body = _via(proxy, "http://tbench.ai/tasks")
    assert status == 403 and b"tbench.ai" in body
    event = gateway.wait_for(lambda e: e["decision"] == "deny")
    assert event["host"] == "tbench.ai" and event["identity"] == "ns1/attempt-1"


@pytest.mark.slow
def test_the_pod_sidecar_program_chains_to_the_gateway_and_keeps_its_key(
    tmp_path: Path, gateway: GatewayProcess, upstream: Upstream
) -> None:
    # What the attempt Pod's native sidecar runs, with the files its Secret volume holds.
    secret = tmp_path / "egress-secret"
    secret.mkdir()
    (secret / "upstream-auth").write_text(valid_credential("ns1/attempt-9"))
    (secret / "policy.json").write_text(EgressPolicy().to_json())
    state, published = tmp_path / "state", tmp_path / "egress-ca"
    port = free_port()
    where = ["--port", str(port), "--publish-dir", str(published)]
    probe = [sys.executable, "-m", "maka_eval.egress.sidecar", "--probe", *where]
    assert subprocess.run(probe, capture_output=True).returncode == 1  # not up yet
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "maka_eval.egress.sidecar",
            *where,
            "--upstream",
            gateway.url,
            "--credential-file",
            str(secret / "upstream-auth"),
            "--policy-file",
            str(secret / "policy.json"),
            "--state-dir",
            str(state),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(probe, capture_output=True).returncode != 0:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() < deadline, "the sidecar's startup probe never passed"
            time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        conn.request("GET", f"http://127.0.0.1:{upstream.port}/from-the-pod")
        response = conn.getresponse()
        assert response.status == 200 and b"/from-the-pod" in response.read()
        conn.close()
        blocked = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        blocked.request("GET", "http://tbench.ai/")
        assert blocked.getresponse().status == 403  # the sidecar's own blocklist
        blocked.close()
        event = gateway.wait_for(lambda e: e["decision"] == "allow")
        assert event["identity"] == "ns1/attempt-9"
        # The subject's folder gets the certificate only; the key stays in the state.
        assert [p.name for p in published.iterdir()] == ["mitmproxy-ca-cert.pem"]
        assert b"PRIVATE KEY" not in (published / "mitmproxy-ca-cert.pem").read_bytes()
        assert b"PRIVATE KEY" in (state / "confdir" / "mitmproxy-ca.pem").read_bytes()
        audit = (state / "audit" / "audit.jsonl").read_text()
        assert "tbench.ai" in audit and "/from-the-pod" in audit
    finally:
        process.terminate()  # what the kubelet does once the subject has ended
        assert process.wait(timeout=20) == 0
    assert len(upstream.seen) == 1


# -- ports: the web's only, unless configured --------------------------------------------------


def test_only_the_allowed_ports_are_forwarded(tmp_path: Path, upstream: Upstream) -> None:
    """By default 80 and 443: anything else is refused before any lookup or connection."""
    process = GatewayProcess(write_key(tmp_path / "key"), allow_ports=()).start()
    try:
        auth = auth_header(valid_credential())
        for target in (f"127.0.0.1:{upstream.port}", "127.0.0.1:25", "db.example.com:5432"):
            answer, _ = connect(process.port, target, auth)
            assert answer.status == 403, target
            assert "is not forwarded (allowed: 80, 443)" in answer.body.decode()
        answer = send(process.port, _get(f"http://127.0.0.1:{upstream.port}/x", auth))
        assert answer.status == 403 and "not forwarded" in answer.body.decode()
        event = process.wait_for(lambda e: e["decision"] == "deny" and e.get("port") == 25)
        assert "port 25 is not forwarded" in event["reason"]
        # Port 443 passes this check (and meets the next: nothing listens there).
        answer, _ = connect(process.port, "127.0.0.1:443", auth)
        assert "not forwarded" not in answer.body.decode()
        assert upstream.seen == []
    finally:
        process.stop()
    # Configured: exactly what --allow-port names.
    wide = GatewayProcess(write_key(tmp_path / "key2"), allow_ports=(str(upstream.port),)).start()
    try:
        auth = auth_header(valid_credential())
        answer = send(wide.port, _get(f"http://127.0.0.1:{upstream.port}/allowed", auth))
        assert answer.status == 200, answer
        answer, _ = connect(wide.port, "127.0.0.1:443", auth)
        assert answer.status == 403 and f"allowed: {upstream.port})" in answer.body.decode()
    finally:
        wide.stop()


def test_allow_port_values_are_checked() -> None:
    assert _ports([]) == ((80, 80), (443, 443))
    assert _ports(["443", "8000-8999", "443"]) == ((443, 443), (8000, 8999))
    for bad in ("0", "65536", "http", "9-1", "-5", "1-"):
        with pytest.raises(ValueError, match="--allow-port"):
            _ports([bad])


# -- HTTP/1.1 framing: h11 reads it, the gateway writes what h11 read -----------------------------


@pytest.fixture
def recorder() -> Iterator[RecordingUpstream]:
    server = RecordingUpstream().start()
    try:
        yield server
    finally:
        server.stop()


def _request(port: int, method: str, path: str, auth: str | None, *extra: str) -> bytes:
    lines = [f"{method} http://127.0.0.1:{port}{path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if auth is not None:
        lines.append(f"Proxy-Authorization: {auth}")
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def _decisions(gateway: GatewayProcess, count: int) -> list[tuple[str, int | None]]:
    wait_until = time.monotonic() + 120  # only ends a hang: the count is the event
    while True:
        decided = [
            (e["decision"], e.get("status")) for e in gateway.audit if e["decision"] != "end"
        ]
        if len(decided) >= count or time.monotonic() > wait_until:
            return decided
        time.sleep(0.02)


def test_a_kept_connection_carries_more_requests_each_checked_as_the_first(
    gateway: GatewayProcess, recorder: RecordingUpstream
) -> None:
    auth = auth_header(valid_credential())
    forged = basic("ns1/attempt-1", "0" * 64)
    port = recorder.port
    stream = (
        _request(port, "GET", "/one", auth)
        + _request(port, "POST", "/two", auth, "Content-Length: 5")
        + b"hello"
        + _request(port, "GET", "/three", forged)  # pipelined behind, no valid credential
        + _request(port, "GET", "/four", auth)  # after a refusal: never read
    )
    replies = read_replies(exchange_raw(gateway.port, [stream]))
    assert [r.status for r in replies] == [200, 200, 407]
    assert replies[0].body == b"upstream says hello /one (0 bytes)"
    assert replies[1].body == b"upstream says hello /two (5 bytes)"
    seen = [read_canonical(data) for data in recorder.take(2)]
    assert [(s.request.method, s.request.target, s.request.body) for s in seen if s.request] == [
        ("GET", "/one", b""),
        ("POST", "/two", b"hello"),
    ]
    assert all(s.rest == b"" and not s.error for s in seen)
    assert _decisions(gateway, 3) == [("allow", 200), ("allow", 200), ("deny", 407)]


def test_a_chunked_body_is_forwarded_as_h11_read_it_not_as_it_came(
    gateway: GatewayProcess, recorder: RecordingUpstream
) -> None:
    auth = auth_header(valid_credential())
    head = _request(
        recorder.port,
        "POST",
        "/upload",
        auth,
        "Transfer-Encoding: Chunked",
        "Expect: 100-continue",
        "Trailer: X-Sum",
        "Connection: close",
    )
    body = b"5;name=value\r\nhello\r\nB \r\n, chunked  \r\n00000\r\nX-Sum: 1\r\n\r\n"
    answer = exchange_raw(gateway.port, [head, body], pause=0.05)
    replies = read_replies(answer)
    assert [r.status for r in replies] == [100, 200]
    assert ("connection", "close") in replies[1].headers
    (data,) = recorder.take(1)
    seen = read_canonical(data)  # one chunk size line per chunk, in lower-case hex
    assert seen.request is not None and seen.rest == b"", seen
    assert seen.request.body == b"hello, chunked  "
    assert b"name=value" not in data and b"X-Sum" not in data and b"Expect" not in data


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n", 400),
        (b"GET http://127.0.0.1:{port}/ HTTP/2.0\r\nHost: x\r\n\r\n", 400),
        (b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
        (b" GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70000, 431),
        (b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 400),
        (
            b"PUT http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1"
            + b"0" * 5000
            + b"\r\n\r\n",
            400,
        ),
    ],
    ids=[
        "no-host",
        "http-2",
        "two-hosts",
        "leading-space",
        "head-too-large",
        "connect-body",
        "5000-digit-length",
    ],
)
def test_a_request_h11_refuses_is_answered_and_what_follows_is_never_read(
    gateway: GatewayProcess, recorder: RecordingUpstream, head: bytes, status: int
) -> None:
    auth = auth_header(valid_credential())
    bad = head.replace(b"{port}", str(recorder.port).encode()).replace(b"{auth}", auth.encode())
    if b"Proxy-Authorization" not in bad:
        bad = bad.replace(b"\r\n", f"\r\nProxy-Authorization: {auth}\r\n".encode(), 1)
    follow = _request(recorder.port, "GET", "/after", auth)
    replies = read_replies(exchange_raw(gateway.port, [bad + follow]))
    assert [r.status for r in replies] == [status]
    assert recorder.take(0) == []
    assert _decisions(gateway, 1) == [("deny", status)]


def test_bytes_sent_with_the_connect_go_into_the_tunnel(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    # A client may send its first tunnel bytes (a TLS ClientHello) without waiting for
    # the 200: they are the tunnel's, not a request of the gateway's.
    auth = auth_header(valid_credential())
    target = f"127.0.0.1:{upstream.port}"
    connect_head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}"
    inner = b"GET /early HTTP/1.1\r\nHost: up\r\nConnection: close\r\n\r\n"
    answer = exchange_raw(gateway.port, [connect_head.encode() + b"\r\n\r\n" + inner])
    assert answer.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK")
    assert answer.endswith(b"upstream says hello /early (0 bytes)")
    assert [s.path for s in upstream.seen] == ["/early"]


def _through(gateway: GatewayProcess, recorder: RecordingUpstream, method: str = "GET") -> Any:
    """A request through the gateway, its answer read by http.client (chunked too)."""
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=20)
    conn.putrequest(method, f"http://127.0.0.1:{recorder.port}/r", skip_host=True)
    conn.putheader("Host", f"127.0.0.1:{recorder.port}")
    conn.putheader("Proxy-Authorization", auth_header(valid_credential()))
    conn.endheaders()
    return conn, conn.getresponse()


@pytest.mark.parametrize(
    ("reply", "body", "framing"),
    [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"hello",
            "chunked",
        ),
        (b"HTTP/1.0 200 OK\r\nX-Old: yes\r\n\r\nuntil the end", b"until the end", "chunked"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            b"abc",
            "chunked",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nxyz", b"xyz", "3"),
    ],
    ids=["chunked", "until-close", "te-and-cl", "length"],
)
def test_responses_are_forwarded_reframed(
    gateway: GatewayProcess, recorder: RecordingUpstream, reply: bytes, body: bytes, framing: str
) -> None:
    recorder.reply = reply
    conn, response = _through(gateway, recorder)
    try:
        assert response.status == 200 and response.read() == body
        if framing == "chunked":
            assert response.getheader("Transfer-Encoding") == "chunked"
            assert response.getheader("Content-Length") is None
        else:
            assert response.getheader("Content-Length") == framing
        assert response.getheader("Connection") is None  # kept: the client's to close
        assert response.getheader("X-Trailer") is None
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 502),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 502),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", 502),
        (b"HTTP/1.1 2000 OK\r\n\r\n", 502),
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"1" * 5000 + b"\r\n\r\n", 502),
        (b"", 502),
    ],
    ids=["two-lengths", "gzip", "upgrade", "bad-status", "5000-digit-length", "nothing"],
)
def test_a_response_h11_refuses_is_a_bad_gateway(
    gateway: GatewayProcess, recorder: RecordingUpstream, reply: bytes, status: int
) -> None:
    recorder.reply = reply
    conn, response = _through(gateway, recorder)
    try:
        assert response.status == status
        assert b"upstream" in response.read()
    finally:
        conn.close()


def test_a_response_body_broken_midway_is_cut_not_completed(
    gateway: GatewayProcess, recorder: RecordingUpstream
) -> None:
    recorder.reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX2\r\nab"
    conn, response = _through(gateway, recorder)
    try:
        assert response.status == 200  # the head went on before the body broke
        with pytest.raises(http.client.IncompleteRead):
            response.read()
    finally:
        conn.close()
    event = gateway.wait_for(lambda e: e["decision"] == "error")
    assert "not followed by CRLF" in event["reason"]


def test_interim_responses_pass_and_a_head_response_has_no_body(
    gateway: GatewayProcess, recorder: RecordingUpstream
) -> None:
    auth = auth_header(valid_credential())
    recorder.reply = (
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"
    )
    stream = b"".join(_request(recorder.port, "HEAD", path, auth) for path in ("/h", "/i"))
    replies = read_replies(exchange_raw(gateway.port, [stream]), head=True)
    # HEAD: the length of what a GET would get, no body; the next answer follows at once.
    assert [(r.status, r.body) for r in replies] == [(103, b""), (200, b""), (103, b""), (200, b"")]
    assert ("content-length", "1234") in replies[1].headers
    assert ("link", "</s.css>") in replies[0].headers
