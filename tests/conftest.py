"""Shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _work_dir(tmp_path, monkeypatch):
    """Attempt workspaces of each test live in its own temporary folder."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("MAKA_EVAL_WORK_DIR", str(work))
    return work


@pytest.fixture(scope="session", autouse=True)
def _seal_keys(tmp_path_factory) -> Iterator[Path]:
    """The session's seal key folder (never the user's): records written by the tests
    are sealed with a key made there on first use, as a real one is. One for the whole
    session, as a user has one, so that runs made by module fixtures verify in every
    test that reads them; a test wanting another key sets MAKA_EVAL_KEY_DIR itself."""
    folder = tmp_path_factory.mktemp("keys") / "maka-eval"
    before = os.environ.get("MAKA_EVAL_KEY_DIR")
    os.environ["MAKA_EVAL_KEY_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("MAKA_EVAL_KEY_DIR", None)
        else:
            os.environ["MAKA_EVAL_KEY_DIR"] = before


@pytest.fixture
def key_dir() -> Path:
    """The seal key folder this test's records are sealed with."""
    return Path(os.environ["MAKA_EVAL_KEY_DIR"])


@pytest.fixture
def toy_sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy third-party sandbox backend (tests/fixtures/toy_sandbox), installed with
    pip and discoverable in this process through its entry point (kind `toy`)."""
    import sys

    from maka_eval.sandbox import backends
    from tests.helpers import install_fixture

    path = install_fixture(Path(__file__).parent / "fixtures" / "toy_sandbox", "toy-sandbox")
    monkeypatch.syspath_prepend(str(path))
    backends.refresh()
    yield path
    monkeypatch.undo()
    sys.modules.pop("maka_toy_sandbox", None)
    backends.refresh()
