"""The process backend: the attempt runs as processes of this machine.

Two ways, chosen per attempt:

- `Namespaces` (Linux, root, bubblewrap): a holder process owns fresh PID, mount, IPC,
  UTS and network namespaces. The subject is entered into them with `nsenter`, so its
  exit code comes from a process it cannot reach; inside, it sees its workspace, its
  home and temp folder (on disk, in the attempt folder), and the instruction, at fixed
  places (/attempt/workspace, ...: sandbox.holders), a /tmp of its own, and the machine's
  files read-only -- but not the run folder, other cells' workspaces, the tasks' tests
  and solutions, /run (engine sockets), or any process but its own. Processes it leaves
  behind live on in the holder's namespaces until the verifier has run, and die with
  the holder. The verifier runs in a namespace of its own that shares only the
  subject's network (a server the subject left still answers on localhost) and is the
  only one that sees the tests and the verifier's log folder, so nothing the subject
  left running can write a reward.
- Without a policed network, the holders are taken ready-made from the executor's
  `NamespacePool` when it has some, and the attempt's folders are mounted into them.
- With a policed network (`Network`, the cell's egress enforcement), the subject's
  namespaces are made inside the executor's network namespace instead of a new one,
  /etc/hosts pins the proxy's name, /etc/resolv.conf names no resolver, and the proxy's
  CA certificate is shown read-only.
- The subject and the verifier, root or not, hold only `SUBJECT_CAPS` (Docker's default set without
  CAP_NET_RAW and CAP_MKNOD), limited by setpriv as it is entered: no CAP_NET_ADMIN or
  CAP_NET_RAW (around the egress policy), no CAP_SYS_ADMIN (setns, unshare, mount: a
  root subject could remount the host's files read-write), no CAP_DAC_READ_SEARCH
  (open_by_handle_at reaches any file of a mounted filesystem), no CAP_MKNOD (there
  is no device cgroup: a node of the host's disk would be readable).
- `PlainProcesses`: the attempt's processes carry a marker and the relay finds and
  kills them by it (see processes.supervisor). Nothing is hidden; the record says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import IO

from maka_eval.engine.modes import Isolation
from maka_eval.processes.output import OutputCapture
from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor, WaitEnd
from maka_eval.processes.table import snapshot
from maka_eval.sandbox.base import Layout, Network, Phase, mapped
from maka_eval.sandbox.files import copy_into, copy_out, copy_path_out
from maka_eval.sandbox.holders import (
    OWN_NAMESPACES,
    VERIFIER_HOME,
    VERIFIER_TMP,
    Holder,
    NamespacePool,
    Sources,
    View,
    end_together,
    make_holder,
    seen_at,
    subject_args,
    verifier_holder,
)

BWRAP_PROBE = (
    *("bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent"),
    *("--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"),
)
"""The smallest sandbox: whether bubblewrap works here, and what it costs alone."""
SUBJECT_CAPS = (
    *("chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap"),
    *("setfcap", "net_bind_service", "sys_chroot", "audit_write"),
)
"""The only capabilities a subject can hold (the bounding set is cut to these and the
inheritable and ambient sets emptied, so no exec regains another): what a root process
in a Docker container holds by default, less CAP_NET_RAW and CAP_MKNOD. The relay's gate
checks the ones that matter are gone (relay.gate.FORBIDDEN)."""


class _Supervised:
    """Programs started through the relay's supervisor: waiting and reaping are its."""

    def __init__(self, supervisor: ProcessSupervisor, attempt_id: str, layout: Layout) -> None:
        self.supervisor = supervisor
        self.attempt_id = attempt_id
        self.layout = layout
        self.notes: list[str] = []

    def wait(
        self,
        proc: subprocess.Popen[bytes],
        timeout: float,
        cancel: CancelToken,
        captures: Sequence[OutputCapture] = (),
    ) -> WaitEnd:
        return self.supervisor.wait(proc, timeout, cancel, captures)

    def release(self, proc: subprocess.Popen[bytes]) -> int:
        return self.supervisor.release(proc)

    def path_of(self, phase: Phase, host_path: str) -> str:
        return host_path

    def verifier_dirs(self) -> tuple[str, str] | None:
        """Made empty now, on the host (nothing is hidden here: see Namespaces)."""
        lay = self.layout
        if lay.verifier_home is None or lay.verifier_tmp is None:
            raise OSError("the layout has no folders for the verifier's HOME and TMPDIR")
        for folder in (lay.verifier_home, lay.verifier_tmp):
            shutil.rmtree(folder, ignore_errors=True)
            Path(folder).mkdir(parents=True, mode=0o700)
        return lay.verifier_home, lay.verifier_tmp

    def tampering(self) -> str | None:
        """The machine's files are out of a subject's reach here (read-only in the
        namespaces; with no isolation, nothing is claimed)."""
        return None

    def _host_of(self, path: str) -> str:
        """The host path of what the sandbox shows at `path`."""
        return path

    def upload(self, host_path: str, sandbox_path: str, user: str | None = None) -> None:
        target = self._host_of(sandbox_path)
        if host_path != target:  # the folders of the layout are shown in place
            copy_into(Path(host_path), target)

    def download(self, sandbox_path: str, host_path: str, max_bytes: int) -> None:
        source = self._host_of(sandbox_path)
        if host_path != source:
            copy_out(source, Path(host_path), max_bytes)

    def collect(self, source: str, target: Path, max_bytes: int) -> str | None:
        # What a subject here writes and a relay may read: its workdir (the workspace)
        # and /logs/agent. Anything else is this machine's own.
        lay = self.layout
        for inside, host in (
            (self.path_of(Phase.SUBJECT, lay.workspace), lay.workspace),
            (Layout.AGENT_LOGS_PATH, lay.agent_logs),
            (self.path_of(Phase.SUBJECT, lay.agent_logs), lay.agent_logs),
        ):
            if source == inside or source.startswith(inside.rstrip("/") + "/"):
                return copy_path_out(host, source[len(inside) :], target, max_bytes)
        return (
            "the process sandbox collects artifacts from the workdir and /logs/agent only "
            "(the rest of what its subject sees is this machine's own files)"
        )


