"""Settling the metering proxy over HTTP, as the relay in a Pod does (it cannot signal the
sidecar), and the relay's reading of the checkpoint with a token from a file."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from maka_eval.egress.policy import EgressPolicy
from maka_eval.egress.proxy import ProxyHandle, start_proxy
from maka_eval.engine.classify import NO_FRAME, ResultContract
from maka_eval.metering.checkpoint import Checkpoint
from maka_eval.metering.settle import SettleError, request_settlement, wait_settled
from maka_eval.relay.metering import recover_metered
from maka_eval.relay.plan import MeteringPlan
from tests.egress.fake_provider import FakeProvider
from tests.metering.provider_payloads import Reported

pytestmark = pytest.mark.slow

TOKEN = "pod-result-token-1b9d"
REPORTED = Reported(prompt=1200, cached=200, cache_write=0, output=345)
PRICES = {"gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10.0, "cacheReadPerMTok": 1.25}}
EXIT = ResultContract.EXIT_CODE


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyHandle]:
    (tmp_path / "meter").mkdir()  # a Pod's emptyDir
    handle = start_proxy(
        state_dir=tmp_path / "state",
        publish_dir=tmp_path / "published",
        policy=EgressPolicy("none", ["blocked.example"]),
        checkpoint_path=tmp_path / "meter" / "provider-usage.json",
        result_token=TOKEN,
    )
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(REPORTED) as fake:
        yield fake


def call(proxy: ProxyHandle, provider: FakeProvider) -> None:
    body = {"model": "gpt-4o-2024-08-06", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=20) as client:
        response = client.post(provider.base() + "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


def token_file(tmp_path: Path, value: str = TOKEN) -> Path:
    path = tmp_path / "token-volume" / "token"
    path.parent.mkdir(exist_ok=True)
    path.write_text(value + "\n")
    return path


def test_a_settle_request_settles_the_figure_until_the_next_model_request(proxy, provider):
    call(proxy, provider)
    request_settlement(proxy.url)
    # Answered only once the settled checkpoint is on disk: no waiting needed.
    settled = proxy.read_checkpoint()
    assert isinstance(settled, Checkpoint), settled
    assert settled.settled and settled.in_flight == 0 and settled.usage_requests == 1
    # A settle (anyone in the Pod may send one) holds only until the next model request.
    call(proxy, provider)
    after = wait_settled(proxy.checkpoint_path, TOKEN, timeout=0.3)
    assert isinstance(after, Checkpoint) and not after.settled and after.requests == 2
    # The request never reached the provider (nor would it reach a gateway), and the
    # audit log says who settled.
    assert [r.path for r in provider.received] == ["/v1/chat/completions"] * 2
    events = [json.loads(line) for line in proxy.audit_log_path.read_text().splitlines()]
    assert any(e.get("event") == "settle" for e in events)


def test_the_relay_settles_over_http_and_prices_the_figure(proxy, provider, tmp_path):
    call(proxy, provider)
    call(proxy, provider)
    plan = MeteringPlan(
        str(proxy.checkpoint_path),
        prices=PRICES,
        token_file=str(token_file(tmp_path)),
        settle_proxy=proxy.url,
    )
    recovery = recover_metered(plan, EXIT, NO_FRAME, host_env={})
    metered = recovery.metered
    assert metered is not None and metered.complete and metered.admitted_requests == 2
    one = REPORTED
    assert metered.usage is not None
    assert metered.usage.total_tokens == 2 * (one.prompt + one.output)
    expected = 2 * ((one.prompt - one.cached) * 2.5 + one.cached * 1.25 + one.output * 10) / 1e6
    assert metered.cost_usd == pytest.approx(expected, abs=1e-9)
    assert any("metered by the egress proxy" in n and "complete" in n for n in recovery.notes)


def test_a_proxy_that_cannot_be_settled_leaves_a_lower_bound(proxy, provider, tmp_path):
    call(proxy, provider)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(SettleError):
        request_settlement(closed, timeout=2)
    plan = MeteringPlan(
        str(proxy.checkpoint_path),
        prices=PRICES,
        token_file=str(token_file(tmp_path)),
        settle_proxy=closed,
    )
    recovery = recover_metered(plan, EXIT, NO_FRAME, host_env={})
    assert recovery.metered is not None and not recovery.metered.complete
    assert recovery.metered.cost_usd is None
    assert any("could not be settled" in n for n in recovery.notes)
    assert any("lower bound" in n for n in recovery.notes)


def test_the_token_file_must_be_a_regular_file(proxy, provider, tmp_path):
    call(proxy, provider)
    real = token_file(tmp_path)
    link = tmp_path / "link-to-token"
    os.symlink(real, link)
    plan = MeteringPlan(str(proxy.checkpoint_path), token_file=str(link), settle_proxy=proxy.url)
    recovery = recover_metered(plan, EXIT, NO_FRAME, host_env={})
    assert recovery.metered is None
    assert any("result token" in n and "not available" in n for n in recovery.notes)
    # A wrong token: the checkpoint does not verify, nothing is attributed.
    wrong = MeteringPlan(
        str(proxy.checkpoint_path),
        token_file=str(token_file(tmp_path, "not-the-token")),
        settle_proxy=proxy.url,
    )
    recovery = recover_metered(wrong, EXIT, NO_FRAME, host_env={})
    assert recovery.metered is None
    assert any("bad_signature" in n for n in recovery.notes)
