"""The report built from attempt sources: per-arm figures, re-pairing, losses and their
warning, partial runs, two runs and what differs between them, summary.json and
cells.csv, all checked against the hand-worked run of test_summary."""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from maka_eval.analysis.provenance import RunState
from maka_eval.analysis.report import build_report, report_json
from maka_eval.analysis.report_files import cells_csv, write_report
from maka_eval.analysis.source import RunDirectorySource, WriterView
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.status import AttemptStatus
from maka_eval.engine.usage import Usage
from maka_eval.executors.load import experiment_from_data
from maka_eval.store.lock import LockInfo, LockState
from maka_eval.store.records import run_document
from maka_eval.store.run_store import RunIdentity, RunWriter
from maka_eval.store.seal import key_dir, signing_key
from tests.analysis.records import FakeSource, attempt
from tests.analysis.test_summary import ATTEMPTS, DOCUMENT
from tests.helpers import spec

OK, FAIL, INFRA = AttemptStatus.COMPLETED, AttemptStatus.SUBJECT_FAILED, AttemptStatus.INFRA_FAILED


@pytest.fixture
def report():
    # The run of test_summary (three subjects x, y, z; tasks a, b; two repetitions):
    #   a::1  x 1.0          y 0.5            z 0.0 (subject_failed)
    #   b::1  x 0.0 (retry)  y 1.0            z -   (two infra failures: exhausted)
    #   a::2  x 1.0          y 0.25 (after a cancellation)  z 1.0
    #   b::2  x -  (its only attempt was interrupted)       y 0.75   z 0.5
    source = FakeSource(DOCUMENT, ATTEMPTS, interrupted_attempts={"b::2::x": [1]})
    return build_report([source], resamples=2000, seed=1)


def test_per_arm_figures_by_hand(report):
    arms = {a.arm: a for a in report.arms}
    x, y = arms["x"], arms["y"]
    assert (x.results, x.cells, x.completed, x.subject_failed) == (3, 4, 3, 0)
    # The task is the unit: x's task a (1.0, 1.0) and task b (0.0) weigh the same.
    assert x.score.estimate == pytest.approx(0.5) and (x.score.n, x.score.tasks) == (3, 2)
    assert x.score.low <= x.score.estimate <= x.score.high
    assert y.score.estimate == pytest.approx(0.625) and not y.binary and x.binary
    # pass@k (a result passes at 1.0): x: task a 2/2, task b 0/1; y: a 0/2, b 1/2.
    assert [(p.k, p.value, p.tasks) for p in x.pass_at_k] == [(1, 0.5, 2), (2, 1.0, 1)]
    assert [(p.k, p.value, p.tasks) for p in y.pass_at_k] == [(1, 0.25, 2), (2, 0.5, 2)]
    # Durations of x's results: 2, 4, 3 seconds.
    assert (x.duration.median, x.duration.max) == (3.0, 4.0)
    assert x.duration.p90 == pytest.approx(3.8)


def test_tokens_and_cost_say_what_is_unknown(report):
    arms = {a.arm: a for a in report.arms}
    x, y = arms["x"], arms["y"]
    # x's results: a::1 (100 output tokens, $0.01), b::1 #2 (200, $0.02), a::2 (nothing).
    assert (x.tokens.reported, x.tokens.unreported) == (2, 1)
    output = {f.kind: f for f in x.tokens.figures}["output"]
    assert (output.total, output.mean) == (300, 150)
    assert x.cost.total_usd == pytest.approx(0.03) and x.cost.mean_usd == pytest.approx(0.015)
    assert (x.cost.known, x.cost.unknown, x.cost.lower_bound) == (2, 1, True)
    # Every attempt of x: $0.01 + $0.10 (the infra failure) + $0.02; a::2's is unknown.
    assert x.cost.all_attempts_usd == pytest.approx(0.13) and x.cost.all_attempts_unknown == 1
    # y reported nothing on its results: unknown, not zero.
    assert y.cost.total_usd is None and not y.cost.lower_bound and y.tokens.reported == 0
    data = report_json(report)["arms"][0]
    assert data["tokens"]["reasoning"] is None and "not reported" in data["tokens"]["reasoningNote"]
    assert data["cost"]["totalIsLowerBound"] is True


