"""The egress proxy for real: `mitmdump` with the addons, started by start_proxy, driven
by the official OpenAI and Anthropic SDKs against a fake provider on loopback."""

from __future__ import annotations

import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from maka_eval.egress.addon import CA_CERT_NAME
from maka_eval.egress.policy import EgressPolicy
from maka_eval.egress.proxy import ADDON_SCRIPT, ProxyHandle, ProxyStartError, start_proxy
from maka_eval.engine.classify import ResultContract
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.engine.usage import Usage
from maka_eval.metering.checkpoint import (
    Checkpoint,
    CheckpointRejected,
    RejectReason,
    derive,
    read_checkpoint,
)
from maka_eval.metering.pricing import ModelPrice, Prices
from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor
from maka_eval.relay.attempt import run_attempt
from maka_eval.relay.plan import AttemptPlan, MeteringPlan
from tests.egress.fake_provider import FakeProvider, make_tls
from tests.helpers import make_task
from tests.metering.provider_payloads import Reported

pytestmark = pytest.mark.slow

TOKEN = "cell-result-token-7c1e"
POLICY = EgressPolicy(
    "none",
    ["blocked.example", "localhost/secret-answers", "127.0.0.1/secret-answers", "re:forbidden"],
)
PRICES = Prices(
    {
        "gpt-4o": ModelPrice(input=2.5, output=10.0, cache_read=1.25, cache_write=0.0),
        "claude-sonnet-4-5": ModelPrice(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75),
    }
)
REPORTED = Reported(prompt=1200, cached=200, cache_write=0, output=345)
START_TIMES: list[float] = []


