"""The local executor end to end: scheduling, resume, retries, budget, --cell, secrets."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from maka_eval.analysis.summary import summarize
from maka_eval.cli.render import status_view
from maka_eval.engine.selection import CellState
from maka_eval.engine.status import AttemptStatus
from maka_eval.errors import CellSelectionError, PrerequisiteError, StoreError
from maka_eval.local.events import BudgetReached, RunStarted
from maka_eval.processes.supervisor import CancelToken
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import PLAIN_PROCESSES, REWARD_ONE, files_containing, spec, write_script

S = AttemptStatus
TOUCH = {"id": "done", "kind": "external", "config": {"command": "touch", "args": ["done.txt"]}}
NOOP = {"id": "noop", "kind": "external", "config": {"command": "true"}}


def statuses(run_dir: Path) -> dict[str, list[str]]:
    contents = read_run(run_dir)
    return {cell: [r.status.value for r in records] for cell, records in contents.records.items()}


def test_runs_every_cell_and_records_each_attempt(setup):
    s = setup(spec(subjects=[TOUCH, NOOP], tasks=[{"id": "a"}, {"id": "b"}], repetitions=2))
    report = s.run()
    assert report.attempts == 8 and not report.cancelled
    summary = summarize(str(s.run_dir))
    assert len(summary.results) == 8
    scores = {row.cell_id: row.selected.result.score for row in summary.results}
    assert scores["a::1::done"] == 1.0 and scores["b::2::noop"] == 0.0
    by_subject = {x.subject_id: x for x in summary.subjects}
    assert by_subject["done"].mean_score == 1.0 and by_subject["noop"].mean_score == 0.0
    assert by_subject["done"].paired_n == 4


def test_resume_runs_nothing_that_has_a_result(setup):
    s = setup(spec(subjects=[TOUCH], tasks=[{"id": "a"}], repetitions=3))
    s.run()
    before = statuses(s.run_dir)
    report = s.run()
    assert report.attempts == 0
    assert statuses(s.run_dir) == before
    started = [e for e in s.events if isinstance(e, RunStarted)]
    assert started[-1].resumed and started[-1].cells_to_run == 0


def test_a_different_spec_is_refused(setup):
    s = setup(spec())
    s.run()
    s.rewrite(spec(repetitions=2))
    with pytest.raises(StoreError) as info:
        s.run()
    assert "experiment.repetitions: 1 -> 2" in info.value.render()


def test_changed_task_files_are_refused(setup, tmp_path):
    s = setup(spec())
    s.run()
    (tmp_path / "tasks" / "t1" / "instruction.md").write_text("Something else.\n")
    with pytest.raises(StoreError, match=r"taskDigests\.t1"):
        s.run()


def test_infra_failures_are_retried_up_to_the_cap_then_only_by_cell(setup):
    no_reward = {"t1": {"test_sh": "#!/bin/sh\nexit 0\n"}}
    s = setup(spec(execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 2}), no_reward)
    s.run()
    contents = read_run(s.run_dir)
    attempts = contents.attempts("t1::1::done")
    assert [r.status for r in attempts] == [S.INFRA_FAILED] * 3
    assert [r.trigger for r in attempts] == ["scheduled", "retry", "retry"]
    summary = summarize(str(s.run_dir))
    assert summary.cells[0].state is CellState.EXHAUSTED and not summary.results
    assert s.run().attempts == 0  # resume leaves an exhausted cell alone
    report = s.run(cells=("t1::1::done",))
    assert report.attempts == 1 and report.records[0].trigger == "manual"


def test_cell_selection_rules(setup):
    s = setup(spec(subjects=[TOUCH, NOOP]))
    s.run()
    with pytest.raises(CellSelectionError) as info:
        s.run(cells=("t1::1::done",))
    assert "already has a valid result (attempt 1, completed)" in info.value.render()
    with pytest.raises(CellSelectionError, match="did you mean 't1::1::done'"):
        s.run(cells=("t1::1::dnoe",))
    report = s.run(cells=("t1::1::done",), force=True)
    assert report.attempts == 1
    summary = summarize(str(s.run_dir))
    row = next(r for r in summary.cells if r.cell_id == "t1::1::done")
    assert row.attempts == 2 and row.selected.attempt == 1  # still the earliest valid attempt


def test_cancel_records_cancelled_attempts_and_resume_finishes(setup, tmp_path):
    fast = tmp_path / "fast"
    script = f"touch started; [ -f {fast} ] || sleep 30; touch done.txt"
    slow = {"id": "slow", "kind": "external", "config": {"command": "sh", "args": ["-c", script]}}
    s = setup(
        spec(
            subjects=[slow],
            tasks=[{"id": "a"}, {"id": "b"}],
            execution={"maxConcurrentTaskGroups": 2},
        )
    )
    cancel = CancelToken()
    work = Path(os.environ["MAKA_EVAL_WORK_DIR"])

    def stop_when_started():
        # The deadline only ends a hang; then the cancel comes early and the test fails.
        deadline = time.monotonic() + 300
        while len(list(work.glob("**/workspace/started"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        cancel.cancel()

    threading.Thread(target=stop_when_started).start()
    report = s.run(cancel=cancel)
    assert report.cancelled
    assert statuses(s.run_dir) == {"a::1::slow": ["cancelled"], "b::1::slow": ["cancelled"]}
    # Stopped, not waited for: neither subject lived to the end of its 30 s sleep.
    records = read_run(s.run_dir).records
    assert all(r.timings["subjectSec"] < 30 for rs in records.values() for r in rs), records
    assert not (s.run_dir / ".writer.lock").exists()
    fast.touch()  # the same spec, run again: it resumes
    report = s.run()
    assert report.attempts == 2
    assert statuses(s.run_dir) == {
        "a::1::slow": ["cancelled", "completed"],
        "b::1::slow": ["cancelled", "completed"],
    }
    summary = summarize(str(s.run_dir))
    assert [r.selected.attempt for r in summary.cells] == [2, 2]


def test_resume_after_cancel_appends_and_selects_the_new_attempt(setup):
    s = setup(spec(subjects=[TOUCH]))
    cancel = CancelToken()
    cancel.cancel()  # cancelled before anything started
    report = s.run(cancel=cancel)
    assert report.cancelled and report.attempts == 0
    s.run()
    contents = read_run(s.run_dir)
    assert [r.status for r in contents.attempts("t1::1::done")] == [S.COMPLETED]


def test_budget_stops_new_groups_and_running_ones_finish(setup, tmp_path):
    agent = write_script(
        tmp_path / "agent.sh",
        (
            "#!/bin/sh\ntouch done.txt\n"
            'printf \'{"protocol":"maka.eval.result.v1","status":"completed",'
            '"usage":{"inputTokens":900,"outputTokens":100},"costUsd":0.5}\' '
            '> "$MAKA_EVAL_RESULT_FILE"\n'
        ),
    )
    subject = {
        "id": "agent",
        "kind": "external",
        "config": {"command": str(agent), "resultContract": "protocol-v1"},
    }
    s = setup(
        spec(
            subjects=[subject],
            tasks=[{"id": f"t{i}"} for i in range(5)],
            execution={"maxConcurrentTaskGroups": 1},
            budget={"maxTokens": 1500},
        )
    )
    report = s.run()
    assert report.attempts == 2  # 1000 tokens < 1500 -> a second group; 2000 >= 1500 -> stop
    assert report.held_by_budget == 3
    assert any(isinstance(e, BudgetReached) for e in s.events)
    summary = summarize(str(s.run_dir))
    assert summary.budget.exhausted and summary.budget.spent_tokens == 2000
    assert summary.count(CellState.PENDING) == 3
    assert s.run().attempts == 0  # still exhausted on resume
    console = Console(record=True, width=200)
    console.print(status_view(summarize(str(s.run_dir))))
    assert "budget reached: 3 cell(s) will not start" in console.export_text()


def test_groups_start_together_and_respect_the_concurrency_limit(setup, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    groups = tmp_path / "groups"
    groups.mkdir()
    arm = write_script(
        tmp_path / "arm.sh",
        (
            "#!/bin/sh\n"
            f'echo "$(date +%s.%N) start" > "{log}/$MAKA_EVAL_CELL_ID"\n'
            # Each arm waits for its group's three arms and for a second group to start
            # (the deadline, 120 s, only ends a hang): launched together, the arms' spans
            # overlap however slow the machine; launched one after another, they cannot.
            f'group="{groups}/${{MAKA_EVAL_CELL_ID%::*}}"\n'
            'mkdir -p "$group" && touch "$group/${MAKA_EVAL_CELL_ID##*::}"\n'
            "n=0\n"
            f'while {{ [ "$(ls "$group" | wc -l)" -lt 3 ] || [ "$(ls {groups} | wc -l)" -lt 2 ]; }}'
            ' && [ "$n" -lt 2400 ]; do sleep 0.05; n=$((n + 1)); done\n'
            "touch done.txt\n"
            f'echo "$(date +%s.%N) end" >> "{log}/$MAKA_EVAL_CELL_ID"\n'
        ),
    )
    subjects = [
        {"id": n, "kind": "external", "config": {"command": str(arm)}} for n in ("a", "b", "c")
    ]
    s = setup(
        spec(
            executor=PLAIN_PROCESSES,
            subjects=subjects,
            tasks=[{"id": f"t{i}"} for i in range(4)],
            repetitions=2,
            execution={"maxConcurrentTaskGroups": 2},
        )
    )
    s.run()
    spans = {}
    for path in log.iterdir():
        lines = path.read_text().split("\n")
        spans[path.name.replace("%3A", ":")] = (
            float(lines[0].split()[0]),
            float(lines[1].split()[0]),
        )
    assert len(spans) == 24
    groups: dict[str, list[tuple[float, float]]] = {}
    for cell, span in spans.items():
        groups.setdefault(cell.rsplit("::", 1)[0], []).append(span)
    for arms in groups.values():
        starts, ends = [a for a, _ in arms], [b for _, b in arms]
        assert max(starts) < min(ends), "arms of a task group must run together"
    group_spans = [(min(a for a, _ in g), max(b for _, b in g)) for g in groups.values()]
    moments = sorted(t for span in group_spans for t in span)
    most = max(sum(1 for a, b in group_spans if a <= m < b) for m in moments)
    assert most <= 2
    assert most == 2  # and the limit is actually used


def test_secrets_never_reach_records_or_artifacts(setup):
    leaky = {
        "id": "leaky",
        "kind": "external",
        "credentials": ["MY_TOKEN"],
        "config": {
            "command": "sh",
            "args": [
                "-c",
                'echo "token=$API_TOKEN"; echo "$API_TOKEN" >&2; printf %s "$API_TOKEN" '
                "> leaked.txt; touch done.txt",
            ],
            "credentialBindings": {"API_TOKEN": "MY_TOKEN"},
        },
    }
    s = setup(spec(subjects=[leaky]))
    secret = "sk-live-0123456789abcdef"
    s.run(host_env={"PATH": "/usr/bin:/bin", "MY_TOKEN": secret})
    assert files_containing(s.run_dir, secret.encode()) == []
    contents = read_run(s.run_dir)
    record = contents.attempts("t1::1::leaky")[0]
    stdout = next(a for a in record.result.artifacts if a.name == "subject.stdout")
    assert (
        artifact_path(s.run_dir, record, stdout.name).read_text() == "token=[redacted:MY_TOKEN]\n"
    )
    assert record.status is S.COMPLETED


def test_missing_prerequisites_start_nothing(setup):
    needs = {
        "id": "needs",
        "kind": "external",
        "credentials": ["ABSENT_KEY"],
        "config": {"command": "no-such-agent-binary"},
    }
    s = setup(spec(subjects=[needs]))
    with pytest.raises(PrerequisiteError) as info:
        s.run()
    text = info.value.render()
    assert "subjects[0].credentials[0]: the environment variable ABSENT_KEY is not set" in text
    assert "subjects[0].config.command: 'no-such-agent-binary' is not on PATH" in text
    assert not s.run_dir.exists()


def test_tasks_needing_a_container_image_are_refused_by_the_process_sandbox(setup):
    process_only = {"kind": "local", "config": {"sandbox": "process"}}
    s = setup(spec(executor=process_only), {"t1": {"files": {"Dockerfile": "FROM debian"}}})
    with pytest.raises(PrerequisiteError, match="builds a container image") as info:
        s.run()
    assert "executor.config.sandbox is 'process'" in info.value.render()
    assert not s.run_dir.exists()


def test_a_task_needing_an_image_without_an_engine_names_what_was_tried(setup, tmp_path):
    s = setup(spec(), {"t1": {"toml": '[environment]\ndocker_image = "debian:bookworm-slim"\n'}})
    host_env = {"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    with pytest.raises(PrerequisiteError) as info:
        s.run(host_env=host_env)
    text = info.value.render()
    assert "asks for container image 'debian:bookworm-slim'" in text
    assert f"no container engine answered (tried unix://{tmp_path}/no.sock: no such socket)" in text
    assert "hack/podman.sh up" in text


def test_the_container_sandbox_refuses_tasks_without_an_image(setup):
    s = setup(spec(executor={"kind": "local", "config": {"sandbox": "container"}}))
    with pytest.raises(PrerequisiteError, match="no environment/Dockerfile and no docker_image"):
        s.run()


@pytest.mark.parametrize(
    ("files", "toml", "message"),
    [
        ({"docker-compose.yaml": "services: {}\n"}, None, "multi-container tasks"),
        ({}, '[environment]\ndocker_image = "x"\ngpus = 1\n', "no NVIDIA runtime"),
    ],
)
def test_what_the_container_sandbox_cannot_do_is_refused(setup, monkeypatch, files, toml, message):
    from maka_eval.local import prerequisites
    from maka_eval.sandbox.container.engine import EngineInfo, EngineProbe

    engine = EngineInfo("unix:///fake.sock", "Podman", "4.3.1", "1.41", gpus=False)
    monkeypatch.setattr(prerequisites, "engine_info", lambda env: EngineProbe(engine, ()))
    s = setup(spec(), {"t1": {"files": files, "toml": toml}})
    with pytest.raises(PrerequisiteError, match=message):
        s.run()


def test_an_allowlist_needs_a_proxy_the_engine_can_put_a_container_behind(setup, monkeypatch):
    # Only Podman joins a namespace by path; on Docker the allowlist could not be kept.
    from maka_eval.local import prerequisites
    from maka_eval.sandbox.container.engine import EngineInfo, EngineProbe

    engine = EngineInfo("unix:///fake.sock", "Docker", "27.0", "1.46", gpus=False)
    monkeypatch.setattr(prerequisites, "engine_info", lambda env: EngineProbe(engine, ()))
    toml = '[environment]\ndocker_image = "x"\nnetwork_mode = "allowlist"\n'
    s = setup(spec(), {"t1": {"toml": toml + 'allowed_hosts = ["pypi.org"]\n'}})
    with pytest.raises(PrerequisiteError) as info:
        s.run()
    text = info.value.render()
    assert "tasks (t1)" in text and "network_mode = 'allowlist' (task.toml)" in text
    assert "only Podman" in text and "leave those tasks out" in text


def test_oracle_and_maka_subjects(setup, tmp_path):
    host = write_script(
        tmp_path / "runtime-host",
        (
            "#!/bin/sh\n"
            '[ "$1" = "--session-profile" ] && [ "$2" = "headless-coding-v1" ] || exit 7\n'
            '[ "$3" = "--model" ] && [ "$4" = "m1" ] || exit 8\n'
            "touch done.txt\n"
            'printf \'{"protocol":"maka.eval.result.v1","status":"completed"}\' '
            '> "$MAKA_EVAL_RESULT_FILE"\n'
        ),
    )
    doc = spec(
        subjects=[
            {"id": "oracle", "kind": "oracle"},
            {
                "id": "maka",
                "kind": "maka",
                "config": {"profile": "headless-coding-v1", "model": "m1"},
            },
        ],
        executor={"kind": "local", "config": {"runtimeHost": {"command": str(host)}}},
    )
    s = setup(doc)
    s.run()
    summary = summarize(str(s.run_dir))
    assert {r.cell_id: r.selected.result.score for r in summary.results} == {
        "t1::1::oracle": 1.0,
        "t1::1::maka": 1.0,
    }


def test_oracle_needs_solutions(setup):
    s = setup(spec(subjects=[{"id": "oracle", "kind": "oracle"}]), {"t1": {"solve_sh": None}})
    with pytest.raises(PrerequisiteError, match=r"solution/solve\.sh is missing"):
        s.run()


def test_orphans_without_the_marker_do_not_outlive_the_run(setup, tmp_path):
    pid_file = tmp_path / "orphan.pid"
    sneaky = {
        "id": "sneaky",
        "kind": "external",
        "config": {
            "command": "sh",
            "args": ["-c", f"( env -i /bin/sleep 1010 & echo $! > {pid_file} ); touch done.txt"],
        },
    }
    s = setup(spec(subjects=[sneaky], executor=PLAIN_PROCESSES))
    s.run()
    pid = int(pid_file.read_text())
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_workspaces_live_outside_the_run_directory(setup):
    where = {
        "id": "where",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", "pwd > done.txt"]},
    }
    s = setup(
        spec(subjects=[where]),
        {
            "t1": {
                "test_sh": (
                    '#!/bin/sh\ncp done.txt "$MAKA_EVAL_VERIFIER_LOGS_DIR/where.txt"\n'
                    + REWARD_ONE[10:]
                )
            }
        },
    )
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::where")[0]
    assert record.status is S.COMPLETED
    workspace = Path(os.environ["MAKA_EVAL_WORK_DIR"])
    assert not any(p.is_relative_to(s.run_dir) for p in [workspace])
    assert not list(workspace.glob("**/workspace"))  # removed after the attempt


def test_records_carry_the_kernel_and_artifact_digests(setup):
    s = setup(spec())
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::done")[0]
    assert record.result.duration_sec >= 0 and record.timings["totalSec"] > 0
    for ref in record.result.artifacts:
        import hashlib

        data = artifact_path(s.run_dir, record, ref.name).read_bytes()
        assert len(data) == ref.bytes and hashlib.sha256(data).hexdigest() == ref.sha256
    doc = json.loads((s.run_dir / "experiment.json").read_text())
    assert doc["experiment"]["id"] == "exp"


def test_a_nop_subject_leaves_the_task_as_it_was(setup):
    doc = spec(subjects=[{"id": "oracle", "kind": "oracle"}, {"id": "nop", "kind": "nop"}])
    s = setup(doc)
    s.run()
    summary = summarize(str(s.run_dir))
    assert {r.cell_id: r.selected.result.score for r in summary.results} == {
        "t1::1::oracle": 1.0,
        "t1::1::nop": 0.0,
    }
