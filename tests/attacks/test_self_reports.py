"""Self-reported figures, for real: a protocol-v1 subject lies in its result frame.

Two lies, each through the local executor. One subject writes an absurd figure (cost
1e308, 10^15 tokens, ...) so that the shared budget reads as reached and no other task
group starts: the frame is malformed, the figure never reaches the budget, and every
group runs. Another makes real model requests through its cell's metering proxy and
reports none of them (or ten billion tokens): the record holds what the proxy metered,
and a note says what the subject claimed.
"""

from __future__ import annotations

import math
import os

import pytest

from maka_eval.analysis.summary import summarize
from maka_eval.engine.status import AttemptStatus
from maka_eval.engine.usage import Usage
from maka_eval.store.run_store import read_run
from tests.egress import attacks
from tests.egress.fake_provider import FakeProvider
from tests.egress.policing import WHY_NOT
from tests.helpers import REWARD_ONE, make_task, spec, write_experiment

SANDBOX = "process sandbox, metered"
"""Where these attacks run (bench/integrity_attacks.py prints it; a parameter naming
another sandbox, such as `policed`, says so in the test's id)."""
ATTACK_CLASS = "self-reported usage and cost"

S = AttemptStatus
PROTOCOL = '"protocol":"maka.eval.result.v1","status":"completed"'
HONEST_FRAME = f'{{{PROTOCOL},"usage":{{"inputTokens":90,"outputTokens":10}},"costUsd":0.01}}'

# What a hostile frame may hold, written as raw JSON text (1e999 is no JSON number a
# writer could produce; the reader sees infinity).
ABSURD = {
    "cost-1e308": '"costUsd":1e308',
    "cost-1e6": '"costUsd":1e6',
    "cost-1e999": '"costUsd":1e999',
    "cost-negative": '"costUsd":-1',
    "tokens-1e15": '"usage":{"inputTokens":1000000000000000}',
    "tokens-float": '"usage":{"outputTokens":1e12}',
    "total-huge": (
        '"usage":{"inputTokens":1000000000000000,"outputTokens":1000000000000000,'
        '"totalTokens":2000000000000000}'
    ),
    "cost-huge-int": '"costUsd":1' + "0" * 400,
}


def framed(subject_id: str, frame: str) -> dict:
    """A protocol-v1 subject that does the task and writes `frame` as its result."""
    script = f"touch done.txt; printf '%s' '{frame}' > \"$MAKA_EVAL_RESULT_FILE\""
    return {
        "id": subject_id,
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", script], "resultContract": "protocol-v1"},
    }


def test_absurd_self_reports_do_not_stop_the_other_groups(setup):
    subjects = [framed("honest", HONEST_FRAME)]
    subjects += [framed(name, f"{{{PROTOCOL},{field}}}") for name, field in ABSURD.items()]
    s = setup(
        spec(
            subjects=subjects,
            tasks=[{"id": "t1"}, {"id": "t2"}],
            # One group at a time: the second starts only if the first left budget.
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
            budget={"maxCostUsd": 1.0, "maxTokens": 1_000_000},
        )
    )
    report = s.run()
    assert report.held_by_budget == 0
    run = read_run(s.run_dir)
    for task in ("t1", "t2"):  # every arm of both groups started
        honest = run.attempts(f"{task}::1::honest")
        assert [r.status for r in honest] == [S.COMPLETED]
        assert honest[0].result.usage == Usage(90, 0, 0, 10)
        for name in ABSURD:
            (record,) = run.attempts(f"{task}::1::{name}")
            result = record.result
            # A malformed frame without admitted model work: the existing rule.
            assert result.status is S.INFRA_FAILED, (name, result.reason)
            assert "the result frame is malformed" in (result.reason or ""), name
            assert result.usage is None and result.cost_usd is None, name
    summary = summarize(str(s.run_dir))
    assert not summary.budget.exhausted
    assert summary.budget.spent_tokens == 200
    assert summary.budget.spent_cost_usd == pytest.approx(0.02)
    assert all(math.isfinite(s.cost_usd or 0) for s in summary.subjects)


