"""The reconciler's policies, one table row per rule: groups, retries, budget, requests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from maka_eval.engine.budget import BudgetState
from maka_eval.engine.expand import expand_ids
from maka_eval.engine.reconcile import (
    Policy,
    Request,
    check_requests,
    decide,
    retry_due,
)
from maka_eval.engine.status import AttemptStatus, Trigger

S = AttemptStatus
T = Trigger
OK = S.COMPLETED
INFRA = S.INFRA_FAILED
FAIL = S.SUBJECT_FAILED
CANCEL = S.CANCELLED

# 3 tasks x 2 repetitions x 2 subjects; groups in order a::1 b::1 c::1 a::2 b::2 c::2.
EXP = expand_ids(("a", "b", "c"), ("x", "y"), 2)
FREE = BudgetState(None, None)
SPENT = BudgetState(1.0, None, spent_cost_usd=1.0)


@dataclass(frozen=True)
class A:
    number: int
    status: AttemptStatus
    trigger: Trigger = T.SCHEDULED
    request: str | None = None


def history(*statuses: AttemptStatus | tuple[AttemptStatus, Trigger]) -> list[A]:
    out = []
    for i, item in enumerate(statuses, 1):
        status, trigger = item if isinstance(item, tuple) else (item, T.SCHEDULED)
        out.append(A(i, status, trigger))
    return out


def done_all(*except_cells: str) -> dict[str, list[A]]:
    return {c.id: history(OK) for c in EXP.cells if c.id not in except_cells}


def starts(decision) -> list[tuple[str, str]]:
    return [(s.cell.id, s.trigger.value) for launch in decision.launches for s in launch.arms]


def groups(decision) -> list[str]:
    return [launch.group.id for launch in decision.launches]


POLICY = Policy(max_concurrent_groups=2, max_infra_retries=1)


def test_a_fresh_experiment_starts_the_first_groups_up_to_the_limit_all_arms_together():
    d = decide(EXP, {}, set(), FREE, POLICY)
    assert groups(d) == ["a::1", "b::1"]
    assert all(launch.together and len(launch.arms) == 2 for launch in d.launches)
    assert all(s.trigger is T.SCHEDULED for launch in d.launches for s in launch.arms)
    assert d.held_by_budget == 0 and not d.idle


def test_running_groups_take_their_slots():
    running = {"a::1::x", "a::1::y", "b::1::x"}
    d = decide(EXP, {"b::1::y": history(OK)}, running, FREE, POLICY)
    assert d.launches == () and d.running_groups == 2
    d = decide(EXP, {"b::1::y": history(OK)}, {"a::1::x"}, FREE, POLICY)
    # a::1::y is pending in a running group: it joins at once, unpaired start.
    assert starts(d)[0] == ("a::1::y", "scheduled") and not d.launches[0].together


@pytest.mark.parametrize(
    ("attempts", "running", "expected"),
    [
        # retry joins its still-running group at once, no slot needed
        ({"a::1::x": history(INFRA)}, {"a::1::y", "b::1::x", "b::1::y"}, [("a::1::x", "retry")]),
        # out of retries (1 retry allowed: 2 infra failures exhaust)
        ({"a::1::x": history(INFRA, INFRA)}, {"a::1::y", "b::1::x", "b::1::y"}, []),
        # a manual attempt is never retried automatically, but the cell stays pending
        (
            {"a::1::x": history((INFRA, T.MANUAL))},
            {"a::1::y", "b::1::x", "b::1::y"},
            [("a::1::x", "scheduled")],
        ),
        # a cancelled attempt is not a failure: scheduled again, not a retry
        (
            {"a::1::x": history(CANCEL)},
            {"a::1::y", "b::1::x", "b::1::y"},
            [("a::1::x", "scheduled")],
        ),
        # a result ends the cell
        ({"a::1::x": history(INFRA, FAIL)}, {"a::1::y", "b::1::x", "b::1::y"}, []),
    ],
)
def test_retry_rules(attempts, running, expected):
    assert starts(decide(EXP, attempts, running, FREE, POLICY)) == expected


def test_a_retry_whose_group_ended_takes_the_next_slot_before_new_groups():
    attempts = {**done_all(), "a::1::x": history(INFRA)}
    for cell in ("b::1::x", "b::1::y", "c::1::x", "c::1::y", "a::2::x", "a::2::y"):
        attempts.pop(cell)
    d = decide(EXP, attempts, {"c::1::x", "c::1::y"}, FREE, POLICY)
    assert groups(d) == ["a::1"] and starts(d) == [("a::1::x", "retry")]


def test_budget_holds_new_groups_but_not_running_groups_or_retries():
    attempts = {"a::1::x": history(INFRA), "a::1::y": history(OK)}
    d = decide(EXP, attempts, set(), SPENT, POLICY)
    assert starts(d) == [("a::1::x", "retry")]
    assert d.held_by_budget == 5  # b::1 c::1 a::2 b::2 c::2
    d = decide(EXP, {}, {"a::1::x"}, SPENT, POLICY)
    assert starts(d) == [("a::1::y", "scheduled")] and d.held_by_budget == 5


def test_everything_done_is_idle_and_settled():
    d = decide(EXP, done_all(), set(), FREE, POLICY)
    assert d.idle and d.settled == len(EXP.groups) and d.exhausted == ()


def test_exhausted_cells_are_reported_and_the_run_ends():
    attempts = {**done_all(), "b::2::y": history(INFRA, INFRA)}
    d = decide(EXP, attempts, set(), FREE, POLICY)
    assert d.idle and d.exhausted == ("b::2::y",)


def test_settled_prefix_is_skipped_and_stays_valid():
    attempts = done_all("c::1::x", "a::2::x", "a::2::y")
    d = decide(EXP, attempts, set(), FREE, POLICY)
    assert d.settled == 2 and groups(d) == ["c::1", "a::2"]
    again = decide(EXP, attempts, {"c::1::x", "a::2::x", "a::2::y"}, FREE, POLICY, settled=2)
    assert again.launches == () and again.settled == 2


def test_manual_requests_append_exactly_one_attempt_each_and_are_never_retried():
    only = Policy(2, 1, schedule=False)
    requests = [Request("b::2::y", "tok"), Request("b::2::x", "tok"), Request("c::1::x", "tok")]
    d = decide(EXP, done_all(), set(), FREE, only, requests)
    assert groups(d) == ["c::1", "b::2"]
    b2 = d.launches[1]
    assert b2.together and {s.cell.id for s in b2.arms} == {"b::2::x", "b::2::y"}
    assert all(s.trigger is T.MANUAL and s.request == "tok" for s in b2.arms)
    # answered requests are not repeated; a failed manual attempt is not retried
    answered = done_all()
    for cell in ("b::2::y", "b::2::x", "c::1::x"):
        answered[cell] = [*answered[cell], A(2, INFRA, T.MANUAL, "tok")]
    assert decide(EXP, answered, set(), FREE, only, requests).idle


def test_manual_requests_respect_slots_and_budget():
    only = Policy(1, 1, schedule=False)
    requests = [Request("a::1::x", "t"), Request("b::1::x", "t")]
    d = decide(EXP, {}, set(), FREE, only, requests)
    assert starts(d) == [("a::1::x", "manual")]
    d = decide(EXP, {}, set(), SPENT, only, requests)
    assert d.launches == () and d.held_by_budget == 2


def test_a_request_next_to_the_schedule_on_a_cluster():
    # The operator keeps scheduling while a rerun token arrives for a finished cell.
    attempts = done_all("c::2::x", "c::2::y")
    d = decide(EXP, attempts, set(), FREE, POLICY, [Request("a::1::x", "rerun-1")])
    assert groups(d) == ["a::1", "c::2"]
    assert starts(d)[0] == ("a::1::x", "manual")


def test_retry_due_rule():
    assert retry_due(history(INFRA), 1)
    assert not retry_due(history(INFRA, INFRA), 1)
    assert not retry_due(history((INFRA, T.MANUAL)), 1)
    assert not retry_due(history(OK, INFRA), 1)
    assert not retry_due([], 1)


def test_check_requests_refuses_unknown_cells_and_cells_with_results():
    attempts = {"a::1::x": history(INFRA, OK)}
    problems = check_requests(EXP, attempts, ["a::1::x", "a::1::z", "b::1::x"], force=False)
    assert [p.where for p in problems] == ["--cell a::1::x", "--cell a::1::z"]
    assert "attempt 2, completed" in problems[0].message
    assert "did you mean 'a::1::" in problems[1].message
    assert [p.where for p in check_requests(EXP, attempts, ["a::1::x"], force=True)] == []
