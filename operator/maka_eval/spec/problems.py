"""Turn pydantic validation errors into problems a user can act on.

Each problem names the JSON path as the user wrote it (`spec.subjects[1].credentials[0]`)
and says what to do, e.g. which fields exist when one is unknown.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Sequence
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from maka_eval.errors import Problem
from maka_eval.spec.egress import misplaced_egress_message


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is typing.Annotated:
        tp = get_args(tp)[0]
    return tp


def _union_members(tp: Any) -> list[Any]:
    tp = _strip_annotated(tp)
    if get_origin(tp) in (typing.Union, types.UnionType):
        return [_strip_annotated(a) for a in get_args(tp)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _tag_of(model: type[BaseModel]) -> str | None:
    tag = getattr(model, "union_tag", None)  # a variant whose kind is open (PluginExecutor)
    if isinstance(tag, str):
        return tag
    field = model.model_fields.get("kind")
    if field is None:
        return None
    args = get_args(field.annotation)
    return args[0] if len(args) == 1 and isinstance(args[0], str) else None


def _field_by_alias(model: type[BaseModel], alias: str) -> Any:
    for name, field in model.model_fields.items():
        if alias in (field.alias, name):
            return field.annotation
    return None


class _Walk:
    """Follows an error location through the model types, dropping union tags."""

    def __init__(self, root: type[BaseModel]) -> None:
        self.root = root

    def resolve(self, loc: Sequence[int | str]) -> tuple[list[int | str], Any]:
        """The user-visible path and the type found at the end of `loc`."""
        tp: Any = self.root
        path: list[int | str] = []
        items = list(loc)
        i = 0
        while i < len(items):
            part = items[i]
            members = _union_members(tp)
            models = [m for m in members if _is_model(m)]
            if len(models) > 1:
                chosen = next((m for m in models if _tag_of(m) == part), None)
                if chosen is not None:  # a discriminated-union tag, not a user key
                    tp = chosen
                    i += 1
                    continue
            base = next((m for m in members if m is not type(None)), members[0])
            base = _strip_annotated(base)
            path.append(part)
            if _is_model(base):
                tp = _field_by_alias(base, str(part))
            elif get_origin(base) in (tuple, list):
                tp = get_args(base)[0] if get_args(base) else Any
            elif get_origin(base) is dict:
                if i + 1 < len(items) and items[i + 1] == "[key]":
                    i += 1
                    tp = str
                else:
                    tp = get_args(base)[1] if get_args(base) else Any
            else:
                tp = Any
            i += 1
        return path, tp

    def model_at(self, loc: Sequence[int | str]) -> type[BaseModel] | None:
        """The model that contains the last element of `loc`, if any."""
        _, tp = self.resolve(loc[:-1])
        models = [m for m in _union_members(tp) if _is_model(m)]
        return models[0] if len(models) == 1 else None


def format_path(parts: Sequence[int | str]) -> str:
    """Render a path as `a.b[0].c` (keys that are not identifiers are quoted)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "a").replace("-", "a").isalnum():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


def _allowed_fields(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _describe_input(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(error: ErrorDetails, walk: _Walk) -> str:
    kind = error["type"]
    loc = error["loc"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "maka_invalid":
        return error["msg"]
    if kind == "missing":
        return "is required; add it"
    if kind == "extra_forbidden":
        model = walk.model_at(loc)
        name = str(loc[-1])
        misplaced = misplaced_egress_message(name)
        if misplaced:
            return misplaced
        if model is None:
            return f"unknown field '{name}'; remove it"
        allowed = _allowed_fields(model)
        if not allowed:
            return f"unknown field '{name}'; this object takes no fields: remove it"
        return (
            f"unknown field '{name}'; {_suggest(name, allowed)}remove it or use one of: "
            + ", ".join(allowed)
        )
    if kind == "union_tag_invalid":
        expected = ctx.get("expected_tags", "")
        tags = [t.strip().strip("'") for t in str(expected).split(",")]
        return (
            f"kind '{ctx.get('tag')}' is not known; {_suggest(str(ctx.get('tag')), tags)}"
            f"use one of: {expected}"
        )
    if kind == "union_tag_not_found":
        return "needs a 'kind' to say which variant this is; add kind: <kind>"
    if kind in ("literal_error", "enum"):  # a Literal, or an Enum such as ResultContract
        expected = str(ctx.get("expected", ""))
        options = [o.strip().strip("'") for o in expected.replace(" or ", ",").split(",")]
        given = str(value)
        return f"{_describe_input(value)} is not allowed; {_suggest(given, options)}use {expected}"
    if kind == "string_type":
        hint = ""
        if isinstance(value, bool | int | float):
            hint = (
                f'; quote it: "{value}"'
                if not isinstance(value, bool)
                else ("; quote it (YAML reads true/false as booleans)")
            )
        return f"must be a string, got {_describe_input(value)}{hint}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be a whole number, got {_describe_input(value)}"
    if kind == "finite_number":
        return f"must be a finite number, got {_describe_input(value)}; write a number"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number, got {_describe_input(value)}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false, got {_describe_input(value)}"
    if kind in ("model_type", "model_attributes_type", "dict_type", "is_instance_of"):
        return f"must be a mapping (key: value), got {_describe_input(value)}"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {_describe_input(value)}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s); add one"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} item(s)"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{error['msg'].replace('Input should be', 'must be')}, got {_describe_input(value)}"
    return str(error["msg"])


def problems_from(
    exc: ValidationError, model: type[BaseModel], prefix: Sequence[int | str] = ()
) -> list[Problem]:
    """One problem per pydantic error, with user-visible paths under `prefix`."""
    walk = _Walk(model)
    problems = []
    errors = exc.errors(include_url=False)
    for error in errors:
        loc = error["loc"]
        if error["type"] == "too_short" and any(
            len(other["loc"]) > len(loc) and other["loc"][: len(loc)] == loc for other in errors
        ):
            continue  # pydantic counts only the valid items; the item errors say more
        path, _ = walk.resolve(loc)
        problems.append(Problem(format_path([*prefix, *path]), _message(error, walk)))
    return problems
