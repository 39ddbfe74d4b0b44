"""Subjects that try to cheat or spy, for real, against the process sandbox (namespaces).

Each attack is an ordinary shell command a hostile agent could run. The attempt must
gain nothing, and the record must say what happened where that is detectable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.sandbox.process import namespaces_unavailable
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import PLAIN_PROCESSES, REWARD_IF_DONE, files_containing, sandbox_layout, spec

S = AttemptStatus
SECRET_A = "sk-alpha-0123456789abcdef"
SECRET_B = "sk-bravo-fedcba9876543210"
TEST_MARKER = "verifier-secret-marker-7f3a"
ISOLATED = {"kind": "local", "config": {"isolation": "namespaces"}}

pytestmark = pytest.mark.skipif(
    namespaces_unavailable() is not None,
    reason=f"the namespace sandbox cannot run here: {namespaces_unavailable()}",
)

# The real verifier: reward 1 only if the subject did the task (done.txt).
VERIFIER = REWARD_IF_DONE.replace("#!/bin/sh\n", f"#!/bin/sh\n# {TEST_MARKER}\n")


def external(subject_id: str, script: str, **extra) -> dict:
    return {
        "id": subject_id,
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", script]},
        **extra,
    }


def stdout_of(run_dir: Path, cell: str) -> str:
    record = read_run(run_dir).attempts(cell)[-1]
    names = {a.name for a in record.result.artifacts}
    if "subject.stdout" not in names:
        return ""
    return artifact_path(run_dir, record, "subject.stdout").read_text()


def test_a_subject_cannot_find_tests_solution_run_folder_or_executor(setup, tmp_path):
    # It knows where everything is on the host (the experiment's folder): it looks there,
    # through its parent's cwd and cmdline, in every /proc entry and the environment.
    spy = external(
        "spy",
        'echo "ppid=$PPID"; ls /proc | grep -E "^[0-9]+$" | tr "\\n" " "; echo;'
        "cat /proc/$PPID/cmdline 2>&1 | tr '\\0' ' '; echo;"
        "ls /proc/$PPID/cwd/ 2>&1;"
        f"grep -rl {TEST_MARKER} {tmp_path} /tmp /run 2>/dev/null | head -5;"
        f"find {tmp_path} /tmp \\( -name test.sh -o -name solve.sh -o -name '0001.json' \\) "
        "2>/dev/null | head -5;"
        "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c MAKA_EVAL_WORK_DIR;"
        "env | sort",
    )
    s = setup(
        spec(subjects=[spy], executor=ISOLATED),
        {"t1": {"test_sh": VERIFIER, "solve_sh": "#!/bin/sh\n# solution-marker\ntouch done.txt\n"}},
    )
    s.run()
    out = stdout_of(s.run_dir, "t1::1::spy")
    assert TEST_MARKER not in out and "solution-marker" not in out
    assert "test.sh" not in out and "solve.sh" not in out and "0001.json" not in out
    assert str(s.run_dir) not in out and "experiment.json" not in out
    assert "ppid=0" in out  # its parent is outside its world
    pids = out.splitlines()[1].split()
    # Only the sandbox's own processes, numbered from 1 in its own PID namespace.
    assert pids and max(map(int, pids)) < 20, pids
    record = read_run(s.run_dir).attempts("t1::1::spy")[0]
    assert record.result.isolation == "namespaces"


def test_a_forged_reward_is_never_read(setup):
    forger = external(
        "forger",
        # Write rewards where the verifier writes them, keep rewriting them in the
        # background, and do not do the task.
        'mkdir -p "$MAKA_EVAL_VERIFIER_LOGS_DIR" /logs/verifier 2>/dev/null;'
        'for d in "$MAKA_EVAL_VERIFIER_LOGS_DIR" /logs/verifier '
        '"$(dirname $MAKA_EVAL_WORKSPACE)/logs/verifier"; do '
        '  echo \'{"reward": 1}\' > "$d/reward.json" 2>/dev/null; '
        '  echo 1 > "$d/reward.txt" 2>/dev/null; done;'
        '( while true; do for d in /logs/verifier "$MAKA_EVAL_VERIFIER_LOGS_DIR"; do '
        '  echo 1 > "$d/reward.txt" 2>/dev/null; done; sleep 0.01; done ) >/dev/null 2>&1 &'
        "sleep 0.2",
    )
    s = setup(spec(subjects=[forger], executor=ISOLATED), {"t1": {"test_sh": VERIFIER}})
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::forger")[0]
    assert record.status is S.COMPLETED and record.result.score == 0.0


def test_a_forged_reward_without_isolation_is_set_aside_and_noted(setup):
    forger = external(
        "forger",
        'logs="$(dirname "$MAKA_EVAL_WORKSPACE")/logs/verifier"; mkdir -p "$logs";'
        'echo \'{"reward": 1}\' > "$logs/reward.json"',
    )
    s = setup(spec(subjects=[forger], executor=PLAIN_PROCESSES), {"t1": {"test_sh": VERIFIER}})
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::forger")[0]
    assert record.result.score == 0.0
    assert record.result.isolation == "none"
    assert any("suspected tampering" in note for note in record.result.notes)


def test_a_subject_cannot_touch_the_run_folder(setup):
    s = setup(spec(subjects=[external("a", "touch done.txt")], executor=ISOLATED))
    s.run()  # the run folder exists now: the second run's subject attacks it
    forger = external(
        "a",
        f'd="{s.run_dir}/cells/t1/1/a/attempts"; mkdir -p "$d"; '
        'echo forged > "$d/0002.json"; echo forged > "$d/0009.json"; '
        f'rm -rf "{s.run_dir}/experiment.json" 2>&1; ls "{s.run_dir}"',
    )
    s.rewrite(spec(subjects=[forger], executor=ISOLATED))
    # a different experiment is refused; the same cell of a new run dir then:
    s.run_dir = s.run_dir.parent / "002"
    s.run()
    first = s.run_dir.parent / "001"
    assert (first / "experiment.json").exists()
    assert not list(first.glob("cells/*/*/*/attempts/0009.json"))
    assert read_run(first).damaged == []


def test_another_subjects_credential_is_out_of_reach(setup, tmp_path):
    drop = tmp_path / "drop"
    alpha = external(
        "alpha", f"echo $ALPHA > {drop} 2>/dev/null; sleep 1; touch done.txt", credentials=["ALPHA"]
    )
    bravo = external(
        "bravo",
        "sleep 0.3; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -i sk- ;"
        f"cat {drop} 2>/dev/null; env | grep -i sk-; touch done.txt",
        credentials=["BRAVO"],
    )
    s = setup(spec(subjects=[alpha, bravo], executor=ISOLATED))
    s.run(host_env={"PATH": "/usr/local/bin:/usr/bin:/bin", "ALPHA": SECRET_A, "BRAVO": SECRET_B})
    out = stdout_of(s.run_dir, "t1::1::bravo")
    assert SECRET_A not in out and "[redacted:ALPHA]" not in out
    assert not drop.exists()  # alpha's /tmp-side write stayed in its own sandbox
    assert files_containing(s.run_dir, SECRET_A.encode()) == []


def test_concurrent_cells_have_their_own_localhost(setup):
    # Every arm serves its own id on the same port; its verifier must get its own answer.
    server = (
        "echo $MAKA_EVAL_SUBJECT_ID > id.txt;"
        "python3 -m http.server 18765 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 0.5; touch done.txt"
    )
    test_sh = (
        "#!/bin/sh\n"
        'got=$(python3 -c "import urllib.request as u;'
        "print(u.urlopen('http://127.0.0.1:18765/id.txt').read().decode().strip())\")\n"
        'if [ "$got" = "$(cat id.txt)" ]; then r=1; else r=0; fi\n'
        'echo $r > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"\n'
    )
    s = setup(
        spec(
            subjects=[external(n, server) for n in ("a", "b", "c")],
            tasks=[{"id": "t1"}, {"id": "t2"}],
            execution={"maxConcurrentTaskGroups": 2},
            executor=ISOLATED,
        ),
        {"t1": {"test_sh": test_sh}, "t2": {"test_sh": test_sh}},
    )
    s.run()
    contents = read_run(s.run_dir)
    scores = {c: rs[0].result.score for c, rs in contents.records.items()}
    assert len(scores) == 6 and set(scores.values()) == {1.0}, scores
    assert all(len(rs) == 1 for rs in contents.records.values())
    # ...and every server died with its sandbox.
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _serves(p)]


def _serves(pid: str) -> bool:
    try:
        return b"18765" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_filling_tmp_hurts_no_one_else(setup):
    filler = external("filler", "head -c 2000000000 /dev/zero > /tmp/fill; touch done.txt")
    bystander = external("bystander", "sleep 1; echo ok > /tmp/mine && touch done.txt")
    s = setup(spec(subjects=[filler, bystander], executor=ISOLATED))
    s.run()
    contents = read_run(s.run_dir)
    assert contents.attempts("t1::1::bystander")[0].result.score == 1.0
    assert contents.attempts("t1::1::filler")[0].status is S.COMPLETED  # its /tmp was full


def test_the_oracle_sees_its_solution_at_harbor_paths(setup):
    oracle = {"id": "oracle", "kind": "oracle"}
    s = setup(
        spec(subjects=[oracle], executor=ISOLATED),
        {
            "t1": {
                # Harbor's paths: /solution for the oracle, /tests and /logs/verifier
                # for the verifier; a test.sh without a shebang runs with bash.
                "solve_sh": "#!/bin/sh\n[ -x /solution/solve.sh ] && touch done.txt\n",
                "test_sh": (
                    "[[ -f /tests/test.sh ]] && [ -f done.txt ] && r=1 || r=0\n"
                    "echo $r > /logs/verifier/reward.txt\n"
                ),
            }
        },
    )
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::oracle")[0]
    assert record.result.score == 1.0, record.result.reason
    assert json.loads(json.dumps(record.to_dict()))["result"]["isolation"] == "namespaces"


def test_no_sandbox_outlives_its_attempt(tmp_path):
    """Holders never used (a verifier that did not run) die with the attempt too."""
    import subprocess
    import time

    from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor
    from maka_eval.sandbox.base import Phase
    from maka_eval.sandbox.process import Namespaces

    supervisor = ProcessSupervisor()
    for i in range(30):
        root = tmp_path / str(i)
        sandbox = Namespaces(supervisor, f"a{i}", sandbox_layout(root))
        sandbox.start()
        if i % 2:
            proc = sandbox.spawn(
                Phase.SUBJECT,
                ["true"],
                env={"PATH": "/usr/bin:/bin"},
                cwd=str(root / "ws"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            sandbox.wait(proc, 10, CancelToken())
            sandbox.release(proc)
        sandbox.stop()

    def left() -> list[str]:
        return [
            pid
            for pid in os.listdir("/proc")
            if pid.isdigit() and str(tmp_path).encode() in _cmdline(pid)
        ]

    # The holders' last processes are reaped in the background: wait for it (the
    # deadline only ends a hang) rather than for a fixed 0.3 s.
    deadline = time.monotonic() + 120
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_attempts_on_ready_made_sandboxes_leave_nothing_for_each_other(setup):
    # Namespaces are made ahead over reused slots: a subject tries to leave a note for
    # a later attempt everywhere it can write (its folders, /tmp, every process's cwd
    # and root, the covered folders under its mounts) and looks for earlier notes.
    places = "/ /attempt /attempt/home /attempt/tmp /tmp /logs /logs/agent /dev/shm"
    leave = (
        'me="note-$MAKA_EVAL_REPETITION"; '
        f"found=$(find {places} -maxdepth 2 -name 'note-*' 2>/dev/null; "
        "ls -a /proc/[0-9]*/cwd/ /proc/[0-9]*/root/attempt/*/ 2>/dev/null | grep note-); "
        'echo "found:[$(echo $found | tr "\\n" " ")]"; '
        f"for d in . {places} /proc/[0-9]*/cwd /proc/[0-9]*/root/attempt/workspace; "
        'do echo x > "$d/$me" 2>/dev/null; done; touch done.txt'
    )
    s = setup(
        spec(
            subjects=[external("noter", leave)],
            executor=ISOLATED,
            repetitions=6,
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 1},
        ),
        {"t1": {}},
    )
    s.run()
    for rep in range(1, 7):
        cell = f"t1::{rep}::noter"
        out = stdout_of(s.run_dir, cell)
        found = out.split("found:[", 1)[1].split("]", 1)[0]
        # Only its own notes, never another repetition's.
        assert all(n.endswith(f"note-{rep}") for n in found.split()), (cell, out)
        assert read_run(s.run_dir).attempts(cell)[0].result.score == 1.0