def test_pairs_discard_unmatched_observations_and_count_them(report):
    pairs = {(p.first, p.second): p for p in report.pairs}
    assert list(pairs) == [("x", "y"), ("x", "z"), ("y", "z")]
    xy, xz, yz = pairs["x", "y"], pairs["x", "z"], pairs["y", "z"]
    # x - y over a::1, b::1, a::2: 0.5, -1.0, 0.75 (y's b::2 has no partner). The task
    # is the unit: task a's mean difference 0.625, task b's -1.0; their mean -0.1875.
    assert (xy.pairs, xy.first_unmatched, xy.second_unmatched) == (3, 0, 1)
    assert xy.difference.estimate == pytest.approx(-0.1875)
    assert (xy.difference.n, xy.difference.tasks) == (3, 2)
    # x's mean is over the same pairs, task by task: (1.0 + 0.0) / 2.
    assert xy.first_mean == pytest.approx(0.5) and xy.second_mean == pytest.approx(0.6875)
    # The test counts tasks: x higher on a (2.0 vs 0.75 over its two pairs), y on b.
    assert xy.test.name == "sign test over tasks" and xy.test.unit == "tasks"
    assert (xy.test.positive, xy.test.negative, xy.test.ties) == (1, 1, 0)
    assert xy.test.p_value == pytest.approx(stats.binomtest(1, 2).pvalue)
    # x - z over a::1, a::2 (x's b::1 and z's b::2 are unmatched): one task, two pairs
    # (1 - 0 and 1 - 1), so one task where x is higher.
    assert (xz.pairs, xz.first_unmatched, xz.second_unmatched) == (2, 1, 1)
    assert xz.difference.estimate == pytest.approx(0.5) and xz.first_mean == 1.0
    assert xz.difference.tasks == 1 and xz.difference.low == xz.difference.high == 0.5
    assert xz.test.name == "sign test over tasks" and (xz.test.positive, xz.test.ties) == (1, 0)
    # y - z: task a 0.5 and -0.75 (mean -0.125), task b 0.25: mean 0.0625.
    assert yz.difference.estimate == pytest.approx(0.0625) and yz.pairs == 3
    # Three comparisons: Holm multiplies the smallest p by 3, the next by 2, the last by 1.
    ps = sorted((p.test.p_value, p.p_holm) for p in report.pairs)
    assert [h for _, h in ps] == pytest.approx(
        [min(1, 3 * ps[0][0]), max(min(1, 3 * ps[0][0]), min(1, 2 * ps[1][0])), 1.0]
    )
    assert not any(p.across_runs for p in report.pairs)


def test_losses_per_arm_and_the_warning_when_they_differ(report):
    losses = {loss.arm: loss for loss in report.losses}
    x, y, z = losses["x"], losses["y"], losses["z"]
    assert (x.started, x.with_result, x.without_result, x.exhausted) == (4, 3, 1, 0)
    assert (x.attempts, x.infra_failed, x.interrupted, x.retried_to_result) == (4, 1, 1, 1)
    assert (y.without_result, y.cancelled, y.retried_to_result) == (0, 1, 1)
    assert (z.without_result, z.exhausted, z.infra_failed) == (1, 1, 2)
    # x and z each lost 1 of 4; y lost none: x-y and y-z differ, x-z does not.
    warned = {(w.first, w.second): w for w in report.loss_warnings}
    assert set(warned) == {("x", "y"), ("y", "z")}
    assert warned["x", "y"].p_value == pytest.approx(stats.fisher_exact([[1, 3], [0, 4]]).pvalue)
    text = " | ".join(report.warnings())
    assert "x and y lost different shares of their started cells (1/4 vs 0/4" in text
    assert "significantly" not in text
    assert "x vs z: 1 result(s) of x and 1 of z have no partner" in text


