"""What `run`, `status` and `results` say around the numbers: damaged records, kept
workspaces, and the end of a cancelled run. The executor is replaced by a fake that
plays events, so these run in-process and fast."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from maka_eval.cli import main as cli_main
from maka_eval.engine.status import AttemptStatus
from maka_eval.local.events import AttemptFinished, AttemptStarted, Cancelling
from tests.analysis.records import attempt, make_run
from tests.cli.test_progress import started

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello" / "experiment.yaml"
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(cli_main.app, list(args), env={"COLUMNS": "160"}, color=False)


@pytest.fixture
def damaged_run(tmp_path) -> tuple[Path, Path]:
    paths = make_run(tmp_path / "run")
    paths["y"].chmod(0o644)
    paths["y"].write_text("{ this is not a record")
    return tmp_path / "run", paths["y"]


@pytest.mark.parametrize("command", ["status", "results"])
def test_a_damaged_record_is_a_warning_naming_the_file(damaged_run, command):
    run_dir, damaged = damaged_run
    result = invoke(command, str(run_dir))
    # Everything else is printed; the exit code says records failed verification.
    assert result.exit_code == cli_main.VERIFICATION_FAILED, result.output
    stderr = result.stderr.replace("\n", "")
    assert "FAILED VERIFICATION" in stderr and f"{damaged}: edited: " in stderr
    assert "t1::1::x" in result.stdout  # the intact record is still shown
    assert "1 FAILED VERIFICATION, left out" in result.stdout


def test_results_json_stays_json_next_to_a_damaged_record(damaged_run):
    run_dir, damaged = damaged_run
    result = invoke("results", str(run_dir), "--format", "json")
    assert result.exit_code == cli_main.VERIFICATION_FAILED
    data = json.loads(result.stdout)
    assert [c["cell"] for c in data["cells"]] == ["t1::1::x"]
    assert str(damaged) in result.stderr.replace("\n", "")
    integrity = data["integrity"]
    assert integrity["state"] == "failed verification" and integrity["verifiedRecords"] == 1
    assert [f["where"] for f in integrity["failures"]] == [str(damaged)]


def test_a_verified_run_says_so_and_exits_0(tmp_path):
    make_run(tmp_path / "run")
    result = invoke("status", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert "2 record(s) verified (sealed with key" in result.stdout
    data = json.loads(invoke("results", str(tmp_path / "run"), "-f", "json").stdout)
    assert data["integrity"]["state"] == "verified" and data["integrity"]["failures"] == []


class FakeRun:
    """Stands in for LocalRun: plays the given events, returns the given report."""

    events_to_play: list = []
    report: SimpleNamespace = SimpleNamespace()

    def __init__(self, loaded, tasks, run_dir, *, options, events) -> None:
        self.events = events
        self.options = options

    def run(self) -> SimpleNamespace:
        for event in self.events_to_play:
            if isinstance(event, AttemptFinished):
                record = event.record
                self.events(AttemptStarted(record.cell_id, record.subject_id, record.attempt))
            self.events(event)
        return self.report


def report(run_dir: Path, **changes) -> SimpleNamespace:
    base = {
        "run_dir": run_dir,
        "cancelled": False,
        "held_by_budget": 0,
        "budget": None,
        "work_dir": None,
    }
    return SimpleNamespace(**{**base, **changes})


def test_keep_workspaces_says_where_they_are(tmp_path, monkeypatch):
    make_run(tmp_path / "run")
    FakeRun.events_to_play = [started(0)]
    FakeRun.report = report(tmp_path / "run", work_dir=tmp_path / "work" / "run-1")
    monkeypatch.setattr(cli_main, "LocalRun", FakeRun)
    result = invoke("run", str(EXAMPLE), "--out", str(tmp_path / "run"), "--keep-workspaces")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert f"workspaces kept in {tmp_path / 'work' / 'run-1'}" in text
    assert "one folder per attempt: <task>__<rep>__<subject>__<n>" in text
    without = invoke("run", str(EXAMPLE), "--out", str(tmp_path / "run"))
    assert "workspaces kept" not in without.stdout


def test_a_cancelled_run_tells_its_story_in_order_on_one_stream(tmp_path, monkeypatch):
    make_run(tmp_path / "run")
    FakeRun.events_to_play = [
        started(2),
        AttemptFinished(attempt("t1::1::x", 2, AttemptStatus.CANCELLED), False),
        Cancelling(running_attempts=2),
        AttemptFinished(attempt("t1::1::y", 2, AttemptStatus.CANCELLED), False),
    ]
    FakeRun.report = report(tmp_path / "run", cancelled=True)
    monkeypatch.setattr(cli_main, "LocalRun", FakeRun)
    result = invoke("run", str(EXAMPLE), "--out", str(tmp_path / "run"))
    assert result.exit_code == 130
    out = result.stdout
    order = [
        out.index("stopping: quiescing"),
        out.index("t1::1::x #2 cancelled"),
        out.index("t1::1::y #2 cancelled"),
        out.index("Results:"),
        out.index("Re-run the same command to resume"),
    ]
    assert order == sorted(order), out