def web_fn(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.fixture
def proxy_factory(tmp_path) -> Iterator[Callable[..., ProxyHandle]]:
    handles: list[ProxyHandle] = []

    def start(name: str = "cell", **kw) -> ProxyHandle:
        t0 = time.perf_counter()
        handle = start_proxy(
            state_dir=tmp_path / name / "state",
            publish_dir=tmp_path / name / "published",
            policy=kw.pop("policy", POLICY),
            checkpoint_path=tmp_path / name / "provider-usage.json",
            result_token=TOKEN,
            prices=kw.pop("prices", PRICES),
            **kw,
        )
        START_TIMES.append(time.perf_counter() - t0)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(REPORTED) as fake:
        yield fake


def client_through(proxy: ProxyHandle, cafile: Path | None = None) -> httpx.Client:
    """An httpx client through the proxy, trusting only `cafile` when given."""
    verify = ssl.create_default_context(cafile=str(cafile)) if cafile else True
    return httpx.Client(proxy=proxy.url, verify=verify, trust_env=False, timeout=20)


def checkpoint(proxy: ProxyHandle) -> Checkpoint:
    found = proxy.read_checkpoint()
    assert isinstance(found, Checkpoint), found
    return found


def wait_idle(proxy: ProxyHandle, requests: int = 1) -> Checkpoint:
    """The checkpoint once it counts the test's `requests` and nothing is in flight (the
    proxy settles a request when the response has ended, a moment after the client has
    read it, and its writer thread puts the checkpoint on disk a moment later still: a
    snapshot from before the first request has nothing in flight either)."""
    deadline = time.monotonic() + 120  # only ends a hang
    while True:
        state = checkpoint(proxy)
        if (state.requests >= requests and state.in_flight == 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def audit_lines(proxy: ProxyHandle) -> list[dict]:
    return [json.loads(line) for line in proxy.audit_log_path.read_text().splitlines()]


# -- metering through the official SDKs ------------------------------------------------------
def test_openai_chat_strips_web_tools_and_meters_usage(proxy_factory, provider):
    proxy = proxy_factory()
    client = openai.OpenAI(
        api_key="sk-test", base_url=provider.base() + "/v1", http_client=client_through(proxy)
    )
    reply = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        tools=[web_fn("WebSearch"), web_fn("bash"), web_fn("FetchURL")],
        tool_choice={"type": "function", "function": {"name": "WebSearch"}},
    )
    assert reply.usage is not None and reply.usage.prompt_tokens == 1200
    sent = provider.received[-1]
    assert [t["function"]["name"] for t in sent.json["tools"]] == ["bash"]
    assert sent.json["tool_choice"] == "auto"
    assert int(sent.headers["content-length"]) == len(sent.raw)  # recomputed
    state = wait_idle(proxy)
    assert (state.requests, state.admitted, state.usage_requests, state.in_flight) == (1, 1, 1, 0)
    assert state.usage == REPORTED.normalized()
    assert state.usage_by_model == {"gpt-4o": REPORTED.normalized()}
    assert not derive(state, PRICES).complete  # not settled yet: a lower bound
    settled = proxy.settle()
    assert isinstance(settled, Checkpoint) and settled.settled
    figure = derive(settled, PRICES)
    assert figure.complete
    assert figure.cost_usd == pytest.approx((1000 * 2.5 + 200 * 1.25 + 345 * 10.0) / 1e6)
    stripped = [e for e in audit_lines(proxy) if e["event"] == "model-request"]
    assert stripped[-1]["stripped"] == ["WebSearch", "FetchURL"]


def test_openai_chat_stream_with_usage(proxy_factory, provider):
    proxy = proxy_factory()
    client = openai.OpenAI(
        api_key="sk-test", base_url=provider.base() + "/v1", http_client=client_through(proxy)
    )
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        tools=[web_fn("web_search"), web_fn("bash")],
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith(
        "word0"
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 345
    assert [t["function"]["name"] for t in provider.received[-1].json["tools"]] == ["bash"]
    state = wait_idle(proxy)
    assert state.usage == REPORTED.normalized() and state.usage_requests == 1


def test_openai_chat_stream_without_usage_is_counted_missing(proxy_factory, provider):
    proxy = proxy_factory()
    client = openai.OpenAI(
        api_key="sk-test", base_url=provider.base() + "/v1", http_client=client_through(proxy)
    )
    list(client.chat.completions.create(model="gpt-4o", messages=[], stream=True))
    wait_idle(proxy)
    proxy.settle()
    figure = derive(checkpoint(proxy), PRICES)
    assert figure.admitted == 1 and figure.missing_usage == 1
    assert not figure.complete and figure.cost_usd is None


def test_openai_responses_hosted_web_search_is_stripped(proxy_factory, provider):
    proxy = proxy_factory()
    client = openai.OpenAI(
        api_key="sk-test", base_url=provider.base() + "/v1", http_client=client_through(proxy)
    )
    response = client.responses.create(
        model="gpt-4o",
        input="hi",
        tools=[
            {"type": "web_search_preview"},
            {"type": "function", "name": "bash", "parameters": {"type": "object"}},
        ],
    )
    assert response.usage is not None and response.usage.input_tokens == 1200
    assert provider.received[-1].json["tools"] == [
        {"type": "function", "name": "bash", "parameters": {"type": "object"}}
    ]
    events = list(
        client.responses.create(
            model="gpt-4o", input="hi", stream=True, tools=[{"type": "web_search"}]
        )
    )
    assert events[-1].type == "response.completed"
    assert "tools" not in provider.received[-1].json
    state = wait_idle(proxy, requests=2)
    assert state.usage == REPORTED.normalized() + REPORTED.normalized()
    assert (state.admitted, state.usage_requests) == (2, 2)


def test_anthropic_messages_streaming_and_not(proxy_factory, provider):
    provider.reported = Reported(prompt=5000, cached=3000, cache_write=700, output=80)
    proxy = proxy_factory()
    client = anthropic.Anthropic(
        api_key="sk-ant-test", base_url=provider.base(), http_client=client_through(proxy)
    )
    tools = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "web_fetch_20250910", "name": "web_fetch"},
        {"name": "Bash", "input_schema": {"type": "object"}},
    ]
    message = client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        tool_choice={"type": "tool", "name": "web_search"},
    )
    assert message.usage.cache_read_input_tokens == 3000
    sent = provider.received[-1].json
    assert sent["tools"] == [{"name": "Bash", "input_schema": {"type": "object"}}]
    assert sent["tool_choice"] == {"type": "auto"}
    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("word0") and final.usage.output_tokens == 80
    expected = Usage(2000, 3000, 700, 80)
    state = wait_idle(proxy, requests=2)
    assert state.usage == expected + expected and state.usage_requests == 2
    proxy.settle()
    figure = derive(checkpoint(proxy), PRICES)
    one = (2000 * 3.0 + 3000 * 0.3 + 700 * 3.75 + 80 * 15.0) / 1e6
    assert figure.complete and figure.cost_usd == pytest.approx(2 * one)


