"""The relay program a task container runs: plan in, bounded result kernel out."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.environment import Healthcheck
from maka_eval.engine.status import AttemptStatus
from maka_eval.engine.task_settings import StepPlan
from maka_eval.relay.plan import AttemptPlan
from tests.relay.conftest import sh

LIGHT = ("pydantic", "typer", "rich", "yaml", "click", "docker", "requests")


def relay(plan_path: Path, result: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "maka_eval.relay",
            "--plan",
            str(plan_path),
            "--result",
            str(result),
        ],
        stderr=subprocess.PIPE,
    )


def test_runs_one_attempt_and_writes_the_kernel(plan_for, tmp_path):
    plan = plan_for(sh("echo working; touch done.txt"))
    (tmp_path / "plan.json").write_text(plan.to_json())
    proc = relay(tmp_path / "plan.json", tmp_path / "termination-log")
    assert proc.wait(30) == 0
    text = (tmp_path / "termination-log").read_text()
    assert len(text.encode()) < 4096
    # The same parser every executor uses for the relay's result.
    kernel = ResultKernel.from_json(text)
    assert kernel.status is AttemptStatus.COMPLETED and kernel.score == 1.0
    # Empty output (stderr, verifier output) is not stored: an artifact has content.
    assert {a.name for a in kernel.artifacts} == {"subject.stdout", "verifier/reward.txt"}
    for entry in kernel.artifacts:
        data = (Path(plan.artifacts_dir) / entry.name).read_bytes()
        assert len(data) == entry.bytes and hashlib.sha256(data).hexdigest() == entry.sha256


def test_sigterm_cancels_and_quiesces(plan_for, tmp_path):
    plan = plan_for(sh("setsid sleep 1007 & echo $! > pid; touch ready; sleep 1000"), timeout=60)
    (tmp_path / "plan.json").write_text(plan.to_json())
    proc = relay(tmp_path / "plan.json", tmp_path / "out.json")
    ready = Path(plan.root) / "workspace" / "ready"
    deadline = time.monotonic() + 120  # only ends a hang
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int((Path(plan.root) / "workspace" / "pid").read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 1
    assert json.loads((tmp_path / "out.json").read_text())["status"] == "cancelled"
    assert not Path(f"/proc/{pid}").exists()


def test_a_malformed_plan_is_refused(tmp_path):
    (tmp_path / "plan.json").write_text('{"attemptId": 1}')
    proc = relay(tmp_path / "plan.json", tmp_path / "out.json")
    assert proc.wait(30) == 2
    assert b"plan is malformed" in proc.stderr.read()


def test_the_relay_imports_nothing_heavy():
    code = (
        "import sys, maka_eval.relay.__main__, maka_eval.relay.attempt;"
        f"print([m for m in {LIGHT!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_container_plan_survives_json(plan_for):
    from dataclasses import replace

    import pytest

    from maka_eval.relay.plan import AttemptPlan, PlanError
    from maka_eval.sandbox.plans import ContainerPlan

    container = ContainerPlan(
        engine="unix:///run/maka-eval/podman.sock",
        image="maka-eval-task/t:0123456789abcdef",
        build_dir="/tasks/t/environment",
        workdir="/app",
        agent_user="agent",
        cpus=1.5,
        memory_mb=512,
        network="no-network",
        env={"A": "1"},
        program="/agents/agent.sh",
    )
    plan = replace(plan_for(["true"]), isolation="container", container=container)
    assert AttemptPlan.from_json(plan.to_json()) == plan
    with pytest.raises(PlanError, match="exactly when isolation is 'container'"):
        AttemptPlan.from_json(replace(plan, isolation="none").to_json())


def test_the_plan_carries_healthchecks_to_the_relay_program(plan_for):
    check = Healthcheck("curl -f localhost:8080", interval_sec=1, retries=5)
    step = StepPlan("one", "i.md", ("tests",), 10.0, 10.0, healthcheck=check)
    plan = replace(plan_for(["true"]), healthcheck=check, steps=(step,))
    again = AttemptPlan.from_json(plan.to_json())
    assert again.healthcheck == check and again.steps[0].healthcheck == check
    assert "healthcheck" not in plan_for(["true"]).to_json()
