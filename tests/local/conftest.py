"""Local runs of small experiments built in a temporary folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from maka_eval.executors.load import load_experiment_file
from maka_eval.local.events import Event
from maka_eval.local.executor import LocalRun, RunOptions, RunReport
from maka_eval.processes.supervisor import CancelToken
from maka_eval.spec.load import LoadedExperiment
from maka_eval.spec.task_directory import TaskDefinition, load_tasks
from tests.helpers import make_task, write_experiment


class Setup:
    def __init__(self, root: Path, doc: dict[str, Any]) -> None:
        self.root = root
        self.doc = doc
        self.path = write_experiment(root, doc)
        self.run_dir = root / "runs" / "001"
        self.events: list[Event] = []

    def load(self) -> tuple[LoadedExperiment, dict[str, TaskDefinition]]:
        loaded = load_experiment_file(self.path)
        return loaded, load_tasks(loaded.experiment, loaded.base_dir)

    def run(
        self,
        *,
        host_env: dict[str, str] | None = None,
        cancel: CancelToken | None = None,
        **options: Any,
    ) -> RunReport:
        loaded, tasks = self.load()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin"} if host_env is None else dict(host_env)
        env.setdefault("MAKA_EVAL_WORK_DIR", os.environ["MAKA_EVAL_WORK_DIR"])
        return LocalRun(
            loaded,
            tasks,
            self.run_dir,
            options=RunOptions(**options),
            events=self.events.append,
            cancel=cancel,
            host_env=env,
        ).run()

    def rewrite(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        write_experiment(self.root, doc)


@pytest.fixture
def setup(tmp_path) -> Callable[..., Setup]:
    def build(doc: dict[str, Any], tasks: dict[str, dict[str, Any]] | None = None) -> Setup:
        for task in doc["tasks"]:
            options = (tasks or {}).get(task["id"], {})
            make_task(tmp_path / "tasks", task.get("path", task["id"]), **options)
        return Setup(tmp_path, doc)

    return build
