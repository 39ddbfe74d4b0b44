"""`executor.kind: harbor` on real Harbor 0.26 and real Podman (proof of issue 10).

Two Harbor runs (7 trials) are shared by the tests of this module:
- `group_run`: write-answer x {oracle, nop, agent (holds a credential), peeker (none)},
  one task group, so the four trials start together;
- `failure_run`: slow-agent (the subject outlives the agent timeout), no-reward (the
  verifier writes no reward) and offline (a no-network task) x {sleeper}, with one
  infrastructure retry.
The same two experiments then run under `executor.kind: local` with the container
backend, and must give the same rewards and statuses.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from maka_eval.artifacts import digest_file
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.errors import PrerequisiteError
from maka_eval.local.executor import RunReport
from maka_eval.store.run_store import artifact_path
from tests.harbor.conftest import HarborSetup, experiment, make_setup
from tests.helpers import files_containing

pytestmark = pytest.mark.slow

TOKEN = "hb-proof-7f3c9e1d2b4a6058"
INSTRUCTION = "Write the number 42 to /app/answer.txt."
SUBJECTS: list[dict[str, Any]] = [
    {"id": "oracle", "kind": "oracle"},
    {"id": "nop", "kind": "nop"},
    {
        "id": "agent",
        "kind": "external",
        "credentials": ["HARBOR_PROOF_TOKEN"],
        "config": {
            "command": "sh",
            "args": [
                "-c",
                # /run/.containerenv exists only inside a Podman container; /app is the
                # task image's WORKDIR: the answer lands where the verifier looks.
                "test -f /run/.containerenv && echo 42 > /app/answer.txt; "
                'echo "token=$HARBOR_PROOF_TOKEN"; echo "workspace=$MAKA_EVAL_WORKSPACE"; '
                'cat "$MAKA_EVAL_INSTRUCTION_FILE"',
            ],
        },
    },
    {
        "id": "peeker",
        "kind": "external",
        "config": {
            "command": "sh",
            "args": ["-c", 'echo "peek=${HARBOR_PROOF_TOKEN:-absent}"'],
        },
    },
]
SLEEPER: dict[str, Any] = {
    "id": "sleeper",
    "kind": "external",
    "config": {
        "command": "sh",
        "args": [
            "-c",
            "echo started > /app/progress.txt; "
            'if [ "$MAKA_EVAL_TASK_ID" = slow-agent ]; then sleep 300; fi; '
            "echo 42 > /app/answer.txt",
        ],
    },
}
LOCAL_CONTAINERS = {"kind": "local", "config": {"sandbox": "container", "isolation": "auto"}}


def _run(root: Path, doc: dict[str, Any], python: str, engine: str, **options: Any):
    setup = make_setup(root, doc, python, engine, {"HARBOR_PROOF_TOKEN": TOKEN})
    return setup, setup.run(**options)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A private folder for this module's runs (kept out of pytest's rotated basetemp,
    which concurrent sessions on one machine prune while a long run is still going)."""
    root = Path(tempfile.mkdtemp(prefix="maka-eval-harbor-tests-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def group_run(scratch: Path, harbor_python: str, container_engine: str):
    root = scratch / "group"
    doc = experiment(["write-answer"], SUBJECTS)
    return _run(root, doc, harbor_python, container_engine, keep_workspaces=True)


@pytest.fixture(scope="module")
def failure_run(scratch: Path, harbor_python: str, container_engine: str):
    root = scratch / "failures"
    doc = experiment(["slow-agent", "no-reward", "offline"], [SLEEPER], retries=1, groups=2)
    return _run(root, doc, harbor_python, container_engine)


def _by_cell(report: RunReport) -> dict[str, list[AttemptRecord]]:
    cells: dict[str, list[AttemptRecord]] = {}
    for record in sorted(report.records, key=lambda r: (r.cell_id, r.attempt)):
        cells.setdefault(record.cell_id, []).append(record)
    return cells


def _artifact(setup: HarborSetup, record: AttemptRecord, name: str) -> Path:
    path = artifact_path(setup.run_dir, record, name)
    assert path.is_file(), f"no {name} for {record.cell_id} at {path}"
    return path


def _trial_files(setup: HarborSetup, record: AttemptRecord) -> dict[str, bytes]:
    with tarfile.open(_artifact(setup, record, "harbor-trial.tar.gz")) as archive:
        return {
            m.name.split("/", 1)[1]: archive.extractfile(m).read()  # type: ignore[union-attr]
            for m in archive.getmembers()
            if m.isfile()
        }


def test_oracle_scores_1_and_nop_scores_0(group_run):
    _, report = group_run
    cells = _by_cell(report)
    oracle, nop = cells["write-answer::1::oracle"], cells["write-answer::1::nop"]
    assert [(r.result.status, r.result.score) for r in oracle] == [(AttemptStatus.COMPLETED, 1.0)]
    assert [(r.result.status, r.result.score) for r in nop] == [(AttemptStatus.COMPLETED, 0.0)]
    assert oracle[0].result.isolation == "container"


def test_external_subject_runs_inside_the_task_container_through_the_relay_agent(group_run):
    setup, report = group_run
    (agent,) = _by_cell(report)["write-answer::1::agent"]
    # The reward needs /app/answer.txt in the container Harbor's verifier scored, and the
    # command wrote it only where /run/.containerenv exists.
    assert (agent.result.status, agent.result.score) == (AttemptStatus.COMPLETED, 1.0)
    assert agent.result.status_source is StatusSource.EXIT_CODE
    files = _trial_files(setup, agent)
    relay = files["agent/maka-relay.json"].decode()
    assert '"kind": "external"' in relay and '"exitCode": 0' in relay
    stdout = files["agent/subject.stdout"].decode()
    assert "workspace=/app" in stdout and INSTRUCTION in stdout
    # Harbor ran our relay Agent, not one of its own.
    assert b"maka_eval_harbor.agent:RelayAgent" in files["config.json"]


def test_the_arms_of_a_group_start_together(group_run):
    _, report = group_run
    starts = [r.subject_started_at for r in report.records]
    assert all(s is not None for s in starts)
    moments = [datetime.fromisoformat(str(s).replace("Z", "+00:00")) for s in starts]
    assert (max(moments) - min(moments)).total_seconds() < 5.0


def test_the_trial_folder_is_an_attempt_artifact_with_bytes_and_sha256(group_run):
    setup, report = group_run
    for record in report.records:
        (entry,) = [a for a in record.result.artifacts if a.name == "harbor-trial.tar.gz"]
        digest = digest_file(_artifact(setup, record, "harbor-trial.tar.gz"))
        assert (entry.bytes, entry.sha256) == (digest.bytes, digest.sha256)
        files = _trial_files(setup, record)
        assert {"result.json", "config.json", "trial.log"} <= set(files)
        assert any(name.startswith("verifier/reward") for name in files)


def test_a_credential_reaches_only_its_subject_and_never_harbors_folders_or_the_run(group_run):
    setup, report = group_run
    cells = _by_cell(report)
    agent_out = _trial_files(setup, cells["write-answer::1::agent"][0])["agent/subject.stdout"]
    assert b"token=[redacted:HARBOR_PROOF_TOKEN]" in agent_out  # it had it, and it is scrubbed
    peeker_out = _trial_files(setup, cells["write-answer::1::peeker"][0])["agent/subject.stdout"]
    assert b"peek=absent" in peeker_out  # the subject that did not declare it never saw it
    harbor_jobs = list((setup.root / "work").glob("*/harbor/trials"))
    assert harbor_jobs and any(harbor_jobs[0].iterdir())  # Harbor's folder was kept
    assert files_containing(harbor_jobs[0], TOKEN.encode()) == []
    assert files_containing(setup.root / "work", TOKEN.encode()) == []
    assert files_containing(setup.run_dir, TOKEN.encode()) == []
    for record in report.records:  # inside the compressed trial artifacts too
        assert all(TOKEN.encode() not in data for data in _trial_files(setup, record).values())


def test_an_agent_timeout_is_subject_failed_with_the_reward_kept(failure_run):
    _, report = failure_run
    (slow,) = _by_cell(report)["slow-agent::1::sleeper"]
    assert slow.result.status is AttemptStatus.SUBJECT_FAILED
    assert slow.result.status_source is StatusSource.TIMEOUT
    assert slow.result.score == 0.5  # the progress file the subject left before the cut


def test_a_missing_reward_is_infra_failed_and_retried_up_to_the_cap(failure_run):
    _, report = failure_run
    attempts = _by_cell(report)["no-reward::1::sleeper"]
    assert [r.attempt for r in attempts] == [1, 2]  # maxInfraRetries: 1
    for record in attempts:
        assert record.result.status is AttemptStatus.INFRA_FAILED
        assert record.result.status_source is StatusSource.VERIFIER
        assert record.result.score is None
        assert "RewardFileNotFoundError" in (record.result.reason or "")


def test_a_no_network_task_runs_offline_with_loopback_only(failure_run):
    _, report = failure_run
    (offline,) = _by_cell(report)["offline::1::sleeper"]
    # The verifier gives 1 only when the container's one interface is lo.
    assert (offline.result.status, offline.result.score) == (AttemptStatus.COMPLETED, 1.0)


def _scores(report: RunReport) -> dict[str, list[tuple[str, float | None]]]:
    return {
        cell: [(r.result.status.value, r.result.score) for r in records]
        for cell, records in _by_cell(report).items()
    }


def test_the_same_tasks_give_the_same_rewards_under_the_local_container_backend(
    group_run, failure_run, scratch, harbor_python, container_engine
):
    for name, (setup, harbor) in {"group": group_run, "failures": failure_run}.items():
        doc = {**setup.doc, "executor": LOCAL_CONTAINERS}
        _, local = _run(scratch / f"local-{name}", doc, harbor_python, container_engine)
        assert all(r.result.isolation == "container" for r in local.records)
        assert _scores(local) == _scores(harbor)


def test_prerequisites_name_the_variable_and_the_versions(
    tmp_path, harbor_python, container_engine
):
    doc = experiment(["write-answer"], [{"id": "nop", "kind": "nop"}])
    setup = make_setup(tmp_path, doc, harbor_python, container_engine)
    del setup.env["MAKA_EVAL_HARBOR_PYTHON"]
    with pytest.raises(
        PrerequisiteError, match=r"MAKA_EVAL_HARBOR_PYTHON: not set \(expected harbor 0\.26\.\*\)"
    ):
        setup.run()
    # maka-eval's own interpreter has no Harbor: found and expected versions are named.
    import sys

    setup.env["MAKA_EVAL_HARBOR_PYTHON"] = sys.executable
    with pytest.raises(
        PrerequisiteError, match=r"has harbor \(not installed\); expected harbor 0\.26"
    ):
        setup.run()
    assert not setup.run_dir.exists()  # nothing was started


def test_harbor_refuses_a_bad_environment_option_before_any_trial(
    tmp_path, harbor_python, container_engine
):
    executor = {
        "kind": "harbor",
        "config": {"environment": {"type": "podman", "no_such_option": 1}},
    }
    doc = experiment(["write-answer"], [{"id": "nop", "kind": "nop"}], executor=executor)
    setup = make_setup(tmp_path, doc, harbor_python, container_engine)
    with pytest.raises(PrerequisiteError) as caught:
        setup.run()
    message = str(caught.value)
    assert "executor.config.environment: Harbor refuses it" in message
    assert "no_such_option" in message
