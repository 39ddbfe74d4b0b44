"""The relay inside a Pod loads the standard library and maka-eval only.

The relay bundle is a frozen interpreter dropped into any task image: what it imports
at run time it must carry. Reading the task's own settings (task.toml) there once
pulled in pydantic and PyYAML through the spec package; this runs the relay's entry
and its Pod-side planning step in a fresh interpreter and checks neither is loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

FOREIGN = ("pydantic", "pydantic_core", "yaml")

PROBE = textwrap.dedent(
    """
    import json, sys
    from maka_eval.relay.__main__ import main  # the Pod's entry point
    from maka_eval.engine.classify import ResultContract
    from maka_eval.engine.launch import SubjectLaunch
    from maka_eval.engine.modes import Isolation
    from maka_eval.relay.plan import AttemptPlan, with_task_dir

    task_dir = sys.argv[1]
    plan = AttemptPlan(
        attempt_id="uid/c/1", run_id="r", cell_id="c", task_id="t", repetition=0,
        subject_id="s", root="/tmp/root", artifacts_dir="/tmp/art",
        instruction_file=task_dir + "/instruction.md", tests_dir=task_dir + "/tests",
        environment_dir=None, subject=SubjectLaunch(("true",), ResultContract.EXIT_CODE),
        agent_timeout_sec=900.0, verifier_timeout_sec=600.0, isolation=Isolation.AUTO,
        task_dir=task_dir,
    )
    done = with_task_dir(AttemptPlan.from_json(plan.to_json()))
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[2:]))
    print(json.dumps({"loaded": loaded, "agent": done.agent_timeout_sec,
                      "steps": len(done.steps)}))
    """
)


def _task(root: Path) -> Path:
    task = root / "task"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Do it.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text(
        '[agent]\ntimeout_sec = 42\n[environment]\nnetwork_mode = "no-network"\n'
        '[[steps]]\nname = "one"\n'
    )
    step = task / "steps" / "one"
    step.mkdir(parents=True)
    (step / "instruction.md").write_text("Step one.\n")
    (step / "tests").mkdir()
    (step / "tests" / "test.sh").write_text("#!/bin/sh\n")
    return task


def test_the_relay_reads_task_toml_without_pydantic_or_yaml(tmp_path: Path) -> None:
    task = _task(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(task), *FOREIGN],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(out.stdout)
    # The task's settings were applied (the probe did reach task.toml) ...
    assert found["agent"] == 42.0
    assert found["steps"] == 1
    # ... and nothing outside the standard library and maka-eval was loaded for it.
    assert found["loaded"] == []