class PlainProcesses(_Supervised):
    """Processes of this machine, found by the attempt's marker (no isolation)."""

    isolation = Isolation.NONE

    def start(self) -> None:
        """Nothing to make: the attempt's folders are the sandbox."""

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
        return self.supervisor.spawn(list(argv), cwd=cwd, env=env, stdout=stdout, stderr=stderr)

    def next_step(self) -> None:
        """Nothing to renew: the relay made the verifier's folders anew."""

    def quiesce(self, phase: Phase, proc: subprocess.Popen[bytes]) -> None:
        self.supervisor.quiesce([proc.pid], self.attempt_id)

    def processes(self) -> list[int]:
        return sorted(self.supervisor.members([], self.attempt_id))

    def stop(self) -> None:
        self.supervisor.end_attempt(self.attempt_id)


@cache
def namespaces_unavailable() -> str | None:
    """Why this machine cannot give attempts their own namespaces, or None if it can."""
    if not sys.platform.startswith("linux"):
        return f"namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "namespaces need root (run maka-eval as root, or set isolation: none)"
    for tool, package in (
        ("bwrap", "bubblewrap"),
        ("nsenter", "util-linux"),
        ("setpriv", "util-linux"),
    ):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian package {package})"
    probe = subprocess.run(
        list(BWRAP_PROBE),
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot make namespaces here: {probe.stderr.strip()[:200]}"
    return None


class Namespaces(_Supervised):
    """The attempt in its own namespaces, made with bubblewrap (see the module docstring).

    Two holders: the subject's (all namespaces new), and the verifier's, which joins the
    subject's network namespace and has its own PID, mount, IPC and UTS namespaces. With
    a `pool` (and no policed network) both are taken ready-made and the attempt's
    folders are mounted into them; otherwise the verifier's is started right after the
    subject's and made while the subject runs.
    """

    isolation = Isolation.NAMESPACES

    def __init__(
        self,
        supervisor: ProcessSupervisor,
        attempt_id: str,
        layout: Layout,
        network: Network | None = None,
        pool: NamespacePool | None = None,
    ) -> None:
        super().__init__(supervisor, attempt_id, layout)
        self.network = network
        """The executor's policed namespace to join; None: a new one, loopback only."""
        self.pool = pool
        self._subject: Holder | None = None
        self._verifier: Holder | None = None
        self._slot: str | None = None
        """The pool's slot whose mount points show this attempt's folders."""
        self._programs: list[subprocess.Popen[bytes]] = []
        self._seen = seen_at(layout)
        self._hosts = {inside: host for host, inside in self._seen.items()}
        lay = layout
        self._view = View(
            hidden=tuple(lay.hidden),
            visible=tuple(lay.visible),
            frame=lay.frame_dir is not None,
            subject_dirs=tuple(sorted(lay.subject_dirs.values())),
            image=lay.in_task_image,
        )
        self._sources = Sources.of(layout)

    def verifier_dirs(self) -> tuple[str, str] | None:
        """In the verifier's own /tmp, a tmpfs of its mount namespace (a step's next
        verifier gets new ones with its new holder)."""
        return VERIFIER_HOME, VERIFIER_TMP

    def path_of(self, phase: Phase, host_path: str) -> str:
        """The attempt's folders are seen at fixed places (/attempt/workspace, /tests, ...);
        anything else (the subject's own program) at its host path."""
        return mapped(self._seen, host_path)

    def _host_of(self, path: str) -> str:
        return mapped(self._hosts, path)

    # -- the holders ----------------------------------------------------------------
    def start(self) -> None:
        # Created empty now: only the verifier's namespace ever sees them.
        Path(self.layout.tests).mkdir(parents=True, exist_ok=True)
        Path(self.layout.verifier_logs).mkdir(parents=True, exist_ok=True)
        if self.network is None and self.pool is not None and self._ready_made(self.pool):
            return
        view, src, sup = self._view, self._sources, self.supervisor
        if self.network is None:
            self._subject = make_holder(
                [], [*OWN_NAMESPACES, "--unshare-net"], subject_args(view, src, None), sup
            )
        else:
            # The executor's namespace, with its policy already loaded.
            join = ["nsenter", f"--net={self.network.namespace}", "--"]
            self._subject = make_holder(
                join, OWN_NAMESPACES, subject_args(view, src, self.network), sup
            )
        self._verifier = verifier_holder(self._subject.ready(), view, src, self.network, sup)

    def _ready_made(self, pool: NamespacePool) -> bool:
        """Take a pair the pool made and show this attempt's folders in it."""
        pair = pool.take(self._view)
        if pair is None:
            return False
        try:
            pool.attach(pair, self.layout)
        except OSError as exc:
            pair.end()
            pool.give_back(pair.slot)
            self.notes.append(f"a ready-made sandbox could not be used ({exc}); made anew")
            return False
        self._subject, self._verifier, self._slot = pair.subject, pair.verifier, pair.slot
        return True

    def next_step(self) -> None:
        subject, verifier = self._subject, self._verifier
        view, src = self._view, self._sources
        if subject is None or not subject.alive():
            # Cut off by its timeout: new namespaces, in the same network namespace (the
            # verifier's holder kept it), over the same workspace.
            if verifier is None or not verifier.alive():
                raise OSError("the sandbox's namespaces are gone; the next step cannot run")
            join = ["nsenter", "--target", str(verifier.ready()), "--net", "--"]
            self._subject = subject = make_holder(
                join, OWN_NAMESPACES, subject_args(view, src, self.network), self.supervisor
            )
        # Ready first: it has joined the network namespace before the verifier that
        # kept it goes.
        target = subject.ready()
        if verifier is not None:
            verifier.end()  # with whatever the last verifier left running
        Path(self.layout.tests).mkdir(parents=True, exist_ok=True)
        Path(self.layout.verifier_logs).mkdir(parents=True, exist_ok=True)
        self._verifier = verifier_holder(target, view, src, self.network, self.supervisor)

    # -- running programs -------------------------------------------------------------
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
        holder = self._subject if phase is Phase.SUBJECT else self._verifier
        if holder is None or not holder.alive():
            raise OSError(f"the {phase.value}'s sandbox is not running")
        target = holder.ready()
        # nsenter forks into the PID namespace and waits: the exit code is the program's,
        # and no process in the sandbox can reach the one reporting it. The root is the
        # holder's; the working directory is looked up inside, after the attempt's
        # folders were mounted. (The verifier's holder lives in the subject's network
        # namespace.)
        namespaces = ("--pid", "--mount", "--ipc", "--uts", "--net")
        inside = self.path_of(phase, cwd)  # a folder of the layout, named either way
        command = ["nsenter", "--target", str(target), *namespaces, "-r", f"--wdns={inside}", "--"]
        # The subject and the verifier alike: the verifier runs the task's tests in what
        # the subject left, and nothing it runs may undo the sandbox (mount, setns, raw
        # sockets, devices).
        keep = "".join(f",+{cap}" for cap in SUBJECT_CAPS)
        command += ["setpriv", "--inh-caps=-all", "--ambient-caps=-all"]
        command += [f"--bounding-set=-all{keep}", "--"]
        command += argv
        host_cwd = self._host_of(inside)
        proc = self.supervisor.spawn(
            command,
            cwd=host_cwd if os.path.isdir(host_cwd) else self.layout.workspace,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        self._programs.append(proc)
        return proc

    def quiesce(self, phase: Phase, proc: subprocess.Popen[bytes]) -> None:
        holder = self._subject if phase is Phase.SUBJECT else self._verifier
        if holder is not None:
            holder.end()  # the kernel ends every process in its namespaces

    def processes(self) -> list[int]:
        table = snapshot()
        children: dict[int, list[int]] = {}
        for pid, info in table.items():
            children.setdefault(info.ppid, []).append(pid)
        holders = [h.proc for h in (self._subject, self._verifier) if h is not None]
        roots = [p.pid for p in (*holders, *self._programs) if p.poll() is None]
        found: set[int] = set()
        stack = list(roots)
        while stack:
            pid = stack.pop()
            if pid in found or pid not in table or table[pid].state == "Z":
                continue
            found.add(pid)
            stack.extend(children.get(pid, ()))
        return sorted(found)

    def stop(self) -> None:
        end_together(self._subject, self._verifier)
        if self._slot is not None and self.pool is not None:
            self.pool.give_back(self._slot)  # nothing of the attempt is mounted there now
            self._slot = None
        self.supervisor.end_attempt(self.attempt_id)


def make_sandbox(
    isolation: Isolation,
    supervisor: ProcessSupervisor,
    attempt_id: str,
    layout: Layout,
    network: Network | None = None,
    pool: NamespacePool | None = None,
) -> PlainProcesses | Namespaces:
    """The process backend the plan asks for. Plain processes cannot join `network`:
    they run in this machine's namespace, and the relay's gate refuses to start them."""
    if isolation is Isolation.NAMESPACES:
        return Namespaces(supervisor, attempt_id, layout, network, pool)
    return PlainProcesses(supervisor, attempt_id, layout)


def interpreted(argv: Sequence[str], shell: str | None = None) -> list[str]:
    """A script without a `#!` line runs with bash, as in Harbor (not with /bin/sh).

    `argv[0]` is read on this machine; `shell` is the bash to name (default: this
    machine's; a container backend names the image's, `bash`). A program named without
    a path is left to the PATH of wherever it runs.
    """
    if not argv or "/" not in argv[0]:
        return list(argv)
    try:
        with open(argv[0], "rb") as handle:
            head = handle.read(4)
    except OSError:
        return list(argv)
    if head.startswith(b"#!") or head == b"\x7fELF":
        return list(argv)
    bash = shell or shutil.which("bash") or "/bin/bash"
    return [bash, *argv]


__all__ = [
    "Namespaces",
    "PlainProcesses",
    "interpreted",
    "make_sandbox",
    "namespaces_unavailable",
]