def test_a_significant_loss_difference_says_so():
    doc = spec(
        tasks=[{"id": f"t{i}"} for i in range(12)],
        subjects=[{"id": s, "kind": "external", "config": {"command": "true"}} for s in "pq"],
    )
    attempts = []
    for i in range(12):
        attempts.append(attempt(f"t{i}::1::p", 1, OK, 1.0))
        # q loses 8 of its 12 cells: two infra failures each exhaust it (maxInfraRetries 1).
        if i < 8:
            attempts += [attempt(f"t{i}::1::q", n, INFRA) for n in (1, 2)]
        else:
            attempts.append(attempt(f"t{i}::1::q", 1, OK, 0.0))
    report = build_report([FakeSource(doc, attempts)], resamples=500)
    (warning,) = report.loss_warnings
    assert warning.p_value == pytest.approx(stats.fisher_exact([[0, 12], [8, 4]]).pvalue)
    assert warning.p_value < 0.05
    assert "p and q lost significantly different shares" in " ".join(report.warnings())
    (pair,) = report.pairs
    assert (pair.pairs, pair.first_unmatched, pair.second_unmatched) == (4, 8, 0)
    assert not report.partial  # exhausted cells are losses, not work still to do


def test_a_run_with_cells_still_to_run_is_partial(report):
    (run,) = report.runs
    # The fake has no writer lock (like a cluster): pending cells mean it is still running.
    assert run.state is RunState.RUNNING and report.partial
    assert run.pending == 1 and run.exhausted == 1 and run.with_result == 10
    assert "Figures cover the 10 of 12 cells with a result so far" in report.warnings()[0]
    assert report_json(report)["partial"] is True


@pytest.mark.parametrize(
    ("writer", "state"),
    [
        (WriterView(LockState.LIVE, LockInfo(1, "h", "t", "c")), RunState.RUNNING),
        (WriterView(LockState.STALE, LockInfo(1, "h", "t", "c")), RunState.INTERRUPTED),
        (WriterView(LockState.FREE, None), RunState.INTERRUPTED),
    ],
)
def test_the_run_state_is_read_from_the_writer_lock(writer, state):
    source = FakeSource(DOCUMENT, ATTEMPTS, writer_view=writer)
    report = build_report([source], resamples=100)
    assert report.runs[0].state is state and report.partial


def test_a_finished_run_is_complete():
    doc = spec(subjects=[{"id": "x", "kind": "external", "config": {"command": "true"}}])
    source = FakeSource(
        doc, [attempt("t1::1::x", 1, OK, 1.0)], writer_view=WriterView(LockState.FREE, None)
    )
    report = build_report([source], resamples=100)
    assert report.runs[0].state is RunState.COMPLETE and not report.partial
    assert report.pairs == () and report.warnings() == []
    assert report.arms[0].pass_at_k == ()  # one repetition: no pass@k


def test_cells_csv_has_every_cell(report):
    rows = list(csv.DictReader(io.StringIO(cells_csv(report))))
    assert len(rows) == 12
    by_cell = {r["cell"]: r for r in rows}
    assert by_cell["b::1::x"]["score"] == "0.0" and by_cell["b::1::x"]["selectedAttempt"] == "2"
    assert by_cell["b::1::x"]["infraFailed"] == "1" and by_cell["b::1::x"]["costUsd"] == "0.02"
    assert by_cell["b::2::x"]["score"] == "" and by_cell["b::2::x"]["interrupted"] == "1"
    assert by_cell["b::1::z"]["state"] == "exhausted" and by_cell["a::1::z"]["passed"] == "0"


def test_write_report_writes_three_files(report, tmp_path):
    written = write_report(report, tmp_path / "out")
    assert written.html is not None and written.html.read_text().startswith("<!DOCTYPE html>")
    data = json.loads(written.json.read_text())
    assert data["format"] == "maka.eval.report.v1" and data["method"]["resamples"] == 2000
    assert [p["first"] + "-" + p["second"] for p in data["pairs"]] == ["x-y", "x-z", "y-z"]
    assert data["pairs"][0]["discardedUnmatched"] == {"x": 0, "y": 1}
    assert written.csv.read_text().startswith("run,arm,subject,task,repetition,cell,")
    lean = write_report(report, tmp_path / "lean", html=False)
    assert lean.html is None and not (tmp_path / "lean" / "report.html").exists()


