"""Harbor-format task directories: what a task is made of, read from disk.

A task directory holds `instruction.md`, an optional `task.toml`, an optional
`environment/` (files placed in the workspace), `tests/test.sh` (the verifier) and an
optional `solution/solve.sh` (for the oracle). Keys of task.toml this executor does not
use are ignored, as Harbor ignores them.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maka_eval.errors import Problem, TaskError
from maka_eval.spec.experiment import Experiment

IMAGE_BUILD_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml", "compose.yaml")


@dataclass(frozen=True)
class TaskDefinition:
    """One task as found on disk, with a digest of its whole directory."""

    id: str
    root: Path
    instruction_file: Path
    tests_dir: Path
    environment_dir: Path | None
    solution_dir: Path | None
    agent_timeout_sec: float | None
    verifier_timeout_sec: float | None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)
    docker_image: str | None = None
    image_build_file: str | None = None
    digest: str = ""


def directory_digest(root: Path) -> str:
    """sha256 over every file's relative path, executable bit and content, in path order.

    Symlinks are followed (a linked `tests/` folder is part of the task: a changed
    verifier must change the digest); a link back to a folder above it is recorded, not
    followed. Only regular files are read: a FIFO or device is recorded by its type.
    """
    digest = hashlib.sha256()
    info = root.stat()
    _digest_folder(digest, root, "", frozenset({(info.st_dev, info.st_ino)}))
    return "sha256:" + digest.hexdigest()


def _digest_folder(
    digest: Any, folder: Path, prefix: str, ancestors: frozenset[tuple[int, int]]
) -> None:
    # The files of a folder, then its subfolders, each in name order (the order os.walk
    # gave before links were followed, so digests of link-free tasks did not change).
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        digest.update(f"{prefix}\0unreadable\0".encode())
        return
    files: list[tuple[str, os.stat_result | None]] = []
    folders: list[tuple[str, os.stat_result]] = []
    for name in names:
        try:
            info: os.stat_result | None = (folder / name).stat()
        except OSError:  # a dangling link or a link loop
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode):
            folders.append((name, info))
        else:
            files.append((name, info))
    for name, info in files:
        path = folder / name
        digest.update(f"{prefix}{name}\0{int(os.access(path, os.X_OK))}\0".encode())
        if info is None:
            target = os.readlink(path) if path.is_symlink() else ""
            digest.update(b"dangling\0" + target.encode())
        elif stat.S_ISREG(info.st_mode):
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 16), b""):
                    digest.update(chunk)
        else:
            digest.update(f"special\0{stat.S_IFMT(info.st_mode):o}".encode())
        digest.update(b"\0")
    for name, info in folders:
        key = (info.st_dev, info.st_ino)
        if key in ancestors:
            digest.update(f"{prefix}{name}/\0cycle\0".encode())
            continue
        _digest_folder(digest, folder / name, f"{prefix}{name}/", ancestors | {key})


def _timeout(table: Any, where: str, problems: list[Problem]) -> float | None:
    if not isinstance(table, Mapping) or "timeout_sec" not in table:
        return None
    value = table["timeout_sec"]
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        problems.append(Problem(where, f"timeout_sec must be a positive number, got {value!r}"))
        return None
    return float(value)


def _env(table: Any, where: str, problems: list[Problem]) -> dict[str, str]:
    if not isinstance(table, Mapping):
        return {}
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        problems.append(Problem(where, "env must be a table of string values"))
        return {}
    return dict(env)


def _multi_step(toml_path: Path) -> Problem | None:
    """Why a multi-step task (`[[steps]]` in task.toml) cannot run yet, or None."""
    try:
        config = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None  # missing or broken: load_task reports it
    if "steps" not in config:
        return None
    count = len(config["steps"]) if isinstance(config["steps"], list) else "several"
    return Problem(
        "",
        f"{toml_path} defines {count} [[steps]]: multi-step tasks are not supported by "
        "maka-eval yet; run this task with Harbor itself, or leave it out of the experiment",
    )


def load_task(task_id: str, root: Path, where: str) -> tuple[TaskDefinition | None, list[Problem]]:
    """Read one task directory; return it (or None) and the problems found."""
    problems: list[Problem] = []
    if not root.is_dir():
        return None, [Problem(where, f"task directory {root} does not exist; check the path")]
    steps = _multi_step(root / "task.toml")
    if steps is not None:
        # Each step has its own instruction and tests: checking the single-step files
        # would only produce misleading messages.
        return None, [Problem(where, steps.message)]
    instruction = root / "instruction.md"
    if not instruction.is_file():
        problems.append(Problem(where, f"{instruction} is missing; every task needs one"))
    elif not instruction.read_text(encoding="utf-8", errors="replace").strip():
        problems.append(Problem(where, f"{instruction} is empty; write the task's instruction"))
    test_script = root / "tests" / "test.sh"
    if not test_script.is_file():
        problems.append(Problem(where, f"{test_script} is missing; the verifier runs it"))

    config: dict[str, Any] = {}
    toml_path = root / "task.toml"
    if toml_path.is_file():
        try:
            config = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            problems.append(Problem(str(toml_path), f"not valid TOML: {exc}"))

    agent_timeout = _timeout(config.get("agent"), f"{toml_path} [agent]", problems)
    verifier_timeout = _timeout(config.get("verifier"), f"{toml_path} [verifier]", problems)
    verifier_env = _env(config.get("verifier"), f"{toml_path} [verifier]", problems)
    solution_env = _env(config.get("solution"), f"{toml_path} [solution]", problems)
    environment = (
        config.get("environment") if isinstance(config.get("environment"), Mapping) else {}
    )
    assert isinstance(environment, Mapping)
    image = environment.get("docker_image")

    environment_dir = root / "environment"
    build_file = next(
        (name for name in IMAGE_BUILD_FILES if (environment_dir / name).is_file()), None
    )
    solution_dir = root / "solution"
    if problems:
        return None, problems
    return (
        TaskDefinition(
            id=task_id,
            root=root,
            instruction_file=instruction,
            tests_dir=root / "tests",
            environment_dir=environment_dir if environment_dir.is_dir() else None,
            solution_dir=solution_dir if (solution_dir / "solve.sh").is_file() else None,
            agent_timeout_sec=agent_timeout,
            verifier_timeout_sec=verifier_timeout,
            verifier_env=verifier_env,
            solution_env=solution_env,
            docker_image=image if isinstance(image, str) and image else None,
            image_build_file=build_file,
            digest=directory_digest(root),
        ),
        [],
    )


def benchmark_root(experiment: Experiment, base_dir: Path) -> Path:
    """The folder holding the task directories."""
    return (base_dir / experiment.spec.benchmark.config.path).resolve()


def load_tasks(
    experiment: Experiment, base_dir: Path, prefix: str = ""
) -> dict[str, TaskDefinition]:
    """Read every task of the experiment; raise TaskError naming each problem."""
    root = benchmark_root(experiment, base_dir)
    if not root.is_dir():
        raise TaskError(
            "the benchmark's task folder is missing:",
            [
                Problem(
                    f"{prefix}benchmark.config.path",
                    f"{root} is not a directory; the path is relative to the experiment file",
                )
            ],
        )
    tasks: dict[str, TaskDefinition] = {}
    problems: list[Problem] = []
    seen: dict[Path, int] = {}
    for index, task in enumerate(experiment.spec.tasks):
        where = f"{prefix}tasks[{index}]"
        folder = root / task.directory_name
        real = folder.resolve()  # symlinks too: the spec's lexical check cannot see them
        if real == root or not real.is_relative_to(root):
            problems.append(
                Problem(
                    f"{where}.path",
                    f"{folder} resolves to {real}, outside the benchmark folder {root}; "
                    "move the task inside it or fix the symlink",
                )
            )
            continue
        if real in seen:
            problems.append(
                Problem(
                    f"{where}.path",
                    f"{folder} is the same task directory as {prefix}tasks[{seen[real]}] "
                    f"(both are {real}); each task must be a different directory",
                )
            )
            continue
        seen[real] = index
        definition, found = load_task(task.id, real, where)
        problems += found
        if definition is not None:
            tasks[task.id] = definition
    if problems:
        raise TaskError(f"{len(problems)} problem(s) with the task directories:", problems)
    return tasks