def test_https_is_intercepted_with_the_cells_ca(proxy_factory, tmp_path):
    """A real CONNECT tunnel: the client trusts only the published CA certificate."""
    tls = make_tls(tmp_path / "provider-tls")
    with FakeProvider(REPORTED, tls=tls.context) as provider:
        proxy = proxy_factory(upstream_trusted_ca=tls.ca_cert)
        http = client_through(proxy, cafile=proxy.ca_cert_path)
        client = anthropic.Anthropic(
            api_key="sk-ant-test", base_url=provider.base("localhost"), http_client=http
        )
        events = list(
            client.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=64,
                stream=True,
                messages=[{"role": "user", "content": "hi"}],
                tools=[
                    {"name": "WebFetch", "input_schema": {}},
                    {"name": "Bash", "input_schema": {}},
                ],
            )
        )
        assert events[-1].type == "message_stop"
        assert [t["name"] for t in provider.received[-1].json["tools"]] == ["Bash"]
        state = wait_idle(proxy)
        assert state.usage == REPORTED.normalized() and state.admitted == 1
        # The client would not talk to the provider directly with that trust: the
        # certificate it saw was the cell CA's, minted by the proxy.
        with pytest.raises(httpx.ConnectError):
            httpx.get(
                provider.base("localhost"),
                verify=ssl.create_default_context(cafile=str(proxy.ca_cert_path)),
                trust_env=False,
            )
        # A path rule applies inside the tunnel, after interception.
        answer = http.get(provider.base("localhost") + "/secret-answers/task-1")
        assert answer.status_code == 403 and "blocked" in answer.text
        assert all("/secret-answers" not in r.path for r in provider.received)


def test_rejected_and_cut_requests(proxy_factory, provider):
    proxy = proxy_factory()
    client = anthropic.Anthropic(
        api_key="sk-ant-test",
        base_url=provider.base(),
        http_client=client_through(proxy),
        max_retries=0,
    )
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="overloaded", max_tokens=8, messages=[])
    with pytest.raises(Exception):  # noqa: B017 - the SDK's error for a cut stream varies
        list(client.messages.create(model="cut-stream", max_tokens=8, messages=[], stream=True))
    state = wait_idle(proxy, requests=2)
    assert (state.requests, state.admitted, state.usage_requests) == (2, 1, 0)
    # The cut stream's message_start counts are kept as a lower bound.
    assert state.usage == Usage(1000, 200, 0, 1)
    proxy.settle()
    figure = derive(checkpoint(proxy), PRICES)
    assert figure.missing_usage == 1 and not figure.complete and figure.cost_usd is None