def test_half_the_plots_are_rendered_by_a_forked_child(report, tmp_path, monkeypatch):
    from maka_eval.analysis import report_files as module
    from maka_eval.analysis.page import render_page

    children = []
    alongside = module._plots_alongside

    def spy(*args):
        children.append(alongside(*args))
        return children[-1]

    monkeypatch.setattr(module, "_plots_alongside", spy)
    written = write_report(report, tmp_path / "out")
    assert len(children) == 1 and children[0] is not None
    # the same page as one process renders alone, plots included
    assert written.html.read_text() == render_page(report)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "cells.csv",
        "report.html",
        "summary.json",
    ]  # no partial page left behind


def test_a_child_that_fails_leaves_its_plots_to_this_process(report, tmp_path, monkeypatch):
    from maka_eval.analysis import page
    from maka_eval.analysis.page import render_page

    here = os.getpid()
    render_plots = page.render_plots

    def fails_in_the_child(report, titles):
        if os.getpid() != here:
            raise RuntimeError("the child's matplotlib is broken")
        return render_plots(report, titles)

    monkeypatch.setattr(page, "render_plots", fails_in_the_child)
    written = write_report(report, tmp_path / "out")
    assert written.html.read_text() == render_page(report)


def test_a_page_that_cannot_be_rendered_raises_here(report, tmp_path, monkeypatch):
    from maka_eval.analysis import page

    def broken(report, plots=None):
        raise RuntimeError("no plots today")

    monkeypatch.setattr(page, "render_page", broken)
    with pytest.raises(RuntimeError, match="no plots today"):
        write_report(report, tmp_path / "out")
    # the other two files were written; no page, whole or partial
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cells.csv", "summary.json"]


def test_build_and_write_writes_cells_csv_from_a_child_during_the_analysis(tmp_path, monkeypatch):
    from maka_eval.analysis import report_files as module

    source = FakeSource(DOCUMENT, ATTEMPTS)
    forked = []
    alongside = module._alongside

    def spy(write):
        forked.append(alongside(write))
        return forked[-1]

    monkeypatch.setattr(module, "_alongside", spy)
    built, written = module.build_and_write_report([source], tmp_path / "out", resamples=500)
    assert len(forked) == 2 and None not in forked  # cells.csv, then the page
    alone = build_report([source], resamples=500)
    assert written.csv.read_text() == cells_csv(alone) == cells_csv(built)
    assert (
        json.loads(written.json.read_text())["arms"]
        == json.loads(json.dumps(report_json(alone)))["arms"]
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "cells.csv",
        "report.html",
        "summary.json",
    ]


def test_a_failed_csv_child_leaves_cells_csv_to_this_process(tmp_path, monkeypatch):
    from maka_eval.analysis import report_files as module

    here = os.getpid()
    cells = module._cells_csv

    def fails_in_a_child(rows):
        if os.getpid() != here:
            raise RuntimeError("the child ran out of memory")
        return cells(rows)

    monkeypatch.setattr(module, "_cells_csv", fails_in_a_child)
    source = FakeSource(DOCUMENT, ATTEMPTS)
    built, written = module.build_and_write_report(
        [source], tmp_path / "out", resamples=200, html=False
    )
    assert written.csv.read_text() == cells_csv(built)


def test_an_analysis_that_fails_reaps_the_csv_child_and_raises(tmp_path, monkeypatch):
    from maka_eval.analysis import report
    from maka_eval.analysis import report_files as module

    forked = []
    alongside = module._alongside

    def spy(write):
        forked.append(alongside(write))
        return forked[-1]

    def broken(*args, **kwargs):
        raise RuntimeError("no bootstrap today")

    monkeypatch.setattr(module, "_alongside", spy)
    monkeypatch.setattr(report, "summarize_arm", broken)
    with pytest.raises(RuntimeError, match="no bootstrap today"):
        module.build_and_write_report(
            [FakeSource(DOCUMENT, ATTEMPTS)], tmp_path / "out", resamples=200
        )
    assert len(forked) == 1 and forked[0] is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(forked[0], os.WNOHANG)  # reaped already: no zombie is left


