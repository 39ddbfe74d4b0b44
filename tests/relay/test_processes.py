"""Quiescing whole process trees, for real: setsid, double forks, background servers."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.processes.supervisor import MARKER_VARIABLE, CancelToken
from maka_eval.processes.table import find_marked
from tests.relay.conftest import sh

pytestmark = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")

# Leaves the process group and session in every way a subject can, records the pids in
# the workspace, then blocks until the framework stops it.
ESCAPE = r"""
setsid sleep 1001 & echo $! > pid.setsid
( setsid sh -c 'sleep 1002 & echo $! > pid.double; wait' & ) &
( sh -c 'sleep 1003 & echo $! > pid.orphan' & )
setsid sh -c 'env -i /bin/sleep 1004 & echo $! > pid.noenv; wait' &
python3 - <<'PY' &
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("pid.daemon", "w").write(str(os.getpid()))
        time.sleep(1005)
    os._exit(0)
os._exit(0)
PY
for f in setsid double orphan noenv daemon; do
  while [ ! -s pid.$f ]; do sleep 0.02; done
done
touch done.txt
sleep 1000
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def pids(workspace: Path) -> dict[str, int]:
    return {p.suffix[1:]: int(p.read_text()) for p in workspace.glob("pid.*")}


def test_timeout_quiesces_descendants_that_left_the_group_and_session(plan_for, run):
    plan = plan_for(sh(ESCAPE), timeout=3.0)
    outcome = run(plan)
    workspace = Path(plan.root) / "workspace"
    found = pids(workspace)
    assert set(found) == {"setsid", "double", "orphan", "noenv", "daemon"}
    # Each escaped in a different way; none survived the timeout.
    assert [name for name, pid in found.items() if alive(pid)] == []
    assert outcome.classification.status is AttemptStatus.SUBJECT_FAILED
    assert outcome.classification.score == 1.0  # the reward is kept after a timeout
    assert find_marked(MARKER_VARIABLE, plan.attempt_id) == []


def test_cancellation_quiesces_the_whole_tree(plan_for, run):
    plan = plan_for(sh(ESCAPE), timeout=60.0)
    cancel = CancelToken()
    workspace = Path(plan.root) / "workspace"
    result = {}
    thread = threading.Thread(target=lambda: result.update(o=run(plan, cancel=cancel)))
    thread.start()
    deadline = time.monotonic() + 120  # only ends a hang
    while not (workspace / "done.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    found = pids(workspace)
    assert all(alive(pid) for pid in found.values())
    cancel.cancel()
    thread.join(20)
    assert result["o"].classification.status is AttemptStatus.CANCELLED
    assert [name for name, pid in found.items() if alive(pid)] == []


SERVER = r"""
cat > server.py <<'PY'
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
open("port.tmp", "w").write(str(s.server_address[1])); os.rename("port.tmp", "port.txt")
s.serve_forever()
PY
setsid nohup python3 server.py > /dev/null 2>&1 &
while [ ! -s port.txt ]; do sleep 0.02; done
echo $! > server.pid
"""

VERIFY_SERVER = r"""#!/bin/sh
port=$(cat port.txt)
url="http://127.0.0.1:$port/"
if python3 -c "import urllib.request as u; assert u.urlopen('$url', timeout=5).read()==b'ok'"; then
  echo 1 > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"
else
  echo 0 > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"
fi
"""


def test_natural_exit_leaves_the_background_server_for_the_verifier(plan_for, run):
    plan = plan_for(sh(SERVER), test_sh=VERIFY_SERVER)
    outcome = run(plan)
    assert outcome.classification.status is AttemptStatus.COMPLETED
    assert outcome.classification.score == 1.0, "the verifier could not reach the server"
    workspace = Path(plan.root) / "workspace"
    server = int((workspace / "server.pid").read_text())
    port = int((workspace / "port.txt").read_text())
    # After the verifier, the attempt is over and nothing of it remains.
    assert not alive(server)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)


def test_no_zombies_are_left_behind(plan_for, run, supervisor):
    run(plan_for(sh(ESCAPE), timeout=2.0))
    me = os.getpid()
    zombies = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == me:
                zombies.append(int(entry.name))
    assert zombies == []


def test_exclusive_supervisor_owns_orphans_without_the_marker(plan_for, tmp_path):
    """In a pod the relay serves one attempt: an orphan that dropped the marker is still its."""
    from maka_eval.processes.supervisor import ProcessSupervisor
    from maka_eval.relay.attempt import run_attempt

    script = "( env -i /bin/sleep 1006 & echo $! > pid.lost ) ; sleep 1000"
    plan = plan_for(sh(script), timeout=1.5)
    supervisor = ProcessSupervisor(exclusive=True)
    run_attempt(plan, supervisor, CancelToken(), {"PATH": "/usr/bin:/bin"})
    lost = int((Path(plan.root) / "workspace" / "pid.lost").read_text())
    assert not alive(lost)


def test_the_end_of_a_run_kills_attempt_orphans_and_leaves_the_host_programs_alone(tmp_path):
    """A program embedding the local executor is a subreaper for its whole life: it may
    adopt a service of its own (a script's background daemon, like a container engine's
    API service). quiesce_adopted() kills only what came from attempts."""
    from maka_eval.processes.supervisor import ProcessSupervisor

    supervisor = ProcessSupervisor()
    assert supervisor.subreaper
    # The host's own daemon: started by a script that exits, so it is re-parented to us.
    subprocess.run(
        ["sh", "-c", f"setsid sleep 1007 </dev/null >/dev/null 2>&1 & echo $! > {tmp_path}/host"],
        check=True,
    )
    host = int((tmp_path / "host").read_text())
    # An attempt's orphan that dropped the marker (env -i) but is still in its session.
    attempt = supervisor.spawn(
        ["sh", "-c", f"env -i /bin/sleep 1008 & echo $! > {tmp_path}/lost"],
        cwd=str(tmp_path),
        env={"PATH": "/usr/bin:/bin", "MAKA_EVAL_ATTEMPT_ID": "a1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    supervisor.release(attempt)
    lost = int((tmp_path / "lost").read_text())
    try:
        assert supervisor.quiesce_adopted() == 1
        assert not alive(lost)
        assert alive(host)
    finally:
        os.kill(host, signal.SIGKILL)
        os.waitpid(host, 0)
