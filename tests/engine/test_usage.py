"""Normalized usage: strict parsing and totals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maka_eval.engine.usage import Usage, UsageError, total_usage

counts = st.integers(min_value=0, max_value=10**12)


@given(counts, counts, counts, counts)
def test_round_trip_and_total(a, b, c, d):
    usage = Usage(a, b, c, d)
    assert Usage.from_json(usage.to_json()) == usage
    assert usage.to_json()["totalTokens"] == a + b + c + d


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"inputTokens": -1},
        {"inputTokens": 1.5},
        {"inputTokens": True},
        {"inputTokens": "3"},
        {"promptTokens": 3},
        {"inputTokens": 1, "totalTokens": 5},
    ],
)
def test_malformed_usage_is_rejected(data):
    with pytest.raises(UsageError):
        Usage.from_json(data)


def test_total_usage_ignores_unknown():
    assert total_usage([Usage(1, 2, 3, 4), None, Usage(1)]).total_tokens == 11
