"""Reading YAML and JSON documents strictly.

PyYAML alone would silently keep the last of two duplicate keys and read `no`, `on`,
`off`, `yes` as booleans (YAML 1.1). Here duplicate keys are errors and only
`true`/`false` are booleans, as in YAML 1.2 and JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from maka_eval import strict_json
from maka_eval.errors import Problem


class DocumentError(Exception):
    """The text is not a well-formed document; carries one problem with its position."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans, timestamps as strings, duplicate keys refused."""


_StrictLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"mapping keys must be strings, got {key!r}", key_node.start_mark
            )
        if key in result:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key '{key}' (a mapping may name a key only once)",
                key_node.start_mark,
            )
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _yaml_problem(source: str, exc: yaml.YAMLError) -> Problem:
    mark = getattr(exc, "problem_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    problem = getattr(exc, "problem", None) or str(exc)
    return Problem(where, f"not valid YAML: {problem}")


def parse_yaml(text: str, source: str) -> Any:
    """Parse exactly one YAML document."""
    try:
        documents = list(yaml.load_all(text, Loader=_StrictLoader))
    except yaml.YAMLError as exc:
        raise DocumentError(_yaml_problem(source, exc)) from None
    documents = [d for d in documents if d is not None]
    if len(documents) != 1:
        raise DocumentError(
            Problem(
                source,
                f"holds {len(documents)} YAML documents; put exactly one experiment in a file",
            )
        )
    return documents[0]


def parse_json(text: str, source: str) -> Any:
    """Parse one JSON document, refusing duplicate keys."""
    try:
        return strict_json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(
            Problem(f"{source}:{exc.lineno}:{exc.colno}", f"not valid JSON: {exc.msg}")
        ) from None
    except ValueError as exc:
        raise DocumentError(Problem(source, f"not valid JSON: {exc}")) from None


def parse_document(text: str, source: str) -> Any:
    """Parse JSON when the name ends in .json, YAML otherwise (YAML also reads JSON)."""
    if source.endswith(".json"):
        return parse_json(text, source)
    return parse_yaml(text, source)
