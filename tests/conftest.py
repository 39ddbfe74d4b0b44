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
