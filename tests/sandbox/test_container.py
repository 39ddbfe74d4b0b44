"""The container sandbox, for real on Podman: Harbor-format tasks that ship an image run
through the local executor; the oracle scores 1 and a subject that does nothing scores 0
on every fixture (tests/fixtures/harbor); images built from a Dockerfile are reused; and
subjects that try to cheat inside the container gain nothing.

The engine comes from the `container_engine` fixture (hack/podman.sh): as root on Linux
these tests never skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.executors.load import load_experiment_file
from maka_eval.local.executor import LocalRun, RunReport
from maka_eval.sandbox.container.engine import client_for
from maka_eval.sandbox.container.images import build_tag, image_builds
from maka_eval.sandbox.container.removal import leftover_containers
from maka_eval.spec.task_directory import directory_digest, load_tasks
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import write_script

pytestmark = pytest.mark.slow

S = AttemptStatus
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "harbor"
PYTHON_IMAGE = "localhost/maka-eval/debian-python:bookworm"
NOP = {"id": "nop", "kind": "external", "config": {"command": "true"}}
ORACLE = {"id": "oracle", "kind": "oracle"}
TEST_MARKER = "verifier-secret-marker-5c1e"
SOLUTION_MARKER = "solution-secret-marker-9d2b"


class Bench:
    """An experiment over some task folders, run with the local executor."""

    def __init__(self, root: Path, engine: str, subjects: list[dict[str, Any]], **spec: Any):
        self.root = root
        self.engine = engine
        self.tasks = root / "tasks"
        self.tasks.mkdir(parents=True, exist_ok=True)
        self.subjects = subjects
        self.spec = spec
        self.runs = 0

    def add(self, source: Path, name: str | None = None) -> str:
        """Copy a task folder in (symlinks would escape the benchmark folder)."""
        name = name or source.name
        shutil.copytree(source, self.tasks / name, symlinks=True)
        return name

    def task(self, name: str, toml: str, test_sh: str, files: dict[str, str] | None = None) -> str:
        folder = self.tasks / name
        folder.mkdir()
        (folder / "instruction.md").write_text("Do the task.\n")
        (folder / "task.toml").write_text(toml)
        write_script(folder / "tests" / "test.sh", test_sh)
        for file, content in (files or {}).items():
            (folder / "environment").mkdir(exist_ok=True)
            (folder / "environment" / file).write_text(content)
        return name

    def write(self, **executor: Any) -> Path:
        doc = {
            "schemaVersion": "maka.eval.v1",
            "id": "containers",
            "benchmark": {
                "id": "b",
                "version": "1",
                "kind": "directory",
                "config": {"path": "tasks"},
            },
            "executor": {"kind": "local", "config": {"sandbox": "container", **executor}},
            "execution": {"maxConcurrentTaskGroups": 2, "maxInfraRetries": 0},
            "subjects": self.subjects,
            "tasks": [{"id": p.name} for p in sorted(self.tasks.iterdir())],
            "repetitions": 1,
            "verifier": {"kind": "harbor"},
            **self.spec,
        }
        path = self.root / "experiment.json"
        path.write_text(json.dumps(doc))
        return path

    def run(self, *, again: bool = False, **executor: Any) -> tuple[RunReport, Path]:
        self.runs += 0 if again else 1
        loaded = load_experiment_file(self.write(**executor))
        tasks = load_tasks(loaded.experiment, loaded.base_dir)
        run_dir = self.root / "runs" / str(self.runs)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"],
            "DOCKER_HOST": self.engine,
        }
        report = LocalRun(loaded, tasks, run_dir, host_env=env).run()
        return report, run_dir


def records(run_dir: Path) -> dict[str, Any]:
    return {cell: attempts[-1] for cell, attempts in read_run(run_dir).records.items()}


def stdout_of(run_dir: Path, record: Any) -> str:
    if "subject.stdout" not in {a.name for a in record.result.artifacts}:
        return ""
    return artifact_path(run_dir, record, "subject.stdout").read_text()


def no_containers_left(engine: str, run_dir: Path) -> None:
    """None of this run's containers is left (other test sessions may be running theirs:
    only this run's are looked for)."""
    run_ids = {r.run_id for attempts in read_run(run_dir).records.values() for r in attempts}
    assert run_ids
    for run_id in run_ids:
        assert leftover_containers(engine, run_id) == []


