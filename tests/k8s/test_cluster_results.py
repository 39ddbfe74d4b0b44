"""`maka-eval results --cluster NS/NAME` against the real API server: an Experiment,
its Cells and Attempts created through the CustomObjectsApi, results written through
the status subresource, and the same tables as for a run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from typer.testing import CliRunner

from maka_eval.cli import main as cli_main
from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.expand import cell_id, group_id
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.spec.experiment import API_GROUP, API_VERSION
from tests.k8s.conftest import REPO

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "hello" / "experiment.k8s.yaml"
VERSION = API_VERSION.split("/", 1)[1]
LABEL = f"{API_GROUP}/experiment"


def kernel(status: AttemptStatus, score: float | None, source: StatusSource) -> dict[str, Any]:
    return ResultKernel(
        status=status,
        score=score,
        usage=None,
        cost_usd=0.002,
        duration_sec=12.5,
        artifacts=(),
        status_source=source,
    ).to_dict()


def owner(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": API_VERSION, "kind": kind, "name": meta["name"], "uid": meta["uid"]}


def test_results_from_the_cluster(control_plane: Path, crds: list[str], namespace: str) -> None:
    api = client.CustomObjectsApi(config.new_client_from_config(str(control_plane)))

    def create(plural: str, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = api.create_namespaced_custom_object(
            API_GROUP, VERSION, namespace, plural, body
        )
        return created

    # The example's document, whatever its executor says today: the CRD and the CLI both
    # take the spec models of spec/experiment.py.
    document = yaml.safe_load(EXAMPLE.read_text())
    experiment = create("experiments", document)
    name = experiment["metadata"]["name"]

    def cell(task: str, subject: str) -> dict[str, Any]:
        return create(
            "cells",
            {
                "apiVersion": API_VERSION,
                "kind": "Cell",
                "metadata": {
                    "name": f"{name}-{task}-1-{subject}",
                    "labels": {LABEL: name},
                    "ownerReferences": [owner("Experiment", experiment)],
                },
                "spec": {
                    "experimentRef": {"name": name},
                    "taskId": task,
                    "repetition": 1,
                    "subjectId": subject,
                    "groupId": group_id(task, 1),
                    "cellId": cell_id(task, 1, subject),
                },
            },
        )

    def attempt(
        cell_obj: dict[str, Any], number: int, result: dict[str, Any] | None
    ) -> dict[str, Any]:
        spec = cell_obj["spec"]
        attempt_name = f"{cell_obj['metadata']['name']}-{number}"
        created = create(
            "attempts",
            {
                "apiVersion": API_VERSION,
                "kind": "Attempt",
                "metadata": {
                    "name": attempt_name,
                    "labels": {LABEL: name},
                    "ownerReferences": [owner("Cell", cell_obj)],
                },
                "spec": {
                    "cellName": cell_obj["metadata"]["name"],
                    "cellId": spec["cellId"],
                    "number": number,
                    "trigger": "scheduled" if number == 1 else "retry",
                    "attemptId": f"{experiment['metadata']['uid']}/{spec['cellId']}/{number}",
                },
            },
        )
        status: dict[str, Any] = {
            "phase": "Running",
            "podName": attempt_name,
            "startedAt": "2025-01-01T10:00:00Z",
        }
        if result is not None:
            status.update(phase="Finished", finishedAt="2025-01-01T10:00:12Z", result=result)
        patched: dict[str, Any] = api.patch_namespaced_custom_object_status(
            API_GROUP, VERSION, namespace, "attempts", attempt_name, {"status": status}
        )
        # Stored as the kernel's wire form (a merge patch drops the null fields).
        stored = {k: v for k, v in (result or {}).items() if v is not None} or None
        assert patched["status"].get("result") == stored
        return created

    oracle = cell("fix-greeting", "oracle")
    noop = cell("fix-greeting", "noop")
    scripted = cell("sum-numbers", "scripted")
    attempt(oracle, 1, kernel(AttemptStatus.INFRA_FAILED, None, StatusSource.INFRASTRUCTURE))
    attempt(oracle, 2, kernel(AttemptStatus.COMPLETED, 1.0, StatusSource.FRAME))
    attempt(noop, 1, kernel(AttemptStatus.SUBJECT_FAILED, 0.25, StatusSource.FRAME))
    attempt(scripted, 1, None)  # still running

    runner = CliRunner()
    result = runner.invoke(
        cli_main.app,
        ["results", "--cluster", f"{namespace}/{name}", "--kubeconfig", str(control_plane)],
        env={"COLUMNS": "160"},
        color=False,
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if "::" in line}
    assert rows["fix-greeting::1::oracle"][1:3] == ["completed", "1.000"]
    assert rows["fix-greeting::1::oracle"][-1] == "2/2"
    assert rows["fix-greeting::1::noop"][1:3] == ["subject_failed", "0.250"]
    assert "sum-numbers::1::scripted" not in rows  # running: no result yet
    assert "22 cell(s) without a result" in result.stdout
    assert result.stderr == ""  # nothing damaged

    target = ["--cluster", f"{namespace}/{name}", "--kubeconfig", str(control_plane)]
    as_json = runner.invoke(cli_main.app, ["results", *target, "--format", "json"])
    data = json.loads(as_json.stdout)
    assert data["runId"] == experiment["metadata"]["uid"]
    assert {c["cell"]: c["score"] for c in data["cells"]} == {
        "fix-greeting::1::oracle": 1.0,
        "fix-greeting::1::noop": 0.25,
    }

    missing = runner.invoke(
        cli_main.app,
        ["status", "--cluster", f"{namespace}/absent", "--kubeconfig", str(control_plane)],
    )
    assert missing.exit_code != 0
    assert f"experiment {namespace}/absent not found" in str(missing.exception)
