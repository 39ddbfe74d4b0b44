"""Start one cell's egress proxy: mitmproxy with the egress addons, its own CA.

`start_proxy` lays out a private state folder (0700: the policy, the result token, the
generated CA in `confdir`, the audit log, the proxy's own log), runs the proxy from
this interpreter's environment (`python -m maka_eval.egress.proxy`, below) and returns
once it listens -- or raises ProxyStartError with the end of its log. Only the CA
certificate reaches `publish_dir`, the folder the subject mounts read-only. The handle
settles metering (SIGUSR1) and stops the proxy (SIGTERM, which settles too), reaping the
process.

The proxy is mitmproxy embedded through its Python API rather than `mitmdump`: the
egress addons (`egress/addon.py`, the same ones the cluster's sidecar loads into
mitmdump) with only the built-in addons a forward proxy needs (`BUILTIN_ADDONS`).
`mitmdump` loads some 35 addons -- flow export, replay, map-local, cookies, the flow
printer -- and mitmproxy offers every event of every request to each of them, which
was half of the proxy's CPU time per request (bench/README.md).

The proxy dies with the process that started it: it watches the read end of a pipe
whose only write end that process holds (`--lifeline`), and shuts down (settling the
checkpoint) when the pipe closes -- also when that process was SIGKILLed. Whenever it
exits it removes its confdir: the CA key does not outlive the cell.

With `upstream` the proxy chains to another proxy (the cluster's egress gateway):
mitmproxy's `upstream:URL` mode, with the gateway credential passed in a private file,
never on the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def proxy_command() -> list[str]:
    """The program that runs a cell's proxy (this module, by this interpreter; `-P`: the
    working directory, the private state folder, is not put on the import path)."""
    return [sys.executable, "-P", "-m", "maka_eval.egress.proxy"]


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
    _lifeline: int = field(default=-1, repr=False)
    """The write end of the proxy's lifeline pipe (held only by this process)."""

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
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
        # The proxy removes its confdir as it exits; not when it was killed.
        shutil.rmtree(self.state_dir / "confdir", ignore_errors=True)
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
    lifeline_read, lifeline_write = os.pipe()  # both ends close-on-exec (not inherited)
    argv = [
        *proxy_command(),
        "--lifeline",
        str(lifeline_read),
        "--listen-host",
        listen_host,
        "--listen-port",
        str(listen_port),
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

    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                cwd=state_dir,
                # Its own process group, so a Ctrl-C meant for the executor does not
                # stop it before the executor settles it; but not its own session: the
                # scheduler's autogroups are per session, and in a group of its own the
                # proxy waited longer for a CPU on a loaded machine (bench/README.md).
                process_group=0,
                pass_fds=(lifeline_read,),
            )
        finally:
            os.close(log_fd)
    except BaseException:
        os.close(lifeline_write)
        raise
    finally:
        os.close(lifeline_read)  # the proxy's end; this process keeps only the write end

    def failed(message: str) -> ProxyStartError:
        if process.poll() is None:
            process.kill()
        process.wait()
        os.close(lifeline_write)
        shutil.rmtree(confdir, ignore_errors=True)
        return ProxyStartError(f"{message}:\n{_tail(log_path)}")

    deadline = time.monotonic() + start_timeout
    ready: dict[str, object] | None = None
    while ready is None:
        if process.poll() is not None:
            raise failed(f"the proxy exited with status {process.returncode} before listening")
        if time.monotonic() >= deadline:
            raise failed(f"the proxy did not listen within {start_timeout:g}s")
        try:
            loaded = strict_json.loads(ready_file.read_bytes())
            ready = loaded if isinstance(loaded, dict) else None
        except (FileNotFoundError, ValueError):
            time.sleep(0.01)
    host, port = ready.get("host"), ready.get("port")
    if not isinstance(host, str) or not isinstance(port, int):
        raise failed(f"the proxy wrote an unreadable {ready_file}")
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
        _lifeline=lifeline_write,
    )


# -- the proxy process ------------------------------------------------------------------------
def builtin_addons() -> list[Any]:
    """mitmproxy's own addons that a forward proxy with these egress addons needs: option
    checks (core), refusing clients from public addresses (block), refusing h2c upgrades
    (disable_h2c: a connection that switched protocols could not be checked), the
    servers, the layer choice (next_layer), TLS interception (tlsconfig), credentials
    for an upstream proxy (upstream_auth), stopping on start-up errors (errorcheck)."""
    from mitmproxy.addons import (
        block,
        core,
        disable_h2c,
        errorcheck,
        next_layer,
        proxyserver,
        tlsconfig,
        upstream_auth,
    )

    return [
        core.Core(),
        block.Block(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),  # type: ignore[no-untyped-call]
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        upstream_auth.UpstreamAuth(),
        errorcheck.ErrorCheck(),
    ]


BUILTIN_ADDONS = (
    "core",
    "block",
    "disableh2c",
    "proxyserver",
    "nextlayer",
    "tlsconfig",
    "upstreamauth",
    "errorcheck",
)
"""What `builtin_addons` loads, by mitmproxy's addon names (tests check the list)."""


def _watch_lifeline(fd: int, on_close: Any) -> None:
    """Call `on_close` once the pipe's write end is closed everywhere (EOF)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            on_close()

    loop.add_reader(fd, readable)


async def _serve(args: argparse.Namespace) -> int:
    from mitmproxy import exceptions, master, options

    from maka_eval.egress.addon import make_addons

    opts = options.Options()
    proxy = master.Master(opts, with_termlog=True)
    builtin = builtin_addons()
    # As in mitmdump, the egress addons come after the servers and before the layer
    # choice: Guard.next_layer sees (and replaces) a raw tunnel before it is relayed.
    proxy.addons.add(*builtin[:4], *make_addons(), *builtin[4:])  # type: ignore[no-untyped-call]
    try:
        opts.update(  # type: ignore[no-untyped-call]
            listen_host=args.listen_host,
            listen_port=args.listen_port,
            mode=args.mode or ["regular"],
            # Decisions are in the audit log; the proxy's own log is for trouble.
            termlog_verbosity="warn",
        )
        opts.set(*args.set)
    except exceptions.OptionsError as exc:
        print(f"maka-eval proxy: {exc}", file=sys.stderr)
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, proxy.shutdown)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if args.lifeline is not None:
        _watch_lifeline(args.lifeline, proxy.shutdown)
    try:
        await proxy.run()
    finally:
        # Only a confdir it was given: mitmproxy's default (~/.mitmproxy) is the user's;
        # and not a sidecar's, whose restart must keep the CA the subject already trusts.
        if not args.keep_confdir and any(item.startswith("confdir=") for item in args.set):
            shutil.rmtree(os.path.expanduser(opts.confdir), ignore_errors=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m maka_eval.egress.proxy`: run one egress proxy (mitmdump's option names)."""
    parser = argparse.ArgumentParser(
        prog="python -m maka_eval.egress.proxy", description="One cell's egress proxy."
    )
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, default=8080)
    parser.add_argument("--mode", action="append", default=[], help="e.g. upstream:URL")
    parser.add_argument(
        "--set", action="append", default=[], metavar="OPTION=VALUE", help="a mitmproxy option"
    )
    parser.add_argument(
        "--keep-confdir",
        action="store_true",
        help="keep the confdir (the CA key) on exit: a restarted proxy reuses its CA",
    )
    parser.add_argument(
        "--lifeline",
        type=int,
        help="a pipe's read end: the proxy shuts down when its write end closes",
    )
    args = parser.parse_args(argv)
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
