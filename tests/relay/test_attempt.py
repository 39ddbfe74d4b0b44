"""One attempt through the relay, for real: contracts, timeouts, verifier, environment."""

from __future__ import annotations

import json
from pathlib import Path

from maka_eval.engine.classify import ExecutionEnd, FrameState, ResultContract
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.engine.usage import Usage
from tests.relay.conftest import artifact, artifact_file, sh

V1 = ResultContract.PROTOCOL_V1
S = AttemptStatus


def frame_script(frame: object, exit_code: int = 0, then: str = "") -> list[str]:
    text = frame if isinstance(frame, str) else json.dumps(frame)
    write = f"cat > \"$MAKA_EVAL_RESULT_FILE\" <<'EOF'\n{text}\nEOF\n"
    return sh(f"touch done.txt; {write}{then}exit {exit_code}")


FRAME = {
    "protocol": "maka.eval.result.v1",
    "status": "completed",
    "usage": {
        "inputTokens": 120,
        "cachedInputTokens": 30,
        "cacheWriteTokens": 0,
        "outputTokens": 40,
    },
    "costUsd": 0.0031,
}


def test_exit_code_contract(plan_for, run):
    plan = plan_for(sh("touch done.txt; echo chatter"))
    ok = run(plan)
    assert ok.classification.status is S.COMPLETED and ok.classification.score == 1.0
    assert ok.classification.usage is None and ok.classification.cost_usd is None
    assert artifact(plan, ok, "subject.stdout") == "chatter\n"  # kept as an artifact, never parsed
    failed = run(plan_for(sh("exit 4")))
    assert failed.classification.status is S.SUBJECT_FAILED
    assert failed.classification.score == 0.0 and failed.classification.exit_code == 4


def test_protocol_v1_frame_is_read_and_wins_over_the_exit_code(plan_for, run):
    plan = plan_for(frame_script(FRAME, exit_code=3), contract=V1)
    outcome = run(plan)
    c = outcome.classification
    assert c.status is S.COMPLETED and c.source is StatusSource.FRAME and c.exit_code is None
    assert c.usage == Usage(120, 30, 0, 40) and c.cost_usd == 0.0031
    assert json.loads(artifact(plan, outcome, "result-frame.json")) == FRAME


def test_frame_without_status_falls_back_to_the_exit_code(plan_for, run):
    frame = {"protocol": "maka.eval.result.v1", "usage": FRAME["usage"]}
    c = run(plan_for(frame_script(frame, exit_code=2), contract=V1)).classification
    assert c.status is S.SUBJECT_FAILED and c.source is StatusSource.EXIT_CODE and c.exit_code == 2
    assert c.usage == Usage(120, 30, 0, 40)


def test_missing_malformed_and_oversized_frames_are_infra_failures(plan_for, run):
    missing = run(plan_for(sh("touch done.txt"), contract=V1))
    assert missing.classification.status is S.INFRA_FAILED
    assert missing.frame.state is FrameState.ABSENT
    assert "frame is missing" in missing.classification.reason

    garbage = run(plan_for(frame_script("{not json"), contract=V1))
    assert garbage.classification.status is S.INFRA_FAILED
    assert "malformed" in garbage.classification.reason

    big = run(
        plan_for(
            sh("head -c 70000 /dev/zero | tr '\\0' ' ' > \"$MAKA_EVAL_RESULT_FILE\""), contract=V1
        )
    )
    assert big.frame.state is FrameState.OVERSIZED
    assert big.classification.status is S.INFRA_FAILED
    assert all(a.name != "result-frame.json" for a in big.artifacts)

    link = run(plan_for(sh('ln -s /etc/hostname "$MAKA_EVAL_RESULT_FILE"'), contract=V1))
    assert link.frame.error == "the frame path is a symbolic link"

    fifo = run(plan_for(sh('mkfifo "$MAKA_EVAL_RESULT_FILE"'), contract=V1))
    assert fifo.frame.state is FrameState.MALFORMED


def test_timeout_is_subject_failed_with_the_reward_kept(plan_for, run):
    outcome = run(plan_for(sh("touch done.txt; sleep 60"), timeout=0.5))
    c = outcome.classification
    assert outcome.execution.end is ExecutionEnd.TIMED_OUT
    assert c.status is S.SUBJECT_FAILED and c.score == 1.0 and c.source is StatusSource.TIMEOUT
    assert outcome.timings["subjectSec"] < 5


