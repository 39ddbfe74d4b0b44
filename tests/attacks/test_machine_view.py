"""The process sandbox shows an allowlist, not the machine: attacked for real by a subject
that looks for the answers around its sandbox (tests/attacks/programs/prowler.py).

The benchmark here lives as people keep one: in a git repository outside /tmp (the
tasks with their solutions and tests committed), with a second checkout of the same tasks
beside it, the run folder next to the repository, and a note in root's home folder. The
subject reads the mount table, walks every folder it names and their parents and the
machine's user and data folders, and runs `git log -p` and `git grep` in every repository
it finds. Nothing of the solution, the tests, the other checkout, the run folder or the
home folder may be in what it read, and the mount table must name none of those places.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.store.run_store import artifact_path, read_run
from tests.attacks.programs import prowler
from tests.attacks.sandboxes import ISOLATED, NAMESPACES, PROCESS_SANDBOXES
from tests.helpers import make_task, spec, write_experiment
from tests.local.conftest import Setup

SANDBOX = "process sandbox (namespaces)"
"""Where these attacks run (bench/integrity_attacks.py prints it; a parameter naming
another sandbox, such as `policed`, says so in the test's id)."""
ATTACK_CLASS = "reading around the sandbox"

pytestmark = NAMESPACES

TAG = uuid.uuid4().hex[:12]
SOLUTION = f"solution-marker-{TAG}"
TESTS = f"tests-marker-{TAG}"
MIRROR = f"mirror-marker-{TAG}"
RUNS = f"runs-marker-{TAG}"
HOME = f"home-marker-{TAG}"
OTHER_TESTS = f"other-task-tests-marker-{TAG}"
KEY = bytes.fromhex(uuid.uuid4().hex + uuid.uuid4().hex)
"""The seal key the executor signs records with (its 32 bytes)."""
MARKERS = {
    "solution": SOLUTION,
    "tests": TESTS,
    "mirror": MIRROR,
    "runs": RUNS,
    "home": HOME,
    "another task's tests": OTHER_TESTS,
}

VERIFIER = f"""#!/bin/sh
# {TESTS}
if [ -f done.txt ]; then r=1; else r=0; fi
echo $r > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"
"""


@pytest.fixture
def bench(tmp_path, monkeypatch) -> Iterator[Path]:
    """A benchmark repository outside /tmp (the sandbox has always had a /tmp of its
    own), a second checkout, a runs folder beside them, a note in /root."""
    root = Path("/var/tmp") / f"maka-eval-attack-{TAG}-{uuid.uuid4().hex[:6]}"
    note = Path("/root") / f".maka-eval-attack-{TAG}"
    try:
        repo = root / "bench"
        for task in ("t1", "t2"):
            make_task(
                repo / "tasks",
                task,
                test_sh=VERIFIER if task == "t1" else VERIFIER.replace(TESTS, OTHER_TESTS),
                solve_sh=f"#!/bin/sh\n# {SOLUTION}\ntouch done.txt\n",
            )
            shutil.copy2(prowler.__file__, repo / "tasks" / task / "tests" / "prowler.py")
        git = ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b"]
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "tasks"], check=True)
        shutil.copytree(repo / "tasks", root / "mirror" / "tasks")
        (root / "mirror" / "README").write_text(MIRROR)
        (root / "runs").mkdir()
        (root / "runs" / "notes.txt").write_text(RUNS)
        note.write_text(HOME)
        # The records' seal key, where a user keeps it (not under /tmp, which sandboxes
        # have always had of their own): the executor alone may read it.
        keys = root / "keys"
        keys.mkdir(mode=0o700)
        (keys / "seal.key").write_bytes(KEY)
        (keys / "seal.key").chmod(0o600)
        monkeypatch.setenv("MAKA_EVAL_KEY_DIR", str(keys))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        note.unlink(missing_ok=True)


def _run_in_bench(bench: Path, subject: dict, executor: dict) -> Path:
    """Run task t1 of the benchmark repository with one subject; the run folder."""
    doc = spec(subjects=[subject], executor=executor, tasks=[{"id": "t1"}])
    doc["benchmark"]["config"] = {"path": "tasks"}
    s = Setup.__new__(Setup)
    s.root, s.doc, s.events = bench / "bench", doc, []
    s.path = write_experiment(bench / "bench", doc)
    s.run_dir = bench / "runs" / "001"
    s.run()
    return s.run_dir