# -- Harbor tasks end to end --------------------------------------------------------------
def test_every_fixture_oracle_scores_1_and_nop_scores_0(container_engine, tmp_path):
    bench = Bench(tmp_path, container_engine, [ORACLE, NOP])
    names = [bench.add(task) for task in sorted(FIXTURES.iterdir())]
    assert len(names) >= 4
    report, run_dir = bench.run()
    found = records(run_dir)
    assert len(found) == 2 * len(names) == report.attempts
    for name in names:
        oracle, nop = found[f"{name}::1::oracle"], found[f"{name}::1::nop"]
        assert (oracle.status, oracle.result.score) == (S.COMPLETED, 1.0), oracle.result
        assert (nop.status, nop.result.score) == (S.COMPLETED, 0.0), nop.result
        assert oracle.result.isolation == nop.result.isolation == "container"
        assert not [n for n in oracle.result.notes if "tampering" in n]
    # reward.json with several metrics: all recorded, "reward" is the score.
    users = found["users-and-rewards::1::oracle"].result.metrics
    assert users == {"reward": 1.0, "owner_ok": 1.0, "verifier_user_ok": 1.0, "env_ok": 1.0}
    assert found["users-and-rewards::1::nop"].result.metrics["verifier_user_ok"] == 1.0
    # This engine cannot cap disk use: the record says so instead of pretending.
    assert any(
        "storage_mb=1024 was not enforced" in n for n in found["fix-greeting::1::nop"].result.notes
    )
    no_containers_left(container_engine, run_dir)


def test_a_subject_program_is_uploaded_and_its_result_frame_read(container_engine, tmp_path):
    agent = write_script(
        tmp_path / "agents" / "agent.sh",
        "#!/bin/sh\n"
        'echo "program=$0 cwd=$(pwd) instruction=$MAKA_EVAL_INSTRUCTION_FILE"\n'
        'head -n 1 "$MAKA_EVAL_INSTRUCTION_FILE"\n'
        "printf 'hello world\\n' > greeting.txt\n"
        'printf \'{"protocol":"maka.eval.result.v1","status":"completed"}\' '
        '> "$MAKA_EVAL_RESULT_FILE"\n',
    )
    scripted = {
        "id": "scripted",
        "kind": "external",
        "config": {"command": str(agent), "resultContract": "protocol-v1"},
    }
    bench = Bench(tmp_path, container_engine, [scripted])
    bench.add(FIXTURES / "fix-greeting")
    _, run_dir = bench.run()
    record = records(run_dir)["fix-greeting::1::scripted"]
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result
    assert "result-frame.json" in {a.name for a in record.result.artifacts}
    out = stdout_of(run_dir, record)
    assert "program=/maka/bin/agent.sh cwd=/app instruction=/maka/instruction.md" in out
    assert "/app/greeting.txt has a typo" in out


def test_an_image_built_from_a_dockerfile_is_reused(container_engine, tmp_path):
    bench = Bench(tmp_path, container_engine, [NOP])
    name = bench.add(FIXTURES / "fix-greeting", "cache-probe")
    # A folder nobody built before: its own digest, its own tag.
    (bench.tasks / name / "environment" / "other.txt").write_text(f"{tmp_path}\n")
    tag = build_tag(name, directory_digest(bench.tasks / name / "environment"))
    before = image_builds[tag]
    try:
        bench.run()
        assert image_builds[tag] == before + 1
        first = _image_id(container_engine, tag)
        bench.run()
        assert image_builds[tag] == before + 1  # not built again
        assert _image_id(container_engine, tag) == first
    finally:
        client_for(container_engine).api.remove_image(tag, force=True)


def _image_id(engine: str, tag: str) -> str:
    return str(client_for(engine).api.inspect_image(tag)["Id"])


def test_a_missing_image_is_a_clear_infrastructure_failure(container_engine, tmp_path):
    bench = Bench(tmp_path, container_engine, [NOP])
    bench.task(
        "gone",
        '[environment]\ndocker_image = "localhost:1/maka-eval/no-such-image:1"\n',
        "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
    )
    _, run_dir = bench.run()
    record = records(run_dir)["gone::1::nop"]
    assert record.status is S.INFRA_FAILED
    assert "localhost:1/maka-eval/no-such-image:1" in (record.result.reason or "")
    assert "could not be pulled" in (record.result.reason or "")


