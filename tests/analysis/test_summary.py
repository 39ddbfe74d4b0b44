"""Per-cell selection, per-subject summaries and pairing, checked against tables worked
out by hand."""

from __future__ import annotations

import json

import pytest

from maka_eval.analysis.pairing import complete_groups, mean_and_sem, paired_scores
from maka_eval.analysis.summary import summarize_source
from maka_eval.cli.render import results_json
from maka_eval.engine.expand import expand_ids
from maka_eval.engine.selection import CellState
from maka_eval.engine.status import AttemptStatus
from maka_eval.errors import Problem
from maka_eval.store.lock import LockState
from tests.analysis.records import FakeSource, attempt
from tests.helpers import spec

OK, FAIL, INFRA, CANCEL = (
    AttemptStatus.COMPLETED,
    AttemptStatus.SUBJECT_FAILED,
    AttemptStatus.INFRA_FAILED,
    AttemptStatus.CANCELLED,
)
SUBJECTS = [{"id": s, "kind": "external", "config": {"command": "true"}} for s in ("x", "y", "z")]
DOCUMENT = spec(
    tasks=[{"id": "a"}, {"id": "b"}],
    subjects=SUBJECTS,
    repetitions=2,
    budget={"maxCostUsd": 1.0, "maxTokens": 10_000},
)

# The run, group by group (maxInfraRetries is 1: two infra failures exhaust a cell).
#
#   group  | x                         | y                               | z
#   a::1   | #1 ok 1.0 (100 tok, $.01) | #1 ok 0.5                       | #1 fail 0.0 (50 tok)
#   b::1   | #1 infra (1000 tok, $.10) | #1 ok 1.0                       | #1 infra (200 tok, $.02)
#          | #2 ok 0.0 (200 tok, $.02) |                                 | #2 infra (200 tok, $.02)
#   a::2   | #1 ok 1.0                 | #1 cancelled                    | #1 ok 1.0
#          |                           | #2 fail 0.25                    |
#          |                           | #3 ok 1.0 (70 tok, $.007) forced|
#   b::2   | (interrupted #1 only)     | #1 ok 0.75                      | #1 ok 0.5
#
# Complete groups (every subject has a result): a::1 and a::2.
ATTEMPTS = [
    attempt("a::1::x", 1, OK, 1.0, tokens=100, cost=0.01, duration=2.0),
    attempt("a::1::y", 1, OK, 0.5),
    attempt("a::1::z", 1, FAIL, 0.0, tokens=50),
    attempt("b::1::x", 1, INFRA, tokens=1000, cost=0.10, duration=9.0),
    attempt("b::1::x", 2, OK, 0.0, tokens=200, cost=0.02, duration=4.0),
    attempt("b::1::y", 1, OK, 1.0),
    attempt("b::1::z", 1, INFRA, tokens=200, cost=0.02),
    attempt("b::1::z", 2, INFRA, tokens=200, cost=0.02),
    attempt("a::2::x", 1, OK, 1.0, duration=3.0),
    attempt("a::2::y", 1, CANCEL),
    attempt("a::2::y", 2, FAIL, 0.25),
    attempt("a::2::y", 3, OK, 1.0, tokens=70, cost=0.007),
    attempt("a::2::z", 1, OK, 1.0),
    attempt("b::2::y", 1, OK, 0.75),
    attempt("b::2::z", 1, OK, 0.5),
]


@pytest.fixture
def source() -> FakeSource:
    return FakeSource(DOCUMENT, ATTEMPTS, interrupted_attempts={"b::2::x": [1]})


def test_each_cell_keeps_its_earliest_valid_attempt(source):
    summary = summarize_source(source)
    rows = {row.cell_id: row for row in summary.cells}
    assert rows["b::1::x"].selected.attempt == 2 and rows["b::1::x"].attempts == 2
    assert rows["a::2::y"].selected.attempt == 2  # not the forced, better attempt 3
    assert rows["a::2::y"].selected.result.score == 0.25
    assert rows["b::1::z"].selected is None and rows["b::1::z"].state is CellState.EXHAUSTED
    assert rows["b::2::x"].selected is None and rows["b::2::x"].state is CellState.PENDING
    assert rows["b::2::x"].interrupted == 1 and rows["b::2::x"].attempts == 0
    assert len(summary.results) == 10 and len(summary.cells) == 12


def test_subject_means_and_sem_by_hand(source):
    subjects = {s.subject_id: s for s in summarize_source(source).subjects}
    x, y, z = subjects["x"], subjects["y"], subjects["z"]
    # Standard errors are clustered by task (Liang-Zeger, factor G/(G-1) = 2 for two
    # tasks): sqrt(2 * sum over tasks of (sum of its residuals)^2) / n.
    # x: a 1.0, b 0.0, a 1.0 -> mean 2/3; residual sums a 2/3, b -2/3 -> sqrt(16/9) / 3.
    assert (x.results, x.cells, x.without_result) == (3, 4, 1)
    assert x.mean_score == pytest.approx(2 / 3) and x.sem == pytest.approx(4 / 9)
    assert (x.completed, x.subject_failed) == (3, 0)
    # y: a 0.5, b 1.0, a 0.25, b 0.75 -> mean 0.625; sums a -0.5, b 0.5 -> sqrt(1) / 4.
    assert y.mean_score == pytest.approx(0.625)
    assert y.sem == pytest.approx(0.25)
    assert (y.completed, y.subject_failed) == (3, 1)
    # z: a 0.0, a 1.0, b 0.5 -> mean 0.5; sums a 0, b 0: two tasks with the same mean.
    assert z.mean_score == pytest.approx(0.5) and z.sem == pytest.approx(0.0)
    # Counted as independent cells x's error would be 1/3 (sample sd sqrt(1/3) / sqrt(3)).
    assert mean_and_sem([1.0, 0.0, 1.0]).sem == pytest.approx(1 / 3)
    assert mean_and_sem([1.0, 0.0, 1.0], ["a", "b", "c"]).sem == pytest.approx(1 / 3)
    assert x.mean_duration_sec == pytest.approx((2.0 + 4.0 + 3.0) / 3)


