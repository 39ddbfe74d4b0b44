"""Reading YAML and JSON documents strictly.

PyYAML alone would silently keep the last of two duplicate keys and read `no`, `on`,
`off`, `yes` as booleans (YAML 1.1). Here duplicate keys are errors and only
`true`/`false` are booleans, as in YAML 1.2 and JSON.

Documents are untrusted input, so every cost is bounded before it is paid: the text
(`MAX_DOCUMENT_BYTES`), the nesting (`MAX_DEPTH`, checked while composing, before
Python's recursion limit is near) and what YAML aliases expand to
(`MAX_EXPANDED_SIZE`, checked on the node graph before anything is expanded).
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from maka_eval import strict_json
from maka_eval.errors import Problem

MAX_DOCUMENT_BYTES = 1 << 20
"""An experiment document is at most 1 MiB."""
MAX_DEPTH = 100
"""Lists and mappings nest at most this deep (a real experiment needs about 8)."""
MAX_EXPANDED_SIZE = 4 * MAX_DOCUMENT_BYTES
"""Characters of every scalar plus one per node once aliases are expanded (a
"billion laughs" bomb is refused here, before it is expanded)."""


class DocumentError(Exception):
    """The text is not a well-formed document; carries one problem with its position."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


def size_problem(size: int, source: str) -> Problem | None:
    """A problem when a document of `size` bytes is over the cap, else None."""
    if size <= MAX_DOCUMENT_BYTES:
        return None
    return Problem(
        source,
        f"the document is larger than {MAX_DOCUMENT_BYTES // (1 << 20)} MiB "
        f"({MAX_DOCUMENT_BYTES} bytes); an experiment document is far smaller, "
        "check that this is the right file",
    )


def _mark(item: yaml.Node | yaml.Event) -> Any:
    return item.start_mark


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph whose aliases expand too far, too deep, or forever.

    Aliases share composed nodes, so the graph stays as small as the text; each node's
    expanded size and height are computed once (iteratively, post-order).
    """
    done: dict[int, tuple[int, int]] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        key = id(node)
        if key in done:
            continue
        children = _children(node)
        if not ready:
            if key in visiting:
                continue
            visiting.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in visiting and id(child) not in done:
                    raise yaml.composer.ComposerError(
                        None,
                        None,
                        "an alias refers to a node that contains it (an infinite document); "
                        "write the value out",
                        _mark(child),
                    )
                stack.append((child, False))
            continue
        size = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)
        size += sum(done[id(child)][0] for child in children)
        height = 0 if isinstance(node, yaml.ScalarNode) else 1
        height += max((done[id(child)][1] for child in children), default=0)
        if size > MAX_EXPANDED_SIZE:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases expand this document beyond {MAX_EXPANDED_SIZE} characters "
                "(a YAML alias bomb?); write the repeated parts out or use fewer aliases",
                _mark(node),
            )
        if height > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases make the document nested more than {MAX_DEPTH} levels deep",
                _mark(node),
            )
        done[key] = (size, height)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans, timestamps as strings, duplicate keys refused,
    and nesting and alias expansion bounded."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if not isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"the document is nested more than {MAX_DEPTH} levels deep",
                _mark(event),
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node


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
    too_big = size_problem(len(text.encode("utf-8", "surrogatepass")), source)
    if too_big:
        raise DocumentError(too_big)
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
    """Parse one JSON document, refusing duplicate keys and runaway nesting.

    NaN and Infinity are kept here so that validation refuses them naming their path.
    """
    too_big = size_problem(len(text.encode("utf-8", "surrogatepass")), source)
    if too_big:
        raise DocumentError(too_big)
    try:
        return strict_json.loads(text, max_depth=MAX_DEPTH, allow_nonfinite=True)
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
