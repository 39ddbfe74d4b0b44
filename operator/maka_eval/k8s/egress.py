"""The operator's side of the egress gateway: where it is, its key, attempt credentials.

Attempt Pods that use the egress proxy reach the outside only through the gateway
(maka_eval.egress.gateway), a Deployment in the operator's namespace behind a Service.
The operator
- knows where the gateway is (`GatewaySettings`: `maka-eval operator --egress-gateway`,
  default `maka-eval-egress-gateway.<operator namespace>.svc:3128`) and resolves the
  Service's name itself, because an attempt Pod may not ask DNS: the address goes into
  the Pod's hostAliases;
- reads the gateway key from a Secret in the gateway's namespace (default
  `maka-eval-egress-gateway`, key `key`), which only the operator and the gateway read;
- derives each attempt's credential from it (maka_eval.egress.credential) and writes it
  into a Secret of the attempt that only the sidecar mounts.

Both are prerequisites: without them the Experiment's PrerequisitesMet condition says
what is missing and nothing starts.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from maka_eval.egress import credential
from maka_eval.errors import Problem

GATEWAY_NAME = "maka-eval-egress-gateway"
"""Name of the gateway's Service, Deployment and key Secret (hack/kind/egress-gateway.yaml)."""
GATEWAY_PORT = 3128
KEY_SECRET_KEY = "key"
GATEWAY_POD_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": GATEWAY_NAME}
"""Labels of the gateway's Pods: attempt NetworkPolicies allow egress to these only."""
DEFAULT_OPERATOR_NAMESPACE = "maka-eval-system"
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
SPEC_PATH = "spec.executor.config.egress"


def operator_namespace(env: Mapping[str, str] | None = None) -> str:
    """The operator's own namespace: $POD_NAMESPACE (the Deployment sets it), else the
    in-cluster ServiceAccount's, else maka-eval-system."""
    env = os.environ if env is None else env
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_OPERATOR_NAMESPACE
    except OSError:
        return DEFAULT_OPERATOR_NAMESPACE


@dataclass(frozen=True)
class GatewaySettings:
    """Where the egress gateway is and which Secret holds its key (operator settings)."""

    namespace: str
    """The gateway's namespace: its Pods (NetworkPolicy) and its key Secret live there."""
    host: str
    """What the sidecars dial: the Service's DNS name (resolved by the operator) or an IP."""
    port: int = GATEWAY_PORT
    """The gateway's port: the Service's and the Pods' (both the same)."""
    key_secret: str = GATEWAY_NAME
    key_name: str = KEY_SECRET_KEY
    pod_labels: Mapping[str, str] = field(default_factory=lambda: dict(GATEWAY_POD_LABELS))

    @classmethod
    def make(
        cls,
        address: str | None = None,
        *,
        namespace: str | None = None,
        key_secret: str | None = None,
    ) -> GatewaySettings:
        """Settings from `maka-eval operator`'s options; None means the default."""
        ns = namespace or operator_namespace()
        host, port = f"{GATEWAY_NAME}.{ns}.svc", GATEWAY_PORT
        if address:
            host, port = split_address(address)
        return cls(namespace=ns, host=host, port=port, key_secret=key_secret or GATEWAY_NAME)


