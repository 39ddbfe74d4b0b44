"""Load an experiment document (either form, YAML or JSON) into an `Experiment`.

Every problem is collected and reported at once with its JSON path and a fix; nothing
is returned unless the whole document is valid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from maka_eval.errors import Problem, SpecError
from maka_eval.spec.documents import DocumentError, parse_document
from maka_eval.spec.experiment import (
    API_VERSION,
    SCHEMA_VERSION,
    BareExperiment,
    Experiment,
    ExperimentSpec,
    KubernetesExperiment,
)
from maka_eval.spec.problems import problems_from
from maka_eval.spec.rules import cross_field_problems

Form = Literal["bare", "kubernetes"]


@dataclass(frozen=True)
class LoadedExperiment:
    """An experiment and where it came from (relative paths resolve from `base_dir`)."""

    experiment: Experiment
    form: Form
    source: str
    base_dir: Path


def _form_of(doc: Mapping[str, Any], source: str) -> Form:
    if "apiVersion" in doc or ("kind" in doc and "spec" in doc):
        return "kubernetes"
    if "schemaVersion" in doc:
        return "bare"
    raise SpecError(
        f"{source} is not an experiment document",
        [
            Problem(
                "",
                f"cannot tell the form: add 'schemaVersion: {SCHEMA_VERSION}' (bare form) or "
                f"'apiVersion: {API_VERSION}' with 'kind: Experiment' (Kubernetes form)",
            )
        ],
    )


def experiment_from_data(data: Any, source: str = "<experiment>") -> tuple[Experiment, Form]:
    """Validate already-parsed data; raise SpecError listing every problem."""
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{source} is not an experiment document",
            [Problem("", f"the document must be a mapping, got {type(data).__name__}")],
        )
    form = _form_of(data, source)
    try:
        text = json.dumps(data, default=str)
    except (TypeError, ValueError) as exc:  # pragma: no cover - parsers only yield JSON types
        raise SpecError(f"{source} cannot be read", [Problem("", str(exc))]) from None

    problems: list[Problem] = []
    experiment: Experiment | None = None
    if form == "bare":
        try:
            bare = BareExperiment.model_validate_json(text)
            spec_fields = {k: getattr(bare, k) for k in ExperimentSpec.model_fields}
            experiment = Experiment(id=bare.id, spec=ExperimentSpec(**spec_fields))
        except ValidationError as exc:
            problems += problems_from(exc, BareExperiment)
        problems += cross_field_problems(data, "")
    else:
        try:
            k8s = KubernetesExperiment.model_validate_json(text)
            experiment = Experiment(id=k8s.metadata.name, spec=k8s.spec)
        except ValidationError as exc:
            problems += problems_from(exc, KubernetesExperiment)
        spec = data.get("spec")
        if isinstance(spec, Mapping):
            problems += cross_field_problems(spec, "spec.")

    unique = list(dict.fromkeys(problems))
    if unique or experiment is None:
        count = len(unique)
        raise SpecError(
            f"{source} is not a valid experiment ({count} problem{'s' if count != 1 else ''}):",
            unique,
        )
    return experiment, form


def load_experiment_text(text: str, source: str, base_dir: Path) -> LoadedExperiment:
    """Parse and validate document text; `source` names it in messages."""
    try:
        data = parse_document(text, source)
    except DocumentError as exc:
        raise SpecError(f"{source} cannot be parsed:", [exc.problem]) from None
    experiment, form = experiment_from_data(data, source)
    return LoadedExperiment(experiment, form, source, base_dir)


def load_experiment_file(path: str | Path) -> LoadedExperiment:
    """Read, parse and validate an experiment file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(
            f"{file}: no such file", [Problem(str(file), "check the path to the experiment")]
        ) from None
    except IsADirectoryError:
        raise SpecError(
            f"{file} is a directory", [Problem(str(file), "name the experiment file itself")]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{file} cannot be read", [Problem(str(file), str(exc))]) from None
    return load_experiment_text(text, str(file), file.resolve().parent)
