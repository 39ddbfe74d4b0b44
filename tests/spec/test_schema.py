"""The CRD schema: structural for Kubernetes, and as strict as the friendly validator.

Every rule the loader enforces must show in the schema (type, enum, pattern, bounds,
required) or be listed in `rules.CROSS_FIELD_RULES`, which the operator checks itself.
The models are introspected, so a new field or check cannot slip past unlisted.
"""

from __future__ import annotations

import dataclasses
import enum
import random
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

import annotated_types
import pytest
from pydantic import AfterValidator, BaseModel, Discriminator, Tag
from pydantic.fields import FieldInfo
from pydantic.json_schema import SkipJsonSchema

from maka_eval.errors import SpecError
from maka_eval.executors.load import experiment_from_data
from maka_eval.spec import experiment as experiment_models
from maka_eval.spec import rules, subjects
from maka_eval.spec.base import Check, SchemaOnly
from maka_eval.spec.experiment import Experiment, ExperimentSpec
from maka_eval.spec.schema import SchemaError, structural_schema
from tests.helpers import spec

SCHEMA = structural_schema(ExperimentSpec)
TYPE_STANDINS = ("x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")
NOT_STRUCTURAL = (
    "$ref",
    "$defs",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "title",
    "const",
    "discriminator",
    "patternProperties",
    "propertyNames",
    "prefixItems",
)


def nodes(node: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield where, node
    for name, child in node.get("properties", {}).items():
        yield from nodes(child, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{where}.*")


@pytest.mark.parametrize("model", [ExperimentSpec, Experiment])
def test_the_schema_is_structural(model):
    schema = structural_schema(model)
    assert schema["type"] == "object"
    for where, node in nodes(schema):
        assert not set(NOT_STRUCTURAL) & set(node), (where, set(NOT_STRUCTURAL) & set(node))
        assert "type" in node or any(node.get(k) for k in TYPE_STANDINS), where
        if node.get("type") == "object":
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), where
            assert not ("properties" in node and "additionalProperties" in node), where
            assert set(node.get("required", [])) <= set(node.get("properties", {})), where
        assert node.get("additionalProperties") is not False, where
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), (where, key)
        if "default" in node:
            assert node["default"] is not None, where
            assert _accepts(node, node["default"]), (where, node["default"])


def test_descriptions_are_kept_and_subject_kinds_are_merged():
    subject = SCHEMA["properties"]["subjects"]["items"]
    assert subject["properties"]["kind"]["enum"] == ["external", "maka", "oracle", "nop"]
    config = subject["properties"]["config"]["properties"]
    assert {"command", "args", "env", "credentialBindings", "resultContract", "profile"} <= set(
        config
    )
    assert config["resultContract"]["enum"] == ["exit-code", "protocol-v1"]
    assert "Agents under test" in SCHEMA["properties"]["subjects"]["description"]
    assert SCHEMA["properties"]["budget"]["properties"]["maxCostUsd"]["nullable"] is True


def test_ids_carry_pattern_and_length_in_the_json_schema():
    raw = Experiment.model_json_schema(by_alias=True)
    assert raw["properties"]["id"]["pattern"] and raw["properties"]["id"]["maxLength"] == 63
    task = SCHEMA["properties"]["tasks"]["items"]["properties"]["id"]
    assert task["pattern"] and task["maxLength"] == 63
    subject = SCHEMA["properties"]["subjects"]["items"]["properties"]
    assert subject["id"]["pattern"] and subject["credentials"]["items"]["pattern"]
    # ... while a bad id still gets the friendly message, not pydantic's.
    with pytest.raises(SpecError) as info:
        experiment_from_data(spec(id="Bad_Id", tasks=[{"id": "t/1"}]))
    text = info.value.render()
    assert "'Bad_Id' is not a valid experiment id" in text and "'t/1' is not a valid id" in text
    assert "should match pattern" not in text


def test_conflicting_variant_types_are_an_error():
    from typing import Annotated, Literal

    from pydantic import Field

    class A(BaseModel):
        kind: Literal["a"]
        size: int

    class B(BaseModel):
        kind: Literal["b"]
        size: str

    class Holder(BaseModel):
        item: Annotated[A | B, Field(discriminator="kind")]

    with pytest.raises(SchemaError, match="size"):
        structural_schema(Holder)


# --- the schema is as strict as the validator -----------------------------------------

