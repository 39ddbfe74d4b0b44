"""Harbor-format task directories."""

from __future__ import annotations

import pytest

from maka_eval.errors import TaskError
from maka_eval.spec.load import experiment_from_data
from maka_eval.spec.task_directory import directory_digest, load_task, load_tasks
from tests.helpers import make_task, spec


def test_a_task_directory_is_read(tmp_path):
    make_task(
        tmp_path,
        "t1",
        files={"a.txt": "x"},
        toml='[agent]\ntimeout_sec = 12.5\n[verifier]\ntimeout_sec = 3\nenv = {K = "v"}\n'
        '[solution]\nenv = {S = "1"}\n[metadata]\nanything = "ignored"\n',
    )
    task, problems = load_task("t1", tmp_path / "t1", "tasks[0]")
    assert not problems and task is not None
    assert task.agent_timeout_sec == 12.5 and task.verifier_timeout_sec == 3.0
    assert task.verifier_env == {"K": "v"} and task.solution_env == {"S": "1"}
    assert task.environment_dir == tmp_path / "t1" / "environment"
    assert task.solution_dir == tmp_path / "t1" / "solution"
    assert task.digest.startswith("sha256:")


def test_problems_are_named_with_the_task_and_file(tmp_path):
    (tmp_path / "empty").mkdir()
    _, problems = load_task("empty", tmp_path / "empty", "tasks[3]")
    text = "\n".join(map(str, problems))
    assert "tasks[3]: " in text and "instruction.md is missing" in text
    assert "tests/test.sh is missing" in text
    make_task(tmp_path, "badtoml", toml="[agent\n")
    _, problems = load_task("badtoml", tmp_path / "badtoml", "tasks[0]")
    assert "not valid TOML" in str(problems[0])
    make_task(tmp_path, "neg", toml="[agent]\ntimeout_sec = -1\n")
    _, problems = load_task("neg", tmp_path / "neg", "tasks[0]")
    assert "timeout_sec must be a positive number" in str(problems[0])


def test_load_tasks_reports_every_task(tmp_path):
    (tmp_path / "tasks").mkdir()
    make_task(tmp_path / "tasks", "ok")
    experiment, _ = experiment_from_data(
        spec(tasks=[{"id": "ok"}, {"id": "gone"}, {"id": "x", "path": "y"}])
    )
    with pytest.raises(TaskError) as info:
        load_tasks(experiment, tmp_path)
    text = info.value.render()
    assert "tasks[1]" in text and "tasks[2]" in text and "tasks[0]" not in text
    with pytest.raises(TaskError, match=r"benchmark\.config\.path"):
        load_tasks(experiment, tmp_path / "elsewhere")


def test_digest_follows_content_and_executable_bit(tmp_path):
    task = make_task(tmp_path, "t", files={"a.txt": "1"})
    before = directory_digest(task)
    assert directory_digest(task) == before
    (task / "environment" / "a.txt").write_text("2")
    changed = directory_digest(task)
    assert changed != before
    (task / "environment" / "a.txt").chmod(0o755)
    assert directory_digest(task) != changed
