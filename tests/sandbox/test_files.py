"""Copying artifacts out of folders a subject could write, attacked for real: links the
subject planted (as the last component, in the middle of the path, inside a folder),
'..' in the path, and a file swapped for a FIFO between the look and the open. Nothing
outside the folder is ever copied, and nothing hangs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from maka_eval.sandbox import files
from maka_eval.sandbox.files import copy_out, copy_path_out

SECRET = "host-secret-4f1d"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the subject's folder, a folder outside it holding a secret, the artifacts)."""
    inside = tmp_path / "workspace"
    outside = tmp_path / "host"
    inside.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    return inside, outside, tmp_path / "artifacts"


def _everything_under(folder: Path) -> str:
    if not folder.exists():
        return ""
    return "".join(p.read_text() for p in sorted(folder.rglob("*")) if p.is_file())


def test_a_link_in_the_middle_of_the_path_is_not_followed(layout):
    inside, outside, artifacts = layout
    (inside / "out").symlink_to(outside)
    why = copy_path_out(str(inside), "out/secret.txt", artifacts / "a", 1 << 20)
    assert why is not None and "link" in why
    assert not (artifacts / "a").exists()


def test_a_link_as_the_last_component_is_not_followed(layout):
    inside, outside, artifacts = layout
    (inside / "result.txt").symlink_to(outside / "secret.txt")
    (inside / "results").symlink_to(outside)
    for name in ("result.txt", "results"):
        why = copy_path_out(str(inside), name, artifacts / name, 1 << 20)
        assert why is not None and "link" in why
    assert SECRET not in _everything_under(artifacts)


def test_links_inside_a_collected_folder_are_skipped(layout):
    inside, outside, artifacts = layout
    folder = inside / "logs"
    folder.mkdir()
    (folder / "ok.txt").write_text("mine")
    (folder / "secret.txt").symlink_to(outside / "secret.txt")
    (folder / "host").symlink_to(outside)
    assert copy_path_out(str(inside), "logs", artifacts / "logs", 1 << 20) is None
    assert sorted(p.name for p in (artifacts / "logs").iterdir()) == ["ok.txt"]
    assert copy_out(str(folder), artifacts / "again", 1 << 20) == len("mine")
    assert SECRET not in _everything_under(artifacts)


def test_dot_dot_never_leaves_the_folder(layout):
    inside, _, artifacts = layout
    why = copy_path_out(str(inside), "../host/secret.txt", artifacts / "x", 1 << 20)
    assert why is not None and "'..'" in why
    assert not (artifacts / "x").exists()


def _fifo_after_the_look(monkeypatch, path: Path) -> None:
    """The subject swaps the regular file at `path` for a FIFO between the copier's stat
    and its open: the stat is made to see the file as it was."""
    before = os.stat(path, follow_symlinks=False)
    path.unlink()
    os.mkfifo(path)
    real_stat = os.stat

    def stale_stat(name, *args, **kwargs):
        if os.path.basename(str(name)) == path.name:
            return before
        return real_stat(name, *args, **kwargs)

    monkeypatch.setattr(files.os, "stat", stale_stat)


@pytest.mark.parametrize("whole_folder", [False, True])
def test_a_file_swapped_for_a_fifo_is_skipped_without_hanging(layout, monkeypatch, whole_folder):
    inside, _, artifacts = layout
    (inside / "logs").mkdir()
    fifo = inside / "logs" / "out.txt"
    fifo.write_text("was a file")
    _fifo_after_the_look(monkeypatch, fifo)
    results: list[object] = []
    if whole_folder:
        work = threading.Thread(
            target=lambda: results.append(copy_out(str(inside / "logs"), artifacts, 1 << 20)),
            daemon=True,
        )
    else:
        work = threading.Thread(
            target=lambda: results.append(
                copy_path_out(str(inside), "logs/out.txt", artifacts / "out.txt", 1 << 20)
            ),
            daemon=True,
        )
    work.start()
    work.join(10)
    if work.is_alive():  # stuck in open(): give it a writer so that the thread ends
        with open(fifo, "wb"):
            pass
        work.join(10)
        pytest.fail("copying waited for a writer on a FIFO the subject planted")
    monkeypatch.undo()  # the real stat again, for the checks
    assert results == [0] if whole_folder else results[0] is not None
    assert not (artifacts / "out.txt").exists()
