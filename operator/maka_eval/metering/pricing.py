"""Model prices: USD per million tokens, per model name, for each kind of token.

A price list is experiment configuration (`spec.metering.prices`; the subject cannot
change it). Cost is only ever computed for a complete metered figure and only when every
model that used tokens has a price for every kind of token it used: a guessed price
would enter the result kernel as if it were known.

Reasoning tokens are not a kind of their own: every provider counts them in the output
tokens (OpenAI's `completion_tokens` / `output_tokens`, Anthropic's `output_tokens`) and
bills them at the output price, so `outputPerMTok` prices them. The cache prices are
optional: a model whose usage holds cache reads (or writes) without a cache-read (or
cache-write) price has no cost, and `Prices.unpriced` says which price is missing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from maka_eval import strict_json
from maka_eval.engine.usage import Usage

PER_MILLION = 1_000_000
MAX_MODELS = 1024
"""A bound for parsing a price list from a file or a plan; no real list comes near it."""
MODEL_NAME_LIMIT = 200
_PRICE_KEYS = {
    "inputPerMTok": "input",
    "outputPerMTok": "output",
    "cacheReadPerMTok": "cache_read",
    "cacheWritePerMTok": "cache_write",
}
_REQUIRED_KEYS = frozenset({"inputPerMTok", "outputPerMTok"})


class PricesError(ValueError):
    """A price list is malformed."""


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens of one model; a cache price of None is not known."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_read", "cache_write"):
            value = getattr(self, name)
            if value is None and name.startswith("cache"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PricesError(f"{name} must be a number")
            if not math.isfinite(value) or value < 0:
                raise PricesError(f"{name} must be a finite, non-negative number")

    def missing(self, usage: Usage) -> tuple[str, ...]:
        """The wire names of the prices `usage` needs that this model lacks."""
        out = []
        if usage.cached_input_tokens and self.cache_read is None:
            out.append("cacheReadPerMTok")
        if usage.cache_write_tokens and self.cache_write is None:
            out.append("cacheWritePerMTok")
        return tuple(out)

    def cost(self, usage: Usage) -> float | None:
        """What `usage` of this model cost, in USD (None when a price it needs is missing)."""
        if self.missing(usage):
            return None
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cached_input_tokens * (self.cache_read or 0.0)
            + usage.cache_write_tokens * (self.cache_write or 0.0)
        ) / PER_MILLION


@dataclass(frozen=True)
class Prices:
    """Prices by model name. A name ending in '*' prices every model it prefixes
    (`gpt-4o*` covers `gpt-4o-2024-08-06`); an exact name wins, then the longest prefix."""

    models: Mapping[str, ModelPrice] = field(default_factory=dict)

    def for_model(self, model: str) -> ModelPrice | None:
        """The price of `model`, or None when the list does not name it."""
        exact = self.models.get(model)
        if exact is not None:
            return exact
        best: tuple[int, ModelPrice] | None = None
        for name, price in self.models.items():
            matches = name.endswith("*") and model.startswith(name[:-1])
            if matches and (best is None or len(name) > best[0]):
                best = (len(name), price)
        return best[1] if best else None

    def unpriced(self, usage_by_model: Mapping[str, Usage]) -> dict[str, str]:
        """{model: why it has no cost} for every model that used tokens the list cannot
        price ('no price', or the missing cache price)."""
        out: dict[str, str] = {}
        for model, usage in sorted(usage_by_model.items()):
            if usage.total_tokens == 0:
                continue
            price = self.for_model(model)
            if price is None:
                out[model] = "no price"
            elif missing := price.missing(usage):
                out[model] = f"no {' or '.join(missing)}"
        return out

    def cost(self, usage_by_model: Mapping[str, Usage]) -> tuple[float | None, tuple[str, ...]]:
        """Total USD of the usage, and the models it cannot price. The cost is None when
        any model that used tokens has no price (for a kind of token it used)."""
        unpriced = self.unpriced(usage_by_model)
        if unpriced:
            return None, tuple(unpriced)
        total = 0.0
        for model, usage in sorted(usage_by_model.items()):
            price = self.for_model(model)
            if usage.total_tokens and price is not None:
                total += price.cost(usage) or 0.0
        return round(total, 9), ()

    # -- the wire form ----------------------------------------------------------------
    def to_dict(self) -> dict[str, dict[str, float]]:
        """{model: {inputPerMTok, outputPerMTok[, cacheReadPerMTok][, cacheWritePerMTok]}}."""
        return {
            name: {
                wire: getattr(price, attr)
                for wire, attr in _PRICE_KEYS.items()
                if getattr(price, attr) is not None
            }
            for name, price in sorted(self.models.items())
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> Prices:
        """Parse the wire form strictly: input and output prices named, the cache prices
        optional, nothing else."""
        if not isinstance(data, Mapping):
            raise PricesError("prices must be an object of model name -> prices")
        if len(data) > MAX_MODELS:
            raise PricesError(f"prices name more than {MAX_MODELS} models")
        models: dict[str, ModelPrice] = {}
        for name, entry in data.items():
            if not isinstance(name, str) or not name or len(name) > MODEL_NAME_LIMIT:
                raise PricesError(f"a model name must be 1 to {MODEL_NAME_LIMIT} characters")
            if (
                not isinstance(entry, Mapping)
                or not set(entry) >= _REQUIRED_KEYS
                or not set(entry) <= set(_PRICE_KEYS)
            ):
                raise PricesError(
                    f"prices of '{name}' must have inputPerMTok and outputPerMTok, and may "
                    "have cacheReadPerMTok and cacheWritePerMTok (nothing else)"
                )
            try:
                models[name] = ModelPrice(**{_PRICE_KEYS[k]: v for k, v in entry.items()})
            except PricesError as exc:
                raise PricesError(f"prices of '{name}': {exc}") from None
        return cls(models)

    @classmethod
    def from_json(cls, text: str | bytes) -> Prices:
        try:
            data = strict_json.loads(text)
        except ValueError as exc:
            raise PricesError(f"prices are not valid JSON: {exc}") from None
        return cls.from_dict(data)
