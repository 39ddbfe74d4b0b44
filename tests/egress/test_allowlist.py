"""task.toml's `network_mode = "allowlist"`, for real: with no egress policy in the spec,
a task that lists its allowed hosts runs in a policed cell whose proxy lets it reach
those hosts and nothing else, in the process sandbox and in a Podman container. The
subject tries an allowed host, a host it does not list, a wrapped URL and the direct
route, and the task's tests fetch from the allowed host too (the verifier is told of the
proxy for such a task); the record carries the policy's digest and the audit log says
why each was refused. (The policy's matching is unit-tested in test_policy.py.)

Root, nftables and bubblewrap (and, for the container, the Podman session fixture) are
needed; without them these tests skip, saying why.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path
from typing import Any

from maka_eval.egress.policy import NOT_ALLOWED, EgressPolicy
from maka_eval.engine.status import AttemptStatus
from maka_eval.local import netns
from maka_eval.store.run_store import artifact_path
from tests.egress import attacks
from tests.egress.policing import POLICED
from tests.helpers import make_task, spec, write_experiment, write_script
from tests.sandbox.conftest import container_engine  # noqa: F401 - the session fixture

pytestmark = POLICED

OTHER_HOST = "127.0.0.3"
"""A second upstream on the host's loopback, which the task does not list."""

PROBE = r"""#!/usr/bin/env python3
import json, os, socket, sys, urllib.error, urllib.request

def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode(errors="replace")[:60]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:200]
    except Exception as exc:
        return None, type(exc).__name__

def direct(host, port):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        return "connected"
    except Exception as exc:
        return type(exc).__name__
    finally:
        s.close()

allowed, other = os.environ["PROBE_ALLOWED"], os.environ["PROBE_OTHER"]
results = {
    "proxy": bool(os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY")),
    "allowed": fetch(allowed),
    "other": fetch(other),
    "wrapped": fetch(allowed.rsplit("/", 1)[0] + "/redirect?url=" + other),
    "direct": direct(other.split("/")[2].split(":")[0], int(other.split(":")[2].split("/")[0])),
}
print(json.dumps(results))
open("done.txt", "w").write("ok")
"""


VERIFIER = """#!/bin/sh
# Reward 1 when the subject finished and the tests themselves reach the allowed host
# (through the proxy, as tests that install their tools do under Harbor's allowlist).
got=$(python3 -c 'import os, urllib.request as u
print(u.urlopen(os.environ["ALLOWED_URL"], timeout=10).read().decode())')
if [ -f done.txt ] && [ "$got" = upstream-ok ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""


class _Upstream(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        body = b"other-upstream"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def run_allowlisted(root: Path, monkeypatch: Any, *, container: bool, engine: str | None):
    """One cell of a task whose task.toml allows only the first upstream's address."""
    seen: list[str] = []
    other = http.server.ThreadingHTTPServer(
        (OTHER_HOST, 0), type("Other", (_Upstream,), {"seen": seen})
    )
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with attacks.host_side(monkeypatch) as side:
            image = f'docker_image = "{attacks.PYTHON_IMAGE}"\n' if container else ""
            toml = (
                f'[environment]\n{image}network_mode = "allowlist"\n'
                f'allowed_hosts = ["{attacks.UPSTREAM_HOST}", "*.example.org"]\n'
            )
            toml += f'[verifier.env]\nALLOWED_URL = "{side.upstream_url}"\n'
            make_task(root / "tasks", "t1", toml=toml, test_sh=VERIFIER)
            write_script(root / "probe.py", PROBE)
            subject = {
                "id": "s",
                "kind": "external",
                "config": {
                    "command": "./probe.py",
                    "env": {
                        "PROBE_ALLOWED": side.upstream_url,
                        "PROBE_OTHER": f"http://{OTHER_HOST}:{other.server_address[1]}/secret",
                    },
                },
            }
            # No executor.config.egress: the task's own allowlist is what polices it.
            config: dict[str, Any] = {"sandbox": "container" if container else "process"}
            doc = spec(subjects=[subject], executor={"kind": "local", "config": config})
            path = write_experiment(root, doc)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            env["MAKA_EVAL_WORK_DIR"] = os.environ.get("MAKA_EVAL_WORK_DIR", str(root / "work"))
            Path(env["MAKA_EVAL_WORK_DIR"]).mkdir(parents=True, exist_ok=True)
            if engine is not None:
                env["DOCKER_HOST"] = engine
            run_dir = root / "run"
            record = attacks.run(path, run_dir, env).records[0]
            stdout = artifact_path(run_dir, record, "subject.stdout").read_text()
            upstream_seen = list(side.seen)
    finally:
        other.shutdown()
        other.server_close()
    results = json.loads(next(line for line in stdout.splitlines() if line.startswith("{")))
    return record, run_dir, results, upstream_seen, seen


def check(record, run_dir, results, upstream_seen, other_seen) -> None:
    assert record.result.status is AttemptStatus.COMPLETED, record.result.reason
    assert record.result.score == 1.0
    assert results["proxy"] is True
    assert results["allowed"] == [200, attacks.UPSTREAM_BODY.decode()]
    # Not listed: refused by the proxy, naming the allowlist; the host never heard it.
    status, body = results["other"]
    assert status == 403 and "allowed_hosts" in body, results
    assert results["direct"] != "connected", results
    # A URL in the query of a request to an allowed host is only data: the request goes
    # to the allowed host (as through Harbor's allowlist), never to the one it names.
    assert results["wrapped"] == [200, attacks.UPSTREAM_BODY.decode()]
    # The subject's two requests, then the verifier's.
    assert len(upstream_seen) == 3 and upstream_seen[0] == upstream_seen[2] == "/ok"
    assert upstream_seen[1].startswith(f"/redirect?url=http://{OTHER_HOST}:")
    assert other_seen == []
    policy = EgressPolicy("none", (), [attacks.UPSTREAM_HOST, "*.example.org"])
    assert record.egress_policy_digest == policy.digest
    audit = artifact_path(run_dir, record, "egress/audit.jsonl").read_text()
    lines = [json.loads(line) for line in audit.splitlines()]
    assert any(NOT_ALLOWED in json.dumps(line) and OTHER_HOST in json.dumps(line) for line in lines)
    assert netns.leftovers(record.run_id) == [] and netns.leftover_tables(record.run_id) == []


def test_an_allowlisted_task_reaches_its_hosts_only_in_the_process_sandbox(tmp_path, monkeypatch):
    record, run_dir, results, upstream_seen, other_seen = run_allowlisted(
        tmp_path, monkeypatch, container=False, engine=None
    )
    assert record.result.isolation == "namespaces"
    check(record, run_dir, results, upstream_seen, other_seen)


def test_an_allowlisted_task_reaches_its_hosts_only_in_a_container(
    container_engine,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    record, run_dir, results, upstream_seen, other_seen = run_allowlisted(
        tmp_path, monkeypatch, container=True, engine=container_engine
    )
    assert record.result.isolation == "container"
    check(record, run_dir, results, upstream_seen, other_seen)
