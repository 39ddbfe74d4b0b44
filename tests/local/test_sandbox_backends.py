"""executor.config.sandbox naming an installed sandbox backend: a third party's backend
(tests/fixtures/toy_sandbox, installed with pip) runs every attempt of a real local run,
and everything around it stays maka-eval's (the relay's verifier, status rules, records).
What it cannot do is refused before anything starts, naming the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.errors import PrerequisiteError
from maka_eval.local.prerequisites import check_prerequisites
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import spec

WHERE = {
    "id": "where",
    "kind": "external",
    "config": {"command": "sh", "args": ["-c", "pwd; touch done.txt"]},
}
ALLOWLIST_TOML = '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.example"]\n'
IDLE = {"id": "idle", "kind": "external", "config": {"command": "true"}}


def _toy(**config: object) -> dict[str, object]:
    return {"kind": "local", "config": {"sandbox": "toy", **config}}


def test_an_installed_backend_runs_every_attempt(setup, toy_sandbox: Path) -> None:
    s = setup(
        spec(
            subjects=[WHERE, IDLE],
            tasks=[{"id": "t1"}, {"id": "t2"}],
            executor=_toy(),
            execution={"maxConcurrentTaskGroups": 2, "maxInfraRetries": 0},
        )
    )
    s.run()
    run = read_run(s.run_dir)
    for task in ("t1", "t2"):
        (done,) = run.attempts(f"{task}::1::where")
        (idle,) = run.attempts(f"{task}::1::idle")
        assert done.status is AttemptStatus.COMPLETED, done.result.reason
        assert done.result.score == 1.0
        assert idle.status is AttemptStatus.COMPLETED and idle.result.score == 0.0
        assert done.result.isolation == "none"  # what the toy backend claims, recorded
        # The subject worked in the toy's own staging folder, not in the attempt's.
        names = [a.name for a in done.result.artifacts]
        out = next((n for n in names if "subject" in n and "stdout" in n), names)
        assert "/toy-sandbox-" in artifact_path(s.run_dir, done, out).read_text()


def test_an_unknown_backend_is_named_before_anything_starts(setup, toy_sandbox: Path) -> None:
    s = setup(spec(executor={"kind": "local", "config": {"sandbox": "firecracker"}}))
    loaded, tasks = s.load()
    with pytest.raises(PrerequisiteError) as caught:
        check_prerequisites(loaded, tasks, {"PATH": "/usr/bin:/bin"})
    (problem,) = caught.value.problems
    assert problem.where == "executor.config.sandbox"
    assert "no sandbox backend 'firecracker' is installed" in problem.message
    assert "'process', 'container', 'toy'" in problem.message
    assert not s.run_dir.exists()


def test_what_a_registered_backend_cannot_enforce_is_refused(setup, toy_sandbox: Path) -> None:
    s = setup(
        spec(tasks=[{"id": "t1"}, {"id": "t2"}], executor=_toy(egress={"mode": "none"})),
        {
            "t2": {
                "toml": '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.example"]\n'
            }
        },
    )
    loaded, tasks = s.load()
    with pytest.raises(PrerequisiteError) as caught:
        check_prerequisites(loaded, tasks, {"PATH": "/usr/bin:/bin"})
    found = {p.where: p.message for p in caught.value.problems}
    assert "cannot join a cell's policed network" in found["executor.config.egress"]
    assert "network_mode = 'allowlist'" in found["tasks[1]"]


def test_a_broken_registration_is_named(setup, toy_sandbox: Path) -> None:
    s = setup(spec(executor={"kind": "local", "config": {"sandbox": "toy-broken"}}))
    loaded, tasks = s.load()
    with pytest.raises(PrerequisiteError) as caught:
        check_prerequisites(loaded, tasks, {"PATH": "/usr/bin:/bin"})
    (problem,) = caught.value.problems
    assert problem.where == "executor.config.sandbox"
    assert "does not implement maka_eval.sandbox.backends.SandboxBackend" in problem.message
