"""Cell -> relay plan for tasks that run in their container image (no engine needed)."""

from __future__ import annotations

from pathlib import Path

from maka_eval.engine.expand import Cell
from maka_eval.executors.load import experiment_from_data
from maka_eval.local.plans import attempt_plan
from maka_eval.local.prerequisites import ResolvedCommands
from maka_eval.sandbox.container.engine import EngineInfo
from maka_eval.sandbox.container.images import build_tag
from maka_eval.spec.task_directory import load_task
from tests.helpers import spec, write_script

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"
ENGINE = EngineInfo("unix:///run/maka-eval/podman.sock", "Podman", "4.3.1", "1.41", gpus=False)


def plan_for(tmp_path: Path, task_name: str, subject: dict, program: Path | None = None):
    task, problems = load_task(task_name, FIXTURES / task_name, "tasks[0]", host_env={})
    assert task is not None, problems
    experiment, _ = experiment_from_data(spec(subjects=[subject], tasks=[{"id": task_name}]))
    commands = ResolvedCommands(
        subjects={subject["id"]: program} if program else {},
        runtime_host=None,
        containers=frozenset({task_name}),
        engine=ENGINE,
    )
    cell = Cell(f"{task_name}::1::{subject['id']}", task_name, 1, subject["id"])
    return task, attempt_plan(
        experiment=experiment,
        cell=cell,
        task=task,
        commands=commands,
        run_id="r",
        attempt_id="r/a/1",
        attempt_root=tmp_path / "attempt",
        artifacts_dir=tmp_path / "artifacts",
    )


def test_a_dockerfile_task_is_built_under_its_environment_digest(tmp_path):
    task, plan = plan_for(tmp_path, "fix-greeting", {"id": "oracle", "kind": "oracle"})
    assert plan.isolation == "container" and plan.container is not None
    assert plan.container.image == build_tag("fix-greeting", task.environment_digest or "")
    assert plan.container.image.startswith("maka-eval-task/fix-greeting:")
    assert plan.container.build_dir == str(FIXTURES / "fix-greeting" / "environment")
    assert plan.environment_dir is None  # the image holds the environment already
    assert (plan.container.cpus, plan.container.memory_mb) == (1.0, 512)
    assert plan.container.network == "public" and plan.container.engine == ENGINE.url
    assert plan.subject.argv == (str(tmp_path / "attempt" / "solution" / "solve.sh"),)


def test_a_prebuilt_image_task_uploads_its_environment_files(tmp_path):
    subject = {"id": "nop", "kind": "external", "config": {"command": "true"}}
    _, plan = plan_for(tmp_path, "sum-numbers", subject, program=Path("/usr/bin/true"))
    assert plan.container is not None
    assert plan.container.image == "localhost/maka-eval/debian-python:bookworm"
    assert plan.container.build_dir is None and plan.container.workdir == "/srv/task"
    assert plan.container.network == "no-network"
    assert plan.container.env == {"OUTPUT_NAME": "sum.txt", "SEPARATOR": ","}
    assert plan.environment_dir == str(FIXTURES / "sum-numbers" / "environment")
    # Named without a path: the image's own `true`, nothing uploaded.
    assert plan.subject.argv == ("true",) and plan.container.program is None


def test_a_subject_named_by_a_path_is_uploaded(tmp_path):
    agent = write_script(tmp_path / "agents" / "agent.sh", "#!/bin/sh\ntrue\n")
    subject = {"id": "a", "kind": "external", "config": {"command": str(agent)}}
    _, plan = plan_for(tmp_path, "users-and-rewards", subject, program=agent)
    assert plan.container is not None
    assert plan.container.program == str(agent) and plan.subject.argv == (str(agent),)
    assert (plan.container.agent_user, plan.container.verifier_user) == ("agent", "checker")
    assert plan.verifier_env == {"EXPECTED_OWNER": "agent"}
