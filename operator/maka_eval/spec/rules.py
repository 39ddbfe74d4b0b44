"""Cross-field rules of the experiment document.

They run on the raw document, next to the structural validation, so that one pass
reports every problem at once: a duplicate id is reported even when another subject
has a typo in an unrelated field.

`CROSS_FIELD_RULES` lists every rule a Kubernetes structural schema cannot express
(these, and the few single-field checks a pattern cannot say), so the operator knows
what it must check beyond the CRD; tests/spec/test_schema.py keeps the list complete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from maka_eval.errors import Problem
from maka_eval.spec import ids
from maka_eval.spec.base import ValueRule, nul_problem
from maka_eval.spec.egress import block_entry_problem, subject_egress_problems
from maka_eval.spec.metering import model_pattern_problem
from maka_eval.spec.paths import normal_task_dir, task_path_problem


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule the CRD schema cannot express; the operator checks it (via the loader)."""

    name: str
    description: str
    checks: tuple[ValueRule, ...] = ()
    """Single-value checks (base.Check) this rule stands for where no schema keyword can."""


CROSS_FIELD_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule("unique-subject-ids", "subjects[].id are unique in the experiment."),
    CrossFieldRule("unique-task-ids", "tasks[].id are unique in the experiment."),
    CrossFieldRule(
        "distinct-task-directories",
        "No two tasks name the same folder (path or id, compared after normalizing './', "
        "'..' and a trailing '/'; reading the tasks compares their real paths too).",
    ),
    CrossFieldRule(
        "task-path-inside-benchmark",
        "tasks[].path is relative and stays inside the benchmark folder, also after "
        "symlinks are resolved when the tasks are read.",
        checks=(task_path_problem,),
    ),
    CrossFieldRule("credentials-declared-once", "A subject declares each credential name once."),
    CrossFieldRule(
        "bindings-name-declared-credentials",
        "Each config.credentialBindings value is a credential the same subject declares.",
    ),
    CrossFieldRule(
        "binding-targets-are-free",
        "A binding target is neither set in config.env nor another declared credential "
        "passed under its own name.",
    ),
    CrossFieldRule(
        "credentials-not-in-env",
        "A declared credential gets no literal value in config.env (secrets never come "
        "from the spec).",
    ),
    CrossFieldRule(
        "reserved-env-names",
        "config.env and config.credentialBindings do not name a variable maka-eval sets for "
        "every subject (engine/launch.py: FIXED_ENV, PATH/HOME/TMPDIR, MAKA_EVAL_*).",
        checks=(ids.reserved_env_problem,),
    ),
    CrossFieldRule(
        "env-map-keys-are-env-names",
        "Keys of config.env and config.credentialBindings are valid environment variable "
        "names (a structural schema cannot constrain map keys).",
        checks=(ids.env_name_problem,),
    ),
    CrossFieldRule(
        "runtime-host-for-maka",
        "executor.config.runtimeHost is required when any subject has kind 'maka'.",
    ),
    CrossFieldRule(
        "kubernetes-executor-maps",
        "Keys of executor.config.taskImages are task ids of the experiment, and keys of "
        "executor.config.credentials are credentials some subject declares.",
        checks=(ids.id_problem, ids.env_name_problem),
    ),
    CrossFieldRule(
        "subject-fields-per-kind",
        "A subject has exactly the fields of its kind: external needs config.command, maka "
        "needs config.profile, oracle and nop take no config fields (the CRD merges the kinds "
        "into one object).",
    ),
    CrossFieldRule(
        "egress-is-executor-configuration",
        "A subject's config.env and config.credentialBindings name no proxy or CA variable "
        "(HTTP_PROXY, NO_PROXY, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, ... in any case): egress "
        "is executor.config.egress, shared by all arms.",
    ),
    CrossFieldRule(
        "egress-block-entries",
        "Each executor.config.egress.block entry parses: a host, a host and path prefix, or "
        "re:<regex> that compiles and does not match the empty text.",
        checks=(block_entry_problem,),
    ),
    CrossFieldRule(
        "metering-price-model-names",
        "Keys of metering.prices are model names or prefixes ending in '*' (a structural "
        "schema cannot constrain map keys).",
        checks=(model_pattern_problem,),
    ),
    CrossFieldRule(
        "no-nul-bytes",
        "Commands, arguments, environment values and other texts contain no NUL byte.",
        checks=(nul_problem,),
    ),
)


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


