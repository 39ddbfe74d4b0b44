"""Expansion, task groups, scheduling, selection and the budget."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.expand import expand_ids
from maka_eval.engine.schedule import plan_launches, waiting_groups
from maka_eval.engine.selection import CellState, cell_state, needs_retry, select_result
from maka_eval.engine.status import AttemptStatus
from maka_eval.engine.usage import Usage

S = AttemptStatus


def test_cells_are_the_cartesian_product_with_ids():
    e = expand_ids(("t1", "t2"), ("a", "b", "c"), 2)
    assert len(e) == 12
    assert [c.id for c in e.groups[0].cells] == ["t1::1::a", "t1::1::b", "t1::1::c"]
    assert e.cell("t2::2::c").task_id == "t2" and e.cell("t2::2::c").repetition == 2


def test_groups_are_repetition_major_and_hold_every_subject():
    e = expand_ids(("t1", "t2"), ("a", "b"), 3)
    assert [g.id for g in e.groups] == ["t1::1", "t2::1", "t1::2", "t2::2", "t1::3", "t2::3"]
    assert all(len(g.cells) == 2 for g in e.groups)
    assert all(c.group_id == g.id for g in e.groups for c in g.cells)


@given(
    st.lists(
        st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), min_size=1, max_size=5, unique=True
    ),
    st.lists(
        st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), min_size=1, max_size=4, unique=True
    ),
    st.integers(min_value=1, max_value=5),
)
def test_expansion_is_deterministic_and_complete(tasks, subjects, reps):
    a = expand_ids(tuple(tasks), tuple(subjects), reps)
    b = expand_ids(tuple(tasks), tuple(subjects), reps)
    assert a.cells == b.cells
    assert len({c.id for c in a.cells}) == len(tasks) * len(subjects) * reps
    assert {(c.task_id, c.repetition, c.subject_id) for c in a.cells} == {
        (t, r, s) for t in tasks for r in range(1, reps + 1) for s in subjects
    }


NO_LIMIT = BudgetState(None, None)


def test_waiting_groups_are_in_order_with_the_arms_that_need_an_attempt():
    e = expand_ids(("t1", "t2"), ("a", "b", "c"), 2)
    waiting = waiting_groups(e, {"t2::1::b", "t1::2::a", "t1::2::c"})
    assert [(w.group.id, [c.id for c in w.cells]) for w in waiting] == [
        ("t2::1", ["t2::1::b"]),
        ("t1::2", ["t1::2::a", "t1::2::c"]),
    ]


def test_plan_starts_up_to_the_limit_in_order():
    e = expand_ids(("t1", "t2", "t3"), ("a", "b"), 2)
    waiting = waiting_groups(e, {c.id for c in e.cells})
    plan = plan_launches(waiting, 0, 2, NO_LIMIT)
    assert [launch.group.id for launch in plan.launches] == ["t1::1", "t2::1"]
    assert [launch.group.id for launch in plan_launches(waiting[2:], 1, 2, NO_LIMIT).launches] == [
        "t3::1"
    ]
    assert plan_launches(waiting[2:], 2, 2, NO_LIMIT).launches == ()
    assert plan_launches([], 0, 2, NO_LIMIT).launches == ()


def test_exhausted_budget_starts_nothing_and_says_how_much_is_held():
    e = expand_ids(("t1", "t2", "t3"), ("a",), 1)
    spent = BudgetState(1.0, None, spent_cost_usd=1.0)
    plan = plan_launches(waiting_groups(e, {c.id for c in e.cells})[1:], 1, 4, spent)
    assert plan.launches == () and plan.held_by_budget == 2


def test_budget_counts_cost_and_tokens_of_every_attempt():
    state = budget_state(
        0.05, 1000, [(Usage(400, 0, 0, 100), 0.01), (None, None), (Usage(300), 0.02)]
    )
    assert state.spent_tokens == 800 and abs(state.spent_cost_usd - 0.03) < 1e-12
    assert not state.exhausted
    assert state.spend(Usage(200), None).exhausted  # 1000 tokens reached
    assert state.spend(None, 0.02).exhausted  # $0.05 reached
    assert not BudgetState(None, None, 1e9, 10**12).exhausted


@dataclass
class A:
    number: int
    status: AttemptStatus


def test_selection_is_the_earliest_valid_attempt():
    attempts = [A(1, S.INFRA_FAILED), A(2, S.SUBJECT_FAILED), A(3, S.COMPLETED)]
    assert select_result(attempts).number == 2
    assert select_result(list(reversed(attempts))).number == 2
    assert select_result([A(1, S.CANCELLED), A(2, S.INFRA_FAILED)]) is None
    assert select_result([]) is None


def test_cell_state_and_the_infra_retry_cap():
    assert cell_state([], 2) is CellState.PENDING
    assert cell_state([S.CANCELLED], 2) is CellState.PENDING
    assert cell_state([S.INFRA_FAILED] * 2, 2) is CellState.PENDING
    assert cell_state([S.INFRA_FAILED] * 3, 2) is CellState.EXHAUSTED
    assert cell_state([S.INFRA_FAILED] * 3 + [S.COMPLETED], 2) is CellState.DONE
    assert cell_state([S.SUBJECT_FAILED], 0) is CellState.DONE
    assert cell_state([S.INFRA_FAILED], 0) is CellState.EXHAUSTED


def test_needs_retry_only_after_infra_failures_under_the_cap():
    assert needs_retry([S.INFRA_FAILED], 1)
    assert not needs_retry([S.INFRA_FAILED, S.INFRA_FAILED], 1)
    assert not needs_retry([S.COMPLETED], 3)
    assert not needs_retry([S.CANCELLED], 3)
    assert not needs_retry([S.SUBJECT_FAILED], 3)
    assert not needs_retry([], 3)
