"""The machine's refusals (disk full, permissions, a failed copy) are one plain message
naming the path, never a traceback or a raw shutil.Error list."""

from __future__ import annotations

import errno
import shutil
import sys

import pytest

from maka_eval.cli import main as cli_main


def run_main(monkeypatch, capsys, exc: BaseException) -> tuple[int, str]:
    def fail(*_args, **_kwargs):
        raise exc

    monkeypatch.setattr(cli_main, "RunDirectorySource", fail)
    monkeypatch.setattr(sys, "argv", ["maka-eval", "status", "runs/x"])
    with pytest.raises(SystemExit) as info:
        cli_main.main()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return int(info.value.code or 0), " ".join(err.split())


def test_no_space_left_names_the_file(monkeypatch, capsys):
    exc = OSError(errno.ENOSPC, "No space left on device", "/runs/x/cells/a/0001.json")
    code, err = run_main(monkeypatch, capsys, exc)
    assert code == 2
    assert "no space left on device while writing /runs/x/cells/a/0001.json" in err


def test_an_os_error_with_two_paths_names_both(monkeypatch, capsys):
    exc = PermissionError(errno.EACCES, "Permission denied", "/a/src", None, "/b/dst")
    code, err = run_main(monkeypatch, capsys, exc)
    assert code == 2
    assert "permission denied: /a/src -> /b/dst" in err


def test_a_shutil_error_is_one_plain_message(monkeypatch, capsys):
    exc = shutil.Error(
        [
            ("/tasks/a/env/big", "/work/a/big", "[Errno 28] No space left on device"),
            ("/tasks/a/env/b2", "/work/a/b2", "[Errno 28] No space left on device"),
        ]
    )
    code, err = run_main(monkeypatch, capsys, exc)
    assert code == 2
    assert "no space left on device while writing /work/a/big" in err
    assert "and 1 more file" in err
    assert "[(" not in err and "Errno" not in err


def test_a_shutil_error_of_another_kind_names_source_and_target(monkeypatch, capsys):
    exc = shutil.Error([("/tasks/a/x", "/work/x", "[Errno 13] Permission denied: '/work/x'")])
    _, err = run_main(monkeypatch, capsys, exc)
    assert "could not copy /tasks/a/x to /work/x: permission denied" in err