def test_the_same_seed_gives_the_same_intervals():
    source = FakeSource(DOCUMENT, ATTEMPTS)
    a = build_report([source], resamples=500, seed=5)
    b = build_report([source], resamples=500, seed=5)
    assert [x.score for x in a.arms] == [x.score for x in b.arms]
    assert [p.difference for p in a.pairs] == [p.difference for p in b.pairs]


# -- two runs -------------------------------------------------------------------------


def _subjects(x_args: list[str]) -> list[dict[str, Any]]:
    return [
        {"id": "x", "kind": "external", "config": {"command": "true", "args": x_args}},
        {"id": "y", "kind": "external", "config": {"command": "true"}},
    ]


def make_run(
    run_dir: Path,
    doc: dict[str, Any],
    records: list[AttemptRecord],
    *,
    version: str,
    created: datetime,
) -> Path:
    """A run directory written by the store's writer, created at `created`."""
    experiment, _ = experiment_from_data(doc, "test")
    identity = RunIdentity(experiment.canonical(), {t["id"]: "sha256:aa" for t in doc["tasks"]})
    key_id = signing_key(key_dir()).key_id  # the test's key (tests/conftest.py)
    run_id = f"run-{run_dir.name}-{secrets.token_hex(4)}"  # (each run its own ledger head)
    document = run_document(run_id, identity.document(), version, key_id)
    document["createdAt"] = created.isoformat()
    run_dir.mkdir(parents=True)
    (run_dir / "experiment.json").write_text(json.dumps(document))
    writer = RunWriter.open(run_dir, identity, version)
    try:
        for record in records:
            slot = writer.reserve(record.task_id, record.repetition, record.subject_id)
            writer.commit(
                slot,
                replace(
                    record,
                    run_id=writer.run_id,
                    attempt=slot.number,
                    attempt_id=f"{writer.run_id}/{record.cell_id}/{slot.number}",
                    maka_eval_version=version,
                ),
            )
    finally:
        writer.close()
    return run_dir