def test_validate_names_the_engine(container_engine, tmp_path):
    bench = Bench(tmp_path, container_engine, [NOP])
    bench.add(FIXTURES / "plain-image")
    bench.write()
    env = {**os.environ, "DOCKER_HOST": container_engine}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "maka_eval.cli.main",
            "validate",
            str(bench.root / "experiment.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "container engine: Podman 4." in proc.stdout
    assert f"at {container_engine}" in proc.stdout
    assert "1 of 1 task(s) run in their container image: plain-image" in proc.stdout


# -- subjects that try to cheat -----------------------------------------------------------
def _marked(bench: Bench, name: str) -> str:
    """A copy of the python fixture whose tests and solution carry secret markers."""
    bench.add(FIXTURES / "sum-numbers", name)
    test_sh = bench.tasks / name / "tests" / "test.sh"
    test_sh.write_text(
        test_sh.read_text().replace("#!/bin/bash\n", f"#!/bin/bash\n# {TEST_MARKER}\n")
    )
    solve = bench.tasks / name / "solution" / "solve.sh"
    solve.write_text(solve.read_text() + f"# {SOLUTION_MARKER}\n")
    return name


def sh(subject_id: str, script: str) -> dict[str, Any]:
    return {
        "id": subject_id,
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", script]},
    }


def test_a_subject_cannot_find_the_tests_or_the_solution(container_engine, tmp_path):
    # It knows Harbor's layout, not the markers: whatever it finds, it prints.
    spy = sh(
        "spy",
        "find / -path /proc -prune -o \\( -name 'test*.sh' -o -name 'solve*.sh' -o -name '*.tar' "
        "-o -name 'test_*.py' \\) -print -exec cat {} \\; 2>/dev/null | head -c 100000;"
        "cat /tests/* /solution/* /maka/.*/* 2>&1;"
        "for p in /proc/[0-9]*; do echo \"$p $(tr '\\0' ' ' < $p/cmdline)\";"
        "  tr '\\0' '\\n' < $p/environ 2>&1; ls -l $p/root/ 2>&1; done;"
        "ls -laR /tests /solution /logs /maka 2>&1; env | sort",
    )
    bench = Bench(tmp_path, container_engine, [spy])
    _marked(bench, "secrets")
    _, run_dir = bench.run()
    record = records(run_dir)["secrets::1::spy"]
    out = stdout_of(run_dir, record)
    assert "sleep infinity" in out  # it did look at every process it could see
    assert TEST_MARKER not in out and SOLUTION_MARKER not in out
    assert "test.sh" not in out and "solve.sh" not in out and "tests.tar" not in out
    assert str(tmp_path) not in out  # nothing of the host's folders
    assert record.result.score == 0.0


def test_forged_rewards_are_never_read_and_are_noted(container_engine, tmp_path):
    forger = sh(
        "forger",
        # Rewards written early, and a loop that keeps rewriting them while the verifier
        # runs; it also tries the verifier's processes' views and removes the folders.
        "mkdir -p /logs/verifier; echo '{\"reward\": 1}' > /logs/verifier/reward.json;"
        "( while true; do mkdir -p /logs/verifier 2>/dev/null;"
        "  echo '{\"reward\": 1}' > /logs/verifier/reward.json 2>/dev/null;"
        "  echo 1 > /logs/verifier/reward.txt 2>/dev/null;"
        "  for r in /proc/[0-9]*/root; do echo 1 > $r/logs/verifier/reward.txt; done 2>/dev/null;"
        "  sleep 0.01; done ) >/dev/null 2>&1 &"
        "sleep 0.2",
    )
    wrecker = sh(
        "wrecker",
        "( while true; do rm -rf /logs /tests 2>/dev/null;"
        "  mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.01;"
        "  done ) >/dev/null 2>&1 & sleep 0.2",
    )
    bench = Bench(tmp_path, container_engine, [forger, wrecker])
    bench.add(FIXTURES / "plain-image")
    # The verifier takes a second: the loops surely write while it runs (the wrapper's own
    # work takes a few milliseconds, less than one turn of a loop under load).
    test_sh = bench.tasks / "plain-image" / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace("#!/bin/sh\n", "#!/bin/sh\nsleep 1\n", 1))
    _, run_dir = bench.run()
    found = records(run_dir)
    forged = found["plain-image::1::forger"]
    assert (forged.status, forged.result.score) == (S.COMPLETED, 0.0), forged.result
    assert any("tampering" in n and "when the subject ended" in n for n in forged.result.notes)
    assert any(
        "suspected tampering" in n and "while the verifier ran" in n for n in forged.result.notes
    )
    wrecked = found["plain-image::1::wrecker"]
    assert wrecked.result.score != 1.0
    assert any("suspected tampering" in n for n in wrecked.result.notes), wrecked.result
    no_containers_left(container_engine, run_dir)


SERVER_TOML = f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\n'
SERVER_TEST = (
    "#!/bin/sh\n"
    'got=$(python3 -c "import urllib.request as u;'
    "print(u.urlopen('http://127.0.0.1:18765/id.txt').read().decode().strip())\")\n"
    'if [ "$got" = "$(cat id.txt)" ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n"
)


