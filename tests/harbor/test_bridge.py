"""The bridge runs in Harbor's interpreter: the standard library, Harbor and the staged
plan reader (the relay's own, standard library only) alone."""

from __future__ import annotations

import ast
import json
import stat
import subprocess
import sys
from pathlib import Path

from maka_eval.engine.classify import ResultContract
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.engine.modes import Isolation
from maka_eval.harbor.bridge.plan_file import PlanFile
from maka_eval.harbor.worker import BRIDGE_DIR, PACKAGE, PLAN_READER, stage_bridge
from maka_eval.relay.plan import AttemptPlan


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_bridge_imports_only_the_standard_library_harbor_and_the_plan_reader():
    for path in sorted(BRIDGE_DIR.glob("*.py")):
        for module in _imports(path):
            top = module.split(".")[0]
            staged = module.startswith("maka_eval") and _staged(module)
            assert top in sys.stdlib_module_names or top == "harbor" or staged, (
                f"{path.name} imports {module}, which is not staged for Harbor's interpreter"
            )


def _staged(module: str) -> bool:
    parts = module.split(".")[1:]
    return "/".join([*parts, "__init__.py"]) in PLAN_READER or (
        bool(parts) and "/".join(parts) + ".py" in PLAN_READER
    )


# Run with -S: no site-packages, so neither maka-eval as installed here nor jiter (the
# staged strict_json falls back to the standard library) can be found, as in Harbor's
# interpreter; only the staged folder and the standard library.
READ_PLAN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from maka_eval_harbor.plan_file import PlanFile
from pathlib import Path
order = PlanFile.read(Path(sys.argv[2]))
loaded = sorted(
    m.__file__[len(sys.argv[1]) + 1:] for n, m in sys.modules.items()
    if n == "maka_eval" or n.startswith(("maka_eval.", "maka_eval_harbor"))
)
foreign = sorted(
    n.split(".")[0] for n, m in sys.modules.items()
    if not n.startswith("maka_eval") and n != "__main__"
    and n.split(".")[0] not in sys.stdlib_module_names
)
print(json.dumps({"loaded": loaded, "foreign": foreign, "plan": order.plan.to_json(),
                  "credentials": dict(order.credentials), "kind": order.kind}))
"""


def _plan() -> AttemptPlan:
    return AttemptPlan(
        attempt_id="r/t::1::s/1",
        run_id="r",
        cell_id="t::1::s",
        task_id="t",
        repetition=1,
        subject_id="s",
        root="/tmp/a",
        artifacts_dir="/tmp/b",
        instruction_file="/tasks/t/instruction.md",
        tests_dir="/tasks/t/tests",
        environment_dir=None,
        subject=SubjectLaunch(("agent", "--x"), ResultContract.PROTOCOL_V1, env={"A": "1"}),
        agent_timeout_sec=30.0,
        verifier_timeout_sec=20.0,
        output_limit_bytes=1234,
        isolation=Isolation.AUTO,
    )


def test_the_staged_bridge_reads_the_plan_with_the_relays_reader_alone(tmp_path):
    folder = stage_bridge(tmp_path / "stage")
    plan_path = tmp_path / "plan.json"
    PlanFile(_plan(), "external", {"TOKEN": "s3cret"}, None, "Do it.", None).write(plan_path)
    # The plan file holds a credential: this user's alone, as the plan of old was.
    assert stat.S_IMODE(plan_path.stat().st_mode) == 0o600
    done = subprocess.run(
        [sys.executable, "-S", "-c", READ_PLAN, str(folder), str(plan_path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # The same plan came out, and the credentials beside it, not in it ...
    assert AttemptPlan.from_json(found["plan"]) == _plan()
    assert found["credentials"] == {"TOKEN": "s3cret"} and "s3cret" not in found["plan"]
    assert found["kind"] == "external"
    assert not plan_path.exists()  # read once, then gone
    # ... read by the staged files alone, and exactly the ones PLAN_READER stages.
    assert found["foreign"] == []
    reader = {f for f in found["loaded"] if f.startswith("maka_eval/")}
    assert reader == {f"maka_eval/{name}" for name in PLAN_READER}


def test_staging_copies_a_self_contained_package(tmp_path):
    folder = stage_bridge(tmp_path)
    names = {p.name for p in (folder / PACKAGE).iterdir()}
    assert {"__init__.py", "agent.py", "environment.py", "worker.py", "plan_file.py"} <= names
    staged = {str(p.relative_to(folder / "maka_eval")) for p in folder.rglob("maka_eval/**/*.py")}
    assert staged == set(PLAN_READER)