def _prowl(bench: Path, tmp_path: Path, executor: dict) -> tuple[bytes, str]:
    agents = tmp_path / "agents"
    agents.mkdir()
    program = agents / "prowler.py"
    shutil.copy2(prowler.__file__, program)
    prowling = {"id": "prowler", "kind": "external", "config": {"command": str(program)}}
    run_dir = _run_in_bench(bench, prowling, executor)
    record = read_run(run_dir).attempts("t1::1::prowler")[-1]
    assert record.status is AttemptStatus.COMPLETED, record.result.reason
    assert record.result.score == 0.0
    found = prowler.decode(artifact_path(run_dir, record, "agent/found.b64").read_text())
    mountinfo = found.split(b"MOUNTINFO\n", 1)[1].split(b"\n/", 1)[0].decode(errors="replace")
    return found, mountinfo


@PROCESS_SANDBOXES
def test_the_subject_finds_no_answer_anywhere_around_it(bench, tmp_path, executor):
    found, _ = _prowl(bench, tmp_path, executor)
    assert b"MOUNTINFO" in found  # the prowler ran and reported
    leaked = {what: marker for what, marker in MARKERS.items() if marker.encode() in found}
    assert leaked == {}
    assert KEY not in found  # the records' seal key


@PROCESS_SANDBOXES
def test_the_mount_table_names_nothing_the_host_hides(bench, tmp_path, executor):
    _, mountinfo = _prowl(bench, tmp_path, executor)
    assert "/proc" in mountinfo  # it is the mount table
    for hidden in (bench, bench / "bench", bench / "bench" / "tasks", bench / "runs"):
        assert str(hidden) not in mountinfo
    for folder in ("/root", "/home", "/srv", "/opt", "/work", "/var/lib", "/sys"):
        assert f" {folder} " not in mountinfo and f" {folder}/" not in mountinfo, folder


def test_the_verifier_finds_no_other_task_run_folder_or_home_either(bench, tmp_path):
    """The verifier (trusted, but it runs in what the subject left: were anything planted
    to run in it) sees its own /tests and nothing else of the benchmark or the machine."""
    test_sh = VERIFIER.replace("if [ -f", "python3 /tests/prowler.py\nif [ -f")
    for task in ("t1", "t2"):
        path = bench / "bench" / "tasks" / task / "tests" / "test.sh"
        path.write_text(test_sh if task == "t1" else test_sh.replace(TESTS, OTHER_TESTS))
    subprocess.run(
        [
            "git",
            "-C",
            str(bench / "bench"),
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-qam",
            "verifier",
        ],
        check=True,
    )
    noop = {"id": "noop", "kind": "external", "config": {"command": "true"}}
    run_dir = _run_in_bench(bench, noop, ISOLATED)
    record = read_run(run_dir).attempts("t1::1::noop")[-1]
    said = artifact_path(run_dir, record, "verifier.stdout").read_text()
    found = prowler.decode(said.split("FOUND:", 1)[1].split()[0])
    assert b"MOUNTINFO" in found
    leaked = {w: m for w, m in MARKERS.items() if m.encode() in found and w != "tests"}
    assert leaked == {}


def test_the_machines_credentials_in_etc_are_masked(setup, tmp_path):
    """/etc is shown, without what an unprivileged user could not read (shadow, private
    keys): a root subject would otherwise read them."""
    reader = {
        "id": "reader",
        "kind": "external",
        "config": {
            "command": "sh",
            "args": [
                "-c",
                "for f in /etc/shadow /etc/gshadow /etc/ssl/private/*; do "
                'echo "== $f"; cat "$f" 2>&1 | head -c 200; done; echo; cat /etc/passwd | head -1',
            ],
        },
    }
    s = setup(
        spec(subjects=[reader], executor={"kind": "local", "config": {"isolation": "namespaces"}})
    )
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::reader")[-1]
    said = artifact_path(s.run_dir, record, "subject.stdout").read_text()
    assert "root:" in said  # /etc/passwd is there
    shadow = Path("/etc/shadow").read_text()
    root_hash = next(line for line in shadow.splitlines() if line.startswith("root:"))
    assert root_hash not in said
    # Not in the sandbox's /etc at all (or masked in place: nothing to read either way).
    shown = said.split("== /etc/shadow\n", 1)[1].split("== ", 1)[0]
    assert shown in (
        "",
        "cat: /etc/shadow: No such file or directory\n",
        "cat: /etc/shadow: Permission denied\n",
    ), shown
