"""Metering end to end with the official SDKs: subjects run by the local executor call a
provider with the `openai` and `anthropic` Python SDKs, streaming and not, through their
cell's proxy. The attempt record's usage is what the provider reported, its cost is that
usage priced with the spec's `metering.prices`, and the provider never saw a web tool.

One run, three subjects (arms): every call priced; a model the spec does not price (no
cost, a note naming it); a stream without usage (a lower bound, no cost).
"""

from __future__ import annotations

import os
import sys
import sysconfig

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.engine.usage import Usage
from maka_eval.store.run_store import read_run
from tests.egress import attacks
from tests.egress.fake_provider import FakeProvider
from tests.egress.policing import POLICED
from tests.helpers import REWARD_ONE, make_task, spec, write_experiment

pytestmark = POLICED


def _sdk_site() -> str:
    """Where the subjects import the SDKs from: this checkout's site-packages. The
    process sandbox shows a program's whole virtualenv (local.plans.program_view), here
    or under /tmp alike."""
    return sysconfig.get_paths()["purelib"]


GPT = "gpt-4o-2024-08-06"
CLAUDE = "claude-sonnet-4-5-20250929"
PRICES = {
    "gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10, "cacheReadPerMTok": 1.25},
    "claude-sonnet-4-5*": {
        "inputPerMTok": 3,
        "outputPerMTok": 15,
        "cacheReadPerMTok": 0.3,
        "cacheWritePerMTok": 3.75,
    },
}

SUBJECT = """
import os, sys
import anthropic, openai
# The fake provider is on the host's loopback, which NO_PROXY names: drop it, so that
# the SDKs go through the proxy (HTTP_PROXY) as they would to a real provider.
for name in ("NO_PROXY", "no_proxy"):
    os.environ.pop(name, None)
mode, base = sys.argv[1], os.environ["PROVIDER"]
oa = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
messages = [{"role": "user", "content": "hi"}]
web = {"type": "function", "function": {"name": "WebSearch", "parameters": {"type": "object"}}}
shell = {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}
if mode == "priced":
    oa.chat.completions.create(model="GPT_MODEL", messages=messages, tools=[web, shell])
    for _ in oa.chat.completions.create(
        model="GPT_MODEL", messages=messages, tools=[web], stream=True,
        stream_options={"include_usage": True},
    ):
        pass
    oa.responses.create(model="GPT_MODEL", input="hi", tools=[{"type": "web_search"}])
    an.messages.create(
        model="CLAUDE_MODEL", max_tokens=64, messages=messages,
        tools=[{"type": "web_search_20250305", "name": "web_search"}],
    )
    with an.messages.stream(
        model="CLAUDE_MODEL", max_tokens=64, messages=messages,
        tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}],
    ) as stream:
        stream.get_final_message()
elif mode == "unpriced":
    oa.chat.completions.create(model="o3-mini", messages=messages)
    an.messages.create(model="CLAUDE_MODEL", max_tokens=64, messages=messages)
elif mode == "partial":
    oa.chat.completions.create(model="GPT_MODEL", messages=messages)
    for _ in oa.chat.completions.create(model="GPT_MODEL", messages=messages, stream=True):
        pass  # no stream_options.include_usage: the stream carries no usage
print("done", mode)
""".replace("GPT_MODEL", GPT).replace("CLAUDE_MODEL", CLAUDE)


def subject(mode: str, provider: FakeProvider) -> dict[str, object]:
    return {
        "id": mode,
        "kind": "external",
        "config": {
            # This checkout's interpreter: it has the SDKs (test dependencies).
            "command": sys.executable,
            "args": ["-c", SUBJECT, mode],
            # The sandbox starts the interpreter by its real path, outside the venv.
            "env": {"PROVIDER": provider.base("127.0.0.1"), "PYTHONPATH": _sdk_site()},
            "resultContract": "exit-code",
        },
    }


def test_sdk_calls_are_metered_and_priced_from_the_spec(tmp_path):
    with FakeProvider() as provider:
        make_task(tmp_path / "tasks", "t1", test_sh=REWARD_ONE)
        config = {"egress": {"mode": "proxy"}, "isolation": "namespaces", "sandbox": "process"}
        doc = spec(
            subjects=[subject(m, provider) for m in ("priced", "unpriced", "partial")],
            executor={"kind": "local", "config": config},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
            metering={"prices": PRICES},
        )
        env = {"PATH": os.environ["PATH"], "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"]}
        attacks.run(write_experiment(tmp_path, doc), tmp_path / "run", env)
        received = list(provider.received)
        one = provider.reported.normalized()
    run = read_run(tmp_path / "run")
    results = {m: run.attempts(f"t1::1::{m}")[-1].result for m in ("priced", "unpriced", "partial")}
    for mode, result in results.items():
        assert result.status is AttemptStatus.COMPLETED, (mode, result.reason, result.notes)

    # Five calls, each reporting `one`: the record holds exactly their sum...
    priced = results["priced"]
    assert priced.usage == Usage(
        5 * one.input_tokens, 5 * one.cached_input_tokens, 0, 5 * one.output_tokens
    )
    # ...and the spec's prices of it: 3 GPT calls and 2 Claude calls.
    gpt = (one.input_tokens * 2.5 + one.cached_input_tokens * 1.25 + one.output_tokens * 10) / 1e6
    claude = (one.input_tokens * 3 + one.cached_input_tokens * 0.3 + one.output_tokens * 15) / 1e6
    assert priced.cost_usd == pytest.approx(3 * gpt + 2 * claude, abs=1e-9)
    assert any("usage metered by the egress proxy" in n and "complete" in n for n in priced.notes)

    # A model the spec does not price: usage recorded, no cost, a note saying which.
    unpriced = results["unpriced"]
    assert unpriced.usage is not None and unpriced.usage.total_tokens == 2 * one.total_tokens
    assert unpriced.cost_usd is None
    assert any("cannot price 'o3-mini' (no price)" in n for n in unpriced.notes), unpriced.notes

    # A stream that carried no usage: the tokens seen are a lower bound, with no cost.
    partial = results["partial"]
    assert partial.usage == one and partial.cost_usd is None
    without_usage = "1 admitted request(s) without usage"
    assert any("lower bound" in n and without_usage in n for n in partial.notes), partial.notes

    # Every call reached the provider, none of them with a web tool.
    posts = [r for r in received if r.method == "POST"]
    assert len(posts) == 5 + 2 + 2
    for request in posts:
        text = request.raw.decode()
        for name in ("WebSearch", "web_search", "web_fetch"):
            assert name not in text, (request.path, text[:300])
    assert any("run_shell" in r.raw.decode() for r in posts)  # other tools are kept
