"""Executors are plug-ins: found through entry points, configured by their own model,
run by maka-eval's own run loop (schedule, store, retries, results)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from maka_eval.artifacts import digest_file
from maka_eval.errors import SpecError
from maka_eval.executors import registry
from maka_eval.executors.base import ENTRY_POINT_GROUP, ExecutorPlugin
from maka_eval.executors.builtin import KubernetesBuiltin, LocalBuiltin
from maka_eval.executors.load import experiment_from_data
from maka_eval.spec.experiment import LocalExecutorConfig, PluginExecutor
from maka_eval.store.run_store import read_run
from tests.helpers import spec

MAKA_EVAL = Path(sys.executable).with_name("maka-eval")
SECRET = "toy-secret-value-8c1f"


def toy_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schemaVersion": "maka.eval.v1",
        "id": "toy-demo",
        "benchmark": {"id": "arith", "version": "1", "config": {}},
        "executor": {"kind": "toy", "config": {}},
        "execution": {"maxConcurrentTaskGroups": 2},
        "subjects": [
            {
                "id": "right",
                "kind": "external",
                "credentials": ["TOY_TOKEN"],
                "config": {"command": "sh", "args": ["-c", 'echo 4; echo "token=$TOY_TOKEN"']},
            },
            {
                "id": "wrong",
                "kind": "external",
                "config": {"command": "sh", "args": ["-c", 'cat; echo 5; echo "token=$TOY_TOKEN"']},
            },
        ],
        "tasks": [
            {"id": "two-plus-two", "input": "What is 2+2?", "config": {"expect": "4"}},
            {"id": "five", "input": "Say five.", "config": {"expect": "5"}},
        ],
        "repetitions": 2,
        "budget": {},
        "verifier": {},
    }
    doc.update(changes)
    return doc


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        experiment_from_data(doc)
    return [str(p) for p in caught.value.problems]


def kubernetes_form(doc: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in doc.items() if k not in ("schemaVersion", "id")}
    return {
        "apiVersion": "eval.maka.dev/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": doc["id"]},
        "spec": body,
    }


# -- discovery ------------------------------------------------------------------------------
def test_the_builtins_register_through_the_entry_point_group():
    points = registry.installed()
    assert points["local"].value == "maka_eval.executors.builtin:LOCAL"
    assert points["kubernetes"].value == "maka_eval.executors.builtin:KUBERNETES"
    assert points["local"].group == ENTRY_POINT_GROUP
    local = registry.load("local")
    assert isinstance(local, LocalBuiltin) and isinstance(local, ExecutorPlugin)
    assert local.config_model is LocalExecutorConfig
    assert isinstance(registry.load("kubernetes"), KubernetesBuiltin)
    assert registry.installed_kinds()[:2] == ("local", "kubernetes")


def test_a_third_party_executor_is_found_and_configured_by_its_own_model(toy):
    assert "toy" in registry.installed_kinds()
    assert registry.installed()["toy"].value == "maka_toy_executor:ToyExecutor"
    experiment, _ = experiment_from_data(toy_doc())
    executor = experiment.spec.executor
    assert isinstance(executor, PluginExecutor) and executor.kind == "toy"
    # The plug-in's defaults are filled in: they are part of the frozen experiment.
    assert experiment.canonical()["executor"] == {
        "kind": "toy",
        "config": {"match": "contains", "failAttempts": 0, "requiresEnv": [], "failPrepare": False},
    }
    plugin = registry.load("toy")
    assert isinstance(plugin, ExecutorPlugin) and plugin.kind == "toy"


def test_a_plug_in_config_is_checked_by_its_model_with_json_paths(toy):
    doc = toy_doc(executor={"kind": "toy", "config": {"mach": "exact", "failAttempts": -1}})
    found = problems(doc)
    assert any(p.startswith("executor.config.mach: unknown field 'mach'") for p in found), found
    assert any(p.startswith("executor.config.failAttempts: ") for p in found), found
    found = problems(kubernetes_form(doc))
    assert any(p.startswith("spec.executor.config.mach: unknown field") for p in found), found


def test_a_plug_in_s_own_rules_name_the_field(toy):
    doc = toy_doc(tasks=[{"id": "t", "input": "Say 4.", "config": {"expect": 4}}])
    assert problems(doc) == ["tasks[0].config.expect: must be a string (executor 'toy')"]
    assert problems(kubernetes_form(doc)) == [
        "spec.tasks[0].config.expect: must be a string (executor 'toy')"
    ]


def test_an_unknown_kind_is_one_line_naming_the_installed_kinds_and_the_fix(toy):
    found = problems(kubernetes_form(toy_doc(executor={"kind": "nosuch", "config": {}})))
    kinds = registry.installed_kinds()
    assert kinds[:2] == ("local", "kubernetes") and "toy" in kinds
    assert found == [
        "spec.executor.kind: no executor 'nosuch' is installed (installed: "
        + ", ".join(f"'{k}'" for k in kinds)
        + "); install a package that registers it in the 'maka_eval.executors' entry-point "
        "group (pip install <package> into the environment maka-eval runs from); see "
        "docs/executors.md"
    ]


def test_pier_is_refused_naming_the_plug_in_interface():
    (found,) = problems(spec(executor={"kind": "pier", "config": {}}))
    assert found.startswith("executor.kind: 'pier' has no public implementation")
    assert "ExecutorPlugin" in found and "run_attempt" in found
    assert "'maka_eval.executors' entry-point group" in found and "docs/executors.md" in found


def test_a_broken_plug_in_is_a_problem_not_a_traceback(monkeypatch):
    point = EntryPoint(name="broken", value="os.path:join", group=ENTRY_POINT_GROUP)
    real = dict(registry.installed())
    monkeypatch.setattr(registry, "installed", lambda: {**real, "broken": point})
    monkeypatch.setattr(registry, "_loaded", {})
    (found,) = problems(spec(executor={"kind": "broken", "config": {}}))
    assert found.startswith("executor.kind: executor 'broken' (os.path:join) does not implement")
    missing = EntryPoint(name="gone", value="no_such_module_here:X", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "installed", lambda: {"gone": missing})
    (found,) = problems(spec(executor={"kind": "gone", "config": {}}))
    assert "could not be loaded: ModuleNotFoundError" in found


def test_a_kind_two_packages_register_is_refused_naming_both(toy, monkeypatch):
    both = ("maka_toy_executor:ToyExecutor", "other_toy:Executor")
    monkeypatch.setattr(registry, "conflicts", lambda: {"toy": both})
    monkeypatch.setattr(registry, "_loaded", {})
    (found,) = problems(toy_doc())
    assert found == (
        "executor.kind: executor 'toy' is registered by several installed packages "
        "(maka_toy_executor:ToyExecutor, other_toy:Executor); uninstall all but one"
    )


# -- running through maka-eval's run loop -------------------------------------------------
def maka_eval(
    toy_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(toy_path), environment.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [str(MAKA_EVAL), *args], capture_output=True, text=True, env=environment, timeout=300
    )


def test_maka_eval_run_drives_a_third_party_executor_end_to_end(toy_path, tmp_path):
    doc = toy_doc(executor={"kind": "toy", "config": {"failAttempts": 1}})
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(doc))
    run_dir = tmp_path / "run"
    done = maka_eval(toy_path, "run", str(path), "--out", str(run_dir), env={"TOY_TOKEN": SECRET})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 cell(s) in 4 task group(s)" in done.stdout

    contents = read_run(run_dir)
    records = contents.records
    assert len(records) == 8
    scores = {}
    for cell_id, attempts in records.items():
        # The plug-in raised on every cell's first attempt: an infrastructure failure,
        # retried by appending a replacement attempt.
        assert [a.status.value for a in attempts] == ["infra_failed", "completed"], cell_id
        assert [a.trigger.value for a in attempts] == ["scheduled", "retry"]
        assert "toy failure of attempt 1" in (attempts[0].result.reason or "")
        final = attempts[1]
        scores[cell_id] = final.result.score
        (artifact,) = final.result.artifacts
        stored = run_dir / "cells" / final.task_id / str(final.repetition) / final.subject_id
        stored = stored / "attempts" / f"{final.attempt:04d}" / artifact.name
        digest = digest_file(stored)
        assert (digest.bytes, digest.sha256) == (artifact.bytes, artifact.sha256)
        out = stored.read_text()
        if final.subject_id == "wrong":
            # The instruction arrives on stdin; the credential of the other subject never.
            assert out.startswith(
                {"two-plus-two": "What is 2+2?", "five": "Say five."}[final.task_id]
            )
            assert "token=\n" in out
        else:
            assert "token=" + SECRET in out
    assert scores == {
        "two-plus-two::1::right": 1.0,
        "two-plus-two::2::right": 1.0,
        "two-plus-two::1::wrong": 0.0,
        "two-plus-two::2::wrong": 0.0,
        "five::1::right": 0.0,
        "five::2::right": 0.0,
        "five::1::wrong": 1.0,
        "five::2::wrong": 1.0,
    }
    # The arms of a task group start together (the plug-in calls the start gate).
    for task in ("two-plus-two", "five"):
        for rep in (1, 2):
            starts = [
                records[f"{task}::{rep}::{s}"][1].subject_started_at for s in ("right", "wrong")
            ]
            assert None not in starts
    # Records and results: the same commands as for any executor.
    results = maka_eval(toy_path, "results", str(run_dir), "--format", "json")
    assert results.returncode == 0, results.stderr
    assert SECRET not in results.stdout
    frozen = json.loads((run_dir / "experiment.json").read_text())
    assert "toy" in json.dumps(frozen) and '"failAttempts": 1' in json.dumps(frozen)
    # The credential's value is nowhere in the run folder (only in the subject's output,
    # which the toy executor stores: the value is the subject's own to print).
    leaked = [
        p
        for p in run_dir.rglob("*")
        if p.is_file() and p.name != "subject.out" and SECRET.encode() in p.read_bytes()
    ]
    assert leaked == []

    # A run's records and results are readable where the plug-in is not installed.
    bare_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for command in ("status", "results"):
        done = subprocess.run(
            [str(MAKA_EVAL), command, str(run_dir)], capture_output=True, text=True, env=bare_env
        )
        assert done.returncode == 0, done.stderr
        assert "8 with a result" in done.stdout or "right" in done.stdout

    # Resuming runs nothing: every cell has its result.
    again = maka_eval(toy_path, "run", str(path), "--out", str(run_dir), env={"TOY_TOKEN": SECRET})
    assert again.returncode == 0, again.stdout + again.stderr
    assert sum(len(a) for a in read_run(run_dir).records.values()) == 16


def test_retries_stop_at_the_cap_and_the_cell_has_no_result(toy_path, tmp_path):
    doc = toy_doc(
        executor={"kind": "toy", "config": {"failAttempts": 9}},
        execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 1},
        tasks=[{"id": "two-plus-two", "input": "What is 2+2?", "config": {"expect": "4"}}],
        repetitions=1,
    )
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(doc))
    done = maka_eval(toy_path, "run", str(path), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_run(tmp_path / "run").records
    for attempts in records.values():
        assert [a.status.value for a in attempts] == ["infra_failed", "infra_failed"]
    assert "2 cell(s) have no result" in done.stdout


def test_missing_prerequisites_are_named_and_nothing_starts(toy_path, tmp_path):
    doc = toy_doc(executor={"kind": "toy", "config": {"requiresEnv": ["TOY_NEEDED_HOME"]}})
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if k != "TOY_NEEDED_HOME"}
    checked = maka_eval(toy_path, "validate", str(path), env=env)
    assert checked.returncode == 2
    assert "TOY_NEEDED_HOME: not set; export TOY_NEEDED_HOME=..." in checked.stderr
    ran = maka_eval(toy_path, "run", str(path), "--out", str(tmp_path / "run"), env=env)
    assert ran.returncode == 2 and "TOY_NEEDED_HOME" in ran.stderr
    assert not (tmp_path / "run").exists()
    present = maka_eval(toy_path, "validate", str(path), env={"TOY_NEEDED_HOME": "/opt/toy"})
    assert present.returncode == 0, present.stderr
    assert "TOY_NEEDED_HOME: /opt/toy" in present.stdout


def test_a_failing_prepare_stops_the_run_before_any_attempt(toy_path, tmp_path):
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(toy_doc(executor={"kind": "toy", "config": {"failPrepare": True}})))
    done = maka_eval(toy_path, "run", str(path), "--out", str(tmp_path / "run"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "executor 'toy' could not prepare the run; no attempt was started" in done.stderr
    assert "OSError: the toy pool could not start" in done.stderr
    assert "Traceback" not in done.stderr
    assert read_run(tmp_path / "run").records == {} or not any(
        read_run(tmp_path / "run").records.values()
    )


def test_an_inline_task_without_tests_cannot_be_scored(toy_path, tmp_path):
    doc = toy_doc(tasks=[{"id": "explain", "input": "Explain recursion.", "config": {}}])
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(doc))
    checked = maka_eval(toy_path, "validate", str(path))
    assert checked.returncode == 2
    assert "is a valid experiment" in checked.stdout
    lines = [line for line in checked.stderr.splitlines() if "tasks[0]" in line]
    assert len(lines) == 1 and "tasks[0].config: inline task 'explain' has no tests" in lines[0]
    assert "cannot be scored" in checked.stderr


def test_ctrl_c_cancels_a_plug_in_attempt(toy_path, tmp_path):
    marker = tmp_path / "started"
    # The subject would answer after an hour: a run that ends at all was not waiting for it.
    script = f"touch '{marker}'; sleep 3600; echo 4"
    doc = toy_doc(
        subjects=[
            {"id": "slow", "kind": "external", "config": {"command": "sh", "args": ["-c", script]}}
        ],
        tasks=[{"id": "two-plus-two", "input": "What is 2+2?", "config": {"expect": "4"}}],
        repetitions=1,
    )
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(doc))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(toy_path)}
    proc = subprocess.Popen(
        [str(MAKA_EVAL), "run", str(path), "--out", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the attempt never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)  # only ends a hang: the subject sleeps an hour
    assert proc.returncode == 130, out + err
    (attempts,) = read_run(run_dir).records.values()
    assert [a.status.value for a in attempts] == ["cancelled"]
    assert attempts[0].result.status_source.value == "cancellation"