_ALPHABET = "aAzZ09_-./: \t\n\0\u3000\xe9"
SAMPLES = [
    *("", " ", "\t", "\u3000", "\x85", " a ", "a", "A", "z9", "_", "_x", "x_1", "1abc"),
    *("a-b", "a.b", "a_b", "-a", "a-", ".a", "a.", "a\n", "\na", "a b", "my key", "a/b"),
    *("a::b", "LANG", "PATH", "HOME", "TZ", "DEBIAN_FRONTEND", "TMPDIR", "MAKA_EVAL_X"),
    *("MAKA_EVAL_", "LANGUAGE", "a\0b", "\0", "/etc", "..", "../x", "x/../..", ".", "./"),
    *("./a", "a/", "a/../b", "exp", "Bad_Id", "bad.id", "\xe9", "x" * 62, "x" * 63),
    *("x" * 64, "A" * 255, "A" * 256, "a" + "-" * 61 + "a", "a" + "-" * 62 + "a"),
]
_rng = random.Random(0)
SAMPLES += ["".join(_rng.choices(_ALPHABET, k=_rng.randint(0, 70))) for _ in range(400)]


def _accepts(node: dict[str, Any], value: Any) -> bool:
    """What the Kubernetes API server would decide for `value` (the keywords used here)."""
    if value is None:
        return bool(node.get("nullable"))
    kind = node.get("type")
    if kind == "string":
        if not isinstance(value, str):
            return False
        pattern = node.get("pattern")
        # RE2 and ECMA-262: '$' is the end of text, an unanchored pattern may match anywhere.
        if pattern and not re.search(pattern.replace("$", r"\Z"), value):
            return False
        if len(value) > node.get("maxLength", len(value)):
            return False
        if len(value) < node.get("minLength", 0):
            return False
    if kind == "array":
        return isinstance(value, list) and all(_accepts(node["items"], v) for v in value)
    return "enum" not in node or value in node["enum"]


def _check_of(item: Any) -> Check | None:
    if isinstance(item, AfterValidator):
        assert isinstance(item.func, Check), f"a validator that is not a base.Check: {item}"
        return item.func
    return None


_BOUNDS = {
    annotated_types.Gt: ("minimum", True),
    annotated_types.Ge: ("minimum", False),
    annotated_types.Lt: ("maximum", True),
    annotated_types.Le: ("maximum", False),
}


def _bound(item: Any) -> Any:
    return getattr(item, dataclasses.fields(item)[0].name)


class Position(typing.NamedTuple):
    where: str
    checks: tuple[Check, ...]
    node: dict[str, Any] | None  # None: a map key, which a structural schema cannot constrain


def _positions(
    tp: Any, metadata: list[Any], node: dict[str, Any] | None, where: str, variant: bool
) -> Iterator[Position]:
    """Walk a type and its schema node together, checking the plain constraints."""
    while typing.get_origin(tp) is typing.Annotated:
        metadata = [*metadata, *typing.get_args(tp)[1:]]
        tp = typing.get_args(tp)[0]
    flat: list[Any] = []
    for item in metadata:
        flat += item.metadata if isinstance(item, FieldInfo) else [item]
    if any(isinstance(item, SkipJsonSchema) for item in flat):
        # Left out of the schema on purpose (plug-in executors: the CRD lists the
        # built-in kinds); every check it has must then be a listed rule.
        yield from _unschematized(tp, where)
        return
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if len(members) < len(typing.get_args(tp)):
            assert node is not None and node.get("nullable"), f"{where}: optional, not nullable"
        for member in members:
            yield from _positions(member, flat, node, where, variant or len(members) > 1)
        return
    for item in flat:
        if type(item) in _BOUNDS:
            keyword, exclusive = _BOUNDS[type(item)]
            bound = _bound(item)
            assert node is not None and node.get(keyword) == bound, f"{where}: {item} not shown"
            assert bool(node.get(f"exclusive{keyword.title()}")) is exclusive, where
        elif isinstance(item, annotated_types.MinLen | annotated_types.MaxLen):
            assert node is not None, where
            prefix = "min" if isinstance(item, annotated_types.MinLen) else "max"
            suffix = "Items" if node.get("type") == "array" else "Length"
            assert node.get(prefix + suffix) == _bound(item), where
        elif not (_check_of(item) or isinstance(item, SchemaOnly | str | Discriminator | Tag)):
            pytest.fail(f"{where}: unknown constraint {item!r}; show it in the schema")
    checks = tuple(c for c in map(_check_of, flat) if c is not None)
    if checks:
        yield Position(where, checks, node)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        assert node is not None and node.get("type") == "object", where
        assert not tp.__pydantic_decorators__.model_validators, (
            f"{tp.__name__} has a model validator: list what it checks in CROSS_FIELD_RULES"
        )
        for name, field in tp.model_fields.items():
            alias = field.alias or name
            child = node["properties"].get(alias)
            assert child is not None, f"{where}.{alias} missing from the schema"
            if field.is_required() and alias not in node.get("required", []):
                # Only the merged subject kinds may lose a requirement, and it is listed.
                assert variant, f"{where}.{alias} is required but not in the schema"
                assert "subject-fields-per-kind" in {r.name for r in rules.CROSS_FIELD_RULES}
            yield from _positions(
                field.annotation, list(field.metadata), child, f"{where}.{alias}", variant
            )
        return
    assert node is not None or tp is str, f"{where}: only string map keys are expected"
    if origin is tuple:
        assert node is not None and node["type"] == "array", where
        yield from _positions(typing.get_args(tp)[0], [], node["items"], f"{where}[]", variant)
    elif origin is dict:
        key, value = typing.get_args(tp)
        assert node is not None and node["type"] == "object", where
        yield from _positions(key, [], None, f"{where}.<key>", variant)
        if value is not Any:
            child = node["additionalProperties"]
            yield from _positions(value, [], child, f"{where}.*", variant)
    elif origin is typing.Literal:
        assert node is not None and set(node["enum"]) >= set(typing.get_args(tp)), where
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        assert node is not None and set(node["enum"]) == {m.value for m in tp}, where
    elif tp in (str, int, float, bool):
        expected = {str: "string", int: "integer", float: "number", bool: "boolean"}[tp]
        assert node is None or node.get("type") == expected, where
    elif tp is not Any:
        pytest.fail(f"{where}: unexpected type {tp!r}")


