"""Read an experiment document (either form, YAML or JSON) and check it by its own rules.

Every problem is collected with its JSON path and a fix. What depends on the machine
rather than the document -- whether `executor.kind` is installed here, and a plug-in's
own checks of its config -- is the loader's (executors.load), which every caller uses:
it sits above the executor registry, which the spec never imports.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from maka_eval.errors import Problem, SpecError
from maka_eval.spec.documents import (
    MAX_DOCUMENT_BYTES,
    DocumentError,
    parse_document,
    size_problem,
)
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


def check_document(data: Any, source: str) -> tuple[Experiment | None, Form, list[Problem]]:
    """Check already-parsed data by the document's own rules: the experiment (None when
    its fields or cross-field rules fail), its form, and every problem found. SpecError
    when `data` is not an experiment document at all."""
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

    if experiment is None or problems:
        return None, form, problems
    return (
        experiment,
        form,
        _task_source_problems(experiment, "spec." if form == "kubernetes" else ""),
    )


def invalid_experiment(source: str, problems: list[Problem]) -> SpecError:
    """The error listing every problem of an experiment document, each once."""
    unique = list(dict.fromkeys(problems))
    count = len(unique)
    return SpecError(
        f"{source} is not a valid experiment ({count} problem{'s' if count != 1 else ''}):",
        unique,
    )


def _task_source_problems(experiment: Experiment, prefix: str) -> list[Problem]:
    """Where the tasks come from: a folder, or the document itself (inline)."""
    problems: list[Problem] = []
    spec = experiment.spec
    benchmark = spec.benchmark
    path = f"{prefix}benchmark.config.path"
    if benchmark.source == "directory" and benchmark.config.path is None:
        problems.append(Problem(path, "required when benchmark.kind is 'directory'; add it"))
    if benchmark.source == "inline" and benchmark.config.path is not None:
        problems.append(
            Problem(path, "inline tasks have no task folder: remove it, or set kind: directory")
        )
    for i, task in enumerate(spec.tasks):
        where = f"{prefix}tasks[{i}]"
        if benchmark.source == "inline":
            if spec.executor.kind in ("local", "kubernetes"):
                problems.append(
                    Problem(
                        where,
                        f"inline task '{task.id}' cannot run under executor.kind "
                        f"'{spec.executor.kind}', which runs Harbor-format task directories: "
                        "put it in a folder (instruction.md, tests/test.sh) under "
                        "benchmark.config.path, or use an executor that takes inline tasks "
                        "(docs/executors.md)",
                    )
                )
            if task.input is None:
                problems.append(
                    Problem(f"{where}.input", "required for inline tasks (the instruction)")
                )
            if task.path is not None:
                problems.append(
                    Problem(f"{where}.path", "inline tasks have no directory; remove it")
                )
        elif task.input is not None:
            problems.append(
                Problem(
                    f"{where}.input",
                    "a task directory's instruction is its instruction.md; remove input "
                    "(or make the benchmark inline)",
                )
            )
    return problems


def parse_experiment_text(text: str, source: str) -> Any:
    """Parse document text (YAML or JSON); SpecError naming `source` if it cannot be."""
    try:
        return parse_document(text, source)
    except DocumentError as exc:
        raise SpecError(f"{source} cannot be parsed:", [exc.problem]) from None


def _read_bounded(file: Path) -> bytes:
    """The bytes of a regular file of at most MAX_DOCUMENT_BYTES, never blocking.

    O_NONBLOCK makes opening a FIFO return at once; fstat then refuses anything but a
    regular file (a FIFO, /dev/zero, a socket), and at most the cap plus one byte is read
    in case the file grew after fstat.
    """
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SpecError(
            f"{file}: no such file", [Problem(str(file), "check the path to the experiment")]
        ) from None
    except OSError as exc:
        raise SpecError(f"{file} cannot be read", [Problem(str(file), str(exc))]) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SpecError(
                f"{file} is a directory", [Problem(str(file), "name the experiment file itself")]
            )
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(
                f"{file} is not a regular file",
                [
                    Problem(
                        str(file),
                        "is not a regular file (a pipe, device or socket); save the "
                        "experiment to a file and name that",
                    )
                ],
            )
        too_big = size_problem(info.st_size, str(file))
        if too_big:
            raise SpecError(f"{file} is too large", [too_big])
        chunks: list[bytes] = []
        left = MAX_DOCUMENT_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise SpecError(f"{file} cannot be read", [Problem(str(file), str(exc))]) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    too_big = size_problem(len(data), str(file))
    if too_big:
        raise SpecError(f"{file} is too large", [too_big])
    return data


def read_experiment_file(path: str | Path) -> str:
    """The text of an experiment file (a regular file of at most 1 MiB, UTF-8)."""
    file = Path(path)
    try:
        return _read_bounded(file).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{file} cannot be read", [Problem(str(file), str(exc))]) from None
