"""An attempt Pod's egress sidecar: mitmproxy with the egress addons, chained to the gateway.

The operator renders it as a native sidecar (an init container with restartPolicy
Always) of every attempt Pod whose experiment sets `executor.config.egress.mode: proxy`:

    python3 -m maka_eval.egress.sidecar --port 15080 \\
        --upstream http://maka-eval-egress-gateway.maka-eval-system.svc:3128 \\
        --credential-file /var/run/maka-eval/egress-secret/upstream-auth \\
        --policy-file /var/run/maka-eval/egress-secret/policy.json \\
        --state-dir /var/run/maka-eval/egress --publish-dir /maka/egress-ca \\
        --checkpoint /maka/egress-meter/provider-usage.json \\
        --result-token-file /var/run/maka-eval/egress-secret/result-token

It replaces itself with the same lean proxy a local cell runs (`python -m
maka_eval.egress.proxy`: only the built-in addons a forward proxy needs), so the
container's SIGTERM reaches mitmproxy, which settles its figures; the same addons
(egress/addon.py): blocklist, audit log, web-tool stripping, metering, and CA
publishing. It listens on loopback only; upstream mode sends every request on to the
gateway with the attempt's credential, which mitmproxy reads from the file (never from
a command line). The CA key and the audit log stay in the state folder, an emptyDir
only this container mounts; only the CA certificate reaches the publish folder, which
the subject mounts read-only. A restarted sidecar reuses the CA it made, so what the
subject already trusts stays valid.

With `--checkpoint`, the proxy writes the signed provider-usage checkpoint there (a
folder the subject's container mounts read-only), keyed by the attempt's result token
(`--result-token-file`, from the attempt's Secret). The relay settles it over HTTP
(metering.settle) once the subject has ended and records the metered usage and cost.

`--probe` is the startup probe: exit 0 once the proxy accepts connections and the CA
certificate is published -- the subject starts only then.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_PORT = 15080
"""Far from the ports tasks' own servers commonly use (3000, 5000, 8000, 8080, 8888)."""
CA_CERT_NAME = "mitmproxy-ca-cert.pem"
"""What the addon publishes (egress.addon.CA_CERT_NAME; not imported: the probe must
start fast and load nothing of mitmproxy)."""


def proxy_argv(args: argparse.Namespace) -> list[str]:
    """The sidecar's proxy command line: the same lean mitmproxy as a local cell's
    (egress/proxy.py: only the built-in addons a forward proxy needs, plus ours)."""
    from maka_eval.egress.proxy import proxy_command

    state = Path(args.state_dir)
    return [
        *proxy_command(),
        "--listen-host",
        args.host,
        "--listen-port",
        str(args.port),
        "--mode",
        f"upstream:{args.upstream}",
        "--keep-confdir",
        "--set",
        f"confdir={state / 'confdir'}",
        "--set",
        f"maka_policy={args.policy_file}",
        "--set",
        f"maka_audit_log={state / 'audit' / 'audit.jsonl'}",
        "--set",
        f"maka_cert_publish_dir={args.publish_dir}",
        "--set",
        f"maka_upstream_auth_file={args.credential_file}",
        *(
            [
                "--set",
                f"maka_checkpoint={args.checkpoint}",
                "--set",
                f"maka_result_token_file={args.result_token_file}",
            ]
            if args.checkpoint
            else []
        ),
    ]


def probe(host: str, port: int, publish_dir: Path) -> str | None:
    """Why the sidecar is not ready yet, or None once it is."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            pass
    except OSError as exc:
        return f"nothing accepts connections on {host}:{port} yet ({exc})"
    cert = publish_dir / CA_CERT_NAME
    try:
        if cert.stat().st_size > 0:
            return None
    except OSError:
        pass
    return f"{cert} is not published yet"


def parser() -> argparse.ArgumentParser:
    """The sidecar's command line."""
    p = argparse.ArgumentParser(prog="python -m maka_eval.egress.sidecar", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--upstream", help="the egress gateway's URL (http://HOST:PORT)")
    p.add_argument("--credential-file", type=Path, help="file holding the attempt credential")
    p.add_argument("--policy-file", type=Path, help="the EgressPolicy JSON")
    p.add_argument("--state-dir", type=Path, help="private folder: CA key, audit log")
    p.add_argument("--publish-dir", type=Path, required=True, help="gets the CA certificate")
    p.add_argument("--checkpoint", type=Path, help="the provider-usage checkpoint to write")
    p.add_argument("--result-token-file", type=Path, help="the checkpoint's HMAC key")
    p.add_argument("--probe", action="store_true", help="exit 0 once ready (startup probe)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Probe, or become the proxy."""
    args = parser().parse_args(argv)
    if args.probe:
        why = probe(args.host, args.port, args.publish_dir)
        if why:
            print(f"egress sidecar: {why}", file=sys.stderr)
            return 1
        return 0
    missing = [
        flag
        for flag, value in (
            ("--upstream", args.upstream),
            ("--credential-file", args.credential_file),
            ("--policy-file", args.policy_file),
            ("--state-dir", args.state_dir),
        )
        if not value
    ]
    if missing:
        print(f"egress sidecar: {', '.join(missing)} required", file=sys.stderr)
        return 2
    if bool(args.checkpoint) != bool(args.result_token_file):
        print("egress sidecar: --checkpoint and --result-token-file go together", file=sys.stderr)
        return 2
    secrets = (args.credential_file, args.policy_file, args.result_token_file)
    for path in (p for p in secrets if p):
        if not Path(path).is_file():
            print(f"egress sidecar: {path} does not exist", file=sys.stderr)
            return 2
    state = Path(args.state_dir)
    (state / "confdir").mkdir(mode=0o700, parents=True, exist_ok=True)
    (state / "audit").mkdir(mode=0o700, exist_ok=True)
    argv_ = proxy_argv(args)
    sys.stdout.flush()
    os.execv(argv_[0], argv_)
    return 127  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
