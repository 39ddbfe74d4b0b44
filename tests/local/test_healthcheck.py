"""task.toml `healthcheck` ([environment] and per step), run for real in the process
sandbox with Harbor 0.26's semantics: `bash -c command` until it exits 0, failures in
the start period not counted, `retries` consecutive failures after it ending the attempt
(an infrastructure failure, the subject never started) or, for a step, the remaining
steps. tests/sandbox/test_container.py runs one in a container.
"""

from __future__ import annotations

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.sandbox.process import namespaces_unavailable
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import spec

S = AttemptStatus
TOUCH = {"id": "done", "kind": "external", "config": {"command": "touch", "args": ["done.txt"]}}
SPEAKER = {"id": "speaker", "kind": "external", "config": {"command": "echo", "args": ["ran"]}}
# Counts its runs in the attempt's /tmp (its own in either isolation, kept between runs).
COUNTING = 'n=$(cat "$TMPDIR/hc" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$TMPDIR/hc"; '


def attempt_with(setup, isolation: str, check: str, subject: dict | None = None):
    """The one attempt of a one-cell run whose task has `check` as its healthcheck."""
    subject = subject or TOUCH
    s = setup(
        spec(
            subjects=[subject],
            executor={"kind": "local", "config": {"isolation": isolation, "sandbox": "process"}},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
        ),
        {"t1": {"toml": f"[environment.healthcheck]\n{check}"}},
    )
    s.run()
    (record,) = read_run(s.run_dir).attempts(f"t1::1::{subject['id']}")
    return s, record


@pytest.fixture(params=["none", "namespaces"])
def isolation(request) -> str:
    if request.param == "namespaces" and namespaces_unavailable():
        pytest.skip(f"no namespaces here: {namespaces_unavailable()}")
    return request.param


def test_the_subject_starts_once_the_environment_is_healthy(setup, isolation):
    # Fails twice, then passes: within retries, so the attempt goes on as usual.
    check = f"command = '{COUNTING}echo check $n; [ $n -ge 3 ]'\ninterval_sec = 0.05\nretries = 3\n"
    s, record = attempt_with(setup, isolation, check)
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result.reason
    said = artifact_path(s.run_dir, record, "healthcheck.out").read_text()
    assert said.strip() == "check 3"


def test_an_environment_that_never_becomes_healthy_is_an_infrastructure_failure(setup, isolation):
    check = f"command = '{COUNTING}echo not yet $n; exit 1'\ninterval_sec = 0.05\nretries = 2\n"
    _, record = attempt_with(setup, isolation, check, SPEAKER)
    assert record.status is S.INFRA_FAILED
    reason = record.result.reason or ""
    assert "healthcheck failed 2 time(s) in a row" in reason and "never became healthy" in reason
    assert "exit code 1, not yet 2" in reason
    # The subject never started.
    assert record.subject_started_at is None
    assert "subject.stdout" not in {a.name for a in record.result.artifacts}


def test_failures_in_the_start_period_do_not_count(setup, isolation):
    # Fails for its first five runs, all within the start period; one retry after it.
    check = (
        f"command = '{COUNTING}[ $n -ge 6 ]'\n"
        "start_period_sec = 30\nstart_interval_sec = 0.02\ninterval_sec = 0.02\nretries = 1\n"
    )
    _, record = attempt_with(setup, isolation, check)
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result.reason


def test_a_check_that_hangs_counts_as_failed_after_its_timeout(setup, isolation):
    check = "command = 'sleep 30'\ntimeout_sec = 0.3\ninterval_sec = 0.01\nretries = 2\n"
    _, record = attempt_with(setup, isolation, check)
    assert record.status is S.INFRA_FAILED
    assert "timed out after 0.3s" in (record.result.reason or "")
    assert record.result.duration_sec < 10  # it did not wait the 30 s
