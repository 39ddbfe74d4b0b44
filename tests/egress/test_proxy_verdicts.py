"""The proxy's remembered blocklist verdicts: the same answers as the policy, bounded."""

from __future__ import annotations

from mitmproxy.test import taddons, tflow

from maka_eval.egress import addon
from maka_eval.egress.policy import EgressPolicy

BLOCKED = "http://github.com/laude-institute/terminal-bench"
ALLOWED = "http://127.0.0.1:8000/v1/chat/completions"


def _guard(policy: EgressPolicy) -> addon.Guard:
    settings = addon.Settings()
    settings.policy = policy
    return addon.Guard(settings)


def _status(guard: addon.Guard, url: str) -> int | None:
    flow = tflow.tflow()
    flow.request.url = url
    with taddons.context():
        guard.request(flow)
    return flow.response.status_code if flow.response is not None else None


def test_a_remembered_verdict_is_the_policys_every_time():
    guard = _guard(EgressPolicy("terminal-bench"))
    for _ in range(3):
        assert _status(guard, BLOCKED) == 403
        assert _status(guard, ALLOWED) is None
    # A new policy is asked afresh: what it blocks is blocked at once.
    guard.settings.policy = EgressPolicy("terminal-bench", ["127.0.0.1/v1"])
    assert _status(guard, ALLOWED) == 403


def test_the_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(addon, "VERDICT_CACHE_SIZE", 10)
    policy = EgressPolicy("terminal-bench")
    guard = _guard(policy)
    for i in range(25):
        assert not guard._check_url(policy, f"http://example.com/{i}").blocked
    assert len(guard._verdicts) <= 10
    long_url = "http://example.com/?q=" + "a" * addon.VERDICT_CACHE_URL_LIMIT
    long_blocked = long_url + "&next=" + BLOCKED
    assert guard._check_url(policy, long_blocked).blocked
    assert long_url not in guard._verdicts and long_blocked not in guard._verdicts
