"""Multi-step tasks (task.toml `[[steps]]`) end to end in the process sandbox (namespaces).

The fixture tests/fixtures/steps/notes is a Harbor 0.26 multi-step task: three steps
(create, append, finish), a shared tests/ folder overlaid by each step's tests/, a step
workdir with a bash setup.sh, per-step timeouts and verifier env, and min_reward gates.
tests/sandbox/test_steps_container.py runs the same scenarios in a container.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.executors.load import load_experiment_file
from maka_eval.local.executor import LocalRun
from maka_eval.sandbox.process import namespaces_unavailable
from maka_eval.spec.task_directory import load_tasks
from maka_eval.store.run_store import artifact_path, read_run

S = AttemptStatus
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "steps"
ORACLE = {"id": "oracle", "kind": "oracle"}
NOP = {"id": "nop", "kind": "external", "config": {"command": "true"}}
# Does the first two steps and not the last (it tells the steps by their instruction).
PARTIAL_SCRIPT = """
case "$(cat "$MAKA_EVAL_INSTRUCTION_FILE")" in
  *"STEP create"*) echo alpha > notes.txt ;;
  *"STEP append"*) cat seed.txt >> notes.txt ;;
esac
"""
PARTIAL = {
    "id": "partial",
    "kind": "external",
    "config": {"command": "sh", "args": ["-c", PARTIAL_SCRIPT]},
}
NAMESPACES = {"kind": "local", "config": {"isolation": "namespaces"}}


def external(subject_id: str, script: str) -> dict[str, Any]:
    return {
        "id": subject_id,
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", script]},
    }


class StepsBench:
    """Copies of the fixture task (edited per test) run with the local executor."""

    def __init__(self, root: Path, fixture: str, executor: dict[str, Any], env: dict[str, str]):
        self.root = root
        self.fixture = FIXTURES / fixture
        self.executor = executor
        self.env = env
        (root / "tasks").mkdir(parents=True)
        self.runs = 0

    def task(self, name: str, edit_toml: tuple[str, str] | None = None) -> Path:
        folder = self.root / "tasks" / name
        shutil.copytree(self.fixture, folder, symlinks=True)
        if edit_toml is not None:
            toml = folder / "task.toml"
            text = toml.read_text()
            assert edit_toml[0] in text
            toml.write_text(text.replace(*edit_toml))
        return folder

    def run(self, subjects: list[dict[str, Any]]) -> dict[str, Any]:
        self.runs += 1
        doc = {
            "schemaVersion": "maka.eval.v1",
            "id": "steps",
            "benchmark": {
                "id": "b",
                "version": "1",
                "kind": "directory",
                "config": {"path": "tasks"},
            },
            "executor": self.executor,
            "execution": {"maxConcurrentTaskGroups": 2, "maxInfraRetries": 0},
            "subjects": subjects,
            "tasks": [{"id": p.name} for p in sorted((self.root / "tasks").iterdir())],
            "repetitions": 1,
            "verifier": {"kind": "harbor"},
        }
        path = self.root / f"experiment-{self.runs}.json"
        path.write_text(json.dumps(doc))
        loaded = load_experiment_file(path)
        tasks = load_tasks(loaded.experiment, loaded.base_dir)
        self.run_dir = self.root / "runs" / str(self.runs)
        LocalRun(loaded, tasks, self.run_dir, host_env=self.env).run()
        return {cell: found[-1] for cell, found in read_run(self.run_dir).records.items()}

    def artifact(self, record: Any, name: str) -> str:
        return artifact_path(self.run_dir, record, name).read_text()


def check_oracle_and_nop(bench: StepsBench, isolation: str) -> None:
    bench.task("notes")
    found = bench.run([ORACLE, NOP])
    oracle, nop = found["notes::1::oracle"], found["notes::1::nop"]
    assert (oracle.status, oracle.result.score) == (S.COMPLETED, 1.0), oracle.result
    assert oracle.result.isolation == nop.result.isolation == isolation
    metrics = oracle.result.metrics
    # Per-key means over the three steps: `created` only the first step reports.
    assert metrics["reward"] == 1.0 and metrics["created"] == pytest.approx(1 / 3)
    assert {k: v for k, v in metrics.items() if k.startswith("step.")} == {
        "step.create.reward": 1.0,
        "step.create.created": 1.0,
        "step.append.reward": 1.0,
        "step.finish.reward": 1.0,
    }
    assert not oracle.result.notes, oracle.result.notes
    for step in ("create", "append", "finish"):
        assert oracle.timings[f"step.{step}.subjectSec"] >= 0
        assert oracle.timings[f"step.{step}.verifierSec"] > 0
    names = {a.name for a in oracle.result.artifacts}
    assert (
        "steps/create/verifier/reward.json" in names and "steps/append/verifier/reward.txt" in names
    )
    # nop: the first step scores 0, below its min_reward: nothing else runs.
    assert (nop.status, nop.result.score) == (S.COMPLETED, 0.0), nop.result
    assert {k: v for k, v in nop.result.metrics.items() if k.startswith("step.")} == {
        "step.create.reward": 0.0,
        "step.create.created": 0.0,
    }
    assert any(
        "step create: reward=0 is below min_reward 1; the remaining steps did not run "
        "(append, finish)" in n
        for n in nop.result.notes
    ), nop.result.notes
    assert "step.append.subjectSec" not in nop.timings


def check_mean_and_final(bench: StepsBench) -> None:
    bench.task("mean")
    bench.task(
        "final", ('multi_step_reward_strategy = "mean"', 'multi_step_reward_strategy = "final"')
    )
    found = bench.run([PARTIAL])
    mean, final = found["mean::1::partial"], found["final::1::partial"]
    # Steps create and append pass, finish fails (its min_reward ends nothing: it is last).
    for record in (mean, final):
        steps = {k: v for k, v in record.result.metrics.items() if k.startswith("step.")}
        assert steps == {
            "step.create.reward": 1.0,
            "step.create.created": 1.0,
            "step.append.reward": 1.0,
            "step.finish.reward": 0.0,
        }, record.result
    assert mean.status is S.COMPLETED and mean.result.score == pytest.approx(2 / 3)
    assert final.status is S.COMPLETED and final.result.score == 0.0
    assert final.result.metrics["reward"] == 0.0 and "created" not in final.result.metrics


def check_min_reward_table_and_failed_setup(bench: StepsBench) -> None:
    # A table min_reward on a key the step does not report counts as -inf: abort.
    bench.task("gated", ('name = "append"\n', 'name = "append"\nmin_reward = { quality = 0.5 }\n'))
    broken = bench.task("broken")
    (broken / "steps" / "append" / "workdir" / "setup.sh").write_text(
        "echo setup-broke >&2\nexit 3\n"
    )
    found = bench.run([ORACLE])
    gated, failed = found["gated::1::oracle"], found["broken::1::oracle"]
    assert gated.status is S.COMPLETED and gated.result.score == 1.0
    assert "step.finish.reward" not in gated.result.metrics
    assert any("quality=-inf is below min_reward 0.5" in n for n in gated.result.notes)
    # A failing setup.sh ends the step with an error, before its subject runs.
    assert failed.status is S.INFRA_FAILED, failed.result
    reason = failed.result.reason or ""
    assert "step 'append': its setup.sh exited with code 3: setup-broke" in reason
    assert "step.append.subjectSec" not in failed.timings


SLOW_FIRST_STEP = """
case "$(cat "$MAKA_EVAL_INSTRUCTION_FILE")" in
  *"STEP create"*) echo alpha > notes.txt; sleep 60 ;;
  *"STEP append"*) cat seed.txt >> notes.txt ;;
  *) echo done >> notes.txt ;;
