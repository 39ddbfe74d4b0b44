"""The sandbox extension point and its conformance kit (maka_eval.sandbox.selfcheck).

The kit passes for maka-eval's own backends (process, with and without namespaces, and
container on real Podman) and for a third party's backend installed with pip and found
by its entry point; it fails, naming the rule, for backends that break the contract.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO

import pytest

from maka_eval.sandbox import backends, selfcheck
from maka_eval.sandbox.backends import SandboxLoadError, SandboxRequest
from maka_eval.sandbox.base import Isolation, Phase
from maka_eval.sandbox.plans import ContainerPlan
from maka_eval.sandbox.process import BACKEND as PROCESS
from maka_eval.sandbox.process import PlainProcesses, namespaces_unavailable

REPO = Path(__file__).resolve().parents[2]


def _isolation(isolation: Isolation):
    return lambda request: replace(request, isolation=isolation)


@pytest.mark.skipif(namespaces_unavailable() is not None, reason=f"{namespaces_unavailable()}")
def test_the_process_backend_in_namespaces_conforms() -> None:
    report = selfcheck.run("process", customize=_isolation(Isolation.NAMESPACES))
    selfcheck.assert_conforms(report)
    assert report.isolation == "namespaces"
    assert not [r for r in report.results if r.passed is None]  # nothing skipped


def test_plain_processes_conform_and_skip_what_they_do_not_claim() -> None:
    report = selfcheck.run(PROCESS, customize=_isolation(Isolation.NONE))
    selfcheck.assert_conforms(report)
    skipped = {r.name for r in report.results if r.passed is None}
    assert skipped == {"tests out of the subject's sight", "hidden folders out of sight"}


def test_the_container_backend_conforms(container_engine: str) -> None:
    from tests.sandbox.conftest import BASE_IMAGE

    def customize(request: SandboxRequest) -> SandboxRequest:
        return replace(request, container=ContainerPlan(engine=container_engine, image=BASE_IMAGE))

    report = selfcheck.run("container", customize=customize)
    selfcheck.assert_conforms(report)
    assert report.isolation == "container"


def test_a_third_party_backend_installed_with_pip_is_found_and_conforms(toy_sandbox: Path) -> None:
    assert "toy" in backends.installed_kinds()
    backend = backends.load("toy")
    assert type(backend).__module__ == "maka_toy_sandbox"
    report = selfcheck.run("toy")
    selfcheck.assert_conforms(report)
    # Its own paths, not the host's: the kit checked through path_of, as the relay does.
    env_row = next(r for r in report.results if r.name == "environment and working folder")
    assert "toy-sandbox-" in env_row.detail


def test_the_kit_runs_from_the_command_line(toy_sandbox: Path) -> None:
    env = {"PYTHONPATH": f"{toy_sandbox}:{REPO / 'operator'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "maka_eval.sandbox.selfcheck", "toy"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sandbox backend 'toy' (isolation: none)" in done.stdout
    assert "15 of 15 checks did not fail" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "maka_eval.sandbox.selfcheck", "nowhere"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert missing.returncode == 2
    assert "no sandbox backend 'nowhere' is installed" in missing.stderr
    assert "'process', 'container'" in missing.stderr and "'toy'" in missing.stderr


def test_an_unknown_or_broken_registration_is_named(toy_sandbox: Path) -> None:
    with pytest.raises(KeyError) as unknown:
        backends.load("nowhere")
    assert "maka_eval.sandboxes" in unknown.value.args[0]
    assert backends.kind_problem("toy") is None and backends.kind_problem("process") is None
    with pytest.raises(SandboxLoadError, match=r"toy-broken.*does not implement"):
        backends.load("toy-broken")


# -- the kit can fail: backends that break one rule each -----------------------------
class _LeakyEnvironment(PlainProcesses):
    """Gives every program this process's whole environment on top of the one asked."""

    def spawn(
        self,
        phase: Phase,
        argv,
        *,
        env: Mapping[str, str],
        cwd: str,
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
        user: str | None = None,
    ) -> subprocess.Popen[bytes]:
        import os

        return super().spawn(
            phase, argv, env={**os.environ, **env}, cwd=cwd, stdout=stdout, stderr=stderr
        )


class _KeepsChildren(PlainProcesses):
    """Ends the program it started but not what that program started."""

    def quiesce(self, phase: Phase, proc: subprocess.Popen[bytes]) -> None:
        proc.kill()


class _FollowsLinks(PlainProcesses):
    """Collects what a link points at."""

    def collect(self, source: str, target: Path, max_bytes: int) -> str | None:
        import shutil

        shutil.copyfile(source, target)
        return None


class _Survives(PlainProcesses):
    """Leaves what the subject started running when the attempt is over."""

    def stop(self) -> None:
        return None


class _Backend:
    def __init__(self, sandbox: type[PlainProcesses]) -> None:
        self.kind = sandbox.__name__
        self.sandbox = sandbox

    def unavailable(self, request: SandboxRequest | None = None) -> str | None:
        return None

    def create(self, request: SandboxRequest) -> PlainProcesses:
        return self.sandbox(request.supervisor, request.attempt_id, request.layout)


@pytest.mark.parametrize(
    ("sandbox", "rule", "said"),
    [
        (_LeakyEnvironment, "environment and working folder", selfcheck.CANARY),
        (_KeepsChildren, "timeout and quiesce", "children running"),
        (_FollowsLinks, "collect", "followed"),
        (_Survives, "stop", "alive"),
    ],
)
def test_a_backend_that_breaks_a_rule_fails_that_check(
    sandbox: type[PlainProcesses], rule: str, said: str
) -> None:
    report = selfcheck.run(_Backend(sandbox))
    failed = {r.name: r.detail for r in report.failures}
    assert rule in failed, report.text()
    assert said in failed[rule]
    with pytest.raises(AssertionError, match="FAIL"):
        selfcheck.assert_conforms(report)


def test_a_backend_unavailable_here_is_reported_not_run() -> None:
    class Nowhere(_Backend):
        def unavailable(self, request: SandboxRequest | None = None) -> str | None:
            return "needs a hypervisor (install one)"

    report = selfcheck.run(Nowhere(PlainProcesses))
    assert [(r.name, r.passed, r.detail) for r in report.results] == [
        ("available here", False, "needs a hypervisor (install one)")
    ]
