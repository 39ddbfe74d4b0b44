"""A real Docker-API container engine for the sandbox's tests (hack/podman.sh).

The session fixture `container_engine` installs and configures rootful Podman if needed,
builds the registry-free base images (cached), starts `podman system service` on a unix
socket, yields its DOCKER_HOST url (``unix:///run/maka-eval/podman.sock``), and stops the
service at the end of the session if it started it. The first run on a fresh machine
installs packages and builds a Debian rootfs: a few minutes (docs/containers.md).

As root on Linux a failure fails the tests loudly; it never skips them. Without root the
tests are skipped, since rootful Podman cannot run.

The `engine` fixture talks to it through the `docker` SDK when that is importable, else
through the `podman` CLI (same storage, no socket). MAKA_EVAL_ENGINE_CLIENT=docker|podman
forces one.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PODMAN_SH = REPO / "hack" / "podman.sh"
BASE_IMAGE = "debian:bookworm-slim"
PYTHON_IMAGE = "localhost/maka-eval/debian-python:bookworm"
CLIENT_TIMEOUT = 60


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    # No timeout: a fresh machine installs packages and builds a rootfs first.
    return subprocess.run([str(PODMAN_SH), *args], capture_output=True, text=True)


@pytest.fixture(scope="session")
def container_engine() -> Iterator[str]:
    """DOCKER_HOST url of a running Podman API service."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the container engine is rootful Podman, which needs Linux")
    if os.geteuid() != 0:
        pytest.skip("the container engine is rootful Podman: hack/podman.sh needs root")
    was_up = _script("service", "status").returncode == 0
    for step in (("setup",), ("images",), ("service", "start")):
        proc = _script(*step)
        if proc.returncode != 0:
            pytest.fail(
                f"hack/podman.sh {' '.join(step)} failed (exit {proc.returncode}):\n"
                f"{_tail(proc.stderr)}",
                pytrace=False,
            )
    lines = proc.stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    if not last.startswith("export DOCKER_HOST=unix://"):
        pytest.fail(
            f"hack/podman.sh service start printed no export line:\n{proc.stdout}", pytrace=False
        )
    try:
        yield last.removeprefix("export DOCKER_HOST=")
    finally:
        if not was_up:
            _script("service", "stop")


def api_get(docker_host: str, path: str) -> tuple[int, bytes]:
    """GET on the engine's unix socket with the standard library only."""

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(CLIENT_TIMEOUT)
            self.sock.connect(docker_host.removeprefix("unix://"))

    conn = UnixConnection("localhost", timeout=CLIENT_TIMEOUT)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@dataclass
class Mount:
    source: Path
    target: str
    read_only: bool = True


@dataclass
class RunResult:
    exit_code: int
    output: str  # stdout and stderr together


@dataclass
class Engine:
    """The few container operations the tests need, over the SDK or the CLI."""

    docker_host: str
    kind: str  # "docker" (the SDK, over the API socket) or "podman" (the CLI)
    _client: Any = field(default=None, repr=False)

    def ping(self) -> bool:
        if self.kind == "docker":
            return bool(self._client.ping())
        return subprocess.run(["podman", "info"], capture_output=True).returncode == 0

    def image_exists(self, name: str) -> bool:
        if self.kind == "docker":
            import docker.errors

            try:
                self._client.images.get(name)
            except docker.errors.ImageNotFound:
                return False
            return True
        return subprocess.run(["podman", "image", "exists", name]).returncode == 0

    def run(
        self,
        image: str,
        command: Sequence[str],
        *,
        network: str = "none",
        mounts: Sequence[Mount] = (),
        memory: str | None = None,
        timeout: float = 120,
    ) -> RunResult:
        """Run to completion: detached, wait, logs, remove (never auto-remove: with it,
        Podman's wait() reports exit code 0)."""
        if self.kind == "docker":
            return self._run_sdk(image, command, network, mounts, memory, timeout)
        return self._run_cli(image, command, network, mounts, memory, timeout)

    def _run_sdk(
        self,
        image: str,
        command: Sequence[str],
        network: str,
        mounts: Sequence[Mount],
        memory: str | None,
        timeout: float,
    ) -> RunResult:
        kwargs: dict[str, Any] = {
            "network_mode": network,
            "volumes": {
                str(m.source): {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
                for m in mounts
            },
            "name": f"maka-eval-test-{uuid.uuid4().hex[:12]}",
        }
        if memory:
            kwargs.update(mem_limit=memory, memswap_limit=memory)
        container = self._client.containers.run(image, list(command), detach=True, **kwargs)
        try:
            status = container.wait(timeout=timeout)
            output = container.logs(stdout=True, stderr=True).decode(errors="replace")
            return RunResult(int(status["StatusCode"]), output)
        finally:
            container.remove(force=True)

    def _run_cli(
        self,
        image: str,
        command: Sequence[str],
        network: str,
        mounts: Sequence[Mount],
        memory: str | None,
        timeout: float,
    ) -> RunResult:
        args = ["podman", "run", "--rm", f"--network={network}"]
        for m in mounts:
            args.append(f"--volume={m.source}:{m.target}:{'ro' if m.read_only else 'rw'}")
        if memory:
            args += [f"--memory={memory}", f"--memory-swap={memory}"]
        proc = subprocess.run(
            [*args, image, *command], capture_output=True, text=True, timeout=timeout
        )
        return RunResult(proc.returncode, proc.stdout + proc.stderr)


def _client_kind() -> str:
    forced = os.environ.get("MAKA_EVAL_ENGINE_CLIENT", "")
    if forced in ("docker", "podman"):
        return forced
    return "docker" if importlib.util.find_spec("docker") else "podman"


@pytest.fixture(scope="session")
def engine(container_engine: str) -> Iterator[Engine]:
    kind = _client_kind()
    if kind == "podman":
        yield Engine(container_engine, "podman")
        return
    import docker

    # Always a client timeout: an attached run has been seen to hang on Podman.
    client = docker.DockerClient(base_url=container_engine, timeout=CLIENT_TIMEOUT)
    try:
        yield Engine(container_engine, "docker", client)
    finally:
        client.close()


def version_info(docker_host: str) -> dict[str, Any]:
    status, body = api_get(docker_host, "/version")
    assert status == 200, body
    info: dict[str, Any] = json.loads(body)
    return info