esac
"""


def check_a_step_cut_off_by_its_timeout(bench: StepsBench) -> None:
    """The first step's subject is cut off after its own timeout; its work is verified
    and the next steps run in the same sandbox."""
    bench.task("notes", ("[steps.agent]\ntimeout_sec = 30.0", "[steps.agent]\ntimeout_sec = 2.0"))
    record = bench.run([external("slow", SLOW_FIRST_STEP)])["notes::1::slow"]
    assert record.status is S.SUBJECT_FAILED, record.result
    assert record.result.score == 1.0 and record.result.status_source == "timeout"
    assert "after 2s" in (record.result.reason or "")
    assert record.result.metrics["step.finish.reward"] == 1.0
    assert record.timings["step.create.subjectSec"] < 20


# -- the process sandbox --------------------------------------------------------------------
needs_namespaces = pytest.mark.skipif(
    namespaces_unavailable() is not None,
    reason=f"the namespace sandbox cannot run here: {namespaces_unavailable()}",
)


def process_bench(tmp_path: Path) -> StepsBench:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"],
    }
    return StepsBench(tmp_path, "notes", NAMESPACES, env)


@needs_namespaces
def test_oracle_scores_1_and_nop_0_with_a_min_reward_abort(tmp_path):
    check_oracle_and_nop(process_bench(tmp_path), "namespaces")


@needs_namespaces
def test_mean_and_final_reward_strategies(tmp_path):
    check_mean_and_final(process_bench(tmp_path))


@needs_namespaces
def test_a_min_reward_table_and_a_failing_setup_end_the_steps(tmp_path):
    check_min_reward_table_and_failed_setup(process_bench(tmp_path))


@needs_namespaces
def test_a_step_whose_healthcheck_fails_ends_the_steps(tmp_path):
    # Harbor's step healthcheck runs after the step's setup.sh, before its subject; an
    # environment that never becomes healthy ends the attempt there.
    bench = process_bench(tmp_path)
    check = (
        'name = "append"\n'
        "healthcheck = { command = 'echo missing; test -f never-made', interval_sec = 0.01, "
        "retries = 2 }\n"
    )
    bench.task("notes", ('name = "append"\n', check))
    record = bench.run([ORACLE])["notes::1::oracle"]
    assert record.status is S.INFRA_FAILED, record.result
    assert "its healthcheck failed 2 time(s) in a row" in (record.result.reason or "")
    notes = " ".join(record.result.notes)
    assert "the remaining steps did not run (finish)" in notes
    assert record.result.metrics.get("step.create.reward") == 1.0
    assert "step.append.reward" not in record.result.metrics
    assert bench.artifact(record, "steps/append/healthcheck.out").strip() == "missing"


@needs_namespaces
def test_a_steps_artifacts_are_collected_after_its_subject(tmp_path):
    bench = process_bench(tmp_path)
    bench.task("notes", ('name = "append"\n', 'name = "append"\nartifacts = ["notes.txt"]\n'))
    record = bench.run([ORACLE])["notes::1::oracle"]
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result
    names = {a.name for a in record.result.artifacts}
    assert "steps/append/artifacts/notes.txt" in names
    assert not any("/artifacts/" in n for n in names if not n.startswith("steps/append/"))
    # As the step's subject left it: two lines (the last step adds the third).
    assert len(bench.artifact(record, "steps/append/artifacts/notes.txt").splitlines()) == 2


SNOOP = r"""
find / -xdev \( -name append-only.txt -o -name lib.sh -o -name reward.json \) 2>/dev/null
ls /tests /logs/verifier 2>&1
mkdir -p /logs/verifier 2>/dev/null && echo 1 > /logs/verifier/reward.txt 2>/dev/null
head -n 1 "$MAKA_EVAL_INSTRUCTION_FILE" | cut -c 1-12 >> /logs/agent/steps.log
mkdir -p /logs/agent/trajectory && echo '{"turns": 1}' > /logs/agent/trajectory/t.json
ln -sf /etc/passwd /logs/agent/passwd
case "$(cat "$MAKA_EVAL_INSTRUCTION_FILE")" in
  *"STEP create"*) echo alpha > notes.txt ;;
  *"STEP append"*)
    cat seed.txt >> notes.txt
    # Left running: keeps trying to forge the next verifier's reward.
    (while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.05; done) & ;;
