"""The shared experiment budget: cost and tokens spent across every attempt.

Each attempt counts what its record says it spent, within the bounds of one attempt
(engine.bounds): a figure beyond them is no measurement (a frame holding one is
malformed now; only a record written before the bounds, or by hand, can) and counts as
nothing, as an unknown figure does. So one arm's made-up number cannot exhaust the
budget of the others, and the sum stays a finite float whatever the records hold
(1e308 twice would be infinity: "$inf" in a table, `Infinity` in JSON no parser takes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from maka_eval.engine.bounds import cost_within_bounds, tokens_within_bounds
from maka_eval.engine.usage import Usage


def counted(usage: Usage | None, cost_usd: float | None) -> tuple[int, float]:
    """(tokens, cost) one attempt adds to the budget: its figures within the bounds of
    one attempt, 0 for one that is unknown or beyond them."""
    tokens = usage.total_tokens if usage is not None and tokens_within_bounds(usage) else 0
    cost = cost_usd if cost_usd is not None and cost_within_bounds(cost_usd) else 0.0
    return tokens, cost


@dataclass(frozen=True)
class BudgetState:
    """Limits and what has been spent so far (every attempt counts, whatever its status)."""

    max_cost_usd: float | None
    max_tokens: int | None
    spent_cost_usd: float = 0.0
    spent_tokens: int = 0

    @property
    def exhausted(self) -> bool:
        """Whether no new task group may start."""
        if self.max_cost_usd is not None and self.spent_cost_usd >= self.max_cost_usd:
            return True
        return self.max_tokens is not None and self.spent_tokens >= self.max_tokens

    def spend(self, usage: Usage | None, cost_usd: float | None) -> BudgetState:
        """The state after one more attempt."""
        tokens, cost = counted(usage, cost_usd)
        return BudgetState(
            self.max_cost_usd,
            self.max_tokens,
            self.spent_cost_usd + cost,
            self.spent_tokens + tokens,
        )

    def describe(self) -> str:
        """One line: what is spent of what is allowed."""
        parts = []
        if self.max_cost_usd is not None:
            parts.append(f"${self.spent_cost_usd:.4f} of ${self.max_cost_usd:g}")
        else:
            parts.append(f"${self.spent_cost_usd:.4f} (no cost limit)")
        if self.max_tokens is not None:
            parts.append(f"{self.spent_tokens:,} of {self.max_tokens:,} tokens")
        else:
            parts.append(f"{self.spent_tokens:,} tokens (no token limit)")
        return ", ".join(parts)


def budget_state(
    max_cost_usd: float | None,
    max_tokens: int | None,
    spending: Iterable[tuple[Usage | None, float | None]],
) -> BudgetState:
    """The budget after the given (usage, cost) of every attempt so far.

    What `BudgetState.spend` would reach one attempt at a time, summed in the same
    order (so to the same float), without a state per attempt (a report sums 100,000)."""
    spent_cost_usd = 0.0
    spent_tokens = 0
    for usage, cost_usd in spending:
        tokens, cost = counted(usage, cost_usd)
        spent_cost_usd += cost
        spent_tokens += tokens
    return BudgetState(max_cost_usd, max_tokens, spent_cost_usd, spent_tokens)
