"""The rules between the steps of a multi-step task (relay.steps) and the plan's steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from maka_eval.engine.classify import Execution, ExecutionEnd, ResultContract, Verification
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.engine.task_settings import step_plans
from maka_eval.relay import steps
from maka_eval.relay.plan import AttemptPlan, PlanError
from maka_eval.relay.steps import StepOutcome
from maka_eval.spec.task_directory import load_task

EXITED = Execution(ExecutionEnd.EXITED, exit_code=0)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "steps" / "notes"


def step(name: str, verification: Verification | None, execution: Execution = EXITED):
    return StepOutcome(name, execution, verification)


def test_min_reward_gates_reward_or_each_key_and_a_missing_key_is_minus_infinity():
    assert steps.min_reward_failure({"reward": 1.0}, 1.0) is None
    assert steps.min_reward_failure({"reward": 0.5}, 0.6) == "reward=0.5 is below min_reward 0.6"
    assert steps.min_reward_failure({"a": 1.0, "b": 0.0}, {"a": 1.0}) is None
    assert steps.min_reward_failure({"a": 1.0}, {"a": 1.0, "b": 0.0}) == (
        "b=-inf is below min_reward 0"
    )
    assert steps.min_reward_failure(None, 0.0) == "reward=-inf is below min_reward 0"


def test_a_step_without_a_reward_or_that_could_not_run_ends_the_attempt():
    assert steps.stop_reason(step("a", Verification(1.0)), None) is None
    assert "produced no reward (x)" in (
        steps.stop_reason(step("a", Verification(None, "x")), None) or ""
    )
    threw = step("a", None, Execution(ExecutionEnd.THREW, error="setup failed"))
    assert steps.stop_reason(threw, None) == "setup failed"
    cancelled = step("a", None, Execution(ExecutionEnd.CANCELLED))
    assert steps.stop_reason(cancelled, None) == "the run was cancelled"
    # reward.json with several metrics and no `reward` key still is a verifier result.
    several = step("a", Verification(None, "no key", metrics={"x": 1.0, "y": 0.0}))
    assert several.rewards == {"x": 1.0, "y": 0.0} and steps.stop_reason(several, None) is None


def test_mean_is_per_key_over_verified_steps_with_missing_keys_zero_and_final_is_the_last():
    outcomes = [
        step("a", Verification(1.0, metrics={"reward": 1.0, "extra": 0.5})),
        step("b", Verification(0.0)),
        step("c", None, Execution(ExecutionEnd.THREW, error="x")),
    ]
    assert steps.aggregate_rewards(outcomes, "mean") == {"extra": 0.25, "reward": 0.5}
    assert steps.aggregate_rewards(outcomes, "final") is None
    assert steps.aggregate_rewards(outcomes[:2], "final") == {"reward": 0.0}
    mean = steps.aggregate_verification(outcomes, "mean", "reward")
    assert (mean.score, dict(mean.metrics)) == (0.5, {"extra": 0.25, "reward": 0.5})
    final = steps.aggregate_verification(outcomes, "final", "reward")
    assert final.score is None and final.error == "the last step (c) produced no reward"
    assert steps.aggregate_verification(
        [step("a", Verification(None, "boom"))], "mean", "reward"
    ).error == ("no step's verifier produced a reward (boom)")
    keyed = steps.aggregate_verification(outcomes, "mean", "extra")
    assert keyed.score == 0.25
    assert steps.step_metrics(outcomes) == {
        "step.a.reward": 1.0,
        "step.a.extra": 0.5,
        "step.b.reward": 0.0,
    }


def test_the_attempts_execution_over_its_steps():
    timed_out = Execution(ExecutionEnd.TIMED_OUT, timeout_sec=5.0)
    failed = Execution(ExecutionEnd.EXITED, exit_code=3)
    assert steps.aggregate_execution([step("a", None), step("b", None, failed)]) == failed
    assert (
        steps.aggregate_execution([step("a", None, failed), step("b", None, timed_out)])
        == timed_out
    )
    threw = steps.aggregate_execution(
        [step("a", None, timed_out), step("b", None, Execution(ExecutionEnd.THREW, error="no"))]
    )
    assert threw.end is ExecutionEnd.THREW and threw.error == "step 'b': no"
    assert steps.aggregate_execution([step("a", None)]) == EXITED


def test_a_plan_with_steps_survives_json_and_a_bad_strategy_is_refused(tmp_path):
    task, _ = load_task("notes", FIXTURE, "tasks[0]", host_env={})
    assert task is not None
    plan = AttemptPlan(
        attempt_id="r/a/1",
        run_id="r",
        cell_id="notes::1::nop",
        task_id="notes",
        repetition=1,
        subject_id="nop",
        root=str(tmp_path / "a"),
        artifacts_dir=str(tmp_path / "art"),
        instruction_file=str(task.instruction_file),
        tests_dir=str(task.tests_dir),
        environment_dir=None,
        subject=SubjectLaunch(argv=("true",), contract=ResultContract.EXIT_CODE),
        agent_timeout_sec=60.0,
        verifier_timeout_sec=30.0,
        steps=step_plans(task, 60.0, 30.0),
        step_reward_strategy="final",
    )
    again = AttemptPlan.from_json(plan.to_json())
    assert again == plan
    assert [s.agent_timeout_sec for s in again.steps] == [30.0, 60.0, 60.0]
    assert again.steps[2].min_reward == {"reward": 1.0}
    single = AttemptPlan.from_json(plan.to_json().replace('"final"', '"mean"'))
    assert single.step_reward_strategy == "mean"
    with pytest.raises(PlanError, match="step_reward_strategy must be 'mean' or 'final'"):
        AttemptPlan.from_json(plan.to_json().replace('"final"', '"best"'))


def test_step_files_never_follow_a_link_the_subject_left(tmp_path):
    from maka_eval.sandbox.files import copy_into, copy_out

    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "data").symlink_to(outside)
    (workspace / "seed.txt").symlink_to(outside / "seed.txt")
    source = tmp_path / "workdir"
    (source / "data").mkdir(parents=True)
    (source / "data" / "x").write_text("x")
    with pytest.raises(OSError, match="data is not a folder"):
        copy_into(source, str(workspace))
    assert list(outside.iterdir()) == []
    # A file link is replaced by the file, not written through.
    files = tmp_path / "files"
    files.mkdir()
    (files / "seed.txt").write_text("seed")
    copy_into(files, str(workspace))
    assert list(outside.iterdir()) == []
    seed = workspace / "seed.txt"
    assert seed.read_text() == "seed" and not seed.is_symlink()
    # Out: regular files only, within the budget.
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    (logs / "sub" / "a.txt").write_text("12345")
    (logs / "big.txt").write_text("x" * 100)
    (logs / "passwd").symlink_to("/etc/passwd")
    copied = copy_out(str(logs), tmp_path / "back", 50)
    assert copied == 5
    assert sorted(
        p.relative_to(tmp_path / "back").as_posix() for p in (tmp_path / "back").rglob("*")
    ) == [
        "sub",
        "sub/a.txt",
    ]