def _task_dir(task: Mapping[str, Any]) -> tuple[str, str] | None:
    """(normal folder, field naming it) of a task, or None when it names none validly."""
    path = task.get("path")
    if path is not None:
        if not isinstance(path, str) or not path.strip() or task_path_problem(path):
            return None  # reported on its own
        return normal_task_dir(path), "path"
    task_id = task.get("id")
    return (normal_task_dir(task_id), "id") if isinstance(task_id, str) and task_id else None


def _unique_task_dirs(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    first: dict[str, int] = {}
    for i, task in _items(doc, "tasks"):
        found = _task_dir(task)
        if found is None:
            continue
        folder, field = found
        if folder not in first:
            first[folder] = i
            continue
        yield Problem(
            f"{prefix}tasks[{i}].{field}",
            f"uses the same task directory '{folder}' as {prefix}tasks[{first[folder]}]; "
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
    if not isinstance(executor, Mapping) or executor.get("kind") not in ("local", "kubernetes"):
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


def _unique_subject_ids(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    return _unique_ids(doc, "subjects", prefix)


def _unique_task_ids(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    return _unique_ids(doc, "tasks", prefix)


def _subject_environments(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    for i, subject in _items(doc, "subjects"):
        yield from _subject_environment(subject, f"{prefix}subjects[{i}]")


def _kubernetes_maps(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    executor = doc.get("executor")
    if not isinstance(executor, Mapping) or executor.get("kind") != "kubernetes":
        return
    config = executor.get("config")
    if not isinstance(config, Mapping):
        return
    where = f"{prefix}executor.config"
    task_ids = [t.get("id") for _, t in _items(doc, "tasks")]
    images = config.get("taskImages")
    for key in images if isinstance(images, Mapping) else ():
        if key not in task_ids:
            known = ", ".join(f"'{t}'" for t in task_ids if isinstance(t, str))
            yield Problem(f"{where}.taskImages.{key}", f"no task has id '{key}'; tasks: {known}")
    declared = {
        c
        for _, s in _items(doc, "subjects")
        for c in (s.get("credentials") or ())
        if isinstance(c, str)
    }
    credentials = config.get("credentials")
    for key in credentials if isinstance(credentials, Mapping) else ():
        if key not in declared:
            yield Problem(
                f"{where}.credentials.{key}",
                f"no subject declares credential '{key}'; declare it in a subject's "
                "credentials or remove this entry",
            )


DocumentCheck = Callable[[Mapping[str, Any], str], Iterable[Problem]]

DOCUMENT_CHECKS: tuple[tuple[tuple[str, ...], DocumentCheck], ...] = (
    (("unique-subject-ids",), _unique_subject_ids),
    (("unique-task-ids",), _unique_task_ids),
    (("distinct-task-directories",), _unique_task_dirs),
    (
        (
            "credentials-declared-once",
            "bindings-name-declared-credentials",
            "binding-targets-are-free",
            "credentials-not-in-env",
        ),
        _subject_environments,
    ),
    (("runtime-host-for-maka",), _runtime_host),
    (("kubernetes-executor-maps",), _kubernetes_maps),
    (("egress-is-executor-configuration",), subject_egress_problems),
)
"""Every check `cross_field_problems` runs, with the CROSS_FIELD_RULES it enforces."""


def cross_field_problems(spec: Mapping[str, Any], prefix: str) -> list[Problem]:
    """Problems that involve more than one field; `prefix` is '' or 'spec.'."""
    problems: list[Problem] = []
    for _, check in DOCUMENT_CHECKS:
        problems += check(spec, prefix)
    return problems
