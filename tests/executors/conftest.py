"""Installs the toy third-party executor (tests/fixtures/toy_executor) with pip.

Like any plug-in it is a separate distribution: pip builds it and installs it into a
target folder (cached by the fixture's digest under ~/.cache/maka-eval/plugins/), whose
dist-info carries the `maka_eval.executors` entry point. Tests put that folder on the
path (sys.path in-process, PYTHONPATH for `maka-eval` subprocesses), so the executor is
found by real entry-point discovery, exactly as an installed package would be.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_eval.executors import registry

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "toy_executor"


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def install_toy() -> Path:
    """The folder the toy executor is installed in (built once per fixture version)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "maka-eval"
    target = cache / "plugins" / f"toy-{_digest(FIXTURE)}"
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        source = Path(scratch) / "src"
        shutil.copytree(FIXTURE, source, ignore=shutil.ignore_patterns("__pycache__"))
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
                "pip could not build the toy executor fixture (it needs setuptools from the "
                f"package index or /opt/wheels): {result.stderr.strip()[-400:]}"
            )
        (staging / ".complete").write_text("")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


@pytest.fixture(scope="session")
def toy_path() -> Path:
    return install_toy()


@pytest.fixture
def toy(toy_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy executor installed and discoverable in this process."""
    monkeypatch.syspath_prepend(str(toy_path))
    registry.refresh()
    yield toy_path
    monkeypatch.undo()
    sys.modules.pop("maka_toy_executor", None)
    registry.refresh()
