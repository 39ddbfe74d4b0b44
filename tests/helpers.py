"""Building small experiments and Harbor-format tasks on disk for tests."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REWARD_ONE = '#!/bin/sh\necho 1 > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"\n'
REWARD_IF_DONE = (
    "#!/bin/sh\n"
    "if [ -f done.txt ]; then r=1; else r=0; fi\n"
    'echo $r > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"\n'
)


def write_script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def loaded_task(root: Path, toml: str, **task: Any) -> tuple[Any, list[Any]]:
    """`make_task(root, "t", toml=toml, ...)`, then `load_task` of it with no host
    environment: (the definition or None, the problems)."""
    from maka_eval.spec.task_directory import load_task

    make_task(root, "t", toml=toml, **task)
    return load_task("t", root / "t", "tasks[0]", host_env={})


def sandbox_layout(root: Path) -> Any:
    """A process or container sandbox's Layout over fresh folders under `root`."""
    from maka_eval.sandbox.base import Layout

    for name in ("ws", "home", "tmp", "agent", "tests", "logs"):
        (root / name).mkdir(parents=True)
    (root / "instruction.md").write_text("x")
    return Layout(
        workspace=str(root / "ws"),
        home=str(root / "home"),
        tmp=str(root / "tmp"),
        frame_dir=None,
        instruction=str(root / "instruction.md"),
        agent_logs=str(root / "agent"),
        tests=str(root / "tests"),
        verifier_logs=str(root / "logs"),
    )


def make_task(
    root: Path,
    task_id: str,
    *,
    test_sh: str = REWARD_IF_DONE,
    solve_sh: str | None = "#!/bin/sh\ntouch done.txt\n",
    files: dict[str, str] | None = None,
    toml: str | None = None,
    instruction: str = "Create done.txt.",
) -> Path:
    task = root / task_id
    task.mkdir(parents=True)
    (task / "instruction.md").write_text(instruction + "\n")
    write_script(task / "tests" / "test.sh", test_sh)
    if solve_sh is not None:
        write_script(task / "solution" / "solve.sh", solve_sh)
    for name, content in (files or {}).items():
        target = task / "environment" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    if toml is not None:
        (task / "task.toml").write_text(toml)
    return task


BASE: dict[str, Any] = {
    "schemaVersion": "maka.eval.v1",
    "id": "exp",
    "benchmark": {"id": "bench", "version": "1", "kind": "directory", "config": {"path": "tasks"}},
    "executor": {"kind": "local"},
    "execution": {"maxConcurrentTaskGroups": 2, "maxInfraRetries": 1},
    "subjects": [
        {"id": "done", "kind": "external", "config": {"command": "touch", "args": ["done.txt"]}}
    ],
    "tasks": [{"id": "t1"}],
    "repetitions": 1,
    "verifier": {"kind": "harbor"},
}


# Plain processes: for tests that watch subjects from the host (pid files, shared logs).
PLAIN_PROCESSES: dict[str, Any] = {"kind": "local", "config": {"isolation": "none"}}


# The example mistake: a credential name with a space, in the second subject.
BAD_CREDENTIAL_SUBJECTS: list[dict[str, Any]] = [
    {"id": "a", "kind": "external", "config": {"command": "true"}},
    {"id": "b", "kind": "external", "credentials": ["my key"], "config": {"command": "true"}},
]


def spec(**changes: Any) -> dict[str, Any]:
    """A valid bare-form document with top-level fields replaced."""
    doc = copy.deepcopy(BASE)
    doc.update(copy.deepcopy(changes))
    return doc


def write_experiment(directory: Path, doc: dict[str, Any], name: str = "experiment.json") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(doc, indent=2))
    return path


def files_containing(root: Path, needle: bytes) -> list[Path]:
    """Every file under root whose bytes contain needle."""
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            if path.is_file() and needle in path.read_bytes():
                hits.append(path)
    return hits


def _fixture_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def install_fixture(fixture: Path, name: str) -> Path:
    """The folder a plug-in fixture (a separate distribution under tests/fixtures) is
    installed in with pip --target, built once per fixture version; its dist-info carries
    the entry points, so it is found exactly as an installed package would be."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "maka-eval"
    target = cache / "plugins" / f"{name}-{_fixture_digest(fixture)}"
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        source = Path(scratch) / "src"
        shutil.copytree(fixture, source, ignore=shutil.ignore_patterns("__pycache__"))
        staging = Path(scratch) / "target"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
                str(staging),
                str(source),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            pytest.skip(
                f"pip could not build the {name} fixture (it needs setuptools from the "
                f"package index or /opt/wheels): {result.stderr.strip()[-400:]}"
            )
        (staging / ".complete").write_text("")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def signal_pending(pid: int, signum: int) -> bool:
    """Whether `signum` was sent to `pid` and waits there (a stopped process holds a
    handled SIGTERM until it runs again): checked at once, no sleep for it to act."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    mask = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(mask & (1 << (signum - 1)))