def test_concurrent_cells_bind_the_same_port_in_their_own_networks(container_engine, tmp_path):
    # Every arm serves its own id on the same port and leaves the server running: its
    # verifier must get its own answer, and the servers die with their containers.
    server = (
        "echo $MAKA_EVAL_SUBJECT_ID > id.txt;"
        "python3 -m http.server 18765 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1"
    )
    bench = Bench(tmp_path, container_engine, [sh(n, server) for n in ("a", "b")])
    bench.task("serve-1", SERVER_TOML, SERVER_TEST)
    bench.task(
        "serve-2", SERVER_TOML.replace("]\n", "]\nnetwork_mode = 'no-network'\n", 1), SERVER_TEST
    )
    _, run_dir = bench.run()
    scores = {cell: record.result.score for cell, record in records(run_dir).items()}
    assert scores == dict.fromkeys(
        ["serve-1::1::a", "serve-1::1::b", "serve-2::1::a", "serve-2::1::b"], 1.0
    )
    no_containers_left(container_engine, run_dir)


def test_filling_tmp_hurts_no_one_else(container_engine, tmp_path):
    filler = sh(
        "filler", "head -c 3000000000 /dev/zero > /tmp/fill; df -h /tmp; echo 42 > answer.txt"
    )
    bystander = sh("bystander", "sleep 1; echo ok > /tmp/mine && echo 42 > answer.txt")
    bench = Bench(tmp_path, container_engine, [filler, bystander])
    bench.add(FIXTURES / "plain-image")
    _, run_dir = bench.run()
    found = records(run_dir)
    assert found["plain-image::1::bystander"].result.score == 1.0
    # Its own /tmp filled up (1 GiB, in memory); the task itself was still done.
    assert found["plain-image::1::filler"].result.score == 1.0
    assert "1.0G" in stdout_of(run_dir, found["plain-image::1::filler"])


def test_a_timed_out_subject_is_quiesced_and_still_verified(container_engine, tmp_path):
    stuck = sh("stuck", "echo 42 > answer.txt; sleep 1000 & sleep 1001")
    bench = Bench(tmp_path, container_engine, [stuck])
    bench.task(
        "slow",
        '[agent]\ntimeout_sec = 2\n[environment]\ndocker_image = "debian:bookworm-slim"\n',
        # Reward 1 only if nothing the subject started survived the timeout.
        "#!/bin/sh\n"
        "left=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 10[0]')\n"
        '[ "$left" = 0 ] && [ -f /answer.txt ] && r=1 || r=0\n'
        "echo $r > /logs/verifier/reward.txt\n",
    )
    _, run_dir = bench.run()
    record = records(run_dir)["slow::1::stuck"]
    assert record.status is S.SUBJECT_FAILED
    assert record.result.score == 1.0, record.result


ENTRYPOINT_DOCKERFILE = """FROM debian:bookworm-slim
COPY entry.sh /entry.sh
RUN chmod 755 /entry.sh
ENTRYPOINT ["/entry.sh"]
"""


def test_the_images_entrypoint_starts_its_services_as_in_harbor(container_engine, tmp_path):
    """The image's ENTRYPOINT runs, given Harbor's command; what it started before the
    subject survives the subject's timeout (quiescing kills only what came after)."""
    stuck = sh("stuck", "echo 42 > answer.txt; sleep 1000 & sleep 1001")
    bench = Bench(tmp_path, container_engine, [stuck, NOP])
    bench.task(
        "service",
        "[agent]\ntimeout_sec = 2\n",
        "#!/bin/sh\n"
        "service=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 77[7]')\n"
        "left=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 10[0]')\n"
        "args=$(cat /entry-args)\n"
        '[ "$service" = 1 ] && [ "$left" = 0 ] && [ "$args" = "sh -c sleep infinity" ] '
        "&& r=1 || r=0\n"
        "echo $r > /logs/verifier/reward.txt\n",
        files={
            "Dockerfile": ENTRYPOINT_DOCKERFILE,
            # A service in the background, then the command, as entrypoints do.
            "entry.sh": '#!/bin/sh\necho "$*" > /entry-args\nsleep 777 &\nexec "$@"\n',
        },
    )
    _, run_dir = bench.run()
    found = records(run_dir)
    assert found["service::1::stuck"].status is S.SUBJECT_FAILED  # timed out
    assert found["service::1::stuck"].result.score == 1.0, found["service::1::stuck"].result
    assert found["service::1::nop"].result.score == 1.0, found["service::1::nop"].result
    assert not any("ENTRYPOINT" in n for n in found["service::1::nop"].result.notes)
    no_containers_left(container_engine, run_dir)


