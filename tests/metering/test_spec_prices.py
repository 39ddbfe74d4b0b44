"""`spec.metering.prices`: validated with JSON paths, turned into the relay's price list,
shown by `maka-eval validate`, and in the CRD schema."""

from __future__ import annotations

import pytest

from maka_eval.engine.usage import Usage
from maka_eval.errors import SpecError
from maka_eval.executors.load import experiment_from_data
from maka_eval.k8s.crds import KINDS, open_api_schema
from maka_eval.metering.pricing import ModelPrice
from maka_eval.spec.metering import model_pattern_problem, prices_of, prices_summary
from tests.helpers import spec

PRICES = {
    "gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10, "cacheReadPerMTok": 1.25},
    "claude-sonnet-4-5": {
        "inputPerMTok": 3,
        "outputPerMTok": 15,
        "cacheReadPerMTok": 0.3,
        "cacheWritePerMTok": 3.75,
    },
}


def problems(doc: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        experiment_from_data(doc)
    return info.value.render().splitlines()


def test_prices_become_the_relays_price_list():
    experiment, _ = experiment_from_data(spec(metering={"prices": PRICES}))
    prices = prices_of(experiment.spec.metering)
    assert prices is not None
    assert prices.for_model("gpt-4o-2024-08-06") == ModelPrice(2.5, 10.0, 1.25, None)
    assert prices.for_model("claude-sonnet-4-5") == ModelPrice(3.0, 15.0, 0.3, 3.75)
    assert prices.for_model("claude-sonnet-4-5-20250929") is None  # exact names are exact
    usage = {"gpt-4o-mini": Usage(1_000_000, 0, 0, 1_000_000)}
    assert prices.cost(usage) == (12.5, ())
    # The canonical document keeps them (they are part of the experiment's identity).
    assert experiment.canonical()["metering"]["prices"]["gpt-4o*"]["cacheWritePerMTok"] is None
    # No prices: no list (metered usage is recorded without a cost).
    bare, _ = experiment_from_data(spec())
    assert prices_of(bare.spec.metering) is None and prices_summary(bare.spec.metering) is None


def test_validate_shows_every_models_prices():
    experiment, _ = experiment_from_data(spec(metering={"prices": PRICES}))
    line = prices_summary(experiment.spec.metering)
    assert line == (
        "2 models, USD per M tokens in/out/cache read/cache write: "
        "claude-sonnet-4-5 3/15/0.3/3.75; gpt-4o* 2.5/10/1.25/-"
    )


@pytest.mark.parametrize(
    ("prices", "expected"),
    [
        (
            {"gpt 4o": {"inputPerMTok": 1, "outputPerMTok": 1}},
            "metering.prices[\"gpt 4o\"]: 'gpt 4o' is not a model name",
        ),
        (
            {"gpt-*4o": {"inputPerMTok": 1, "outputPerMTok": 1}},
            "metering.prices[\"gpt-*4o\"]: 'gpt-*4o' is not a model name",
        ),
        ({"m": {"inputPerMTok": 1}}, "metering.prices.m.outputPerMTok: is required; add it"),
        (
            {"m": {"inputPerMTok": -1, "outputPerMTok": 1}},
            "metering.prices.m.inputPerMTok: must be greater than or equal to 0",
        ),
        (
            {"m": {"inputPerMTok": "1", "outputPerMTok": 1}},
            "metering.prices.m.inputPerMTok:",
        ),
        (
            {"m": {"inputPerMTok": 1, "outputPerMTok": 1, "reasoningPerMTok": 1}},
            "metering.prices.m.reasoningPerMTok: unknown field 'reasoningPerMTok'",
        ),
    ],
)
def test_a_bad_price_is_reported_with_its_path(prices, expected):
    found = problems(spec(metering={"prices": prices}))
    assert any(expected in line for line in found), found


def test_model_patterns():
    for good in ("gpt-4o", "gpt-4o*", "*", "openai/gpt-4o", "claude-sonnet-4-5@20250929"):
        assert model_pattern_problem(good) is None, good
    for bad in ("", "a b", "a*b", "**", "x" * 129, "tab\tname"):
        assert model_pattern_problem(bad), bad


def test_the_crd_schema_holds_the_prices():
    schema = open_api_schema(next(k for k in KINDS if k.kind == "Experiment"))
    prices = schema["properties"]["spec"]["properties"]["metering"]["properties"]["prices"]
    entry = prices["additionalProperties"]
    assert entry["required"] == ["inputPerMTok", "outputPerMTok"]
    assert entry["properties"]["cacheWritePerMTok"]["nullable"] is True
    assert entry["properties"]["inputPerMTok"]["minimum"] == 0