def test_no_chunk_is_held_back(proxy_factory, provider):
    """The provider sends the next chunk only after the client has seen the previous
    one: a proxy that held a chunk back would stall the stream (and fail here)."""
    proxy = proxy_factory()
    with (
        client_through(proxy) as http,
        http.stream(
            "POST",
            provider.base() + "/v1/messages",
            json={"model": "paced", "max_tokens": 8, "messages": [], "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        seen = 0
        buffer = b""
        for data in response.iter_raw():
            buffer += data
            while b"\n\n" in buffer:
                _, buffer = buffer.split(b"\n\n", 1)
                provider.pacing.seen[seen].set()
                seen += 1
    assert seen == len(provider.pacing.seen) == 11
    assert wait_idle(proxy).usage_requests == 1


# -- the blocklist, raw TCP, audit, CA, checkpoint -----------------------------------------
def test_blocked_requests_get_403_with_the_reason(proxy_factory, provider):
    proxy = proxy_factory()
    with client_through(proxy) as http:
        plain = http.get("http://blocked.example/answers")
        assert plain.status_code == 403 and "blocked.example" in plain.text
        wrapped = http.get(provider.base() + "/r?u=https://forbidden.example/x")
        assert wrapped.status_code == 403
        assert http.get(provider.base() + "/fine").status_code == 200
        with pytest.raises(httpx.ProxyError, match="403"):
            http.get("https://blocked.example/")
    assert [r.path for r in provider.received] == ["/fine"]
    decisions = [(e["event"], e["decision"]) for e in audit_lines(proxy)]
    assert ("request", "block") in decisions and ("connect", "block") in decisions
    assert ("request", "allow") in decisions
    assert checkpoint(proxy).requests == 0  # blocked requests are never metered


class RawServer:
    """A TCP server on loopback that records what reaches it (and may greet first)."""

    def __init__(self, greeting: bytes = b"") -> None:
        self.received: list[bytes] = []
        self.greeting = greeting
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.server.settimeout(20)
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        conn.settimeout(5)
        try:
            if self.greeting:
                conn.sendall(self.greeting)
            while data := conn.recv(1024):
                self.received.append(data)
        except OSError:
            pass
        conn.close()

    def close(self) -> None:
        self.thread.join(10)
        self.server.close()


def tunnel(proxy: ProxyHandle, port: int) -> socket.socket:
    sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
    target = f"127.0.0.1:{port}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    sock.settimeout(10)
    try:
        while chunk := sock.recv(1024):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_raw_tcp_inside_connect_is_killed(proxy_factory):
    """Raw TCP sent into a tunnel is not forwarded; the tunnel is closed."""
    proxy = proxy_factory()
    server = RawServer()
    with tunnel(proxy, server.port) as sock:
        sock.sendall(b"SSH-2.0-raw-protocol\r\nnot http, not tls\r\n")
        assert read_until_closed(sock) == b""
    server.close()
    assert server.received == []
    kills = [e for e in audit_lines(proxy) if e["event"] == "tcp"]
    assert kills and kills[0]["decision"] == "kill" and kills[0]["port"] == server.port


def test_a_server_speaking_first_is_not_relayed(proxy_factory):
    """A protocol where the server greets first (SSH, SMTP) is not relayed either."""
    proxy = proxy_factory()
    server = RawServer(greeting=b"SSH-2.0-OpenSSH_9.2\r\n")
    with tunnel(proxy, server.port) as sock:
        assert read_until_closed(sock) == b""
    server.close()
    assert any(e["event"] == "tcp" and e["decision"] == "kill" for e in audit_lines(proxy))


def test_audit_log_is_bounded_and_rotated(proxy_factory):
    proxy = proxy_factory(audit_log_max_bytes=8192)
    with client_through(proxy) as http:
        for i in range(120):
            assert http.get(f"http://blocked.example/{i}/" + "x" * 100).status_code == 403
    log = proxy.audit_log_path
    backup = log.with_name(log.name + ".1")
    assert log.stat().st_size <= 8192 and backup.stat().st_size <= 8192
    assert backup.stat().st_size > 8192 - 600  # rotated when full, not earlier
    for path in (log, backup):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        for line in path.read_text().splitlines():
            assert json.loads(line)["event"]
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name, backup.name]
    assert "/119/" in log.read_text()  # the newest decision is in the current file


def test_only_the_ca_certificate_is_published(proxy_factory):
    proxy = proxy_factory()
    published = proxy.ca_cert_path.parent
    assert [p.name for p in published.iterdir()] == [CA_CERT_NAME]
    assert stat.S_IMODE(proxy.ca_cert_path.stat().st_mode) == 0o644
    text = proxy.ca_cert_path.read_text()
    assert "BEGIN CERTIFICATE" in text and "PRIVATE KEY" not in text
    confdir = proxy.state_dir / "confdir"
    assert stat.S_IMODE(confdir.stat().st_mode) == 0o700
    assert stat.S_IMODE(proxy.state_dir.stat().st_mode) == 0o700
    assert "PRIVATE KEY" in (confdir / "mitmproxy-ca.pem").read_text()
    assert (confdir / CA_CERT_NAME).read_text() == text
    # Each cell gets its own CA.
    other = proxy_factory("other-cell")
    assert other.ca_cert_path.read_text() != text


def test_the_checkpoint_verifies_with_the_token_only(proxy_factory, provider):
    proxy = proxy_factory()
    client = openai.OpenAI(
        api_key="sk-test", base_url=provider.base() + "/v1", http_client=client_through(proxy)
    )
    client.chat.completions.create(model="gpt-4o", messages=[])
    wait_idle(proxy)
    assert stat.S_IMODE(proxy.checkpoint_path.stat().st_mode) == 0o644
    assert isinstance(read_checkpoint(proxy.checkpoint_path, TOKEN), Checkpoint)
    wrong = read_checkpoint(proxy.checkpoint_path, "not-the-token")
    assert isinstance(wrong, CheckpointRejected) and wrong.reason is RejectReason.BAD_SIGNATURE
    assert TOKEN not in proxy.checkpoint_path.read_text()
    proxy.stop()
    final = checkpoint(proxy)
    assert final.settled and final.requests == 1  # shutting down settles


def test_upstream_chaining_with_credentials(proxy_factory, provider, tmp_path):
    """The cluster sidecar's mode: every request leaves through an upstream proxy (the
    egress gateway) that requires the attempt's credential."""
    gateway_log = tmp_path / "gateway.log"
    port_probe = socket.create_server(("127.0.0.1", 0))
    gateway_port = port_probe.getsockname()[1]
    port_probe.close()
    gateway = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mitmdump"),
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            str(gateway_port),
            "--set",
            f"confdir={tmp_path / 'gateway-conf'}",
            "--set",
            "proxyauth=ns/attempt-1:s3cret",
            "--set",
            "flow_detail=0",
        ],
        stdout=gateway_log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", gateway_port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, gateway_log.read_text()
                time.sleep(0.05)
        upstream = f"http://127.0.0.1:{gateway_port}"
        sidecar = proxy_factory(upstream=upstream, upstream_auth="ns/attempt-1:s3cret")
        assert "s3cret" not in " ".join(
            Path(f"/proc/{sidecar.pid}/cmdline").read_text().split("\0")
        )
        client = openai.OpenAI(
            api_key="sk-test",
            base_url=provider.base() + "/v1",
            http_client=client_through(sidecar),
        )
        reply = client.chat.completions.create(
            model="gpt-4o", messages=[], tools=[web_fn("WebSearch"), web_fn("bash")]
        )
        assert reply.usage is not None
        assert [t["function"]["name"] for t in provider.received[-1].json["tools"]] == ["bash"]
        assert wait_idle(sidecar).usage == REPORTED.normalized()
        with client_through(sidecar) as http:
            assert http.get("http://blocked.example/").status_code == 403
        # Without the credential the gateway refuses.
        anonymous = proxy_factory("anonymous", upstream=upstream)
        with client_through(anonymous) as http:
            assert http.get(provider.base() + "/fine").status_code == 407
    finally:
        gateway.terminate()
        gateway.wait(10)


# -- start-up -----------------------------------------------------------------------------
def test_a_state_dir_is_never_reused(proxy_factory):
    proxy_factory("cell")
    with pytest.raises(ProxyStartError, match="new CA"):
        proxy_factory("cell")


def test_the_addon_fails_closed_without_a_policy(tmp_path):
    """mitmdump refuses to start (rather than run without the blocklist)."""
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "mitmdump"),
            "--listen-port",
            "0",
            "-s",
            str(ADDON_SCRIPT),
            "--set",
            f"confdir={tmp_path / 'conf'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "maka_policy" in result.stdout + result.stderr


