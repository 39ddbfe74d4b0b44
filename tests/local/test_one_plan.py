"""One plan builder: the local executor's plan, the kubernetes executor's (rendered by
the operator, completed by the relay inside the Pod from the task it finds there) and
the Harbor executor's (read by the relay Agent in Harbor's interpreter) are the same plan
for the same cell, but for what is by nature each executor's own.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from maka_eval import layout
from maka_eval.engine.expand import Cell
from maka_eval.engine.modes import Isolation
from maka_eval.executors.attempts import launch_of, task_inputs
from maka_eval.executors.base import AttemptIdentity, AttemptRequest
from maka_eval.executors.load import experiment_from_data
from maka_eval.harbor.config import HarborExecutorConfig
from maka_eval.harbor.executor import HarborExecutor, harbor_plan
from maka_eval.k8s.render import attempt_plan as pod_plan
from maka_eval.k8s.render import executor_config
from maka_eval.local.plans import attempt_plan as local_plan
from maka_eval.local.prerequisites import ResolvedCommands
from maka_eval.relay.plan import AttemptPlan, with_task_dir
from maka_eval.spec.task_directory import load_task

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
HARBOR = {"kind": "harbor", "config": {"environment": {"type": "podman"}}}

BY_NATURE = {
    # Where the attempt's folders are: this machine's run folder, the Pod's volumes, or
    # the attempt's private folder the relay Agent stages from.
    "attempt_id",  # the run's id locally and under Harbor, the Experiment's uid in a cluster
    "run_id",
    "root",
    "artifacts_dir",
    # How the subject is kept apart: resolved here; in a Pod the relay decides (auto);
    # under Harbor, Harbor's environment is the sandbox (auto: not maka-eval's).
    "isolation",
    # What the sandbox hides and shows: this machine's folders, or the Pod's; nothing
    # under Harbor, whose environment holds only what the relay Agent uploads.
    "hidden",
    "visible",
    "in_task_image",  # only a Pod runs the relay inside the task's own image
}


class _NoCancel:
    def is_set(self) -> bool:
        return False

    def on_cancel(self, listener: Any) -> None:
        del listener


def _harbor_plan(cell: Cell, tmp_path: Path) -> AttemptPlan:
    """The plan the Harbor executor writes for the relay Agent (run_attempt's own)."""
    doc = yaml.safe_load((HELLO / "experiment.yaml").read_text())
    experiment, _ = experiment_from_data({**doc, "executor": HARBOR})
    task, problems = load_task(cell.task_id, HELLO / "tasks" / cell.task_id, "t", host_env={})
    assert task is not None, problems
    subject = experiment.subject(cell.subject_id)
    config = HarborExecutorConfig.model_validate(HARBOR["config"])
    request = AttemptRequest(
        cell=cell,
        task=task_inputs(experiment, {cell.task_id: task})[cell.task_id],
        subject=subject,
        launch=launch_of(subject, task),
        credentials={},
        attempt=AttemptIdentity("r", "r/c/1", 1),
        artifacts_dir=tmp_path / "harbor-artifacts",
        work_dir=tmp_path / "harbor",
        deadline=0.0,
        cancel=_NoCancel(),
        start_gate=lambda: None,
        config=config,
        host_env={},
    )
    launch = HarborExecutor._launch(subject, request.launch, config)
    plan, _ = harbor_plan(request, launch, experiment, HELLO, tmp_path / "harbor" / "relay")
    return plan


def _plans(task_id: str, subject_id: str, tmp_path: Path) -> dict[str, AttemptPlan]:
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
        # As the local executor resolves the command named by a path.
        commands=ResolvedCommands(
            subjects={"scripted": (HELLO / "agents" / "scripted_agent.py").resolve()},
            runtime_host=None,
            isolation=Isolation.NONE,
        ),
        run_id="r",
        attempt_id="r/c/1",
        attempt_root=tmp_path / "attempt",
        artifacts_dir=tmp_path / "artifacts",
    )
    rendered = pod_plan(cluster, cell, "uid/c/1", executor_config(cluster))
    # The Pod's benchmark folder is this one (the benchmark image copies it there).
    assert rendered.task_dir is not None and rendered.task_dir.endswith(f"/tasks/{task_id}")
    in_pod = with_task_dir(replace(rendered, task_dir=str(task.root)))
    return {"local": here, "pod": in_pod, "harbor": _harbor_plan(cell, tmp_path)}


def _comparable(plan: AttemptPlan) -> dict[str, Any]:
    data = asdict(plan)
    for name in BY_NATURE:
        del data[name]
    # The oracle's solve.sh is run from the attempt's own folder (see "root"); a program
    # named by a path is the benchmark image's copy of this folder's in a Pod.
    data["subject"]["argv"] = [
        a.replace(plan.root, "<root>").replace(layout.POD_BENCHMARK_DIR, str(HELLO.resolve()))
        for a in plan.subject.argv
    ]
    return data


@pytest.mark.parametrize(
    ("task_id", "subject_id"),
    [
        ("sum-numbers", "oracle"),
        ("fix-greeting", "oracle"),
        ("sum-numbers", "noop"),
        ("sort-names", "scripted"),
    ],
)
def test_the_local_pod_and_harbor_plans_of_a_cell_are_one_plan(
    task_id: str, subject_id: str, tmp_path: Path
) -> None:
    plans = _plans(task_id, subject_id, tmp_path)
    here = plans["local"]
    for executor in ("pod", "harbor"):
        assert _comparable(plans[executor]) == _comparable(here), executor
    # task.toml's own settings were applied on every side (each task sets 30 s).
    assert {p.agent_timeout_sec for p in plans.values()} == {30.0}
    assert {p.task_dir for p in plans.values()} == {None}


def test_the_fields_left_out_are_the_ones_that_differ(tmp_path: Path) -> None:
    # Not a blanket exception: each field named by nature does differ here.
    plans = _plans("sum-numbers", "oracle", tmp_path)
    here = asdict(plans["local"])
    differing = {
        executor: {k for k, v in here.items() if asdict(plan)[k] != v}
        for executor, plan in plans.items()
    }
    assert differing["pod"] - {"subject"} <= BY_NATURE
    assert {"root", "artifacts_dir", "attempt_id", "isolation", "in_task_image"} <= differing["pod"]
    assert differing["harbor"] - {"subject"} <= BY_NATURE
    assert {"root", "artifacts_dir", "isolation", "visible"} <= differing["harbor"]
