"""Metering in the local executor, end to end: a subject in a policed cell calls a
provider through its cell's proxy, then dies without writing its result frame. The
relay recovers the usage from the proxy's signed checkpoint, and the attempt is a failed
subject (the model work was done and billed), not an infrastructure retry."""

from __future__ import annotations

import os

from maka_eval.engine.status import AttemptStatus
from maka_eval.store.run_store import read_run
from tests.egress import attacks
from tests.egress.fake_provider import FakeProvider
from tests.egress.policing import POLICED
from tests.helpers import REWARD_ONE, make_task, spec, write_experiment

pytestmark = POLICED

SUBJECT = """
import json, os, urllib.request
body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "web_search"}]}).encode()
request = urllib.request.Request(os.environ["PROVIDER"] + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
# The fake provider is on the host's loopback, which NO_PROXY names: drop it, so that
# the request goes through the proxy as one to a real provider would.
for name in ("NO_PROXY", "no_proxy"):
    os.environ.pop(name, None)
print(urllib.request.urlopen(request, timeout=20).read()[:80])
os.kill(os.getpid(), 9)  # killed, not asked to stop: no result frame
"""


def test_a_killed_subject_is_metered_from_the_checkpoint(tmp_path):
    with FakeProvider() as provider:
        make_task(tmp_path / "tasks", "t1", test_sh=REWARD_ONE)
        subject = {
            "id": "s",
            "kind": "external",
            "config": {
                "command": "python3",
                "args": ["-c", SUBJECT],
                "env": {"PROVIDER": provider.base("127.0.0.1")},
                "resultContract": "protocol-v1",
            },
        }
        config = {"egress": {"mode": "proxy"}, "isolation": "namespaces", "sandbox": "process"}
        doc = spec(
            subjects=[subject],
            executor={"kind": "local", "config": config},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
        )
        env = {"PATH": os.environ["PATH"], "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"]}
        attacks.run(write_experiment(tmp_path, doc), tmp_path / "run", env)
        received = list(provider.received)
    record = read_run(tmp_path / "run").attempts("t1::1::s")[-1]
    result = record.result
    assert result.status is AttemptStatus.SUBJECT_FAILED, result.reason
    assert result.usage == provider.reported.normalized()
    assert result.cost_usd is None  # no prices in the spec
    # The provider never saw the web tool the subject asked for.
    assert len(received) == 1 and "web_search" not in received[0].raw.decode()
