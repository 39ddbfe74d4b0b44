"""Task paths: relative to the benchmark folder, never leaving it, compared in one form.

`a`, `./a`, `a/` and `b/../a` name one folder, so duplicates are found on the normal
form; the loader then resolves symlinks and checks the real folder again.
"""

from __future__ import annotations

import posixpath


def normal_task_dir(value: str) -> str:
    """The lexical normal form of a task folder (`./a/` and `a` are both `a`)."""
    return posixpath.normpath(value)


def task_path_problem(value: str) -> str | None:
    """Why `value` cannot name a task folder inside the benchmark folder, or None."""
    if value.startswith("/"):
        return (
            f"'{value}' is an absolute path; give the task folder relative to the "
            "benchmark folder (benchmark.config.path)"
        )
    normal = normal_task_dir(value)
    if normal == ".." or normal.startswith("../"):
        return f"'{value}' leaves the benchmark folder; name a folder inside it"
    if normal == ".":
        return f"'{value}' is the benchmark folder itself; name the task's own folder inside it"
    return None