def test_two_runs_are_paired_across_and_their_differences_named(tmp_path):
    doc_a = spec(
        tasks=[{"id": "t1"}, {"id": "t2"}],
        subjects=_subjects(["a"]),
        benchmark={"id": "bench", "version": "1", "kind": "directory", "config": {"path": "t"}},
    )
    doc_b = spec(
        tasks=[{"id": "t1"}, {"id": "t3"}],
        subjects=_subjects(["b"]),
        benchmark={"id": "bench", "version": "2", "kind": "directory", "config": {"path": "t"}},
        execution={"maxConcurrentTaskGroups": 2, "maxInfraRetries": 3},
    )
    with_usage = replace(
        attempt("t1::1::x", 1, OK, 1.0, cost=0.5),
        result=replace(
            attempt("t1::1::x", 1, OK, 1.0, cost=0.5).result,
            usage=Usage(input_tokens=10, cached_input_tokens=5, output_tokens=2),
        ),
    )
    run_a = make_run(
        tmp_path / "a",
        doc_a,
        [
            with_usage,
            attempt("t1::1::y", 1, OK, 0.0),
            attempt("t2::1::x", 1, OK, 1.0),
            attempt("t2::1::y", 1, FAIL, 0.0),
        ],
        version="0.1.0",
        created=datetime(2025, 1, 1, 9, tzinfo=UTC),
    )
    run_b = make_run(
        tmp_path / "b",
        doc_b,
        [
            attempt("t1::1::x", 1, OK, 0.0),
            attempt("t1::1::y", 1, OK, 0.0),
            attempt("t3::1::x", 1, OK, 1.0),
            attempt("t3::1::y", 1, OK, 1.0),
        ],
        version="0.2.0",
        created=datetime(2025, 2, 3, 9, tzinfo=UTC),
    )
    report = build_report(
        [RunDirectorySource(run_a), RunDirectorySource(run_b)], resamples=200, seed=0
    )
    assert [a.arm for a in report.arms] == ["A:x", "A:y", "B:x", "B:y"]
    # Only pairs across the runs; each pairs t1::1 and discards t2 (A) and t3 (B).
    assert [(p.first, p.second) for p in report.pairs] == [
        ("A:x", "B:x"),
        ("A:x", "B:y"),
        ("A:y", "B:x"),
        ("A:y", "B:y"),
    ]
    ax_bx = report.pairs[0]
    assert ax_bx.across_runs and ax_bx.pairs == 1 and ax_bx.difference.estimate == 1.0
    assert (ax_bx.first_unmatched, ax_bx.second_unmatched) == (1, 1)
    differences = "\n".join(report.run_differences)
    assert 'benchmark.version: "1" -> "2"' in differences
    assert "execution.maxInfraRetries: 1 -> 3" in differences
    assert 'subjects.x.config.args: ["a"] -> ["b"]' in differences
    assert "tasks: 1 only in A (t2), 1 only in B (t3)" in differences
    assert "maka-eval version: 0.1.0 -> 0.2.0" in differences
    assert "start date: 2025-01-01 -> 2025-02-03" in differences
    assert "subjects.y" not in differences  # y is configured the same in both
    warning = next(w for w in report.warnings() if "not a paired design" in w)
    assert "benchmark.version" in warning and "start date" in warning
    tokens = {f.kind: f.total for f in report.arms[0].tokens.figures}
    assert tokens == {"input": 10, "cache read": 5, "cache write": 0, "output": 2}
    assert report.arms[0].tokens.total == 17
    data = report_json(report)
    assert [r["label"] for r in data["runs"]] == ["A", "B"]
    assert data["pairs"][0]["design"] == "across runs (not paired)"


def test_two_identical_runs_still_warn_that_they_are_separate_occasions(tmp_path):
    doc = spec(subjects=_subjects([]))
    records = [attempt("t1::1::x", 1, OK, 1.0), attempt("t1::1::y", 1, OK, 0.0)]
    when = datetime(2025, 1, 1, tzinfo=UTC)
    a = make_run(tmp_path / "a", doc, records, version="0.1.0", created=when)
    b = make_run(tmp_path / "b", doc, records, version="0.1.0", created=when)
    report = build_report([RunDirectorySource(a), RunDirectorySource(b)], resamples=100)
    assert report.run_differences == ()
    assert any("not a paired design" in w and "agree" in w for w in report.warnings())


def test_a_report_needs_one_or_two_runs():
    with pytest.raises(ValueError):
        build_report([])
    source = FakeSource(DOCUMENT, ATTEMPTS)
    with pytest.raises(ValueError):
        build_report([source, source, source])


def test_report_help_names_values_not_types():
    from typer.testing import CliRunner

    from maka_eval.cli.main import app

    result = CliRunner().invoke(app, ["report", "--help"], env={"COLUMNS": "120"}, color=False)
    assert result.exit_code == 0, result.output
    text = result.output
    for option in ("--cluster NAMESPACE/NAME", "--kubeconfig PATH", "--out DIR", "--bootstrap N"):
        assert option in text
    assert "--seed S" in text and "[RUN_DIR] [RUN_DIR_B]" in text
    assert "<int>" not in text and "<bool>" not in text


def test_a_run_without_any_result_yet_still_reports(tmp_path):
    live = WriterView(LockState.LIVE, LockInfo(1, "h", "t", "c"))
    report = build_report([FakeSource(DOCUMENT, [], writer_view=live)], resamples=100)
    assert report.partial and all(a.score is None and a.results == 0 for a in report.arms)
    assert all(p.pairs == 0 and p.difference is None and p.test is None for p in report.pairs)
    assert report.loss_warnings == ()
    written = write_report(report, tmp_path)
    assert written.html is not None and written.html.read_text().count("<svg") == 4
    assert json.loads(written.json.read_text())["arms"][0]["meanScore"] is None