# -- against the real metering proxy --------------------------------------------------------
PRICES = {"gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10, "cacheReadPerMTok": 1.25}}

LIAR = """
import json, os, sys, urllib.request
for name in ("NO_PROXY", "no_proxy"):  # the provider is on loopback: go through the proxy
    os.environ.pop(name, None)
body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
for _ in range(2):
    request = urllib.request.Request(
        os.environ["PROVIDER"] + "/v1/chat/completions", body.encode(),
        {"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=60).read()
open("done.txt", "w").close()
with open(os.environ["MAKA_EVAL_RESULT_FILE"], "w") as frame:
    frame.write(os.environ["FRAME"])
"""

LIES = {
    # nothing at all, though two requests were billed
    "under": ('{"inputTokens":0,"outputTokens":0}', 0.0, "0 tokens and $0.0000"),
    # bounded, but enough to exhaust any budget if it were believed
    "over": (
        '{"inputTokens":5000000000,"outputTokens":4000000000}',
        99999.0,
        "9,000,000,000 tokens and $99,999.0000",
    ),
}


def liar(name: str, provider: FakeProvider) -> dict:
    usage, cost, _ = LIES[name]
    frame = f'{{{PROTOCOL},"usage":{usage},"costUsd":{cost}}}'
    return {
        "id": name,
        "kind": "external",
        "config": {
            "command": "python3",
            "args": ["-c", LIAR],
            "env": {"PROVIDER": provider.base("127.0.0.1"), "FRAME": frame},
            "resultContract": "protocol-v1",
        },
    }


policed = pytest.mark.skipif(WHY_NOT is not None, reason=f"cannot police a cell here: {WHY_NOT}")


def metered_run(tmp_path, names: list[str], tasks: list[str], **changes) -> tuple:
    """Run `names` (LIES) on `tasks` in policed cells whose proxy meters a fake provider:
    the run's records, what the proxy metered per attempt and its price."""
    with FakeProvider() as provider:
        for task in tasks:
            make_task(tmp_path / "tasks", task, test_sh=REWARD_ONE)
        config = {"egress": {"mode": "proxy"}, "isolation": "namespaces", "sandbox": "process"}
        doc = spec(
            subjects=[liar(name, provider) for name in names],
            tasks=[{"id": task} for task in tasks],
            executor={"kind": "local", "config": config},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
            metering={"prices": PRICES},
            **changes,
        )
        env = {"PATH": os.environ["PATH"], "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"]}
        report = attacks.run(write_experiment(tmp_path, doc), tmp_path / "run", env)
        one = provider.reported.normalized()
    metered = Usage(2 * one.input_tokens, 2 * one.cached_input_tokens, 0, 2 * one.output_tokens)
    price = (
        metered.input_tokens * 2.5 + metered.cached_input_tokens * 1.25 + metered.output_tokens * 10
    ) / 1e6
    return report, read_run(tmp_path / "run"), metered, price


def assert_metered_and_noted(result, name: str, metered: Usage, price: float) -> None:
    assert result.status is S.COMPLETED, (name, result.reason, result.notes)
    assert result.usage == metered, name
    assert result.cost_usd == pytest.approx(price, abs=1e-9), name
    said = LIES[name][2]
    assert (
        f"suspected misreport: the subject reported {said}, the proxy metered "
        f"{metered.total_tokens:,} tokens and ${price:,.4f}"
    ) in result.notes, result.notes
    # The frame as written is kept too, as an artifact.
    assert "result-frame.json" in {a.name for a in result.artifacts}


@pytest.mark.slow
@policed
def test_an_under_reporting_subject_is_recorded_as_the_proxy_metered_it(tmp_path):
    _, run, metered, price = metered_run(tmp_path, ["under"], ["t1"])
    (record,) = run.attempts("t1::1::under")
    assert_metered_and_noted(record.result, "under", metered, price)


@pytest.mark.slow
@policed
def test_an_over_reporting_subject_neither_outranks_the_meter_nor_stops_the_others(tmp_path):
    budget = {"maxCostUsd": 1.0, "maxTokens": 1_000_000}
    report, run, metered, price = metered_run(tmp_path, ["over"], ["t1", "t2"], budget=budget)
    assert report.held_by_budget == 0  # the second group started
    for task in ("t1", "t2"):
        (record,) = run.attempts(f"{task}::1::over")
        assert_metered_and_noted(record.result, "over", metered, price)
    summary = summarize(str(tmp_path / "run"))
    assert summary.budget.spent_tokens == 2 * metered.total_tokens
    assert summary.budget.spent_cost_usd == pytest.approx(2 * price)
    assert not summary.budget.exhausted
