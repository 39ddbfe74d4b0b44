"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _work_dir(tmp_path, monkeypatch):
    """Attempt workspaces of each test live in its own temporary folder."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("MAKA_EVAL_WORK_DIR", str(work))
    return work


@pytest.fixture(autouse=True)
def key_dir(tmp_path, monkeypatch):
    """Each test seals its records with a key of its own, in a folder outside its run
    and work folders (never the user's key folder): made on first use, as a real one."""
    folder = tmp_path / "keys"
    monkeypatch.setenv("MAKA_EVAL_KEY_DIR", str(folder))
    return folder
