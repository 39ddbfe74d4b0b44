"""The bridge runs in Harbor's interpreter: the standard library and Harbor only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from maka_eval.harbor.worker import BRIDGE_DIR, PACKAGE, stage_bridge


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_bridge_imports_only_the_standard_library_and_harbor():
    allowed_maka = {"maka_eval"}  # `from maka_eval import strict_json`, staged alongside
    for path in sorted(BRIDGE_DIR.glob("*.py")):
        for module in _imports(path):
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or top == "harbor" or module in allowed_maka, (
                f"{path.name} imports {module}"
            )


def test_staging_copies_a_self_contained_package(tmp_path):
    folder = stage_bridge(tmp_path)
    names = {p.name for p in (folder / PACKAGE).iterdir()}
    assert {"__init__.py", "agent.py", "environment.py", "worker.py", "strict_json.py"} <= names
    # strict_json is standard library only, so the fallback import works in Harbor's Python.
    assert _imports(folder / PACKAGE / "strict_json.py") <= set(sys.stdlib_module_names) | {
        "__future__"
    }
