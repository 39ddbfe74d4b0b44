"""Credentials, attacked for real in the process sandbox (namespaces), with and without
a policed network: a subject that wants another arm's API key, or anything of the
executor's environment, and a verifier that must not hold any credential.

The credentials are exported in the executor's own environment, as a user who runs
`export OPENAI_API_KEY=... ; maka-eval run ...` has them. What the spy finds it writes out
base64-encoded, which redaction cannot recognise: the tests decode it, so they check what
the spy could read, not what redaction caught afterwards.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from pathlib import Path

import pytest

from maka_eval.store.run_store import artifact_path, read_run
from tests.attacks.programs import spy
from tests.attacks.sandboxes import CONTAINER, EVERY_SANDBOX, ISOLATED, NAMESPACES
from tests.helpers import REWARD_ONE, spec
from tests.sandbox.test_container import PYTHON_IMAGE

SANDBOX = "process sandbox (namespaces)"
"""Where these attacks run (bench/integrity_attacks.py prints it; a parameter naming
another sandbox, such as `policed`, says so in the test's id)."""
ATTACK_CLASS = "credentials"

pytestmark = NAMESPACES

SECRET_A = "sk-spy-own-0123456789abcdef0123"
SECRET_B = "sk-victim-fedcba9876543210fedc"
HOST_SECRET = "aws-host-only-5f4e3d2c1b0a99887766"
"""In the executor's environment, declared by no subject."""

SPY = Path(spy.__file__)
"""Reads everything that could carry an environment and writes it out base64-encoded."""
VICTIM = "import time; time.sleep(4)"

# The verifier (trusted, but it must hold no credential): its whole environment, every
# environ it can read, base64 on its stdout; reward 1 regardless.
VERIFIER_SPY = (
    "#!/bin/sh\n"
    "python3 -c '\n"
    "import base64, glob, os\n"
    'data = b"\\0".join(f"{k}={v}".encode() for k, v in os.environ.items())\n'
    'for path in glob.glob("/proc/[0-9]*/environ"):\n'
    "    try:\n"
    '        data += b"\\n" + open(path, "rb").read()\n'
    "    except OSError:\n"
    "        pass\n"
    'print("VLOOT:" + base64.b64encode(bytes(b ^ 0x5A for b in data)).decode())\n'
    "'\n" + REWARD_ONE.split("\n", 1)[1]
)


def _export(monkeypatch) -> dict[str, str]:
    for name, value in (("KEY_A", SECRET_A), ("KEY_B", SECRET_B), ("AWS_SECRET", HOST_SECRET)):
        monkeypatch.setenv(name, value)
    return dict(os.environ)


def _subjects(tmp_path: Path) -> list[dict]:
    agents = tmp_path / "agents"
    agents.mkdir(exist_ok=True)
    program = agents / SPY.name
    shutil.copy2(SPY, program)
    spy = {
        "id": "spy",
        "kind": "external",
        "credentials": ["KEY_A"],
        "config": {"command": str(program), "args": ["--linger"]},
    }
    victim = {
        "id": "victim",
        "kind": "external",
        "credentials": ["KEY_B"],
        "config": {"command": "python3", "args": ["-c", VICTIM]},
    }
    return [spy, victim]


def _decoded(text: str, marker: str, xor: bool = False) -> bytes:
    out = b""
    for match in re.finditer(re.escape(marker) + r"([A-Za-z0-9+/=]*)", text):
        data = base64.b64decode(match.group(1) + "=" * (-len(match.group(1)) % 4))
        out += bytes(b ^ spy.KEY for b in data) if xor else data
    return out


def _artifact(run_dir: Path, cell: str, name: str) -> str:
    record = read_run(run_dir).attempts(cell)[-1]
    if name not in {a.name for a in record.result.artifacts}:
        return ""
    return artifact_path(run_dir, record, name).read_text(errors="replace")


def _spy_loot(run_dir: Path) -> bytes:
    loot = _decoded(_artifact(run_dir, "t1::1::spy", "subject.stdout"), "LOOT:", xor=True)
    loot += spy.decode(_artifact(run_dir, "t1::1::spy", "agent/loot.b64"))
    assert loot, "the spy read nothing: the attack did not run"
    return loot


def _run(setup, monkeypatch, tmp_path, executor, request=None) -> tuple[Path, bytes]:
    env = _export(monkeypatch)
    doc = spec(
        subjects=_subjects(tmp_path), executor=executor, execution={"maxConcurrentTaskGroups": 1}
    )
    task: dict = {"test_sh": VERIFIER_SPY}
    if executor is CONTAINER:
        assert request is not None
        env["DOCKER_HOST"] = request.getfixturevalue("container_engine")
        task["toml"] = f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\n'
    s = setup(doc, {"t1": task})
    s.run(host_env=env)
    return s.run_dir, _spy_loot(s.run_dir)


@EVERY_SANDBOX
def test_no_process_a_subject_can_see_carries_another_credential(
    setup, monkeypatch, tmp_path, executor, request
):
    _, loot = _run(setup, monkeypatch, tmp_path, executor, request)
    # PID 1 of the sandbox, every process, files: neither the other arm's key nor the
    # executor's environment. Its own key it has, in its own environment only.
    assert SECRET_B.encode() not in loot
    assert HOST_SECRET.encode() not in loot
    assert b"MAKA_EVAL_WORK_DIR" not in loot  # nothing of the executor's environment
    assert b"/proc/1/cmdline=" in loot  # it did read PID 1
    if executor is not CONTAINER:  # (a container's init holds a capability it lacks)
        assert b"/proc/1/environ=" in loot
    pid1 = (
        loot.split(b"/proc/1/environ=", 1)[1].split(b"\n", 1)[0] if b"/proc/1/env" in loot else b""
    )
    # Not even its own key: PID 1 is bubblewrap, or the container's sleeping init.
    assert SECRET_A.encode() not in pid1


@EVERY_SANDBOX
def test_a_process_left_reading_while_the_verifier_runs_finds_nothing(
    setup, monkeypatch, tmp_path, executor, request
):
    run_dir, _ = _run(setup, monkeypatch, tmp_path, executor, request)
    later = spy.decode(_artifact(run_dir, "t1::1::spy", "agent/later.b64"))
    assert b"/proc/1/cmdline=" in later, "the process left behind read nothing"
    assert SECRET_B.encode() not in later and HOST_SECRET.encode() not in later


@EVERY_SANDBOX
def test_the_verifier_holds_no_credential(setup, monkeypatch, tmp_path, executor, request):
    run_dir, _ = _run(setup, monkeypatch, tmp_path, executor, request)
    for cell, own in (("t1::1::spy", SECRET_A), ("t1::1::victim", SECRET_B)):
        seen = _decoded(_artifact(run_dir, cell, "verifier.stdout"), "VLOOT:", xor=True)
        assert seen, "the verifier's spy printed nothing"
        assert b"PATH=" in seen  # it did dump its environment
        # In a container the verifier shares the PID namespace with what the subject
        # left running (tests look for the services it started): a root verifier can
        # read that subject's own key from such a process, never any other.
        others = [s for s in (SECRET_A, SECRET_B, HOST_SECRET) if s != own]
        mine = [] if executor is CONTAINER else [own]
        for secret in [*others, *mine]:
            assert secret.encode() not in seen, (cell, secret)
        own_environment = seen.split(b"\n", 1)[0]
        assert own.encode() not in own_environment  # never handed to it
        assert b"MAKA_EVAL_WORK_DIR" not in seen


def test_no_credential_reaches_the_run_folder_in_any_encoding_it_was_given_in(setup, monkeypatch):
    """A subject writes its own key out, encoded: the artifacts, records and reasons
    carry no form of it that a reader would recognise (redaction, the last line)."""
    env = _export(monkeypatch)
    leak = (
        "import base64, os, urllib.parse\n"
        "k = os.environ['KEY_A']\n"
        "b = k.encode()\n"
        "e = base64.b64encode\n"
        "forms = [k, e(b).decode(), e(b'x' + b).decode(), e(b'xy' + b).decode(),\n"
        "         base64.urlsafe_b64encode(b).decode(), b.hex(), b.hex().upper(),\n"
        "         urllib.parse.quote(k, safe=''), k[::-1]]\n"
        "print('\\n'.join(forms))\n"
        "os.makedirs('/logs/agent', exist_ok=True)\n"
        "open('/logs/agent/leak.txt', 'w').write(' '.join(forms))\n"
    )
    leaker = {
        "id": "leaker",
        "kind": "external",
        "credentials": ["KEY_A"],
        "config": {"command": "python3", "args": ["-c", leak]},
    }
    s = setup(spec(subjects=[leaker], executor=ISOLATED), {"t1": {"test_sh": REWARD_ONE}})
    s.run(host_env=env)
    forms = _forms(SECRET_A)
    found = []
    for path in s.run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [(path.name, f) for f in forms if f.encode() in data]
    assert found == []
    stdout = _artifact(s.run_dir, "t1::1::leaker", "subject.stdout")
    assert stdout.count("[redacted:KEY_A]") == len(forms)


def _forms(secret: str) -> list[str]:
    import urllib.parse

    raw = secret.encode()
    return [
        secret,
        base64.b64encode(raw).decode().rstrip("="),
        base64.b64encode(b"x" + raw).decode()[4:-4],
        base64.b64encode(b"xy" + raw).decode()[4:-4],
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        raw.hex(),
        raw.hex().upper(),
        urllib.parse.quote(secret, safe=""),
        secret[::-1],
    ]


HIDER = r"""
import os, subprocess, sys
from maka_eval.processes.supervisor import ProcessSupervisor
os.environ["KEY_Z"] = sys.stdin.read()
ProcessSupervisor()  # what the executor and the relay make first
# A subject run as a plain process of the same user (isolation: none) reads the
# executor's environment, and its command line.
probe = subprocess.run(
    ["sh", "-c", f"cat /proc/{os.getpid()}/environ /proc/{os.getpid()}/cmdline"],
    capture_output=True, env={"PATH": "/usr/bin:/bin"},
)
sys.stdout.buffer.write(probe.stdout + b"|" + probe.stderr)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the executor as another user")
def test_a_plain_process_of_the_same_user_cannot_read_the_executors_environment(tmp_path):
    """Without namespaces (isolation: none, a user who is not root), subjects are the
    executor's user: its environment (every credential) is still out of their reach."""
    import subprocess
    import sys

    import maka_eval

    operator_dir = str(Path(maka_eval.__file__).parents[1])
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            HIDER,
        ],
        input=SECRET_B.encode(),
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": operator_dir},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    out = proc.stdout
    assert b"|" in out, proc.stderr
    assert SECRET_B.encode() not in out
    assert b"Permission denied" in out


@pytest.mark.parametrize("table", ["environment.env", "verifier.env", "solution.env"])
def test_a_task_file_cannot_pull_a_declared_credential_into_its_environment(tmp_path, table):
    """task.toml's env tables are filled from the executor's environment, as Harbor fills
    them; the task's env reaches every arm's container (and a verifier's): a template
    naming a credential a subject declares is refused, naming it, before anything runs."""
    from maka_eval.spec.task_directory import load_task
    from tests.helpers import make_task

    make_task(
        tmp_path,
        "t",
        toml=f'[{table}]\nA = "x-${{KEY_B}}"\nB = "${{KEY_A:-fallback}}"\n',
    )
    env = {"KEY_A": SECRET_A, "KEY_B": SECRET_B, "OTHER": "fine"}
    task, problems = load_task(
        "t", tmp_path / "t", "tasks[0]", host_env=env, withheld=frozenset({"KEY_A", "KEY_B"})
    )
    text = "\n".join(str(p) for p in problems)
    assert task is None
    assert "names KEY_B, a credential a subject declares" in text
    assert "names KEY_A, a credential a subject declares" in text  # a default does not help
    assert SECRET_A not in text and SECRET_B not in text
