"""Normalized token usage: what every subject's usage is converted to.

`input_tokens` excludes cached input (as Inspect AI counts it; Harbor's includes it), so
the four counts add up to the total without double counting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

USAGE_FIELDS = {
    "inputTokens": "input_tokens",
    "cachedInputTokens": "cached_input_tokens",
    "cacheWriteTokens": "cache_write_tokens",
    "outputTokens": "output_tokens",
}
MAX_TOKENS = 10**15
"""What one count of a wire form may hold at all (records, checkpoints, the CRD); what
one attempt may plausibly report is much less (engine.bounds)."""


class UsageError(ValueError):
    """A usage mapping is malformed."""


@dataclass(frozen=True)
class Usage:
    """Token counts of one attempt (or a sum of attempts)."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Every token counted once."""
        return (
            self.input_tokens
            + self.cached_input_tokens
            + self.cache_write_tokens
            + self.output_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.output_tokens + other.output_tokens,
        )

    def to_json(self) -> dict[str, int]:
        """The wire form (camelCase keys, plus the total)."""
        out = {wire: getattr(self, attr) for wire, attr in USAGE_FIELDS.items()}
        out["totalTokens"] = self.total_tokens
        return out

    @classmethod
    def from_json(cls, data: Any, limit: int = MAX_TOKENS) -> Usage:
        """Parse the wire form strictly: known keys only, whole numbers from 0 to `limit`
        (never a boolean or a float, even 1.0), and a `totalTokens` that is their sum."""
        if not isinstance(data, Mapping):
            raise UsageError("usage must be an object")
        values: dict[str, int] = {}
        for key, value in data.items():
            if key == "totalTokens":
                continue
            if key not in USAGE_FIELDS:
                raise UsageError(f"usage has unknown field '{key}'")
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"usage.{key} must be a whole number")
            if not 0 <= value <= limit:
                raise UsageError(f"usage.{key} is out of range (0 to {limit:,})")
            values[USAGE_FIELDS[key]] = value
        usage = cls(**values)
        total = data.get("totalTokens")
        if total is not None and (
            isinstance(total, bool) or not isinstance(total, int) or total != usage.total_tokens
        ):
            raise UsageError("usage.totalTokens must be the sum of the counts, a whole number")
        return usage


def total_usage(usages: Iterable[Usage | None]) -> Usage:
    """Sum of the known usages (unknown ones count as nothing)."""
    result = Usage()
    for usage in usages:
        if usage is not None:
            result = result + usage
    return result
