"""Start one cell's egress proxy: `mitmdump` with the egress addons, its own CA.

`start_proxy` lays out a private state folder (0700: the policy, the result token, the
generated CA in `confdir`, the audit log, mitmdump's own log), runs `mitmdump` from
this interpreter's environment with `egress/addon.py`, and returns once it listens --
or raises ProxyStartError with the end of its log. Only the CA certificate reaches
`publish_dir`, the folder the subject mounts read-only. The handle settles metering
(SIGUSR1) and stops the proxy (SIGTERM, which settles too), reaping the process.

With `upstream` the proxy chains to another proxy (the cluster's egress gateway):
mitmproxy's `upstream:URL` mode, with the gateway credential passed in a private file,
never on the command line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from maka_eval import strict_json
from maka_eval.egress.policy import EgressPolicy
from maka_eval.metering.checkpoint import Checkpoint, CheckpointRejected, read_checkpoint
from maka_eval.metering.pricing import Prices

ADDON_SCRIPT = Path(__file__).with_name("addon.py")
CA_CERT_NAME = "mitmproxy-ca-cert.pem"
START_TIMEOUT_SEC = 30.0
STOP_TIMEOUT_SEC = 10.0
LOG_TAIL_BYTES = 4000


class ProxyStartError(RuntimeError):
    """The proxy did not come up; the message ends with the tail of its log."""


def mitmdump_path() -> Path:
    """`mitmdump` of the environment this interpreter runs in."""
    return Path(sys.executable).parent / "mitmdump"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - LOG_TAIL_BYTES))
            return file.read().decode("utf-8", "replace").strip()
    except OSError:
        return "(no log)"


def _private_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


@dataclass
class ProxyHandle:
    """A running egress proxy."""

    host: str
    port: int
    pid: int
    ca_cert_path: Path
    """The published CA certificate (what the subject trusts)."""
    audit_log_path: Path
    checkpoint_path: Path
    state_dir: Path
    log_path: Path
    _process: subprocess.Popen[bytes] = field(repr=False)
    _token: str = field(repr=False)

    @property
    def url(self) -> str:
        """The proxy's URL, for HTTP_PROXY / HTTPS_PROXY."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def read_checkpoint(self) -> Checkpoint | CheckpointRejected:
        """The checkpoint as a reader with the result token sees it."""
        return read_checkpoint(self.checkpoint_path, self._token)

    def settle(self, timeout: float = 5.0) -> Checkpoint | CheckpointRejected:
        """Tell the proxy the subject is done; wait (bounded) until the checkpoint says
        settled with nothing in flight, and return it as read."""
        if self.running:
            os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while True:
            found = self.read_checkpoint()
            done = isinstance(found, Checkpoint) and found.settled and found.in_flight == 0
            if done or time.monotonic() >= deadline or not self.running:
                return found
            time.sleep(0.01)

    def stop(self, timeout: float = STOP_TIMEOUT_SEC) -> int:
        """Stop the proxy (SIGTERM settles the checkpoint; SIGKILL after `timeout`) and
        reap it; returns its exit status. Safe to call twice."""
        proc = self._process
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def __enter__(self) -> ProxyHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_proxy(
    *,
    state_dir: Path,
    publish_dir: Path,
    policy: EgressPolicy,
    checkpoint_path: Path,
    result_token: str,
    listen_host: str = "127.0.0.1",
    listen_port: int = 0,
    upstream: str | None = None,
    upstream_auth: str | None = None,
    prices: Prices | None = None,
    upstream_trusted_ca: Path | None = None,
    audit_log_max_bytes: int | None = None,
    start_timeout: float = START_TIMEOUT_SEC,
) -> ProxyHandle:
    """Start a cell's egress proxy and wait until it listens (see the module docstring).

    `state_dir` must not hold a previous proxy's CA (each start makes a new one);
    `upstream` is a proxy URL (http://gateway:3128) with `upstream_auth` 'user:password';
    `upstream_trusted_ca` is a CA bundle to verify upstream servers with instead of the
    system's; `prices` lets the proxy log the settled cost.
    """
    if not result_token:
        raise ValueError("the proxy signs its checkpoint with a non-empty result token")
    state_dir = Path(state_dir).resolve()
    publish_dir = Path(publish_dir).resolve()
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    confdir = state_dir / "confdir"
    try:
        confdir.mkdir(mode=0o700)
    except FileExistsError:
        raise ProxyStartError(
            f"{confdir} exists: every proxy start generates a new CA in a new state folder"
        ) from None
    publish_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    if publish_dir == state_dir or state_dir in publish_dir.parents:
        raise ValueError("publish_dir must be outside the private state_dir")

    policy_file = state_dir / "policy.json"
    token_file = state_dir / "result-token"
    ready_file = state_dir / "ready.json"
    audit_log = state_dir / "audit" / "audit.jsonl"
    log_path = state_dir / "mitmdump.log"
    _private_file(policy_file, policy.to_json())
    _private_file(token_file, result_token)
    argv = [
        str(mitmdump_path()),
        "--listen-host",
        listen_host,
        "--listen-port",
        str(listen_port),
        "-s",
        str(ADDON_SCRIPT),
        "--set",
        f"confdir={confdir}",
        "--set",
        f"maka_policy={policy_file}",
        "--set",
        f"maka_audit_log={audit_log}",
        "--set",
        f"maka_cert_publish_dir={publish_dir}",
        "--set",
        f"maka_checkpoint={Path(checkpoint_path).resolve()}",
        "--set",
        f"maka_result_token_file={token_file}",
        "--set",
        f"maka_ready_file={ready_file}",
        # Quiet: one line per flow would fill the log; decisions are in the audit log.
        "--set",
        "flow_detail=0",
        "--set",
        "termlog_verbosity=warn",
    ]
    if audit_log_max_bytes is not None:
        argv += ["--set", f"maka_audit_log_max_bytes={audit_log_max_bytes}"]
    if prices is not None:
        prices_file = state_dir / "prices.json"
        _private_file(prices_file, prices.to_json())
        argv += ["--set", f"maka_prices={prices_file}"]
    if upstream is not None:
        argv += ["--mode", f"upstream:{upstream}"]
        if upstream_auth is not None:
            auth_file = state_dir / "upstream-auth"
            _private_file(auth_file, upstream_auth)
            argv += ["--set", f"maka_upstream_auth_file={auth_file}"]
    elif upstream_auth is not None:
        raise ValueError("upstream_auth needs an upstream proxy")
    if upstream_trusted_ca is not None:
        argv += ["--set", f"ssl_verify_upstream_trusted_ca={Path(upstream_trusted_ca).resolve()}"]

    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            cwd=state_dir,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)

    deadline = time.monotonic() + start_timeout
    ready: dict[str, object] | None = None
    while ready is None:
        if process.poll() is not None:
            raise ProxyStartError(
                f"mitmdump exited with status {process.returncode} before listening:\n"
                f"{_tail(log_path)}"
            )
        if time.monotonic() >= deadline:
            process.kill()
            process.wait()
            raise ProxyStartError(
                f"mitmdump did not listen within {start_timeout:g}s:\n{_tail(log_path)}"
            )
        try:
            loaded = strict_json.loads(ready_file.read_bytes())
            ready = loaded if isinstance(loaded, dict) else None
        except (FileNotFoundError, ValueError):
            time.sleep(0.01)
    host, port = ready.get("host"), ready.get("port")
    if not isinstance(host, str) or not isinstance(port, int):
        process.kill()
        process.wait()
        raise ProxyStartError(f"the proxy wrote an unreadable {ready_file}")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1" if listen_host in ("", "0.0.0.0") else listen_host
    return ProxyHandle(
        host=host,
        port=port,
        pid=process.pid,
        ca_cert_path=publish_dir / CA_CERT_NAME,
        audit_log_path=audit_log,
        checkpoint_path=Path(checkpoint_path).resolve(),
        state_dir=state_dir,
        log_path=log_path,
        _process=process,
        _token=result_token,
    )
