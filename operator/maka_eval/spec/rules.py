"""Cross-field rules of the experiment document.

They run on the raw document, next to the structural validation, so that one pass
reports every problem at once: a duplicate id is reported even when another subject
has a typo in an unrelated field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from maka_eval.errors import Problem


def _items(doc: Mapping[str, Any], key: str) -> list[tuple[int, Mapping[str, Any]]]:
    value = doc.get(key)
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, Mapping)]


def _repeats(
    doc: Mapping[str, Any], key: str, value_of: Callable[[Mapping[str, Any]], Any]
) -> Iterator[tuple[int, str, int]]:
    """(index, value, index of its first use) for every item repeating an earlier value."""
    first: dict[str, int] = {}
    for i, item in _items(doc, key):
        value = value_of(item)
        if not isinstance(value, str):
            continue
        if value in first:
            yield i, value, first[value]
        else:
            first[value] = i


def _unique_ids(doc: Mapping[str, Any], key: str, prefix: str) -> Iterator[Problem]:
    for i, value, j in _repeats(doc, key, lambda item: item.get("id")):
        yield Problem(
            f"{prefix}{key}[{i}].id",
            f"duplicate id '{value}' (already used by {prefix}{key}[{j}]); ids must be unique",
        )


def _unique_task_dirs(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    for i, path, j in _repeats(doc, "tasks", lambda item: item.get("path", item.get("id"))):
        yield Problem(
            f"{prefix}tasks[{i}]",
            f"uses the same task directory '{path}' as {prefix}tasks[{j}]; "
            "each task must be a different directory (use repetitions for more samples)",
        )


def _subject_environment(subject: Mapping[str, Any], where: str) -> Iterator[Problem]:
    raw_credentials = subject.get("credentials")
    credentials = (
        [c for c in raw_credentials if isinstance(c, str)]
        if isinstance(raw_credentials, list)
        else []
    )
    seen: set[str] = set()
    for j, name in enumerate(credentials):
        if name in seen:
            yield Problem(f"{where}.credentials[{j}]", f"'{name}' is declared twice; remove one")
        seen.add(name)

    config = subject.get("config")
    if not isinstance(config, Mapping):
        return
    env = config.get("env") if isinstance(config.get("env"), Mapping) else {}
    bindings = (
        config.get("credentialBindings")
        if isinstance(config.get("credentialBindings"), Mapping)
        else {}
    )
    assert isinstance(env, Mapping) and isinstance(bindings, Mapping)
    bound_sources = {s for s in bindings.values() if isinstance(s, str)}

    for target, source in bindings.items():
        path = f"{where}.config.credentialBindings.{target}"
        if isinstance(source, str) and source not in seen:
            yield Problem(
                path,
                f"'{source}' is not declared in {where}.credentials; declare it there "
                "(a subject receives only the credentials it declares)",
            )
        if target in env:
            yield Problem(
                path,
                f"'{target}' is also set in {where}.config.env; a variable gets one value, "
                "remove one of them",
            )
        if target in seen and target not in bound_sources and target != source:
            yield Problem(
                path,
                f"'{target}' is also a declared credential passed under its own name; "
                "bind a different target name",
            )

    for name in env:
        if name in seen and name not in bound_sources:
            yield Problem(
                f"{where}.config.env.{name}",
                f"'{name}' is a declared credential; its value comes from the environment "
                "of maka-eval, never from the spec: remove it from env",
            )


def _runtime_host(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    executor = doc.get("executor")
    if not isinstance(executor, Mapping) or executor.get("kind") != "local":
        return
    config = executor.get("config")
    has_host = isinstance(config, Mapping) and config.get("runtimeHost") is not None
    if has_host:
        return
    for i, subject in _items(doc, "subjects"):
        if subject.get("kind") == "maka":
            yield Problem(
                f"{prefix}executor.config.runtimeHost",
                f"required because {prefix}subjects[{i}] ('{subject.get('id')}') has kind "
                "'maka'; add runtimeHost: {command: <Runtime Host program>}",
            )
            return


def cross_field_problems(spec: Mapping[str, Any], prefix: str) -> list[Problem]:
    """Problems that involve more than one field; `prefix` is '' or 'spec.'."""
    problems: list[Problem] = []
    problems += _unique_ids(spec, "subjects", prefix)
    problems += _unique_ids(spec, "tasks", prefix)
    problems += _unique_task_dirs(spec, prefix)
    for i, subject in _items(spec, "subjects"):
        problems += _subject_environment(subject, f"{prefix}subjects[{i}]")
    problems += _runtime_host(spec, prefix)
    return problems
