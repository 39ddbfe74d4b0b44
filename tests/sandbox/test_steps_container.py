"""Multi-step tasks (task.toml `[[steps]]`) end to end in the container sandbox (Podman).

The fixture tests/fixtures/steps/notes-image is the process sandbox's notes task with an
environment/Dockerfile FROM debian:bookworm-slim: the three steps run in one container.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maka_eval.sandbox.container.removal import leftover_containers
from maka_eval.sandbox.container.sandbox import ContainerSandbox
from maka_eval.store.run_store import read_run
from tests.local.test_steps import (
    SNOOP,
    StepsBench,
    check_a_step_cut_off_by_its_timeout,
    check_agent_logs,
    check_mean_and_final,
    check_min_reward_table_and_failed_setup,
    check_oracle_and_nop,
    external,
)

pytestmark = pytest.mark.slow


def container_bench(tmp_path: Path, engine: str) -> StepsBench:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"],
        "DOCKER_HOST": engine,
    }
    executor = {"kind": "local", "config": {"sandbox": "container"}}
    return StepsBench(tmp_path, "notes-image", executor, env)


def test_oracle_scores_1_and_nop_0_with_a_min_reward_abort(container_engine, tmp_path):
    bench = container_bench(tmp_path, container_engine)
    check_oracle_and_nop(bench, "container")
    # Of every run the check made (other test sessions may be running their own).
    run_ids = {
        record.run_id
        for run_dir in (tmp_path / "runs").iterdir()
        for attempts in read_run(run_dir).records.values()
        for record in attempts
    }
    assert run_ids
    for run_id in run_ids:
        assert leftover_containers(container_engine, run_id) == []


def test_mean_and_final_reward_strategies(container_engine, tmp_path):
    check_mean_and_final(container_bench(tmp_path, container_engine))


def test_a_min_reward_table_and_a_failing_setup_end_the_steps(container_engine, tmp_path):
    check_min_reward_table_and_failed_setup(container_bench(tmp_path, container_engine))


def test_no_step_sees_another_steps_tests_or_forges_a_reward(
    container_engine, tmp_path, monkeypatch
):
    fetched: list[str] = []
    get = ContainerSandbox._get

    def recording_get(self, path, limit):
        fetched.append(path)
        return get(self, path, limit)

    monkeypatch.setattr(ContainerSandbox, "_get", recording_get)
    bench = container_bench(tmp_path, container_engine)
    bench.task("notes")
    found = bench.run([external("snoop", SNOOP)])
    record = found["notes::1::snoop"]
    assert record.result.metrics["step.finish.reward"] == 0.0, record.result
    assert record.result.metrics["step.append.reward"] == 1.0
    out = "".join(
        bench.artifact(record, a.name)
        for a in record.result.artifacts
        if a.name.startswith("steps/") and a.name.endswith("subject.stdout")
    )
    assert "append-only.txt" not in out and "lib.sh" not in out
    check_agent_logs(bench, record)
    # A small /logs/agent came back with the verifier's reports: no extra trip to the engine.
    assert "/logs/agent" not in fetched
    # The loop left running wrote the shared /logs/verifier: discarded and noted.
    assert any("suspected tampering" in n for n in record.result.notes), record.result.notes


def test_a_step_cut_off_by_its_timeout_is_verified_and_the_next_steps_run(
    container_engine, tmp_path
):
    check_a_step_cut_off_by_its_timeout(container_bench(tmp_path, container_engine))
