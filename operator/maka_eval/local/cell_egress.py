"""One cell's egress enforcement in the local executor: namespace, proxy, audit log.

For an attempt whose egress is policed (executor.config.egress mode 'proxy'), before
the relay starts: the cell's network namespace is made (local.netns), the cell's proxy
is started on the host end of its veth (egress.proxy: blocklist, audit log, metering,
a CA of its own), and the namespace's policy is loaded for that address and port. The
relay gets an `EgressPlan` naming all of it. When the attempt is over the proxy is
stopped, the namespace removed, and the audit log stored as an artifact of the attempt.

Everything the proxy keeps (CA key, audit log, checkpoint, result token) lives in a
folder next to the attempt's, under the executor's work folder, which no sandbox sees;
only the CA certificate is shown to the subject, read-only.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from maka_eval.artifacts import Redactor, copy_artifact
from maka_eval.contract.kernel import ArtifactEntry
from maka_eval.egress.policy import EgressPolicy
from maka_eval.egress.proxy import ProxyHandle, start_proxy
from maka_eval.local import netns
from maka_eval.relay.plan import EgressPlan

AUDIT_ARTIFACTS = ("egress/audit.jsonl", "egress/audit.previous.jsonl")
"""Artifact names of the audit log and of the part rotated out of it."""


@dataclass
class CellEgress:
    """A cell's running egress enforcement (see the module docstring)."""

    network: netns.CellNetwork
    proxy: ProxyHandle
    policy: EgressPolicy
    folder: Path
    setup_sec: float = 0.0
    teardown_sec: float = 0.0
    _finished: bool = field(default=False, repr=False)

    def plan(self, verifier_uses_proxy: bool = False) -> EgressPlan:
        """What the relay needs: the namespace to join and check, the proxy to name (to
        the verifier too, when `verifier_uses_proxy`)."""
        return EgressPlan(
            namespace=self.network.path,
            namespace_identity=self.network.identity,
            proxy_name=netns.PROXY_NAME,
            proxy_address=self.network.host_address,
            proxy_port=self.proxy.port,
            ca_cert=str(self.proxy.ca_cert_path),
            policy_digest=self.policy.digest,
            verifier_uses_proxy=verifier_uses_proxy,
        )

    def timings(self) -> dict[str, float]:
        """Per-cell costs of enforcement, for the attempt record."""
        return {
            "egressSetupSec": self.setup_sec,
            "egressNamespaceSetupSec": self.network.setup_sec,
            "egressTeardownSec": self.teardown_sec,
            "egressNamespaceTeardownSec": self.network.teardown_sec,
        }

    def finish(self) -> None:
        """Stop the proxy and remove the namespace (idempotent)."""
        if self._finished:
            return
        started = time.perf_counter()
        try:
            self.proxy.stop()
        finally:
            self.network.remove()
            self._finished = True
            self.teardown_sec = time.perf_counter() - started

    def store_audit_log(self, artifacts_dir: Path, redactor: Redactor) -> tuple[ArtifactEntry, ...]:
        """Copy the (finished) audit log into the attempt's artifacts, redacted and
        digested; empty files are not stored."""
        log = self.proxy.audit_log_path
        sources = (log, log.with_name(log.name + ".1"))
        entries = []
        for name, source in zip(AUDIT_ARTIFACTS, sources, strict=True):
            if not source.is_file() or source.stat().st_size == 0:
                continue
            target = artifacts_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = copy_artifact(source, target, redactor)
            entries.append(ArtifactEntry(name, digest.bytes, digest.sha256))
        return tuple(entries)


def start_cell_egress(
    *, run_id: str, cell_id: str, folder: Path, policy: EgressPolicy, result_token: str
) -> CellEgress:
    """Namespace, proxy, policy -- in that order; nothing is left behind on failure."""
    started = time.perf_counter()
    folder.mkdir(mode=0o700, parents=True, exist_ok=False)
    network = netns.create(run_id, cell_id)
    try:
        proxy = start_proxy(
            state_dir=folder / "state",
            publish_dir=folder / "publish",
            policy=policy,
            checkpoint_path=folder / "provider-usage.json",
            result_token=result_token,
            listen_host=network.host_address,
            listen_port=0,
        )
        try:
            network.enforce(proxy.port)
        except BaseException:
            proxy.stop()
            raise
    except BaseException:
        with contextlib.suppress(Exception):
            network.remove()
        raise
    return CellEgress(network, proxy, policy, folder, setup_sec=time.perf_counter() - started)


__all__ = ["AUDIT_ARTIFACTS", "CellEgress", "start_cell_egress"]