esac
"""


@needs_namespaces
def test_no_step_sees_another_steps_tests_or_forges_a_reward(tmp_path):
    bench = process_bench(tmp_path)
    bench.task("notes")
    found = bench.run([external("snoop", SNOOP)])
    record = found["notes::1::snoop"]
    # The third step's verifier scores 0 (no `done`), whatever the subject wrote.
    assert record.result.metrics["step.finish.reward"] == 0.0, record.result
    assert record.result.metrics["step.append.reward"] == 1.0
    out = "".join(
        bench.artifact(record, a.name)
        for a in record.result.artifacts
        if a.name.startswith("steps/") and a.name.endswith("subject.stdout")
    )
    assert "append-only.txt" not in out and "lib.sh" not in out and "reward.json" not in out
    check_agent_logs(bench, record)


def check_agent_logs(bench: StepsBench, record: Any) -> None:
    """/logs/agent comes back as `agent/<path>` artifacts (links not followed)."""
    names = {a.name for a in record.result.artifacts}
    assert {"agent/steps.log", "agent/trajectory/t.json"} <= names, names
    assert "agent/passwd" not in names
    log = bench.artifact(record, "agent/steps.log").split()
    assert log == ["STEP", "create:", "STEP", "append:", "STEP", "finish:"], log


@needs_namespaces
def test_a_step_cut_off_by_its_timeout_is_verified_and_the_next_steps_run(tmp_path):
    check_a_step_cut_off_by_its_timeout(process_bench(tmp_path))
