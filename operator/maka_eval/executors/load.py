"""Loading an experiment on this machine: the document's own checks, then the executor's.

What the document says is checked by the spec (spec.load). What depends on the machine
is checked here, above the executor registry, which the spec never imports:
`executor.kind` is 'local', 'kubernetes' or a kind an installed plug-in registers in the
'maka_eval.executors' entry-point group, and a plug-in's own model and rules validate its
`executor.config` (docs/executors.md). The CRD lists only the built-in kinds: the
operator runs kind 'kubernetes'. Every problem is reported at once, with its JSON path
and the fix; nothing is returned unless the whole document is valid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from maka_eval.errors import Problem
from maka_eval.executors.registry import (
    BUILTIN_KINDS,
    ExecutorLoadError,
    installed,
    kind_problem,
    load,
)
from maka_eval.spec.experiment import Experiment, PluginExecutor
from maka_eval.spec.load import (
    Form,
    LoadedExperiment,
    check_document,
    invalid_experiment,
    parse_experiment_text,
    read_experiment_file,
)
from maka_eval.spec.problems import problems_from


def experiment_from_data(
    data: Any, source: str = "<experiment>", *, frozen: bool = False
) -> tuple[Experiment, Form]:
    """Validate already-parsed data; raise SpecError listing every problem.

    `frozen`: the document is a run's experiment.json, validated when it was frozen; its
    executor plug-in need not be installed here to read the run's records and results.
    """
    experiment, form, problems = check_document(data, source)
    prefix = "spec." if form == "kubernetes" else ""
    kind = _executor_kind(data, form)
    wrong_kind = kind_problem(kind, frozen=frozen) if kind is not None else None
    if wrong_kind is not None:
        problems.append(Problem(f"{prefix}executor.kind", wrong_kind))
    elif experiment is not None and isinstance(experiment.spec.executor, PluginExecutor):
        experiment, more = _plugin_config(experiment, prefix, frozen=frozen)
        problems += more
    if problems or experiment is None:
        raise invalid_experiment(source, problems)
    return experiment, form


def _executor_kind(data: Mapping[str, Any], form: Form) -> str | None:
    """The plug-in kind the document names (None: a built-in kind, or none readable,
    which the document's own checks report)."""
    doc = data.get("spec") if form == "kubernetes" else data
    executor = doc.get("executor") if isinstance(doc, Mapping) else None
    kind = executor.get("kind") if isinstance(executor, Mapping) else None
    return kind if isinstance(kind, str) and kind not in BUILTIN_KINDS else None


def _plugin_config(
    experiment: Experiment, prefix: str, *, frozen: bool
) -> tuple[Experiment, list[Problem]]:
    """A plug-in executor's own config and rules. Its config is parsed by its own model
    and stored with its defaults filled in (they are part of the frozen experiment)."""
    spec = experiment.spec
    executor = spec.executor
    assert isinstance(executor, PluginExecutor)
    if frozen and executor.kind not in installed():
        return experiment, []  # a frozen run's experiment, read without its plug-in
    config_path = f"{prefix}executor.config"
    problems: list[Problem] = []
    try:
        plugin = load(executor.kind)
        model = plugin.config_model
        try:
            config = model.model_validate_json(json.dumps(executor.config))
        except ValidationError as exc:
            return experiment, problems_from(exc, model, tuple(config_path.split(".")))
        problems += [
            Problem(p.where if prefix else p.where.removeprefix("spec."), p.message)
            for p in plugin.validate(config, experiment)
        ]
    except ExecutorLoadError as exc:
        return experiment, [Problem(f"{prefix}executor.kind", str(exc))]
    filled = PluginExecutor(
        kind=executor.kind, config=config.model_dump(mode="json", by_alias=True)
    )
    new_spec = spec.model_copy(update={"executor": filled})
    return experiment.model_copy(update={"spec": new_spec}), problems


def load_experiment_text(text: str, source: str, base_dir: Path) -> LoadedExperiment:
    """Parse and validate document text; `source` names it in messages."""
    experiment, form = experiment_from_data(parse_experiment_text(text, source), source)
    return LoadedExperiment(experiment, form, source, base_dir)


def load_experiment_file(path: str | Path) -> LoadedExperiment:
    """Read, parse and validate an experiment file (a regular file of at most 1 MiB)."""
    file = Path(path)
    return load_experiment_text(read_experiment_file(file), str(file), file.resolve().parent)
