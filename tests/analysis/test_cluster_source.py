"""The cluster AttemptSource, against a fake CustomObjectsApi that returns plain dicts
(what the kubernetes client returns for custom objects): records are built with the
shared parsers, running attempts are not records, damaged ones are reported, and the
CLI turns every cluster mistake into one line naming the fix."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from maka_eval.analysis import cluster as cluster_module
from maka_eval.analysis.cluster import ClusterError, ClusterSource, parse_target
from maka_eval.analysis.summary import summarize_source
from maka_eval.cli import main as cli_main
from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.expand import cell_id, group_id
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage
from maka_eval.spec.experiment import API_GROUP, API_VERSION
from tests.analysis.records import TWO_SUBJECTS
from tests.helpers import spec

NS = "evals"
NAME = "exp"
UID = "0000-experiment-uid"
LABEL = f"{API_GROUP}/experiment"
T0 = "2025-01-01T10:00:00Z"
T1 = "2025-01-01T10:01:30Z"


def kernel(status: AttemptStatus, score: float | None, **extra: Any) -> dict[str, Any]:
    source = {
        AttemptStatus.COMPLETED: StatusSource.FRAME,
        AttemptStatus.SUBJECT_FAILED: StatusSource.FRAME,
        AttemptStatus.INFRA_FAILED: StatusSource.INFRASTRUCTURE,
        AttemptStatus.CANCELLED: StatusSource.CANCELLATION,
    }[status]
    values: dict[str, Any] = {
        "status": status,
        "score": score,
        "usage": None,
        "cost_usd": None,
        "duration_sec": 2.5,
        "artifacts": (),
        "status_source": source,
        **extra,
    }
    return ResultKernel(**values).to_dict()


def experiment_object() -> dict[str, Any]:
    body = spec(subjects=TWO_SUBJECTS, tasks=[{"id": "t1"}, {"id": "t2"}])
    del body["schemaVersion"], body["id"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Experiment",
        "metadata": {"name": NAME, "namespace": NS, "uid": UID},
        "spec": body,
        "status": {"phase": "Running"},
    }


def cell_name(task: str, subject: str) -> str:
    return f"{NAME}-{task}-1-{subject}"


def cell_object(task: str, subject: str, *, owner_uid: str = UID) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Cell",
        "metadata": {
            "name": cell_name(task, subject),
            "namespace": NS,
            "uid": f"uid-{cell_name(task, subject)}",
            "labels": {LABEL: NAME},
            "ownerReferences": [{"kind": "Experiment", "name": NAME, "uid": owner_uid}],
        },
        "spec": {
            "experimentRef": {"name": NAME},
            "taskId": task,
            "repetition": 1,
            "subjectId": subject,
            "groupId": group_id(task, 1),
            "cellId": cell_id(task, 1, subject),
        },
    }


def attempt_object(
    task: str,
    subject: str,
    number: int,
    result: dict[str, Any] | None,
    *,
    trigger: Trigger = Trigger.SCHEDULED,
) -> dict[str, Any]:
    cell = cell_name(task, subject)
    status: dict[str, Any] = {"phase": "Running", "podName": f"{cell}-{number}", "startedAt": T0}
    if result is not None:
        status.update(phase="Finished", finishedAt=T1, result=result)
    return {
        "apiVersion": API_VERSION,
        "kind": "Attempt",
        "metadata": {
            "name": f"{cell}-{number}",
            "namespace": NS,
            "uid": f"uid-{cell}-{number}",
            "creationTimestamp": f"2025-01-01T09:00:0{number}Z",
            "labels": {LABEL: NAME},
            "ownerReferences": [{"kind": "Cell", "name": cell, "uid": f"uid-{cell}"}],
        },
        "spec": {
            "cellName": cell,
            "cellId": cell_id(task, 1, subject),
            "number": number,
            "trigger": trigger.value,
            "attemptId": f"{UID}/{cell_id(task, 1, subject)}/{number}",
        },
        "status": status,
    }


class FakeApi:
    """A CustomObjectsApi that answers from dicts and records the calls it got."""

    def __init__(
        self,
        experiment: dict[str, Any] | None = None,
        cells: list[dict[str, Any]] | None = None,
        attempts: list[dict[str, Any]] | None = None,
        error: Exception | None = None,
    ) -> None:
        self.objects = {
            "experiments": [experiment] if experiment else [],
            "cells": cells or [],
            "attempts": attempts or [],
        }
        self.error = error
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.connected: list[Any] = []
        """The --kubeconfig of each `connect` that returned this API."""

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **kwargs: Any
    ) -> Any:
        assert (group, version) == (API_GROUP, "v1alpha1")
        self.calls.append(("get", plural, kwargs))
        if self.error is not None:
            raise self.error
        for obj in self.objects[plural]:
            if obj["metadata"]["name"] == name and obj["metadata"]["namespace"] == namespace:
                return copy.deepcopy(obj)
        raise api_exception(404, {"name": name, "group": API_GROUP, "kind": plural})

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, **kwargs: Any
    ) -> Any:
        assert (group, version) == (API_GROUP, "v1alpha1")
        self.calls.append(("list", plural, kwargs))
        key, _, value = kwargs["label_selector"].partition("=")
        items = [
            copy.deepcopy(obj)
            for obj in self.objects[plural]
            if obj["metadata"]["namespace"] == namespace
            and obj["metadata"].get("labels", {}).get(key) == value
        ]
        return {"apiVersion": API_VERSION, "kind": "List", "items": items}


def api_exception(status: int, details: dict[str, Any] | None = None, message: str = "") -> Any:
    reasons = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 500: "Internal"}
    exc = ApiException(status=status, reason=reasons.get(status, "Error"))
    exc.body = json.dumps(
        {"kind": "Status", "status": "Failure", "message": message, "code": status}
        | ({"details": details} if details else {})
    )
    return exc


def cluster(*attempts: dict[str, Any], cells: list[dict[str, Any]] | None = None) -> FakeApi:
    if cells is None:
        cells = [cell_object(t, s) for t in ("t1", "t2") for s in ("x", "y")]
    return FakeApi(experiment_object(), cells, list(attempts))


def completed(score: float) -> dict[str, Any]:
    return kernel(AttemptStatus.COMPLETED, score)


# -- the source --------------------------------------------------------------------------


def test_records_are_built_from_attempts_and_their_cells():
    usage = Usage(input_tokens=100, output_tokens=20).to_json()
    api = cluster(
        attempt_object("t1", "x", 2, completed(1.0), trigger=Trigger.RETRY),
        attempt_object("t1", "x", 1, kernel(AttemptStatus.INFRA_FAILED, None, reason="evicted")),
        attempt_object("t1", "y", 1, completed(0.5) | {"usage": usage, "costUsd": 0.01}),
        attempt_object("t2", "y", 1, kernel(AttemptStatus.SUBJECT_FAILED, 0.0)),
    )
    source = ClusterSource(api, NS, NAME)

    # One GET of the Experiment and one LIST each of Attempts and Cells, by label.
    assert [(verb, plural) for verb, plural, _ in api.calls] == [
        ("get", "experiments"),
        ("list", "attempts"),
        ("list", "cells"),
    ]
    assert all(kw["label_selector"] == f"{LABEL}={NAME}" for v, _, kw in api.calls if v == "list")
    assert source.location == f"{NS}/{NAME}"
    assert source.run_id == UID
    assert source.experiment_origin == f"Experiment {NS}/{NAME}"
    assert source.experiment_document()["metadata"]["name"] == NAME
    assert source.writer() is None and source.interrupted() == {} and source.damaged() == []

    records = source.records()
    assert sorted(records) == ["t1::1::x", "t1::1::y", "t2::1::y"]
    first, second = records["t1::1::x"]  # in attempt-number order
    assert (first.attempt, first.status) == (1, AttemptStatus.INFRA_FAILED)
    assert first.result.reason == "evicted"
    assert (second.attempt, second.trigger, second.result.score) == (2, Trigger.RETRY, 1.0)
    assert second.run_id == UID and second.experiment_id == NAME
    assert (second.task_id, second.repetition, second.subject_id) == ("t1", 1, "x")
    assert second.attempt_id == f"{UID}/t1::1::x/2"
    assert second.host == "exp-t1-1-x-2"
    assert second.started_at.isoformat() == "2025-01-01T10:00:00+00:00"
    assert second.finished_at.isoformat() == "2025-01-01T10:01:30+00:00"
    (y,) = records["t1::1::y"]
    assert y.result.usage is not None and y.result.usage.total_tokens == 120
    assert y.result.cost_usd == 0.01

    summary = summarize_source(source)
    assert not summary.has_writer_lock and summary.run_dir == f"{NS}/{NAME}"
    selected = {row.cell_id: row.selected for row in summary.cells}
    assert selected["t1::1::x"] is second
    assert selected["t2::1::x"] is None
    assert {s.subject_id: s.mean_score for s in summary.subjects} == {"x": 1.0, "y": 0.25}


def test_a_running_attempt_is_not_a_record():
    api = cluster(
        attempt_object("t1", "x", 1, completed(1.0)),
        attempt_object("t1", "y", 1, None),  # its Pod runs: no result yet
        attempt_object("t2", "x", 1, None) | {"status": None},  # not even a status
    )
    source = ClusterSource(api, NS, NAME)
    assert list(source.records()) == ["t1::1::x"]
    assert source.damaged() == [] and source.interrupted() == {}
    rows = {row.cell_id: row for row in summarize_source(source).cells}
    assert rows["t1::1::y"].attempts == 0 and rows["t1::1::y"].selected is None


def test_a_damaged_result_is_reported_and_left_out():
    bad = completed(0.5) | {"status": "winning"}
    api = cluster(attempt_object("t1", "x", 1, completed(1.0)), attempt_object("t1", "y", 1, bad))
    source = ClusterSource(api, NS, NAME)
    assert list(source.records()) == ["t1::1::x"]
    (problem,) = source.damaged()
    assert problem.where == f"attempt {NS}/exp-t1-1-y-1"
    assert "result.status" in problem.message and "must be one of" in problem.message
    summary = summarize_source(source)
    assert [p.where for p in summary.damaged] == [problem.where]
    assert {row.cell_id: row.selected for row in summary.cells}["t1::1::y"] is None


def _renamed_cell(obj: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["cellId"] = "t2::1::y"
    return obj


@pytest.mark.parametrize(
    ("attempt", "cells", "complaint"),
    [
        (  # a score on an infrastructure failure: the kernel's own rules refuse it
            attempt_object("t1", "x", 1, kernel(AttemptStatus.INFRA_FAILED, None) | {"score": 1}),
            None,
            "score: a infra_failed attempt has no score",
        ),
        (  # an unknown field in the kernel
            attempt_object("t1", "x", 1, completed(1.0) | {"bonus": 1}),
            None,
            "unknown field(s) bonus",
        ),
        (
            attempt_object("t1", "x", 1, completed(1.0)),
            [cell_object("t1", "y")],
            "its Cell exp-t1-1-x is missing",
        ),
        (
            _renamed_cell(attempt_object("t1", "x", 1, completed(1.0))),
            None,
            "claims cell t2::1::y but its Cell exp-t1-1-x is t1::1::x",
        ),
        (
            attempt_object("t1", "x", 1, completed(1.0)),
            [cell_object("t1", "x", owner_uid="an-earlier-experiment")],
            "belongs to an earlier Experiment of the same name",
        ),
        (
            attempt_object("t1", "x", 1, completed(1.0)) | {"spec": {"cellName": "exp-t1-1-x"}},
            None,
            "not a valid Attempt spec: spec.",
        ),
    ],
)
def test_untrustworthy_attempts_are_damaged(attempt, cells, complaint):
    api = cluster(attempt, attempt_object("t2", "y", 1, completed(0.0)), cells=cells)
    if cells is not None:
        api.objects["cells"].append(cell_object("t2", "y"))
    source = ClusterSource(api, NS, NAME)
    assert list(source.records()) == ["t2::1::y"]
    (problem,) = source.damaged()
    assert problem.where == f"attempt {NS}/exp-t1-1-x-1"
    assert complaint in problem.message, problem.message


def test_two_attempts_claiming_one_number_keep_the_first_created():
    first = attempt_object("t1", "x", 1, completed(1.0))
    copy_ = attempt_object("t1", "x", 1, completed(0.0))
    copy_["metadata"].update(name="exp-t1-1-x-1b", creationTimestamp="2025-01-01T09:30:00Z")
    source = ClusterSource(cluster(copy_, first), NS, NAME)
    (record,) = source.records()["t1::1::x"]
    assert record.result.score == 1.0
    (problem,) = source.damaged()
    assert problem.where == f"attempt {NS}/exp-t1-1-x-1b"
    assert "already is" in problem.message


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            api_exception(404, {"name": NAME, "group": API_GROUP, "kind": "experiments"}),
            f"experiment {NS}/{NAME} not found: check the namespace and name "
            f"(`kubectl get experiments -n {NS}` lists them)",
        ),
        (api_exception(404), "install the CRDs with `kubectl apply -f crds/`"),
        (
            api_exception(403, message='experiments.eval.maka.dev "exp" is forbidden: User "u"'),
            'forbidden: experiments.eval.maka.dev "exp" is forbidden: User "u"; grant get and '
            f"list on experiments, cells and attempts ({API_GROUP}) in namespace {NS}",
        ),
        (api_exception(401), "refused the kubeconfig's credentials (401 Unauthorized)"),
        (api_exception(500, message="etcd is down"), "answered 500 Internal for evals/exp"),
        (ConnectionRefusedError(111, "Connection refused"), "cannot reach the Kubernetes API"),
    ],
)
def test_api_errors_become_one_clear_error(error, expected):
    with pytest.raises(ClusterError) as info:
        ClusterSource(FakeApi(experiment_object(), error=error), NS, NAME)
    assert expected in info.value.summary
    assert "\n" not in info.value.render()


@pytest.mark.parametrize("value", ["foo", "/exp", "ns/", "a/b/c", ""])
def test_parse_target_wants_namespace_slash_name(value):
    with pytest.raises(ValueError, match="expected NAMESPACE/NAME"):
        parse_target(value)
    assert parse_target("evals/exp") == ("evals", "exp")


# -- the command line ---------------------------------------------------------------------

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(cli_main.app, list(args), env={"COLUMNS": "160"}, color=False)


@pytest.fixture
def fake_cluster(monkeypatch) -> FakeApi:
    api = cluster(
        attempt_object("t1", "x", 1, completed(0.75)),
        attempt_object("t1", "y", 1, completed(0.25)),
        attempt_object("t2", "x", 1, completed(1.0) | {"status": "winning"}),
        attempt_object("t2", "y", 1, None),
    )

    def connect(kubeconfig=None):
        api.connected.append(kubeconfig)
        return api

    monkeypatch.setattr(cluster_module, "connect", connect)
    return api


def test_results_and_status_read_the_cluster_with_the_same_tables(fake_cluster, tmp_path):
    result = invoke("results", "--cluster", f"{NS}/{NAME}")
    assert result.exit_code == 3, result.output  # printed, and one Attempt left out
    assert "Results (earliest valid attempt per cell)" in result.stdout
    assert "t1::1::x" in result.stdout and "0.750" in result.stdout
    assert "t1::1::y" in result.stdout and "0.250" in result.stdout
    assert "2 cell(s) without a result: t2::1::x, t2::1::y" in result.stdout
    assert "1 attempt record(s) in evals/exp FAILED VERIFICATION" in result.stderr
    assert f"attempt {NS}/exp-t2-1-x-1" in result.stderr

    as_json = invoke("results", "--cluster", f"{NS}/{NAME}", "--format", "json")
    data = json.loads(as_json.stdout)
    assert data["runId"] == UID
    assert {c["cell"]: c["score"] for c in data["cells"]} == {"t1::1::x": 0.75, "t1::1::y": 0.25}

    status = invoke("status", "--cluster", f"{NS}/{NAME}", "--kubeconfig", str(tmp_path / "kc"))
    assert status.exit_code == 3, status.output
    assert f"{NS}/{NAME}  ({UID})" in status.stdout
    assert "writer" not in status.stdout  # the operator writes; there is no lock
    assert "maka-eval run" not in status.stdout  # no local hints for a cluster
    assert "1 FAILED VERIFICATION, left out" in status.stdout
    assert "not sealed: written by the operator alone" in status.stdout
    assert fake_cluster.connected == [None, None, tmp_path / "kc"]


@pytest.mark.parametrize("command", ["status", "results"])
@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--cluster", "foo"], "expected NAMESPACE/NAME"),
        (["--cluster", "evals/exp/x"], "expected NAMESPACE/NAME"),
        (["runs/x", "--cluster", "evals/exp"], "not both"),
        ([], "name a run directory, or an experiment on a cluster with --cluster"),
        (["runs/x", "--kubeconfig", "kc"], "only applies with --cluster"),
    ],
)
def test_cluster_argument_mistakes_are_usage_errors(fake_cluster, command, args, complaint):
    result = invoke(command, *args)
    assert result.exit_code == 2, result.output
    assert complaint in " ".join(result.stderr.split())
    assert fake_cluster.connected == []


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["maka-eval", *args])
    with pytest.raises(SystemExit) as info:
        cli_main.main()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return int(info.value.code or 0), " ".join(err.split())


def test_a_missing_experiment_is_one_line_naming_the_fix(monkeypatch, capsys):
    api = FakeApi(None)
    monkeypatch.setattr(cluster_module, "connect", lambda kubeconfig=None: api)
    code, err = run_main(monkeypatch, capsys, "results", "--cluster", f"{NS}/nope")
    assert code == 2
    assert err == (
        f"error: experiment {NS}/nope not found: check the namespace and name "
        f"(`kubectl get experiments -n {NS}` lists them)"
    )


def test_no_kubeconfig_is_one_line_naming_the_fix(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, err = run_main(monkeypatch, capsys, "status", "--cluster", f"{NS}/{NAME}")
    assert code == 2
    assert err.startswith("error: no Kubernetes configuration found: pass --kubeconfig PATH")


def test_a_broken_kubeconfig_is_one_line(monkeypatch, capsys, tmp_path):
    broken = tmp_path / "kubeconfig"
    broken.write_text("just a string\n")
    code, err = run_main(
        monkeypatch, capsys, "results", "--cluster", f"{NS}/{NAME}", "--kubeconfig", str(broken)
    )
    assert code == 2
    assert err.startswith(f"error: the kubeconfig {broken} cannot be used:")
    missing = tmp_path / "missing"
    code, err = run_main(
        monkeypatch, capsys, "results", "--cluster", f"{NS}/{NAME}", "--kubeconfig", str(missing)
    )
    assert code == 2
    assert err == f"error: --kubeconfig {missing}: no such file; name a kubeconfig file"


def test_forbidden_is_one_line(monkeypatch, capsys):
    api = FakeApi(experiment_object(), error=api_exception(403, message="no access"))
    monkeypatch.setattr(cluster_module, "connect", lambda kubeconfig=None: api)
    code, err = run_main(monkeypatch, capsys, "status", "--cluster", f"{NS}/{NAME}")
    assert code == 2
    assert err.startswith("error: forbidden: no access; grant get and list")


def test_the_run_command_does_not_load_kubernetes():
    code = (
        "import sys; import maka_eval.cli.main; "
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
