"""The sandbox interface the relay runs one attempt against (Harbor's environment shape).

The relay prepares the attempt's folders on the host, then asks the sandbox to start,
to run the subject and later the verifier in it, to stop what the subject left when it
is cut off, and finally to tear everything down. What the subject can see and reach is
the sandbox's business: a backend that cannot isolate says so (`Isolation.NONE`), and
the record carries it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Protocol

from maka_eval import layout
from maka_eval.engine.modes import Isolation
from maka_eval.processes.output import OutputCapture
from maka_eval.processes.supervisor import CancelToken, WaitEnd


class Phase(StrEnum):
    """Which program of the attempt runs."""

    SUBJECT = "subject"
    VERIFIER = "verifier"


@dataclass(frozen=True)
class Layout:
    """Host folders of one attempt and where each is seen inside the sandbox."""

    workspace: str
    home: str
    tmp: str
    frame_dir: str | None
    instruction: str
    agent_logs: str
    tests: str
    verifier_logs: str
    subject_dirs: Mapping[str, str] = field(default_factory=dict)
    """Extra folders for the subject only (the oracle's solution): host path -> path
    inside the sandbox."""
    hidden: Sequence[str] = ()
    """Host folders no sandbox may see (the run folder, every workspace, the tasks)."""
    visible: Sequence[str] = ()
    """Host paths the subject needs besides the machine's runtime (its own program)."""
    in_task_image: bool = False
    """The machine is the task's own image (the relay in a Pod): its folders are shown
    but the hidden ones (else only the runtime folders are)."""
    verifier_home: str | None = None
    """Host folder for the verifier's HOME where the backend has no private one of its
    own (plain processes); made empty before each verifier."""
    verifier_tmp: str | None = None
    """Likewise for its TMPDIR."""
    evidence_dir: str | None = None
    """Host folder where the sandbox leaves what it found for the record (e.g. the files
    the subject changed outside its folders); its files become `evidence/<name>`
    artifacts."""

    TESTS_PATH = layout.TESTS_PATH
    VERIFIER_LOGS_PATH = layout.VERIFIER_LOGS_PATH
    AGENT_LOGS_PATH = layout.AGENT_LOGS_PATH


def mapped(paths: Mapping[str, str], path: str) -> str:
    """`path` through a map of folders (or files) to where they are seen: a path in a
    mapped folder keeps its place in it; an unmapped path is itself."""
    if path in paths:
        return paths[path]
    for source, seen in paths.items():
        if path.startswith(source.rstrip("/") + "/"):
            return seen.rstrip("/") + path[len(source.rstrip("/")) :]
    return path


@dataclass(frozen=True)
class Network:
    """A network namespace the executor made and policed (egress enforcement): the
    sandbox joins it instead of making its own, and shows the subject the files that go
    with it. The subject holds neither CAP_NET_RAW nor CAP_NET_ADMIN in it."""

    namespace: str
    """Path of the namespace (/run/netns/NAME)."""
    hosts: Mapping[str, str]
    """Names pinned in /etc/hosts (name -> address): the proxy's."""
    hosts_file: str
    """Host file the process sandbox shows as /etc/hosts (this machine's, plus `hosts`);
    a container gets `hosts` as its engine's extra hosts."""
    resolv_file: str
    """Host file shown as /etc/resolv.conf: no nameserver (no resolver is reachable)."""
    ca_cert: str | None = None
    """Host path of the proxy's CA certificate, shown read-only (see `path_of`)."""


class Sandbox(Protocol):
    """Runs one attempt's processes; the relay owns everything else."""

    isolation: Isolation
    notes: list[str]
    """What the sandbox saw that the record should say (suspected tampering, a limit the
    engine could not enforce); read by the relay when the attempt is over."""

    def verifier_dirs(self) -> tuple[str, str] | None:
        """HOME and TMPDIR of the verifier as it sees them: its own, not the subject's
        (no ~/.local site-packages, dotfiles or temp files the subject planted); None
        when the backend sets them itself."""

    def tampering(self) -> str | None:
        """After the verifier ran, before `stop`: what the subject changed of the
        verifier's own start-up (shell, interpreter chain, loader, libraries), naming
        the files; None when nothing (or when the backend leaves the subject no way to
        change them). The attempt is then the subject's failure with score 0."""

    def start(self) -> None:
        """Make the sandbox (before the subject, after the workspace is prepared)."""

    def path_of(self, phase: Phase, host_path: str) -> str:
        """Where a host folder of the layout is seen by `phase`'s processes."""

    def spawn(
        self,
        phase: Phase,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
        user: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a program of the attempt (OSError when it cannot start). `user` (a
        step's task.toml user) replaces the plan's where the backend has users."""

    def upload(self, host_path: str, sandbox_path: str, user: str | None = None) -> None:
        """Copy a host file, or a folder's content, to `sandbox_path` as the subject
        sees it (merged into a folder already there; links the subject left are never
        followed), owned by `user` where the backend has users. OSError when it cannot."""

    def download(self, sandbox_path: str, host_path: str, max_bytes: int) -> None:
        """Copy what is at `sandbox_path` (a folder's regular files, at most `max_bytes`
        in all) into the new or empty host folder `host_path`; nothing when it is gone."""

    def collect(self, source: str, target: Path, max_bytes: int) -> str | None:
        """A task artifact: copy what is at `source` as the subject sees it (a regular
        file, or a folder's regular files, at most `max_bytes` in all; links never
        followed) to the new host path `target` (a file or a folder, as the source is);
        why nothing was copied, or None."""

    def next_step(self) -> None:
        """Another step of a multi-step task follows: the subject's sandbox is ready
        again (one cut off by its timeout took its processes with it), and the next
        verifier gets its own empty /tests and /logs/verifier (the relay has emptied the
        host folders) that no process of the previous verifier can reach. What the
        subject left running keeps running, as in Harbor."""

    def wait(
        self,
        proc: subprocess.Popen[bytes],
        timeout: float,
        cancel: CancelToken,
        captures: Sequence[OutputCapture] = (),
    ) -> WaitEnd:
        """Wait for exit, the timeout or cancellation."""

    def release(self, proc: subprocess.Popen[bytes]) -> int:
        """Reap a program that ended; its exit code."""

    def quiesce(self, phase: Phase, proc: subprocess.Popen[bytes]) -> None:
        """Stop `phase`'s program and everything it started, now."""

    def processes(self) -> list[int]:
        """Host pids of the attempt's processes still alive."""

    def stop(self) -> None:
        """The attempt is over: nothing of it may survive."""