def test_a_bad_policy_file_stops_the_start(tmp_path):
    (tmp_path / "policy.json").write_text('{"format": "something else"}')
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "mitmdump"),
            "--listen-port",
            "0",
            "-s",
            str(ADDON_SCRIPT),
            "--set",
            f"confdir={tmp_path / 'conf'}",
            "--set",
            f"maka_policy={tmp_path / 'policy.json'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0


def test_start_times(proxy_factory):
    """Every start above was timed; this one too. mitmdump itself dominates (its import
    and the CA's key): about 0.6 s on an idle machine."""
    proxy_factory("timed")
    print(
        f"\nproxy start: n={len(START_TIMES)} min={min(START_TIMES):.2f}s "
        f"median={sorted(START_TIMES)[len(START_TIMES) // 2]:.2f}s max={max(START_TIMES):.2f}s"
    )
    assert min(START_TIMES) < 10


def test_the_relay_recovers_usage_after_the_wrapper_is_killed(proxy_factory, provider, tmp_path):
    """End to end: a protocol-v1 subject makes a model request through the cell's proxy
    and is killed before writing its frame. The relay settles the proxy, verifies the
    checkpoint and scores a failed subject with the metered usage and cost."""
    proxy = proxy_factory()
    request = (
        "import json, urllib.request;"
        f"o = urllib.request.build_opener(urllib.request.ProxyHandler({{'http': '{proxy.url}'}}));"
        f"r = urllib.request.Request('{provider.base()}/v1/chat/completions',"
        " data=json.dumps({'model': 'gpt-4o', 'messages': []}).encode(),"
        " headers={'content-type': 'application/json'});"
        "o.open(r, timeout=20).read()"
    )
    script = f'{sys.executable} -c "{request}" && touch done.txt && kill -9 $$'
    task = make_task(tmp_path / "tasks", "t1")
    plan = AttemptPlan(
        attempt_id="run/t1::1::s/1",
        run_id="run",
        cell_id="t1::1::s",
        task_id="t1",
        repetition=1,
        subject_id="s",
        root=str(tmp_path / "attempt"),
        artifacts_dir=str(tmp_path / "artifacts"),
        instruction_file=str(task / "instruction.md"),
        tests_dir=str(task / "tests"),
        environment_dir=None,
        subject=SubjectLaunch(argv=("/bin/sh", "-c", script), contract=ResultContract.PROTOCOL_V1),
        agent_timeout_sec=60,
        verifier_timeout_sec=30,
        metering=MeteringPlan(str(proxy.checkpoint_path), prices=PRICES.to_dict()),
    )
    env = {"PATH": os.environ["PATH"], "MAKA_EVAL_RESULT_TOKEN": TOKEN}
    outcome = run_attempt(
        plan, ProcessSupervisor(), CancelToken(), env, settle_metering=proxy.settle
    )
    c = outcome.classification
    assert c.status is AttemptStatus.SUBJECT_FAILED and c.source is StatusSource.ADMITTED_WORK
    assert c.score == 1.0
    assert c.usage == REPORTED.normalized()
    assert c.cost_usd == pytest.approx((1000 * 2.5 + 200 * 1.25 + 345 * 10.0) / 1e6)
