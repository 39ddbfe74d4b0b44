"""A cell's proxy lives no longer than the process that started it, nor does its CA key.

The launcher runs in a child process that is then SIGKILLed (no handler, no cleanup):
its proxy must notice on its own, shut down -- settling the checkpoint -- and remove
the confdir that holds the CA key. A proxy stopped the ordinary way removes it too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from maka_eval.egress.policy import EgressPolicy
from maka_eval.egress.proxy import BUILTIN_ADDONS, builtin_addons, start_proxy
from maka_eval.metering.checkpoint import Checkpoint, read_checkpoint

pytestmark = pytest.mark.slow

TOKEN = "lifetime-token"

LAUNCHER = textwrap.dedent(
    """
    import json, sys, threading, time
    from pathlib import Path
    from maka_eval.egress.policy import EgressPolicy
    from maka_eval.egress.proxy import start_proxy

    root = Path(sys.argv[1])
    handles = []

    def start(name):
        handles.append(start_proxy(
            state_dir=root / name / "state",
            publish_dir=root / name / "published",
            policy=EgressPolicy("terminal-bench"),
            checkpoint_path=root / name / "provider-usage.json",
            result_token=sys.argv[2],
        ))

    # One proxy started from the main thread, one from a worker thread that has ended
    # by the time of the kill (as an executor's pool thread may have).
    start("main")
    worker = threading.Thread(target=start, args=("worker",))
    worker.start()
    worker.join()
    print(json.dumps([[h.pid, str(h.state_dir)] for h in handles]), flush=True)
    time.sleep(3600)
    """
)


def _gone(pid: int) -> bool:
    """Exited (a zombie that its new parent has not reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_proxies_die_with_a_sigkilled_launcher_and_take_their_ca_key(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), TOKEN],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = launcher.stdout.readline() if launcher.stdout else ""
        proxies = [(pid, Path(state)) for pid, state in json.loads(line)]
        assert len(proxies) == 2
        for pid, state in proxies:
            assert not _gone(pid) and "maka_eval.egress.proxy" in _cmdline(pid)
            assert (state / "confdir" / "mitmproxy-ca.pem").is_file()
        # The proxy started from the thread that ended is still up: its lifetime is the
        # process's, not the thread's.
        time.sleep(0.5)
        assert not any(_gone(pid) for pid, _ in proxies)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 120  # only ends a hang
        while not all(_gone(pid) for pid, _ in proxies) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [(pid, _cmdline(pid)) for pid, _ in proxies if not _gone(pid)]
        assert left == [], f"proxies outlived their launcher: {left}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid, _ in proxies if "proxies" in locals() else []:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    for _, state in proxies:
        assert not (state / "confdir").exists(), "the CA key outlived the proxy"
        # It shut down as on SIGTERM: the checkpoint is settled, the audit log closed.
        checkpoint = read_checkpoint(state.parent / "provider-usage.json", TOKEN)
        assert isinstance(checkpoint, Checkpoint) and checkpoint.settled
        audit = (state / "audit" / "audit.jsonl").read_text().splitlines()
        assert json.loads(audit[-1])["event"] == "settle"


def test_a_stopped_proxy_leaves_no_ca_key_and_loads_only_the_addons_it_needs(tmp_path):
    proxy = start_proxy(
        state_dir=tmp_path / "state",
        publish_dir=tmp_path / "published",
        policy=EgressPolicy("terminal-bench"),
        checkpoint_path=tmp_path / "provider-usage.json",
        result_token=TOKEN,
    )
    assert (proxy.state_dir / "confdir" / "mitmproxy-ca.pem").is_file()
    assert proxy.stop() == 0
    assert not (proxy.state_dir / "confdir").exists()
    assert proxy.ca_cert_path.is_file()  # the published certificate stays
    # Everything the proxy loads besides the egress addons: nothing that records,
    # replays or rewrites flows; h2c upgrades refused.
    loaded = [type(addon).__name__.lower() for addon in builtin_addons()]
    assert loaded == list(BUILTIN_ADDONS)
    assert "disableh2c" in loaded and not {"save", "maplocal", "mapremote"} & set(loaded)
