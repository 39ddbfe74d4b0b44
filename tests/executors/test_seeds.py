"""The seeds' own documents: the predecessor's example experiment validates unchanged,
its field names mean what they meant there, and what it lacks to run is one line each."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from maka_eval.errors import SpecError
from maka_eval.executors import registry
from maka_eval.executors.attempts import readiness_problems, task_inputs
from maka_eval.executors.load import experiment_from_data, load_experiment_file
from maka_eval.spec.experiment import PluginExecutor
from maka_eval.spec.subjects import MakaSubject
from maka_eval.spec.task_directory import load_tasks
from maka_eval.strict_json import loads

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "examples" / "seeds"
SEED = SEEDS / "demo-experiment.json"
SEED_TASKS = SEEDS / "demo-experiment.tasks.json"
MAKA_EVAL = Path(sys.executable).with_name("maka-eval")


def seed() -> dict[str, Any]:
    data = loads(SEED.read_text())
    assert isinstance(data, dict)
    return data


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        experiment_from_data(doc)
    return [str(p) for p in caught.value.problems]


def needs(kind: str) -> None:
    if kind not in registry.installed():
        pytest.skip(f"executor '{kind}' is not installed in this environment")


def test_the_saved_seed_is_the_seeds_example_verbatim():
    doc = seed()
    assert list(doc) == [
        "schemaVersion", "id", "benchmark", "executor", "execution", "subjects", "tasks",
        "repetitions", "budget", "verifier",
    ]  # fmt: skip
    assert doc["executor"] == {"kind": "harbor", "config": {}}
    assert doc["tasks"] == [{"id": "task-01", "input": "Explain recursion.", "config": {}}]
    assert doc["benchmark"] == {"id": "term-bench", "version": "2.0", "config": {}}
    assert doc["verifier"] == {} and doc["budget"] == {}


def test_the_seed_validates_unchanged():
    needs("harbor")
    loaded = load_experiment_file(SEED)
    spec = loaded.experiment.spec
    assert isinstance(spec.executor, PluginExecutor) and spec.executor.kind == "harbor"


def test_every_seed_field_maps_to_ours_with_its_documented_default(toy):
    # The same document with the toy executor, so that only the core's reading is tested.
    doc = seed()
    doc["executor"] = {"kind": "toy", "config": {}}
    experiment, form = experiment_from_data(doc)
    assert form == "bare" and experiment.id == "demo-experiment"
    spec = experiment.spec
    # benchmark without kind and without a folder: inline tasks.
    assert spec.benchmark.kind is None and spec.benchmark.source == "inline"
    assert (spec.benchmark.id, spec.benchmark.version) == ("term-bench", "2.0")
    assert spec.execution.max_concurrent_task_groups == 2
    assert spec.execution.max_infra_retries == 2
    assert spec.execution.default_timeouts.agent_sec == 900.0
    # subjects[].credentials: [] and a maka subject with config: {}.
    (subject,) = spec.subjects
    assert isinstance(subject, MakaSubject) and subject.id == "maka-subject"
    assert subject.credentials == () and subject.config.profile == "headless-coding-v1"
    # tasks[].input is the instruction, tasks[].config goes to the executor.
    (task,) = spec.tasks
    assert (task.id, task.input, task.config) == ("task-01", "Explain recursion.", {})
    inputs = task_inputs(experiment, {})
    assert inputs["task-01"].instruction == "Explain recursion."
    assert inputs["task-01"].directory is None and inputs["task-01"].config == {}
    assert spec.repetitions == 3
    # budget: {} is no limit; verifier: {} is Harbor's verifier scoring 'reward'.
    assert spec.budget.max_cost_usd is None and spec.budget.max_tokens is None
    assert spec.verifier.kind == "harbor" and spec.verifier.config.score_key == "reward"
    canonical = experiment.canonical()
    assert canonical["benchmark"]["kind"] is None
    assert canonical["verifier"] == {"kind": "harbor", "config": {"scoreKey": "reward"}}
    assert canonical["tasks"] == [
        {"id": "task-01", "path": None, "input": "Explain recursion.", "config": {}}
    ]


def test_what_the_seed_lacks_to_run_is_one_line_naming_the_field(toy):
    doc = seed()
    doc["executor"] = {"kind": "toy", "config": {}}
    experiment, _ = experiment_from_data(doc)
    (missing,) = readiness_problems(experiment, "")
    assert missing.where == "tasks[0].config"
    assert "inline task 'task-01' has no tests" in missing.message
    assert "cannot be scored" in missing.message
    # The built-in executors run task directories: an inline task is wrong for them (the
    # operator, which validates with the same loader, refuses it before anything starts).
    builtins = {
        "local": {"runtimeHost": {"command": "maka"}},
        "kubernetes": {
            "relayImage": "r",
            "egressImage": "e",
            "benchmarkImage": "b",
            "taskImage": "t",
            "runtimeHost": {"command": "maka"},
        },
    }
    for kind, config in builtins.items():
        doc["executor"] = {"kind": kind, "config": config}
        assert problems(doc) == [
            f"tasks[0]: inline task 'task-01' cannot run under executor.kind '{kind}', which "
            "runs Harbor-format task directories: put it in a folder (instruction.md, "
            "tests/test.sh) under benchmark.config.path, or use an executor that takes "
            "inline tasks (docs/executors.md)"
        ]


def test_maka_eval_validate_on_the_seed_says_what_is_missing(toy_path, tmp_path):
    doc = seed()
    doc["executor"] = {"kind": "toy", "config": {}}
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(toy_path)}
    done = subprocess.run(
        [str(MAKA_EVAL), "validate", str(path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "is a valid experiment" in done.stdout
    assert "(inline tasks)" in done.stdout
    problem_lines = [line for line in done.stderr.splitlines() if line.lstrip().startswith("- ")]
    # One line per missing thing, each naming its field: the core's (nothing can score
    # the inline task) and the executor's (the toy runs external subjects only).
    assert [line.split(":")[0].strip() for line in problem_lines] == [
        "- tasks[0].config",
        "- subjects[0].kind",
    ], done.stderr
    assert "inline task 'task-01' has no tests" in problem_lines[0]


def test_the_seed_with_a_real_task_set_validates():
    needs("harbor")
    loaded = load_experiment_file(SEED_TASKS)
    assert loaded.experiment.spec.benchmark.source == "directory"
    tasks = load_tasks(loaded.experiment, loaded.base_dir)
    assert sorted(tasks) == ["fix-greeting", "sum-numbers"]


def test_the_real_task_set_variation_reads_the_same_under_every_executor(toy):
    doc = loads(SEED_TASKS.read_text())
    assert isinstance(doc, dict)
    doc["executor"] = {"kind": "toy", "config": {}}
    experiment, _ = experiment_from_data(doc)
    tasks = load_tasks(experiment, SEEDS)
    inputs = task_inputs(experiment, tasks)
    assert inputs["sum-numbers"].directory == (REPO / "examples/hello/tasks/sum-numbers")
    assert inputs["sum-numbers"].instruction.strip()
    assert readiness_problems(experiment, "") == []
    # Under the local executor the only thing missing is the Runtime Host of the maka
    # subject: one line naming the field.
    doc["executor"] = {"kind": "local", "config": {}}
    assert problems(doc) == [
        "executor.config.runtimeHost: required because subjects[0] ('maka-subject') has kind "
        "'maka'; add runtimeHost: {command: <Runtime Host program>}"
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["tasks"][0].pop("input"),
            "tasks[0].input: required for inline tasks (the instruction)",
        ),
        (
            lambda d: d["benchmark"].update(kind="directory"),
            "benchmark.config.path: required when benchmark.kind is 'directory'; add it",
        ),
        (
            lambda d: d["benchmark"].update(kind="inline", config={"path": "tasks"}),
            "benchmark.config.path: inline tasks have no task folder: remove it, or set kind: "
            "directory",
        ),
        (
            lambda d: d["tasks"][0].update(path="x"),
            "tasks[0].path: inline tasks have no directory; remove it",
        ),
        (
            lambda d: d["benchmark"].update(kind="manifest"),
            "benchmark.kind: ",
        ),
        (
            lambda d: d["verifier"].update(kind="pytest"),
            "verifier.kind: 'pytest' is not allowed; use 'harbor'",
        ),
    ],
)
def test_each_inline_rule_names_its_field(toy, change, expected):
    doc = copy.deepcopy(seed())
    doc["executor"] = {"kind": "toy", "config": {}}
    change(doc)
    found = problems(doc)
    assert any(p.startswith(expected) for p in found), found


def test_a_task_directory_takes_its_instruction_from_instruction_md(toy):
    doc = loads(SEED_TASKS.read_text())
    assert isinstance(doc, dict)
    doc["executor"] = {"kind": "toy", "config": {}}
    doc["tasks"][0]["input"] = "Do something else."
    assert problems(doc) == [
        "tasks[0].input: a task directory's instruction is its instruction.md; remove input "
        "(or make the benchmark inline)"
    ]


def test_inline_tasks_naming_harbor_task_paths_validate_and_lack_nothing_of_ours():
    needs("harbor")
    loaded = load_experiment_file(SEEDS / "demo-experiment.inline.json")
    experiment = loaded.experiment
    assert experiment.spec.benchmark.source == "inline"
    assert [t.config for t in experiment.spec.tasks] == [
        {"path": "../hello/tasks/sum-numbers"},
        {"path": "../hello/tasks/fix-greeting"},
    ]
    # Each task names what scores it: nothing is missing on maka-eval's side.
    assert readiness_problems(experiment, "") == []
    inputs = task_inputs(experiment, {})
    assert inputs["sum-numbers"].config == {"path": "../hello/tasks/sum-numbers"}
    assert inputs["sum-numbers"].instruction.startswith("Write the sum")
