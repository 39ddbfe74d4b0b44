"""Metering configuration: the model prices that turn metered usage into a cost.

Prices are experiment configuration (`spec.metering.prices`), shared by every arm: the
egress proxy meters what each subject's model requests used, and the relay prices the
figure with these (metering.pricing). Cost is recorded only for a complete figure of
models that all have a price; a partial figure keeps its tokens as a lower bound.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from maka_eval.metering.checkpoint import MODEL_NAME_LIMIT
from maka_eval.metering.pricing import ModelPrice, Prices
from maka_eval.spec.base import Check, SpecModel

_MODEL_PATTERN = re.compile(r"[^\s*]*\*?")


def model_pattern_problem(value: str) -> str | None:
    """Why `value` cannot name the models a price applies to (the fix named), or None."""
    if not value or len(value) > MODEL_NAME_LIMIT or not _MODEL_PATTERN.fullmatch(value):
        return (
            f"'{value[:60]}' is not a model name: write the model as the provider names it "
            f"('gpt-4o-2024-08-06', 'claude-sonnet-4-5'), or a prefix ending in '*' "
            f"('gpt-4o*' prices every dated version); no spaces, '*' only at the end, "
            f"at most {MODEL_NAME_LIMIT} characters"
        )
    return None


ModelPattern = Annotated[str, AfterValidator(Check(model_pattern_problem))]
UsdPerMillion = Annotated[float, Field(ge=0, le=1_000_000)]


class ModelPriceSpec(SpecModel):
    """USD per million tokens of one model, for each kind of token it is billed for."""

    input_per_m_tok: UsdPerMillion = Field(
        description="Input tokens that were not read from the provider's prompt cache."
    )
    output_per_m_tok: UsdPerMillion = Field(
        description="Output tokens, reasoning tokens included (providers bill them as output)."
    )
    cache_read_per_m_tok: UsdPerMillion | None = Field(
        default=None,
        description=(
            "Input tokens read from the prompt cache. Without it, a run that read the "
            "cache has no cost (null, with a note)."
        ),
    )
    cache_write_per_m_tok: UsdPerMillion | None = Field(
        default=None,
        description=(
            "Input tokens written to the prompt cache (Anthropic). Without it, a run that "
            "wrote the cache has no cost (null, with a note)."
        ),
    )

    def model_price(self) -> ModelPrice:
        return ModelPrice(
            input=self.input_per_m_tok,
            output=self.output_per_m_tok,
            cache_read=self.cache_read_per_m_tok,
            cache_write=self.cache_write_per_m_tok,
        )


class MeteringConfig(SpecModel):
    """How metered model usage is priced (shared by all arms)."""

    prices: dict[ModelPattern, ModelPriceSpec] = Field(
        default_factory=dict,
        description=(
            "Model name -> USD per million tokens. A name ending in '*' prices every model "
            "it prefixes ('gpt-4o*'); an exact name wins, then the longest prefix. Names "
            "are matched against the model the provider's response names. A model without "
            "a price gets no cost (null, with a note), never a guessed one."
        ),
    )

    def to_prices(self) -> Prices:
        """The price list the relay and the proxy use."""
        return Prices({name: entry.model_price() for name, entry in self.prices.items()})


def prices_of(config: MeteringConfig | None) -> Prices | None:
    """The experiment's price list; None when it names no prices."""
    if config is None or not config.prices:
        return None
    return config.to_prices()


def prices_summary(config: MeteringConfig | None) -> str | None:
    """One line for `maka-eval validate`: each model's USD per million input, output,
    cache-read and cache-write tokens ('-': no price); None when no prices are set."""
    if config is None or not config.prices:
        return None

    def usd(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    listed = "; ".join(
        f"{name} {usd(p.input_per_m_tok)}/{usd(p.output_per_m_tok)}/"
        f"{usd(p.cache_read_per_m_tok)}/{usd(p.cache_write_per_m_tok)}"
        for name, p in sorted(config.prices.items())
    )
    count = len(config.prices)
    models = f"{count} model{'s' if count != 1 else ''}"
    return f"{models}, USD per M tokens in/out/cache read/cache write: {listed}"