def test_an_entrypoint_that_ends_at_once_is_left_out_and_noted(container_engine, tmp_path):
    bench = Bench(tmp_path, container_engine, [NOP])
    bench.task(
        "ends",
        "",
        "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
        files={
            "Dockerfile": ENTRYPOINT_DOCKERFILE,
            "entry.sh": "#!/bin/sh\necho not running my arguments\nexit 3\n",
        },
    )
    _, run_dir = bench.run()
    record = records(run_dir)["ends::1::nop"]
    assert record.result.score == 1.0, record.result
    (note,) = [n for n in record.result.notes if "ENTRYPOINT" in n]
    assert "exit status 3" in note and "not running my arguments" in note, note
    assert "ran without it" in note
    no_containers_left(container_engine, run_dir)


def test_containers_left_by_a_writer_that_died_are_removed(container_engine, tmp_path):
    bench = Bench(tmp_path, container_engine, [NOP])
    bench.add(FIXTURES / "plain-image")
    _, run_dir = bench.run()
    run_id = read_run(run_dir).run_id
    client = client_for(container_engine)
    orphan = client.containers.create(
        "debian:bookworm-slim",
        entrypoint=["sleep"],
        command=["infinity"],
        labels={"dev.maka.eval.attempt-id": f"{run_id}/x/1", "dev.maka.eval.run-id": run_id},
        network_mode="none",
        stop_signal="SIGKILL",
    )
    orphan.start()
    assert leftover_containers(container_engine, run_id) == [orphan.id]
    bench.run(again=True)  # resumes: nothing to run, and the orphan is gone
    assert leftover_containers(container_engine, run_id) == []


def test_the_environment_healthcheck_runs_in_the_container_before_the_subject(
    container_engine, tmp_path
):
    # Podman marks its containers with /run/.containerenv: the check runs inside, first.
    check = (
        "[environment.healthcheck]\n"
        "command = 'test -f /run/.containerenv && date +%s%N > /tmp/healthy && echo in-container'\n"
    )
    subject = sh("after", "test -f /tmp/healthy && echo 42 > /answer.txt")
    bench = Bench(tmp_path, container_engine, [subject])
    bench.task(
        "checked",
        '[environment]\ndocker_image = "debian:bookworm-slim"\n' + check,
        '#!/bin/sh\n[ "$(cat /answer.txt)" = 42 ] && r=1 || r=0\n'
        "echo $r > /logs/verifier/reward.txt\n",
    )
    _, run_dir = bench.run()
    record = records(run_dir)["checked::1::after"]
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result
    said = artifact_path(run_dir, record, "healthcheck.out").read_text()
    assert said.strip() == "in-container"


def test_task_artifacts_are_collected_from_the_container(container_engine, tmp_path):
    make = (
        "mkdir -p /srv/data/sub && echo one > /srv/data/a.txt && echo two > /srv/data/sub/b.txt"
        " && echo tmp > /srv/data/sub/c.tmp && ln -s /etc/shadow /srv/data/shadow"
        " && ln -s /etc/passwd /srv/link.txt && echo 42 > /answer.txt"
    )
    bench = Bench(tmp_path, container_engine, [sh("maker", make)])
    bench.task(
        "collect",
        'artifacts = [{ source = "/srv/data", exclude = ["*.tmp"] }, "answer.txt", '
        '"/srv/link.txt", "/srv/none"]\n'
        '[environment]\ndocker_image = "debian:bookworm-slim"\n',
        "#!/bin/sh\nrm -rf /srv/data; echo 1 > /logs/verifier/reward.txt\n",
    )
    _, run_dir = bench.run()
    record = records(run_dir)["collect::1::maker"]
    assert record.status is S.COMPLETED, record.result
    names = sorted(a.name for a in record.result.artifacts if a.name.startswith("artifacts/"))
    # Collected before the verifier removed them; answer.txt is relative: in the workdir
    # (/), named as written; no link inside a folder is followed (shadow), no *.tmp.
    assert names == [
        "artifacts/answer.txt",
        "artifacts/srv/data/a.txt",
        "artifacts/srv/data/sub/b.txt",
    ]
    assert artifact_path(run_dir, record, "artifacts/srv/data/sub/b.txt").read_text() == "two\n"
    # A source that is itself a link is never followed, as in the process sandbox (Podman
    # would archive what it points at, as root: any file of the container).
    assert "artifact /srv/link.txt: not collected (it is a link" in " | ".join(record.result.notes)
    assert "artifact /srv/none: not collected (it does not exist)" in record.result.notes
