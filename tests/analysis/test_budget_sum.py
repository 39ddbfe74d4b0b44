"""The budget a summary reports: summed in one pass, to exactly what spending attempt by
attempt reaches (the engine's `BudgetState.spend`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.usage import Usage

_tokens = st.integers(min_value=0, max_value=10**9)
_usage = st.none() | st.builds(Usage, _tokens, _tokens, _tokens, _tokens)
_cost = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False) | st.just(0.0)
_limits = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(
    st.lists(st.tuples(_usage, _cost), max_size=60),
    _limits,
    st.none() | st.integers(min_value=0, max_value=10**10),
)
def test_one_pass_sum_is_the_attempt_by_attempt_state(spending, max_cost, max_tokens):
    state = BudgetState(max_cost, max_tokens)
    for usage, cost in spending:
        state = state.spend(usage, cost)
    summed = budget_state(max_cost, max_tokens, iter(spending))
    assert summed == state
    assert repr(summed.spent_cost_usd) == repr(state.spent_cost_usd)  # the same float
    assert type(summed.spent_tokens) is int and summed.exhausted == state.exhausted


def test_nothing_spent():
    assert budget_state(1.0, None, []) == BudgetState(1.0, None, 0.0, 0)
