"""One plan builder: the local executor's plan and the kubernetes executor's (rendered by
the operator, completed by the relay inside the Pod from the task it finds there) are
the same plan for the same cell, but for what is by nature each executor's own.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from maka_eval.engine.expand import Cell
from maka_eval.engine.modes import Isolation
from maka_eval.k8s.render import attempt_plan as pod_plan
from maka_eval.k8s.render import executor_config
from maka_eval.local.plans import attempt_plan as local_plan
from maka_eval.local.prerequisites import ResolvedCommands
from maka_eval.relay.plan import AttemptPlan, with_task_dir
from maka_eval.spec.load import experiment_from_data
from maka_eval.spec.task_directory import load_task

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"

BY_NATURE = {
    # Where the attempt's folders are: this machine's run folder, or the Pod's volumes.
    "attempt_id",  # the run's id locally, the Experiment's uid in a cluster
    "run_id",
    "root",
    "artifacts_dir",
    # How the subject is kept apart: resolved here; in a Pod the relay decides (auto).
    "isolation",
    # What the sandbox hides and shows: this machine's folders, or the Pod's.
    "hidden",
    "visible",
    "in_task_image",  # only a Pod runs the relay inside the task's own image
}


def _plans(task_id: str, subject_id: str, tmp_path: Path) -> tuple[AttemptPlan, AttemptPlan]:
    local_doc = yaml.safe_load((HELLO / "experiment.yaml").read_text())
    pod_doc = yaml.safe_load((HELLO / "experiment.k8s.yaml").read_text())
    local, _ = experiment_from_data(local_doc)
    cluster, _ = experiment_from_data(pod_doc)
    cell = Cell(f"{task_id}::1::{subject_id}", task_id, 1, subject_id)
    task, problems = load_task(task_id, HELLO / "tasks" / task_id, "tasks[0]", host_env={})
    assert task is not None, problems
    here = local_plan(
        experiment=local,
        cell=cell,
        task=task,
        commands=ResolvedCommands(subjects={}, runtime_host=None, isolation=Isolation.NONE),
        run_id="r",
        attempt_id="r/c/1",
        attempt_root=tmp_path / "attempt",
        artifacts_dir=tmp_path / "artifacts",
    )
    rendered = pod_plan(cluster, cell, "uid/c/1", executor_config(cluster))
    # The Pod's benchmark folder is this one (the benchmark image copies it there).
    assert rendered.task_dir is not None and rendered.task_dir.endswith(f"/tasks/{task_id}")
    in_pod = with_task_dir(replace(rendered, task_dir=str(task.root)))
    return here, in_pod


def _comparable(plan: AttemptPlan) -> dict[str, Any]:
    data = asdict(plan)
    for name in BY_NATURE:
        del data[name]
    # The oracle's solve.sh is run from the attempt's own folder (see "root").
    data["subject"]["argv"] = [a.replace(plan.root, "<root>") for a in plan.subject.argv]
    return data


@pytest.mark.parametrize(
    ("task_id", "subject_id"), [("sum-numbers", "oracle"), ("fix-greeting", "oracle")]
)
def test_the_local_and_the_pod_plan_of_a_cell_are_one_plan(
    task_id: str, subject_id: str, tmp_path: Path
) -> None:
    here, in_pod = _plans(task_id, subject_id, tmp_path)
    assert _comparable(here) == _comparable(in_pod)
    # task.toml's own settings were applied on both sides (sum-numbers sets 30 s).
    if task_id == "sum-numbers":
        assert here.agent_timeout_sec == in_pod.agent_timeout_sec == 30.0
    assert in_pod.task_dir is None and here.task_dir is None


def test_the_fields_left_out_are_the_ones_that_differ(tmp_path: Path) -> None:
    # Not a blanket exception: each field named by nature does differ here.
    here, in_pod = _plans("sum-numbers", "oracle", tmp_path)
    differing = {k for k, v in asdict(here).items() if asdict(in_pod)[k] != v}
    assert differing - {"subject"} <= BY_NATURE
    assert {"root", "artifacts_dir", "attempt_id", "isolation", "in_task_image"} <= differing