def test_verifier_failures_are_infra(plan_for, run):
    no_reward = run(plan_for(sh("touch done.txt"), test_sh="#!/bin/sh\nexit 0\n"))
    assert no_reward.classification.status is S.INFRA_FAILED
    assert "neither reward.json nor reward.txt" in no_reward.classification.reason
    slow = run(plan_for(sh("true"), test_sh="#!/bin/sh\nsleep 60\n", verifier_timeout=0.5))
    assert slow.classification.status is S.INFRA_FAILED
    assert "timed out" in slow.classification.reason
    no_shebang = run(
        plan_for(
            sh("touch done.txt"), test_sh='echo 1 > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"\n'
        )
    )
    assert no_shebang.classification.score == 1.0


def test_a_subject_that_cannot_start_is_an_infra_failure(plan_for, run):
    outcome = run(plan_for(["/nonexistent/agent"]))
    assert outcome.execution.end is ExecutionEnd.THREW
    assert outcome.classification.status is S.INFRA_FAILED
    assert "cannot start '/nonexistent/agent'" in outcome.classification.reason


def test_environment_is_built_from_nothing(plan_for, run):
    host = {
        "PATH": "/usr/bin:/bin",
        "OPENAI_API_KEY": "sk-declared",
        "AWS_SECRET": "hunter2",
        "HOME": "/root",
    }
    plan = plan_for(
        sh("env > env.txt; touch done.txt"),
        env={"MODE": "bench"},
        credentials={"API_KEY": "OPENAI_API_KEY"},
    )
    outcome = run(plan, host_env=host)
    assert outcome.classification.status is S.COMPLETED
    env = dict(
        line.split("=", 1)
        for line in (Path(plan.root) / "workspace" / "env.txt").read_text().splitlines()
        if "=" in line
    )
    assert env["API_KEY"] == "sk-declared"
    assert "OPENAI_API_KEY" not in env and "AWS_SECRET" not in env
    assert "hunter2" not in json.dumps(env)
    assert env["DEBIAN_FRONTEND"] == "noninteractive" and env["TZ"] == "Etc/UTC"
    assert env["MODE"] == "bench"
    assert env["HOME"] == str(Path(plan.root) / "home") and env["HOME"] != "/root"
    assert env["MAKA_EVAL_CELL_ID"] == plan.cell_id
    assert Path(env["MAKA_EVAL_INSTRUCTION_FILE"]).read_text() == "Create done.txt.\n"


def test_a_missing_credential_is_an_infra_failure_not_a_start(plan_for, run, tmp_path):
    plan = plan_for(sh("touch started"), credentials={"KEY": "NOT_SET"})
    outcome = run(plan, host_env={"PATH": "/bin"})
    assert outcome.classification.status is S.INFRA_FAILED
    assert "NOT_SET is not set" in outcome.classification.reason
    assert not (Path(plan.root) / "workspace" / "started").exists()


def test_tests_reach_the_attempt_only_after_the_subject_stopped(plan_for, run):
    plan = plan_for(
        sh('if ls "$MAKA_EVAL_WORKSPACE/../tests" 2>/dev/null; then exit 9; fi; touch done.txt')
    )
    outcome = run(plan)
    assert outcome.classification.status is S.COMPLETED
    assert (Path(plan.root) / "tests" / "test.sh").exists()


def test_environment_files_are_in_the_workspace(plan_for, run):
    plan = plan_for(
        sh('[ "$(cat data/input.txt)" = "42" ] && touch done.txt'), files={"data/input.txt": "42"}
    )
    assert run(plan).classification.score == 1.0


def test_start_gate_runs_after_preparation_and_before_the_subject(plan_for, run):
    plan = plan_for(sh("touch done.txt"))
    seen = {}

    def gate():
        workspace = Path(plan.root) / "workspace"
        seen["prepared"] = workspace.is_dir()
        seen["started"] = (workspace / "done.txt").exists()

    run(plan, start_gate=gate)
    assert seen == {"prepared": True, "started": False}


def test_timings_add_up(plan_for, run):
    plan = plan_for(sh("touch done.txt"))
    outcome = run(plan)
    t = outcome.timings
    parts = t["prepareSec"] + t["subjectSec"] + t["verifierSec"] + t["cleanupSec"]
    assert abs(parts - t["totalSec"]) < 0.01
    assert artifact_file(plan, outcome, "verifier/reward.txt").exists()
