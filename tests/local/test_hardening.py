"""What the review found by trying it: output caps, secrets in every string, a full disk,
edited agent scripts, and multi-arm groups that must not spin."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.errors import ResourceError, StoreError
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import PLAIN_PROCESSES, files_containing, spec, write_script

S = AttemptStatus
SECRET_A = "sk-alpha-0123456789abcdef"
SECRET_B = "sk-bravo-fedcba9876543210"


def test_output_past_the_cap_is_cut_with_a_marker_and_the_record_says_so(setup):
    loud = {
        "id": "loud",
        "kind": "external",
        # 40 MB on stdout: far past the cap, and faster to discard than to store.
        "config": {"command": "sh", "args": ["-c", "head -c 40000000 /dev/zero; touch done.txt"]},
    }
    s = setup(
        spec(subjects=[loud], execution={"maxConcurrentTaskGroups": 1, "maxOutputBytes": 4096})
    )
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::loud")[0]
    assert record.status is S.COMPLETED and record.result.score == 1.0
    stdout = next(a for a in record.result.artifacts if a.name == "subject.stdout")
    assert stdout.truncated
    data = artifact_path(s.run_dir, record, "subject.stdout").read_bytes()
    assert data[:4096] == b"\0" * 4096
    assert data[4096:].decode() == (
        "\n[maka-eval: output cut at 4096 bytes; 39995904 more bytes were discarded]\n"
    )
    assert stdout.bytes == len(data)
    # Nothing of the 40 MB was kept anywhere, not even in the work folder.
    work = Path(os.environ["MAKA_EVAL_WORK_DIR"])
    assert sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) < 1_000_000


def test_short_output_is_not_marked(setup):
    s = setup(spec())
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::done")[0]
    assert not any(a.truncated for a in record.result.artifacts)


def _two_subjects_with_secrets(frame: dict, reward: str, drop: Path) -> dict:
    leaky_frame = (
        "import json, os\n"
        f"open({str(drop)!r}, 'w').write(os.environ['ALPHA'])\n"
        f"frame = {json.dumps(frame)}\n"
        "text = json.dumps(frame).replace('@A', os.environ.get('ALPHA', '')).replace("
        "'@B', os.environ.get('ALPHA_COPY', ''))\n"
        "open(os.environ['MAKA_EVAL_RESULT_FILE'], 'w').write(text)\n"
        "print('mine:', os.environ.get('ALPHA'))\n"
    )
    return {
        "subjects": [
            {
                "id": "alpha",
                "kind": "external",
                "credentials": ["ALPHA"],
                "config": {
                    "command": "python3",
                    "args": ["-c", leaky_frame],
                    "resultContract": "protocol-v1",
                },
            },
            {
                # Bravo learned alpha's key somehow (a shared cache, a log): it prints it.
                "id": "bravo",
                "kind": "external",
                "credentials": ["BRAVO"],
                "config": {
                    "command": "sh",
                    "args": ["-c", f"sleep 1; echo stolen $(cat {drop}); touch done.txt"],
                },
            },
        ],
        "reward": reward,
    }


@pytest.mark.parametrize(
    ("frame", "test_sh"),
    [
        # the secret as an unknown frame field -> malformed frame -> reason names fields
        (
            {"protocol": "maka.eval.result.v1", "@A": 1},
            "echo 1 > $MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt",
        ),
        # the secret as a reward.json key -> "no 'reward' key (keys: ...)"
        (
            {"protocol": "maka.eval.result.v1"},
            f"echo '{{\"{SECRET_A}\": 1}}' > $MAKA_EVAL_VERIFIER_LOGS_DIR/reward.json",
        ),
        # the secret as reward.txt content -> "does not hold one number: ..."
        (
            {"protocol": "maka.eval.result.v1"},
            f"echo '{SECRET_A}' > $MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt",
        ),
        # a reward.json key that is the secret next to a valid reward -> metrics names
        (
            {"protocol": "maka.eval.result.v1"},
            f'echo \'{{"reward": 1, "{SECRET_A}": 2}}\' > $MAKA_EVAL_VERIFIER_LOGS_DIR/reward.json',
        ),
    ],
)
def test_no_credential_value_reaches_any_record_field_or_artifact(setup, frame, test_sh, tmp_path):
    parts = _two_subjects_with_secrets(frame, test_sh, tmp_path / "shared-drop")
    # Plain processes, so that bravo can steal alpha's key through a shared file; the
    # sandbox tests prove that, isolated, it cannot.
    s = setup(
        spec(subjects=parts["subjects"], executor=PLAIN_PROCESSES),
        {"t1": {"test_sh": "#!/bin/sh\n" + test_sh + "\n"}},
    )
    s.run(host_env={"PATH": "/usr/local/bin:/usr/bin:/bin", "ALPHA": SECRET_A, "BRAVO": SECRET_B})
    assert files_containing(s.run_dir, SECRET_A.encode()) == []
    assert files_containing(s.run_dir, SECRET_B.encode()) == []
    contents = read_run(s.run_dir)
    every = [r for rs in contents.records.values() for r in rs]
    assert every and all(SECRET_A not in json.dumps(r.to_dict()) for r in every)
    texts = " ".join(str(r.result.reason) + json.dumps(dict(r.result.metrics)) for r in every)
    bravo = contents.attempts("t1::1::bravo")[0]
    stdout = artifact_path(s.run_dir, bravo, "subject.stdout").read_text()
    assert stdout == "stolen [redacted:ALPHA]\n"  # another subject's secret, redacted too
    assert SECRET_A not in texts
    if "@A" in json.dumps(frame) or ("reward.txt" in test_sh and SECRET_A in test_sh):
        assert "[redacted:ALPHA]" in texts
    # ...and the terminal: status and results print reasons.
    from typer.testing import CliRunner

    from maka_eval.cli.main import app

    for command in (["status", str(s.run_dir)], ["results", str(s.run_dir), "--format", "json"]):
        out = CliRunner().invoke(app, command)
        assert SECRET_A not in out.output and SECRET_B not in out.output


def test_an_edited_agent_script_is_a_different_experiment(setup, tmp_path):
    agent = write_script(tmp_path / "agents" / "agent.sh", "#!/bin/sh\ntouch done.txt\n")
    subject = {"id": "mine", "kind": "external", "config": {"command": "agents/agent.sh"}}
    s = setup(spec(subjects=[subject]))
    s.run()
    agent.write_text("#!/bin/sh\necho changed; touch done.txt\n")
    with pytest.raises(StoreError) as info:
        s.run()
    assert "programDigests.subjects.mine" in info.value.render()


def test_two_arm_groups_do_not_spin(setup):
    """A group's arms end at different times; the executor must sleep, not poll."""
    slow = {
        "id": "slow",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", "sleep 1.5; touch done.txt"]},
    }
    fast = {"id": "fast", "kind": "external", "config": {"command": "touch", "args": ["done.txt"]}}
    s = setup(spec(subjects=[slow, fast], repetitions=2, execution={"maxConcurrentTaskGroups": 1}))
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    s.run()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert wall >= 3.0
    # Waiting 3 s for the slow arms costs next to no CPU (a 0.25 s poll or a spin would not).
    assert cpu < 0.6 * wall, (cpu, wall)
    records = read_run(s.run_dir).records
    assert {c: [r.status for r in rs] for c, rs in records.items()} == {
        f"t1::{rep}::{subj}": [S.COMPLETED] for rep in (1, 2) for subj in ("slow", "fast")
    }