def test_paired_means_use_only_groups_where_every_subject_has_a_result(source):
    subjects = {s.subject_id: s for s in summarize_source(source).subjects}
    # a::1 and a::2 only: x 1.0, 1.0; y 0.5, 0.25; z 0.0, 1.0.
    assert {s: subjects[s].paired_n for s in "xyz"} == {"x": 2, "y": 2, "z": 2}
    assert subjects["x"].paired_mean_score == pytest.approx(1.0)
    assert subjects["y"].paired_mean_score == pytest.approx(0.375)
    assert subjects["z"].paired_mean_score == pytest.approx(0.5)
    # Differences against the first subject, per complete group:
    # y - x: -0.5, -0.75 -> mean -0.625; z - x: -1.0, 0.0 -> mean -0.5. Both groups are
    # task a: one task, so no standard error (counted as two independent pairs it
    # would have claimed 0.125 and 0.5).
    assert subjects["x"].paired_difference is None
    dy, dz = subjects["y"].paired_difference, subjects["z"].paired_difference
    assert (dy.baseline, dy.n) == ("x", 2)
    assert dy.mean == pytest.approx(-0.625) and dy.sem is None
    assert dz.mean == pytest.approx(-0.5) and dz.sem is None


def test_pairing_functions_directly():
    expansion = expand_ids(("a", "b", "c"), ("p", "q"), 1)
    scores = {
        "a::1::p": 1.0,
        "a::1::q": 0.0,
        "b::1::p": 0.5,
        "b::1::q": None,  # no result: b drops out of the pairing
        "c::1::p": 0.0,
        "c::1::q": 0.0,
    }
    assert [g.id for g in complete_groups(expansion, scores)] == ["a::1", "c::1"]
    assert paired_scores(expansion, scores) == {"p": [1.0, 0.0], "q": [0.0, 0.0]}
    # A cell missing from the map counts as having no result.
    del scores["c::1::q"]
    assert paired_scores(expansion, scores) == {"p": [1.0], "q": [0.0]}
    assert mean_and_sem([]).mean is None and mean_and_sem([0.3]).sem is None


def test_no_complete_group_means_no_paired_mean():
    attempts = [attempt("a::1::x", 1, OK, 1.0), attempt("b::1::y", 1, OK, 1.0)]
    summary = summarize_source(FakeSource(DOCUMENT, attempts))
    for s in summary.subjects:
        assert s.paired_n == 0 and s.paired_mean_score is None
    assert summary.subjects[1].paired_difference.mean is None


def test_tokens_and_cost_count_selected_attempts_only(source):
    summary = summarize_source(source)
    subjects = {s.subject_id: s for s in summary.subjects}
    # x: selected a::1 #1 (100, $.01), b::1 #2 (200, $.02), a::2 #1 (nothing reported);
    # its infra failure (1000, $.10) is budget spending, not x's result.
    assert subjects["x"].tokens == 300 and subjects["x"].cost_usd == pytest.approx(0.03)
    # y reported nothing on its selected attempts (attempt 3's 70 tokens were not selected).
    assert subjects["y"].tokens is None and subjects["y"].cost_usd is None
    # z reported tokens on one selected attempt and cost on none.
    assert subjects["z"].tokens == 50 and subjects["z"].cost_usd is None
    # The budget counts every attempt: 100+50+1000+200+200+200+70 tokens.
    assert summary.budget.spent_tokens == 1820
    assert summary.budget.spent_cost_usd == pytest.approx(0.177)
    assert summary.attempts == 15
    assert summary.attempt_counts == {
        "completed": 9,
        "subject_failed": 2,
        "infra_failed": 3,
        "cancelled": 1,
    }


def test_json_says_null_for_unreported_totals_and_names_the_sem(source):
    data = json.loads(results_json(summarize_source(source)))
    subjects = {s["subject"]: s for s in data["subjects"]}
    assert subjects["y"]["tokens"] is None and subjects["y"]["costUsd"] is None
    assert subjects["x"]["tokens"] == 300
    assert subjects["x"]["sem"] == pytest.approx(4 / 9) and "stderr" not in subjects["x"]
    assert subjects["y"]["pairedDifference"]["baseline"] == "x"
    assert data["budget"]["spentTokens"] == 1820


def test_damaged_records_and_writer_are_carried_through(source):
    source.damaged_records = [Problem("cells/a/1/x/attempts/0002.json", "not valid")]
    summary = summarize_source(source)
    assert [p.where for p in summary.damaged] == ["cells/a/1/x/attempts/0002.json"]
    assert summary.lock is LockState.FREE and not summary.has_writer_lock
    assert summary.run_dir == "memory" and summary.run_id == "run-test"
