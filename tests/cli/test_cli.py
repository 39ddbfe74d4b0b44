"""The maka-eval command: output, exit codes, and never a traceback for a user mistake."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import BAD_CREDENTIAL_SUBJECTS, spec, write_experiment

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello"


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "maka_eval.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def hello(tmp_path_factory) -> Path:
    """The hello example, copied and run once for the whole module."""
    root = tmp_path_factory.mktemp("hello")
    shutil.copytree(EXAMPLE, root / "hello")
    result = cli("run", str(root / "hello" / "experiment.yaml"), "--out", str(root / "run"))
    assert result.returncode == 0, result.stderr + result.stdout
    return root


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_validate_prints_the_expansion():
    result = cli("validate", str(EXAMPLE / "experiment.yaml"), "--cells")
    assert result.returncode == 0
    assert "24 (8 groups x 3 subjects)" in result.stdout
    assert "8 (4 tasks x 2 repetitions), at most 4 at once" in result.stdout
    assert "serve-status::2::scripted" in result.stdout
    assert "prerequisites for the local executor are present" in result.stdout


def test_a_cluster_experiment_validates_here_and_is_not_run_here(tmp_path):
    result = cli("validate", str(EXAMPLE / "experiment.k8s.yaml"))
    assert result.returncode == 0, result.stderr
    assert "executor       kubernetes" in result.stdout
    assert "checked by the operator on the cluster" in result.stdout
    run = cli("run", str(EXAMPLE / "experiment.k8s.yaml"), "--out", str(tmp_path / "run"))
    assert run.returncode == 2
    assert "spec.executor.kind: is 'kubernetes': apply it to a cluster" in run.stderr
    assert not (tmp_path / "run").exists()


def test_validate_reports_every_problem_with_its_path(tmp_path):
    doc = spec(
        subjects=BAD_CREDENTIAL_SUBJECTS,
        repetitions=0,
    )
    path = write_experiment(tmp_path, doc)
    result = cli("validate", str(path))
    assert result.returncode == 2
    assert (
        "subjects[1].credentials[0]: 'my key' is not a valid environment variable name"
        in result.stderr
    )
    assert "repetitions: must be greater than or equal to 1" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("validate", "/nonexistent/experiment.yaml"), "no such file"),
        (("status", "/nonexistent/run"), "not a maka-eval run directory"),
        (("results", "/nonexistent/run"), "not a maka-eval run directory"),
        (("run", "/nonexistent/e.yaml", "--out", "/tmp/x"), "no such file"),
    ],
)
def test_user_mistakes_are_messages_not_tracebacks(args, message):
    result = cli(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_usage_errors_exit_2():
    result = cli("run")
    assert result.returncode == 2
    assert "Missing argument" in result.stderr or "Usage" in result.stderr


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_run_prints_results_and_the_numbers_are_right(hello):
    data = json.loads(cli("results", str(hello / "run"), "--format", "json").stdout)
    subjects = {s["subject"]: s for s in data["subjects"]}
    assert subjects["oracle"]["meanScore"] == 1.0 and subjects["oracle"]["results"] == 8
    assert subjects["noop"]["meanScore"] == 0.0
    # The scripted agent solves fix-greeting and sum-numbers, not the other two.
    assert subjects["scripted"]["meanScore"] == 0.5
    assert subjects["scripted"]["tokens"] > 0 and subjects["scripted"]["costUsd"] > 0
    # Exit-code contract: usage and cost are not reported, so the totals are null, not 0.
    assert subjects["oracle"]["tokens"] is None and subjects["oracle"]["costUsd"] is None
    assert subjects["scripted"]["sem"] is not None and "stderr" not in subjects["scripted"]
    assert len(data["cells"]) == 24 and data["withoutResult"] == []
    rows = list(csv.DictReader(io.StringIO(cli("results", str(hello / "run"), "-f", "csv").stdout)))
    assert len(rows) == 24 and {r["subject"] for r in rows} == {"oracle", "noop", "scripted"}
    table = cli("results", str(hello / "run")).stdout
    assert "Results (earliest valid attempt per cell)" in table and "paired" in table


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_status_shows_cells_subjects_and_writer(hello):
    result = cli("status", str(hello / "run"))
    assert result.returncode == 0
    assert "24 total, 24 with a result" in result.stdout
    assert "none (not running)" in result.stdout
    assert "serve-status::1::oracle" in result.stdout


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_rerun_resumes_without_running_anything(hello):
    result = cli("run", str(hello / "hello" / "experiment.yaml"), "--out", str(hello / "run"))
    assert result.returncode == 0
    assert "0 cell(s) in 0 task group(s)" in result.stdout
    assert "24 cell(s) already have results" in result.stdout


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_a_different_spec_into_the_same_directory_is_refused(hello, tmp_path):
    changed = tmp_path / "hello"
    shutil.copytree(hello / "hello", changed)
    text = (changed / "experiment.yaml").read_text().replace("repetitions: 2", "repetitions: 3")
    (changed / "experiment.yaml").write_text(text)
    result = cli("run", str(changed / "experiment.yaml"), "--out", str(hello / "run"))
    assert result.returncode == 2
    assert "holds a different experiment" in result.stderr
    assert "experiment.repetitions: 2 -> 3" in result.stderr


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_cell_options(hello):
    experiment = str(hello / "hello" / "experiment.yaml")
    unknown = cli("run", experiment, "--out", str(hello / "run"), "--cell", "sum-numbers::9::noop")
    assert unknown.returncode == 2 and "no such cell" in unknown.stderr
    refused = cli("run", experiment, "--out", str(hello / "run"), "--cell", "sum-numbers::1::noop")
    assert refused.returncode == 2 and "already has a valid result" in refused.stderr


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_unlock_without_a_lock(hello):
    result = cli("unlock", str(hello / "run"))
    assert result.returncode == 2 and "no writer lock" in result.stderr


@pytest.mark.slow  # bubblewrap: the hello example is checked or run
def test_an_unusable_output_directory_is_a_message(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = cli("run", str(EXAMPLE / "experiment.yaml"), "--out", str(blocker / "run"))
    assert result.returncode == 2
    assert "error:" in result.stderr
