"""The shared budget cannot be poisoned by one attempt's figure, even an old record's."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from maka_eval.engine.bounds import MAX_ATTEMPT_COST_USD, MAX_ATTEMPT_TOKENS
from maka_eval.engine.budget import BudgetState, budget_state, counted
from maka_eval.engine.usage import MAX_TOKENS, Usage


def test_a_figure_within_the_bounds_counts_in_full():
    assert counted(Usage(MAX_ATTEMPT_TOKENS), MAX_ATTEMPT_COST_USD) == (
        MAX_ATTEMPT_TOKENS,
        MAX_ATTEMPT_COST_USD,
    )
    assert counted(Usage(100, 10, 1, 20), 0.25) == (131, 0.25)
    assert counted(None, None) == (0, 0.0)


def test_a_figure_beyond_the_bounds_counts_as_nothing():
    """What a record written before the bounds may hold (its wire form takes any finite
    cost and 10^15 tokens a count): no measurement, so it is not spent."""
    assert counted(Usage(MAX_TOKENS, MAX_TOKENS, MAX_TOKENS, MAX_TOKENS), 1e308) == (0, 0.0)
    assert counted(Usage(MAX_ATTEMPT_TOKENS, 1), MAX_ATTEMPT_COST_USD * 1.0001) == (0, 0.0)
    assert counted(Usage(-1, 5), -0.5) == (0, 0.0)  # only a hand-made Usage can
    assert counted(None, math.inf) == (0, 0.0)
    assert counted(None, math.nan) == (0, 0.0)


def test_old_records_with_huge_figures_leave_the_budget_finite_and_open():
    """Two records of the old attack (costUsd 1e308, 10^15 tokens) next to real work:
    summed naively the cost is infinity and every group stops."""
    attack = (Usage(MAX_TOKENS), 1e308)
    real = (Usage(1000, 0, 0, 100), 0.02)
    spending = [attack, real, attack, real]
    state = budget_state(10.0, 10**6, spending)
    assert state.spent_cost_usd == 0.04 and state.spent_tokens == 2200
    assert not state.exhausted
    step = BudgetState(10.0, 10**6)
    for usage, cost in spending:
        step = step.spend(usage, cost)
    assert step == state
    assert "inf" not in state.describe()


_costs = st.none() | st.floats(min_value=0, allow_nan=False, allow_infinity=False)
_tokens = st.integers(min_value=0, max_value=MAX_TOKENS)
_usages = st.none() | st.builds(Usage, _tokens, _tokens, _tokens, _tokens)


@given(st.lists(st.tuples(_usages, _costs), max_size=50))
def test_whatever_the_records_hold_the_sum_is_finite_and_bounded(spending):
    state = budget_state(None, None, spending)
    assert math.isfinite(state.spent_cost_usd)
    assert 0 <= state.spent_cost_usd <= len(spending) * MAX_ATTEMPT_COST_USD
    assert 0 <= state.spent_tokens <= len(spending) * MAX_ATTEMPT_TOKENS
