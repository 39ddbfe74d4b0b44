"""Real Harbor 0.26 on real Podman for `executor.kind: harbor` (hack/harbor.sh, hack/podman.sh).

The session fixture `harbor_python` makes (or reuses) Harbor's own virtualenv with
hack/harbor.sh and yields its interpreter; `container_engine` (tests/sandbox) installs
Podman, builds the registry-free base images (`debian:bookworm-slim` among them) and
starts its API service for the local executor's container backend. As root on Linux a
failure fails the tests loudly; without root they are skipped (rootful Podman).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_eval.executors.load import load_experiment_file
from maka_eval.local.executor import LocalRun, RunOptions, RunReport
from maka_eval.spec.task_directory import load_tasks
from tests.helpers import write_experiment
from tests.sandbox.conftest import container_engine  # noqa: F401  (a session fixture)

REPO = Path(__file__).resolve().parents[2]
HARBOR_SH = REPO / "hack" / "harbor.sh"
TASKS = Path(__file__).resolve().parent / "tasks"


@pytest.fixture(scope="session")
def harbor_python(container_engine: str) -> Iterator[str]:  # noqa: F811
    """Harbor's interpreter (a Python 3.12 virtualenv with harbor==0.26.*)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("Harbor runs its tasks on rootful Podman here, which needs root on Linux")
    # No timeout: the first run on a fresh machine installs Harbor (a few minutes).
    proc = subprocess.run([str(HARBOR_SH)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"hack/harbor.sh failed:\n{proc.stderr[-3000:]}", pytrace=False)
    yield proc.stdout.strip().splitlines()[-1]


class HarborSetup:
    """An experiment over copies of tests/harbor/tasks, run in-process like `maka-eval run`."""

    def __init__(self, root: Path, doc: dict[str, Any], env: dict[str, str]) -> None:
        self.root = root
        self.doc = doc
        self.env = env
        self.path = write_experiment(root, doc)
        self.run_dir = root / "runs" / "001"

    def run(self, **options: Any) -> RunReport:
        loaded = load_experiment_file(self.path)
        tasks = load_tasks(loaded.experiment, loaded.base_dir)
        return LocalRun(
            loaded, tasks, self.run_dir, options=RunOptions(**options), host_env=self.env
        ).run()


def make_setup(
    root: Path,
    doc: dict[str, Any],
    harbor_python: str,
    docker_host: str,
    extra_env: dict[str, str] | None = None,
) -> HarborSetup:
    """Copies of the fixture tasks and the experiment under `root`, with the environment
    a user would have (Harbor's interpreter named by MAKA_EVAL_HARBOR_PYTHON)."""
    shutil.copytree(TASKS, root / "tasks")
    (root / "work").mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "MAKA_EVAL_HARBOR_PYTHON": harbor_python,
        "DOCKER_HOST": docker_host,
        "MAKA_EVAL_WORK_DIR": str(root / "work"),
        **(extra_env or {}),
    }
    return HarborSetup(root, doc, env)


def experiment(
    tasks: list[str],
    subjects: list[dict[str, Any]],
    *,
    executor: dict[str, Any] | None = None,
    retries: int = 1,
    groups: int = 1,
) -> dict[str, Any]:
    """A bare-form experiment over the fixture tasks."""
    return {
        "schemaVersion": "maka.eval.v1",
        "id": "harbor-proof",
        "benchmark": {
            "id": "fixtures",
            "version": "1",
            "kind": "directory",
            "config": {"path": "tasks"},
        },
        "executor": executor
        or {"kind": "harbor", "config": {"environment": {"type": "podman", "delete": False}}},
        "execution": {"maxConcurrentTaskGroups": groups, "maxInfraRetries": retries},
        "subjects": subjects,
        "tasks": [{"id": t} for t in tasks],
        "repetitions": 1,
    }