def split_address(address: str) -> tuple[str, int]:
    """`host:port` or `host` (port 3128); an IPv6 address in brackets."""
    text = address.strip()
    if text.startswith("["):
        inside, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or str(GATEWAY_PORT)
        host = inside
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, str(GATEWAY_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a gateway address (host:port): {address!r}")
    return host, int(port)


@dataclass(frozen=True)
class GatewayRoute:
    """How an attempt's sidecar reaches the gateway, resolved (rendered into the Pod)."""

    host: str
    address: str
    """The IP `host` resolves to (pinned in the Pod's hostAliases); equal to host for
    an IP."""
    port: int
    namespace: str
    pod_labels: Mapping[str, str]

    @property
    def url(self) -> str:
        """The sidecar's upstream proxy URL."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}"

    @property
    def pinned(self) -> bool:
        """Whether the host is a name the Pod must resolve through hostAliases."""
        return self.host != self.address


@dataclass(frozen=True)
class GatewayAccess:
    """What starting an egress-proxied attempt needs: the route and the key."""

    route: GatewayRoute
    key: bytes = field(repr=False)

    def credential(self, namespace: str, attempt_name: str) -> str:
        """The attempt's credential (`identity:password`)."""
        identity = credential.attempt_identity(namespace, attempt_name)
        return credential.credential(self.key, identity)

    def result_token(self, namespace: str, attempt_name: str, attempt_uid: str) -> str:
        """The key of the attempt's provider-usage checkpoint (sidecar and relay)."""
        identity = credential.attempt_identity(namespace, attempt_name)
        return credential.result_token(self.key, identity, attempt_uid)


Resolve = Callable[[str, int], str]


def system_resolve(host: str, port: int) -> str:
    """The first address the system resolver gives (IPv4 first)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def _secret_value(secret: Mapping[str, Any], key: str) -> bytes | None:
    data = secret.get("data") or {}
    if key in data:
        try:
            return base64.b64decode(data[key], validate=True)
        except (binascii.Error, ValueError, TypeError):
            return None
    string_data = secret.get("stringData") or {}
    value = string_data.get(key)
    return value.encode() if isinstance(value, str) else None


def gateway_access(
    settings: GatewaySettings,
    get_secret: Callable[[str, str], Mapping[str, Any] | None],
    resolve: Resolve = system_resolve,
) -> GatewayAccess | list[Problem]:
    """The gateway's route and key, or the problems that stop attempts from starting."""
    problems = []
    key: bytes | None = None
    where = f"Secret '{settings.key_secret}' in namespace {settings.namespace}"
    make = (
        f"kubectl -n {settings.namespace} create secret generic {settings.key_secret} "
        f"--from-literal={settings.key_name}=$(openssl rand -hex 32)"
    )
    secret = get_secret(settings.namespace, settings.key_secret)
    if secret is None:
        problems.append(
            Problem(
                SPEC_PATH,
                f"the egress gateway's key ({where}, key '{settings.key_name}') does not "
                f"exist; install the gateway (hack/kind/egress-gateway.yaml) or create it: "
                f"{make}",
            )
        )
    else:
        raw = _secret_value(secret, settings.key_name)
        if raw is None:
            problems.append(
                Problem(SPEC_PATH, f"{where} has no key '{settings.key_name}'; add one: {make}")
            )
        else:
            try:
                key = credential.load_key(raw)
            except credential.InvalidKey as exc:
                problems.append(Problem(SPEC_PATH, f"{where}: {exc}"))
    try:
        address = str(ipaddress.ip_address(settings.host))
    except ValueError:
        try:
            address = resolve(settings.host, settings.port)
        except OSError as exc:
            problems.append(
                Problem(
                    SPEC_PATH,
                    f"the egress gateway {settings.host}:{settings.port} does not resolve "
                    f"({exc}); install it (hack/kind/egress-gateway.yaml) or point the "
                    "operator at it: maka-eval operator --egress-gateway HOST:PORT",
                )
            )
            address = ""
    if problems or key is None:
        return problems
    route = GatewayRoute(
        host=settings.host,
        address=address,
        port=settings.port,
        namespace=settings.namespace,
        pod_labels=dict(settings.pod_labels),
    )
    return GatewayAccess(route, key)


# -- the sidecar's startup deadline ---------------------------------------------------------

SIDECAR_CONTAINER = "egress-proxy"
"""The native sidecar's name (k8s.render.EGRESS_CONTAINER)."""
SIDECAR_STARTUP_DEADLINE_SEC = 180.0
"""How long an attempt waits for its egress sidecar to pass its startup probe (the
probe itself allows two minutes) before the attempt is an infrastructure failure: a
sidecar that never starts would otherwise hold the Pod in Init for good, the kubelet
restarting it again and again."""


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def sidecar_waiting_since(pod: Mapping[str, Any]) -> datetime | None:
    """Since when the Pod's egress sidecar has been trying to start and is not started
    yet (None: no sidecar, started, or not its turn yet). A sidecar that restarted
    counts from the Pod's start: its first try is over."""
    status = pod.get("status") or {}
    for container in status.get("initContainerStatuses") or ():
        if container.get("name") != SIDECAR_CONTAINER or container.get("started"):
            continue
        state = container.get("state") or {}
        pod_start = _time(status.get("startTime"))
        if int(container.get("restartCount") or 0) > 0 or "terminated" in state:
            return pod_start
        if "running" in state:
            return _time((state.get("running") or {}).get("startedAt")) or pod_start
        waiting = (state.get("waiting") or {}).get("reason")
        if waiting == "CrashLoopBackOff":
            return pod_start
    return None


def sidecar_not_started_reason(waited_sec: float) -> str:
    """The infrastructure failure's reason."""
    return (
        f"the attempt's egress proxy (the {SIDECAR_CONTAINER} sidecar) did not pass its "
        f"startup probe within {waited_sec:g}s; see its log: kubectl logs <pod> -c "
        f"{SIDECAR_CONTAINER}"
    )
