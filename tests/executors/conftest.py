"""Installs the toy third-party executor (tests/fixtures/toy_executor) with pip.

Like any plug-in it is a separate distribution: pip builds it and installs it into a
target folder (cached by the fixture's digest under ~/.cache/maka-eval/plugins/), whose
dist-info carries the `maka_eval.executors` entry point. Tests put that folder on the
path (sys.path in-process, PYTHONPATH for `maka-eval` subprocesses), so the executor is
found by real entry-point discovery, exactly as an installed package would be.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_eval.executors import registry
from tests.helpers import install_fixture

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "toy_executor"


def install_toy() -> Path:
    """The folder the toy executor is installed in (built once per fixture version)."""
    return install_fixture(FIXTURE, "toy")


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
