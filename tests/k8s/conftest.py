"""A real Kubernetes control plane for the operator's tests (hack/envtest.sh).

The session fixture `control_plane` starts etcd, kube-apiserver, kube-controller-manager
and kube-scheduler built from Go modules (building them into the cache first if needed:
that can take many minutes on a fresh machine, see docs/envtest.md), yields the
kubeconfig path, and stops the control plane at the end of the session if it started it.
A failed build or start fails the tests loudly; it never skips them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENVTEST = REPO / "hack" / "envtest.sh"
NODE_NAME = "maka-eval-node"
KUBECTL = os.environ.get("KUBECTL") or shutil.which("kubectl") or "/usr/bin/kubectl"


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def control_plane() -> Iterator[Path]:
    """Path of the admin kubeconfig of a running control plane."""
    was_up = subprocess.run([str(ENVTEST), "status"], capture_output=True).returncode == 0
    # No timeout: the first build on a fresh machine takes a long time (docs/envtest.md).
    start = subprocess.run([str(ENVTEST), "start"], capture_output=True, text=True)
    if start.returncode != 0:
        pytest.fail(
            f"hack/envtest.sh start failed (exit {start.returncode}):\n{_tail(start.stderr)}",
            pytrace=False,
        )
    last = start.stdout.strip().splitlines()[-1] if start.stdout.strip() else ""
    if not last.startswith("export KUBECONFIG="):
        pytest.fail(f"hack/envtest.sh start printed no export line:\n{start.stdout}", pytrace=False)
    kubeconfig = Path(last.removeprefix("export KUBECONFIG="))
    try:
        yield kubeconfig
    finally:
        if not was_up:
            subprocess.run([str(ENVTEST), "stop"], capture_output=True, text=True, check=False)


class Kubectl:
    """kubectl against the test control plane (no Python client dependency)."""

    def __init__(self, kubeconfig: Path, cache_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.cache_dir = cache_dir

    def run(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [KUBECTL, f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache_dir}", *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, obj: dict[str, Any], namespace: str | None = None) -> Any:
        ns = [f"--namespace={namespace}"] if namespace else []
        return json.loads(
            self.run("apply", *ns, "-f", "-", "-o", "json", input=json.dumps(obj)).stdout
        )

    def exists(self, *args: str) -> bool:
        proc = self.run("get", *args, "--ignore-not-found", "-o", "name", check=False)
        if proc.returncode != 0:
            raise AssertionError(proc.stderr)
        return bool(proc.stdout.strip())


def wait_until(predicate: Any, timeout: float = 60.0, interval: float = 0.3, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def wait_for_none_left(
    remaining: Callable[[], int], stall: float = 300.0, interval: float = 1.0, what: str = ""
) -> None:
    """Waits until `remaining()` is 0, however long that takes while the count keeps
    falling: a loaded machine deletes slowly but surely. Fails only after `stall`
    seconds without the count going down (garbage collection stuck, not slow)."""
    best = remaining()
    progress_at = time.monotonic()
    while best:
        if time.monotonic() - progress_at > stall:
            raise AssertionError(f"{best} {what or 'objects'} left, none gone for {stall:.0f}s")
        time.sleep(interval)
        now = remaining()
        if now < best:
            best, progress_at = now, time.monotonic()


@pytest.fixture(scope="session")
def kubectl(control_plane: Path, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(control_plane, tmp_path_factory.mktemp("kubectl-cache"))


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace whose default service account exists (pods need it)."""
    name = f"envtest-{uuid.uuid4().hex[:8]}"
    kubectl.run("create", "namespace", name)
    wait_until(
        lambda: kubectl.exists("serviceaccount", "default", f"--namespace={name}"),
        what=f"serviceaccount default in {name}",
    )
    try:
        yield name
    finally:
        kubectl.run("delete", "namespace", name, "--wait=false", check=False)


CRDS = REPO / "crds"


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> list[str]:
    """The CRDs of crds/ applied and Established; their names."""
    applied = kubectl.run("apply", "-f", str(CRDS), "-o", "name").stdout.split()
    names = [name.rsplit("/", 1)[-1] for name in applied]
    crd_names = [f"crd/{name}" for name in names]
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", *crd_names)
    return names