def test_records_say_why_each_attempt_ran(setup):
    flaky = {
        "id": "flaky",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", "touch done.txt"]},
    }
    s = setup(spec(subjects=[flaky]), {"t1": {"test_sh": "#!/bin/sh\nexit 0\n"}})
    s.run()
    records = read_run(s.run_dir).attempts("t1::1::flaky")
    assert [r.trigger for r in records] == [Trigger.SCHEDULED, Trigger.RETRY]
    assert all(r.result.status_source is StatusSource.VERIFIER for r in records)
    s.run(cells=("t1::1::flaky",))
    again = read_run(s.run_dir).attempts("t1::1::flaky")[-1]
    assert again.trigger is Trigger.MANUAL and again.request and again.request.startswith("cli-")


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def small_disk(tmp_path):
    """A real 16 MiB file system (tmpfs), mounted for the test and removed after."""
    if not _is_root():
        pytest.skip("mounting a small file system to fill needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_work_disk_stops_the_run_without_charging_anyone(setup, small_disk, monkeypatch):
    monkeypatch.setenv("MAKA_EVAL_WORK_DIR", str(small_disk))
    filler = {
        "id": "filler",
        "kind": "external",
        "config": {
            "command": "sh",
            "args": ["-c", "head -c 64000000 /dev/zero > big; touch done.txt"],
        },
    }
    bystander = {
        "id": "bystander",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", "sleep 0.5; touch done.txt"]},
    }
    s = setup(
        spec(
            subjects=[filler, bystander],
            tasks=[{"id": "t1"}, {"id": "t2"}],
            execution={"maxConcurrentTaskGroups": 2, "maxInfraRetries": 2},
        )
    )
    with pytest.raises(ResourceError) as info:
        s.run(host_env={"PATH": "/usr/bin:/bin", "MAKA_EVAL_WORK_DIR": str(small_disk)})
    message = info.value.render()
    assert str(small_disk) in message and "is full" in message
    every = [r for rs in read_run(s.run_dir).records.values() for r in rs]
    assert every, "the attempts that were running are recorded"
    assert all(r.status is S.CANCELLED for r in every), [(r.cell_id, r.status) for r in every]
    assert all(r.trigger is Trigger.SCHEDULED for r in every)  # no retry was spent
    # With room again, the same command resumes and every cell gets its result.
    # The spec is frozen: free the space instead of changing the agent.
    subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
    s.run(host_env={"PATH": "/usr/bin:/bin", "MAKA_EVAL_WORK_DIR": str(small_disk)})
    contents = read_run(s.run_dir)
    selected = {c: [r.status for r in rs][-1] for c, rs in contents.records.items()}
    assert selected == {
        f"{t}::1::{x}": S.COMPLETED for t in ("t1", "t2") for x in ("filler", "bystander")
    }


@pytest.mark.skipif(
    os.geteuid() != 0 or os.path.exists("/logs"),
    reason="needs root and a machine without its own /logs (the test makes one)",
)
def test_a_machine_with_its_own_logs_folder_still_sandboxes_its_attempts(setup):
    # Found by running a task with artifacts unsandboxed: once the host had a /logs, the
    # read-only view of it left no room for /logs/agent and /logs/verifier.
    from maka_eval.sandbox.process import namespaces_unavailable

    if namespaces_unavailable():
        pytest.skip(f"no namespaces here: {namespaces_unavailable()}")
    Path("/logs/app").mkdir(parents=True)
    try:
        (Path("/logs/app") / "host.log").write_text("the machine's own\n")
        look = {
            "id": "look",
            "kind": "external",
            "config": {"command": "sh", "args": ["-c", "ls -R /logs; touch done.txt"]},
        }
        s = setup(
            spec(
                subjects=[look],
                executor={"kind": "local", "config": {"isolation": "namespaces"}},
                execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
            )
        )
        s.run()
        record = read_run(s.run_dir).attempts("t1::1::look")[0]
    finally:
        import shutil

        shutil.rmtree("/logs")
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result.reason
    seen = artifact_path(s.run_dir, record, "subject.stdout").read_text()
    assert "host.log" not in seen and "agent" in seen
