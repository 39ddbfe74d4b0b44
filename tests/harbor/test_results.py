"""Harbor trial folders -> status, score and artifacts, by the engine's rules (no Harbor run).

The folders are what Harbor 0.26 writes (result.json's exception_info, verifier_result,
agent_execution) plus the relay Agent's record; the real ones are exercised in
test_harbor_executor.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from maka_eval.artifacts import Redactor, digest_file
from maka_eval.engine.classify import ResultContract
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.harbor.config import OFFLINE_PODMAN, HarborExecutorConfig, harbor_environment
from maka_eval.harbor.results import TRIAL_ARTIFACT, trial_kernel

TIMING = {"started_at": "2026-12-03T07:00:00Z", "finished_at": "2026-12-03T07:00:07.5Z"}


def trial(
    root: Path,
    *,
    rewards: dict[str, float] | None = None,
    exception: str | None = None,
    relay: dict[str, Any] | None = None,
) -> Path:
    folder = root / "task__1__s__1__run"
    (folder / "agent").mkdir(parents=True)
    result: dict[str, Any] = {
        "exception_info": (
            {"exception_type": exception, "exception_message": f"{exception} happened"}
            if exception
            else None
        ),
        "verifier_result": {"rewards": rewards} if rewards is not None else None,
        "agent_execution": TIMING,
    }
    (folder / "result.json").write_text(json.dumps(result))
    if relay is not None:
        (folder / "agent" / "maka-relay.json").write_text(json.dumps(relay))
    return folder


def kernel(folder: Path | None, tmp_path: Path, contract=ResultContract.EXIT_CODE, **kw: Any):
    return trial_kernel(
        folder,
        contract=contract,
        score_key="reward",
        agent_timeout_sec=8.0,
        artifacts_dir=tmp_path / "artifacts",
        redactor=Redactor.of({}),
        **kw,
    )


EXITED = {"end": "exited", "exitCode": 0}


def test_a_scored_trial_is_completed_with_harbors_reward_and_the_trial_as_an_artifact(tmp_path):
    k = kernel(trial(tmp_path, rewards={"reward": 1.0, "style": 0.5}, relay=EXITED), tmp_path)
    assert (k.status, k.score, k.status_source) == (
        AttemptStatus.COMPLETED,
        1.0,
        StatusSource.EXIT_CODE,
    )
    assert dict(k.metrics) == {"reward": 1.0, "style": 0.5}
    assert k.duration_sec == 7.5
    (artifact,) = k.artifacts
    digest = digest_file(tmp_path / "artifacts" / TRIAL_ARTIFACT)
    assert (artifact.name, artifact.bytes, artifact.sha256) == (
        TRIAL_ARTIFACT,
        digest.bytes,
        digest.sha256,
    )


def test_a_nonzero_exit_is_subject_failed_with_the_reward(tmp_path):
    k = kernel(
        trial(tmp_path, rewards={"reward": 0.0}, relay={"end": "exited", "exitCode": 3}), tmp_path
    )
    assert (k.status, k.score, k.exit_code) == (AttemptStatus.SUBJECT_FAILED, 0.0, 3)


def test_harbors_agent_timeout_is_subject_failed_with_the_reward_kept(tmp_path):
    folder = trial(tmp_path, rewards={"reward": 0.5}, exception="AgentTimeoutError")
    k = kernel(folder, tmp_path)
    assert (k.status, k.score, k.status_source) == (
        AttemptStatus.SUBJECT_FAILED,
        0.5,
        StatusSource.TIMEOUT,
    )
    assert "8s" in (k.reason or "")


@pytest.mark.parametrize(
    "exception", ["RewardFileNotFoundError", "RewardFileEmptyError", "VerifierTimeoutError"]
)
def test_no_reward_is_an_infrastructure_failure(tmp_path, exception):
    k = kernel(trial(tmp_path, exception=exception, relay=EXITED), tmp_path)
    assert (k.status, k.score, k.status_source) == (
        AttemptStatus.INFRA_FAILED,
        None,
        StatusSource.VERIFIER,
    )
    assert exception in (k.reason or "")


def test_a_reward_without_the_score_key_is_an_infrastructure_failure(tmp_path):
    k = kernel(trial(tmp_path, rewards={"accuracy": 1.0}, relay=EXITED), tmp_path)
    assert k.status is AttemptStatus.INFRA_FAILED and "scoreKey" in (k.reason or "")


@pytest.mark.parametrize(
    "exception", ["EnvironmentStartTimeoutError", "RuntimeError", "AgentSetupTimeoutError"]
)
def test_environment_and_setup_failures_are_infrastructure(tmp_path, exception):
    k = kernel(trial(tmp_path, exception=exception), tmp_path)
    assert (k.status, k.status_source) == (AttemptStatus.INFRA_FAILED, StatusSource.INFRASTRUCTURE)
    assert exception in (k.reason or "")


def test_a_trial_without_the_relay_record_is_an_infrastructure_failure(tmp_path):
    k = kernel(trial(tmp_path, rewards={"reward": 1.0}), tmp_path)
    assert k.status is AttemptStatus.INFRA_FAILED and "relay Agent left no record" in (
        k.reason or ""
    )


def test_a_trial_harbor_never_wrote_is_an_infrastructure_failure_and_cancel_is_cancelled(tmp_path):
    k = kernel(None, tmp_path, error="ValueError: no such task")
    assert k.status is AttemptStatus.INFRA_FAILED and "no such task" in (k.reason or "")
    assert kernel(None, tmp_path, cancelled=True).status is AttemptStatus.CANCELLED
    folder = trial(tmp_path, exception="CancelledError")
    assert kernel(folder, tmp_path).status is AttemptStatus.CANCELLED


def test_a_protocol_v1_frame_travels_through_the_relay_record(tmp_path):
    frame = {
        "protocol": "maka.eval.result.v1",
        "status": "subject_failed",
        "usage": {
            "inputTokens": 10,
            "cachedInputTokens": 0,
            "cacheWriteTokens": 0,
            "outputTokens": 5,
        },
        "costUsd": 0.25,
    }
    relay = {
        **EXITED,
        "frame": {
            "state": "present",
            "data": base64.b64encode(json.dumps(frame).encode()).decode(),
        },
    }
    k = kernel(
        trial(tmp_path, rewards={"reward": 1.0}, relay=relay), tmp_path, ResultContract.PROTOCOL_V1
    )
    assert (k.status, k.status_source, k.cost_usd) == (
        AttemptStatus.SUBJECT_FAILED,
        StatusSource.FRAME,
        0.25,
    )
    absent = {**EXITED, "frame": {"state": "absent"}}
    (tmp_path / "b").mkdir()
    k = kernel(
        trial(tmp_path / "b", rewards={"reward": 1.0}, relay=absent),
        tmp_path / "b",
        ResultContract.PROTOCOL_V1,
    )
    assert k.status is AttemptStatus.INFRA_FAILED and "frame is missing" in (k.reason or "")


def test_the_environment_config_passes_harbors_fields_and_options_through():
    config = HarborExecutorConfig.model_validate(
        {"environment": {"type": "podman", "delete": False, "keep_containers": True}}
    )
    assert harbor_environment(config) == {
        "import_path": OFFLINE_PODMAN,
        "delete": False,
        "kwargs": {"keep_containers": True},
    }
    daytona = HarborExecutorConfig.model_validate(
        {"environment": {"type": "daytona", "kwargs": {"a": 1}}}
    )
    assert harbor_environment(daytona) == {"type": "daytona", "kwargs": {"a": 1}}
    assert HarborExecutorConfig.model_validate({}).environment == {"type": "docker"}
    assert HarborExecutorConfig.model_validate({}).harbor_version == "0.26"
    with pytest.raises(ValueError, match="give `type`"):
        HarborExecutorConfig.model_validate({"environment": {"delete": False}})
    with pytest.raises(ValueError):
        HarborExecutorConfig.model_validate({"harborVersion": "0.25"})