def _unschematized(model: type[BaseModel], where: str) -> Iterator[Position]:
    """The checks of a model that has no schema node (node None: must be listed)."""
    for name, field in model.model_fields.items():
        metadata: list[Any] = list(field.metadata)
        tp = field.annotation
        while typing.get_origin(tp) is typing.Annotated:
            metadata += typing.get_args(tp)[1:]
            tp = typing.get_args(tp)[0]
        checks = tuple(c for c in map(_check_of, metadata) if c is not None)
        if checks:
            yield Position(f"{where}.{field.alias or name}", checks, None)


def _positions_of(model: type[BaseModel], schema: dict[str, Any]) -> list[Position]:
    return list(_positions(model, [], schema, model.__name__, False))


def _listed(check: Check) -> bool:
    return any(check.problem in rule.checks for rule in rules.CROSS_FIELD_RULES)


@pytest.mark.parametrize(
    "model", [ExperimentSpec, Experiment, experiment_models.BareExperiment], ids=str
)
def test_every_check_is_in_the_schema_or_a_listed_rule(model):
    positions = _positions_of(model, structural_schema(model))
    assert any(p.where.endswith(".id") for p in positions)  # the walk found the id checks
    for where, checks, node in positions:
        for check in checks:
            refused = [s for s in SAMPLES if check.problem(s)]
            assert refused, f"{where}: {check} refuses no sample; add samples"
            expressed = node is not None and not any(_accepts(node, s) for s in refused)
            assert expressed or _listed(check), (
                f"{where}: {check} is neither in the schema nor in CROSS_FIELD_RULES "
                f"(the schema accepts {[s for s in refused if node and _accepts(node, s)][:3]})"
            )
        if node is not None:
            # And the schema never refuses what the validator accepts.
            too_strict = [
                s
                for s in SAMPLES
                if all(not c.problem(s) for c in checks) and not _accepts(node, s)
            ]
            assert not too_strict, f"{where}: the schema refuses {too_strict[:3]}"


def test_listed_rules_are_real():
    names = [rule.name for rule in rules.CROSS_FIELD_RULES]
    assert len(names) == len(set(names))
    run = {name for rule_names, _ in rules.DOCUMENT_CHECKS for name in rule_names}
    assert run <= set(names), run - set(names)
    # What a rule stands for: a document check, a field check, or the merged union.
    for rule in rules.CROSS_FIELD_RULES:
        assert rule.name in run or rule.checks or rule.name == "subject-fields-per-kind", rule
    checks = {c.problem for p in _positions_of(ExperimentSpec, SCHEMA) for c in p.checks}
    for rule in rules.CROSS_FIELD_RULES:
        assert set(rule.checks) <= checks, f"{rule.name} names a check no field uses"


def test_the_subject_union_is_what_subject_fields_per_kind_covers():
    variants = typing.get_args(typing.get_args(subjects.Subject)[0])
    required = [
        {
            f.alias or n
            for n, f in v.model_fields["config"].annotation.model_fields.items()
            if f.is_required()
        }
        for v in variants
    ]
    merged = SCHEMA["properties"]["subjects"]["items"]["properties"]["config"]
    assert set.union(*required) - set(merged.get("required", [])), "nothing lost: drop the rule"
