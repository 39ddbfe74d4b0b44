"""`maka-eval plan`: the smallest detectable difference and the tasks x repetitions a
difference needs, from assumed figures or measured on a run; bad input named, never a
traceback."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from scipy import stats
from typer.testing import CliRunner

from maka_eval.cli import main as cli_main
from maka_eval.cli.main import app
from maka_eval.engine.status import AttemptStatus
from maka_eval.executors.load import experiment_from_data
from maka_eval.store.run_store import RunIdentity, RunWriter
from tests.analysis.records import attempt
from tests.helpers import spec, write_experiment

runner = CliRunner()
Z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)


def plan(*args: str):
    return runner.invoke(app, ["plan", *args], env={"COLUMNS": "200"}, color=False)


def document(tasks: int, repetitions: int, subjects: str = "pq") -> dict:
    return spec(
        tasks=[{"id": f"t{i}"} for i in range(tasks)],
        subjects=[{"id": s, "kind": "external", "config": {"command": "true"}} for s in subjects],
        repetitions=repetitions,
    )


@pytest.fixture
def experiment(tmp_path) -> Path:
    """100 tasks x 3 repetitions x 3 subjects."""
    return write_experiment(tmp_path / "exp", document(100, 3, "pqr"))


def test_assumed_figures_give_the_closed_form(experiment):
    result = plan(str(experiment))
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "100 tasks x 3 repetitions x 3 subjects (3 comparisons)" in text
    # Defaults: variance 0.25, half within, no correlation -> between 0.25, within 0.25.
    se = math.sqrt((0.25 + 0.25 / 3) / 100)
    assert f"{se:.4f}" in text and f"{Z * se:.4f}" in text
    # Three comparisons: Holm's strictest step tests at 0.05 / 3.
    z3 = stats.norm.ppf(1 - 0.05 / 6) + stats.norm.ppf(0.8)
    assert "alpha/3 = 0.0167" in text and f"{z3 * se:.4f}" in text
    assert "assumed: score variance 0.25, within-task share 0.5, correlation 0" in text


def test_a_target_difference_gives_tasks_per_repetition_count(experiment):
    result = plan(
        str(experiment), "--difference", "0.1", "--within-share", "0.8", "--correlation", "0.5"
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    # between 2 (1 - 0.5)(1 - 0.8) 0.25 = 0.05, within 2 x 0.8 x 0.25 = 0.4.
    for reps in (1, 2, 3, 5, 10, 20):
        tasks = math.ceil(Z**2 * (0.05 + 0.4 / reps) / 0.1**2)
        assert f" {tasks:,} " in text, (reps, tasks)
    # With the 100 tasks: V x 100 <= 0.01 x 100 / Z^2 = 0.1274, so 0.4 / K <= 0.0774.
    reps = math.ceil(0.4 / (0.01 * 100 / Z**2 - 0.05))
    assert f"with this experiment's 100 tasks, at alpha 0.05: {reps} repetitions" in text


def test_too_few_tasks_for_any_repetitions_says_how_many_tasks(tmp_path):
    path = write_experiment(tmp_path / "e", document(20, 2))
    result = plan(str(path), "--difference", "0.05", "--within-share", "0.2")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    floor = math.ceil(Z**2 * (2 * 0.8 * 0.25) / 0.05**2)  # between alone
    assert "no number of repetitions is enough" in text
    assert f"at least {floor:,} tasks" in text
    assert "alpha/" not in text  # one comparison: nothing to adjust


def make_run(run_dir: Path, tasks: int, repetitions: int, scores) -> Path:
    """A finished run of subjects p and q with the scores given by scores(t, r, s)."""
    experiment, _ = experiment_from_data(document(tasks, repetitions), "test")
    identity = RunIdentity(experiment.canonical(), {f"t{i}": "sha256:aa" for i in range(tasks)})
    writer = RunWriter.open(run_dir, identity, "0")
    try:
        for t in range(tasks):
            for r in range(1, repetitions + 1):
                for s in "pq":
                    slot = writer.reserve(f"t{t}", r, s)
                    record = attempt(
                        f"t{t}::{r}::{s}", slot.number, AttemptStatus.COMPLETED, scores(t, r, s)
                    )
                    writer.commit(slot, replace(record, run_id=writer.run_id))
    finally:
        writer.close()
    return run_dir


def test_figures_measured_on_a_run(tmp_path):
    # p passes tasks 0-5 always and task 6-7 on its first repetition only; q passes none.
    def scores(t, r, s):
        return float(s == "p" and (t < 6 or (t < 8 and r == 1)))

    run = make_run(tmp_path / "run", 12, 2, scores)
    path = write_experiment(tmp_path / "e", document(50, 4))
    result = plan(str(path), "--from", str(run), "--difference", "0.2")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert f"measured on {run} (12 tasks x 2 repetitions)" in text
    # Per-task mean differences: six 1.0, two 0.5, four 0.0. Within: tasks 6 and 7
    # vary by (0.5^2 x 2) each: 1.0 over 12 degrees of freedom. Between: their sample
    # variance less within / 2.
    means = [1.0] * 6 + [0.5] * 2 + [0.0] * 4
    within = 1.0 / 12
    between = stats.tvar(means) - within / 2
    assert f"p \u2212 q {between:.4f} {within:.4f}" in text
    se = math.sqrt((between + within / 4) / 50)
    assert f"{se:.4f} {Z * se:.4f}" in text
    assert f"{math.ceil(Z**2 * (between + within) / 0.04):,}" in text  # 1 repetition


def test_a_run_with_one_repetition_is_said_to_hide_the_within_part(tmp_path):
    run = make_run(tmp_path / "run", 10, 1, lambda t, r, s: float(s == "p" and t < 7))
    path = write_experiment(tmp_path / "e", document(30, 3))
    result = plan(str(path), "--from", str(run))
    assert result.exit_code == 0, result.output
    assert "cannot be told apart" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--within-share", "1.5"], "--within-share"),
        (["--correlation", "-3"], "--correlation"),
        (["--score-variance", "0"], "--score-variance"),
        (["--alpha", "0"], "--alpha"),
        (["--power", "1"], "--power"),
        (["--difference", "-0.1"], "--difference"),
        (["--difference", "nan"], "--difference"),
        (["--from", "somewhere", "--correlation", "0.3"], "--correlation"),
        (["--correlation", "1", "--within-share", "0"], "--correlation"),
    ],
)
def test_bad_options_are_named_without_a_traceback(experiment, args, named):
    result = plan(str(experiment), *args)
    assert result.exit_code == 2, result.output
    assert named in result.output and "Traceback" not in result.output


def test_one_subject_and_a_run_without_pairs_are_refused(tmp_path):
    one = write_experiment(tmp_path / "one", document(10, 2, "p"))
    result = plan(str(one))
    assert result.exit_code == 2 and "one subject" in result.output
    run = make_run(tmp_path / "run", 3, 1, lambda t, r, s: 1.0)
    path = write_experiment(tmp_path / "e", document(10, 2))
    result = plan(str(path), "--from", str(run))
    assert result.exit_code == 2 and "--from" in result.output


def test_a_bad_experiment_names_the_field(tmp_path, monkeypatch, capsys):
    doc = document(10, 2)
    doc["repetitions"] = 0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(sys, "argv", ["maka-eval", "plan", str(path)])
    with pytest.raises(SystemExit) as info:
        cli_main.main()
    err = capsys.readouterr().err
    assert info.value.code == 2 and "repetitions" in err and "Traceback" not in err
