"""The bridge runs in Harbor's interpreter: the standard library and Harbor only."""

from __future__ import annotations

import ast
import subprocess
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
    # strict_json needs only the standard library (jiter, when there, is only faster), so
    # the fallback import works in Harbor's Python.
    tops = {module.split(".")[0] for module in _imports(folder / PACKAGE / "strict_json.py")}
    assert tops <= set(sys.stdlib_module_names) | {
        "__future__",
        "jiter",
    }
    without_jiter = (
        "import sys; sys.modules['jiter'] = None; "  # importing it now raises ImportError
        f"sys.path.insert(0, {str(folder / PACKAGE)!r}); import strict_json; "
        "assert strict_json._jiter_from_json is None; "
        "print(strict_json.loads(b'{\"a\": [1]}'))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", without_jiter], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'a': [1]}"
