"""The sane bounds of what one attempt can have spent: the one place they are named.

No agent run spends ten billion tokens or a hundred thousand dollars. A figure beyond
these is not a measurement but a broken or hostile report: a result frame that holds
one is malformed (relay.frame), and the shared budget never counts one (engine.budget),
so a single arm cannot exhaust the budget of every other arm with a made-up number.

These are far below what a record's wire form may hold (`engine.usage.MAX_TOKENS` per
count, any finite cost): records written before the bounds existed stay readable.
"""

from __future__ import annotations

import math

from maka_eval.engine.usage import Usage

MAX_ATTEMPT_TOKENS = 10**10
"""Tokens one attempt may report, in any one count and in total."""
MAX_ATTEMPT_COST_USD = 1e5
"""US dollars one attempt may report."""


def tokens_within_bounds(usage: Usage) -> bool:
    """Whether every count and the total are at most MAX_ATTEMPT_TOKENS (no count is
    negative, so a total within the bound holds every count within it)."""
    return (
        usage.input_tokens >= 0
        and usage.cached_input_tokens >= 0
        and usage.cache_write_tokens >= 0
        and usage.output_tokens >= 0
        and usage.total_tokens <= MAX_ATTEMPT_TOKENS
    )


def cost_within_bounds(cost_usd: float) -> bool:
    """Whether a cost is a finite number from 0 to MAX_ATTEMPT_COST_USD."""
    return math.isfinite(cost_usd) and 0 <= cost_usd <= MAX_ATTEMPT_COST_USD
