"""The process backend: the attempt runs as processes of this machine.

Two ways, chosen per attempt:

- `Namespaces` (Linux, root, bubblewrap): a holder process owns fresh PID, mount, IPC,
  UTS and network namespaces. The subject is entered into them with `nsenter`, so its
  exit code comes from a process it cannot reach; inside, it sees its workspace, its
  home and /tmp (on disk, in the attempt folder), the instruction, and the machine's
  files read-only -- but not the run folder, other cells' workspaces, the tasks' tests
  and solutions, /run (engine sockets), or any process but its own. Processes it leaves
  behind live on in the holder's namespaces until the verifier has run, and die with
  the holder. The verifier runs in a namespace of its own that shares only the
  subject's network (a server the subject left still answers on localhost) and is the
  only one that sees the tests and the verifier's log folder, so nothing the subject
  left running can write a reward.
- With a policed network (`Network`, the cell's egress enforcement), the subject's
  namespaces are made inside the executor's network namespace instead of a new one,
  /etc/hosts pins the proxy's name, /etc/resolv.conf names no resolver, and the proxy's
  CA certificate is shown read-only.
- The subject, root or not, holds only `SUBJECT_CAPS` (Docker's default set without
  CAP_NET_RAW and CAP_MKNOD), limited by setpriv as it is entered: no CAP_NET_ADMIN or
  CAP_NET_RAW (around the egress policy), no CAP_SYS_ADMIN (setns, unshare, mount: a
  root subject could remount the host's files read-write), no CAP_DAC_READ_SEARCH
  (open_by_handle_at reaches any file of a mounted filesystem), no CAP_MKNOD (there
  is no device cgroup: a node of the host's disk would be readable).
- `PlainProcesses`: the attempt's processes carry a marker and the relay finds and
  kills them by it (see relay.processes). Nothing is hidden; the record says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO

from maka_eval import strict_json
from maka_eval.process_table import snapshot
from maka_eval.relay.output import OutputCapture
from maka_eval.relay.processes import CancelToken, ProcessSupervisor, WaitEnd
from maka_eval.sandbox.base import Isolation, Layout, Network, Phase
from maka_eval.sandbox.files import copy_into, copy_out, copy_path_out

# Top-level folders the sandbox makes anew instead of showing the host's.
_FRESH = frozenset({"proc", "dev", "tmp", "run", "lost+found"})
HOLDER_START_TIMEOUT = 10.0
OUTER_EXIT_TIMEOUT = 2.0
"""How long the outer bubblewrap may take to reap its killed init and exit."""
BWRAP_PROBE = (
    *("bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent"),
    *("--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"),
)
"""The smallest sandbox: whether bubblewrap works here, and what it costs alone."""
TMP_BYTES = 1 << 30
"""Size of a sandbox's own /tmp (memory-backed); TMPDIR points at the attempt's folder."""
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

    def upload(self, host_path: str, sandbox_path: str, user: str | None = None) -> None:
        if host_path != sandbox_path:  # the folders of the layout are shown in place
            copy_into(Path(host_path), sandbox_path)

    def download(self, sandbox_path: str, host_path: str, max_bytes: int) -> None:
        if host_path != sandbox_path:
            copy_out(sandbox_path, Path(host_path), max_bytes)

    def collect(self, source: str, target: Path, max_bytes: int) -> str | None:
        # What a subject here writes and a relay may read: its workdir (the workspace,
        # seen at its host path) and /logs/agent. Anything else is this machine's own.
        lay = self.layout
        for inside, host in (
            (lay.workspace, lay.workspace),
            (Layout.AGENT_LOGS_PATH, lay.agent_logs),
            (lay.agent_logs, lay.agent_logs),
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

    def path_of(self, phase: Phase, host_path: str) -> str:
        return host_path

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


@cache
def _root_binds() -> tuple[str, ...]:
    """The host's top-level folders, read-only (symlinks kept as symlinks)."""
    args: list[str] = []
    for name in sorted(os.listdir("/")):
        path = f"/{name}"
        if name in _FRESH:
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


def _existing(paths: Sequence[str]) -> list[str]:
    return [p for p in paths if os.path.isdir(p)]


@dataclass
class _Holder:
    """A bubblewrap process keeping a set of namespaces alive (it runs `cat`)."""

    proc: subprocess.Popen[bytes]
    info_fd: int
    lifeline: int = -1
    """Write end of the pipe the holder's program reads: when this process dies, for
    whatever reason, the kernel closes it, the program sees EOF and exits, and bubblewrap
    takes the namespace down with it."""
    init_pid: int | None = None
    """bubblewrap's init inside (killing it ends every process in the namespace)."""
    target: int | None = None
    """Its program: nsenter targets it (root and working directory are the sandbox's)."""

    def ready(self) -> int:
        """The pid to nsenter, once bubblewrap has made the namespaces."""
        if self.target is None:
            init = _read_info(self.info_fd)
            os.close(self.info_fd)
            self.info_fd = -1
            target = _first_child(init) if init is not None else None
            if init is None or target is None:
                error = b""
                with contextlib.suppress(Exception):
                    self.proc.kill()
                    error = self.proc.communicate(timeout=5)[1] or b""
                raise OSError(f"bubblewrap could not make the sandbox: {error.decode()[:300]}")
            self.init_pid, self.target = init, target
        return self.target

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill bubblewrap's init: the kernel ends every process in the namespace, and
        the outer bubblewrap, which waits for that init, reaps it and exits (`end`).
        The outer one is killed at once only when the init is unknown."""
        if self.lifeline >= 0:
            os.close(self.lifeline)
            self.lifeline = -1
        if self.info_fd >= 0:
            if self.init_pid is None:
                # Never used (the verifier did not run): learn its init first. Killing
                # only the outer bubblewrap can race its child's --die-with-parent set-up
                # and leave the namespace's init running, orphaned.
                self.init_pid = _read_info(self.info_fd)
            os.close(self.info_fd)
            self.info_fd = -1
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        else:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def end(self) -> None:
        """Kill, then reap the holder. The outer bubblewrap is given a moment to reap the
        namespace's init itself: killed first, it would leave that init to us (this
        process is a subreaper), a zombie the supervisor then looks through every
        process of the machine to account for."""
        self.kill()
        try:
            self.proc.wait(timeout=OUTER_EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


def _read_info(fd: int) -> int | None:
    """The host pid of the sandbox's init, from bubblewrap's info fd."""
    deadline = time.monotonic() + HOLDER_START_TIMEOUT
    data = b""
    while b"}" not in data and time.monotonic() < deadline:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        pid = strict_json.loads(data[: data.index(b"}") + 1])["child-pid"]
    except (ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) else None


def _first_child(pid: int) -> int | None:
    deadline = time.monotonic() + HOLDER_START_TIMEOUT
    path = f"/proc/{pid}/task/{pid}/children"
    while time.monotonic() < deadline:
        try:
            with open(path) as handle:
                children = handle.read().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.0005)
    return None


class Namespaces(_Supervised):
    """The attempt in its own namespaces, made with bubblewrap (see the module docstring).

    Two holders: the subject's (all namespaces new), and the verifier's, which joins the
    subject's network namespace and has its own PID, mount, IPC and UTS namespaces. The
    verifier's is started right after the subject's and made while the subject runs.
    """

    isolation = Isolation.NAMESPACES

    def __init__(
        self,
        supervisor: ProcessSupervisor,
        attempt_id: str,
        layout: Layout,
        network: Network | None = None,
    ) -> None:
        super().__init__(supervisor, attempt_id, layout)
        self.network = network
        """The executor's policed namespace to join; None: a new one, loopback only."""
        self._subject: _Holder | None = None
        self._verifier: _Holder | None = None
        self._programs: list[subprocess.Popen[bytes]] = []

    # -- what each phase sees -------------------------------------------------------
    def _common(self) -> list[str]:
        lay = self.layout
        args = [*_root_binds(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
        if os.path.isdir("/logs"):
            # This machine's own /logs is not the task's, and read-only it would leave
            # no room for /logs/agent and /logs/verifier.
            args += ["--tmpfs", "/logs"]
        # /tmp is the attempt's own, in memory and capped: filling it hurts no one else.
        args += ["--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
        mounts = [(hidden, ["--tmpfs", hidden]) for hidden in _existing(lay.hidden)]
        mounts += [(p, ["--ro-bind", p, p]) for p in lay.visible if os.path.exists(p)]
        # Outer folders first (hidden before visible at the same depth): a visible folder
        # that holds a hidden one -- the program's folder around the run folder or the
        # work folder -- must not show it again.
        for _, mount in sorted(mounts, key=lambda m: len(Path(m[0]).parts)):
            args += mount
        for folder in (lay.workspace, lay.home, lay.tmp):
            args += ["--bind", folder, folder]
        if self.network is not None:
            # The policed namespace has no reachable resolver: the proxy's name is pinned.
            args += ["--ro-bind", self.network.hosts_file, _etc_target("/etc/hosts")]
            args += ["--ro-bind", self.network.resolv_file, _etc_target("/etc/resolv.conf")]
        return args

    def _subject_view(self) -> list[str]:
        lay = self.layout
        args = self._common()
        if lay.frame_dir is not None:
            args += ["--bind", lay.frame_dir, lay.frame_dir]
        args += ["--ro-bind", lay.instruction, lay.instruction]
        args += ["--bind", lay.agent_logs, Layout.AGENT_LOGS_PATH]
        for host, inside in lay.subject_dirs.items():
            args += ["--ro-bind", host, host, "--ro-bind", host, inside]
        return args + self._ca_cert()

    def _ca_cert(self) -> list[str]:
        """The proxy's CA certificate (public), read-only, where both phases find it."""
        if self.network is None or self.network.ca_cert is None:
            return []
        return ["--ro-bind", self.network.ca_cert, self.network.ca_cert]

    def _verifier_view(self) -> list[str]:
        lay = self.layout
        return [
            *self._common(),
            *("--bind", lay.tests, lay.tests, "--bind", lay.tests, Layout.TESTS_PATH),
            *("--bind", lay.verifier_logs, lay.verifier_logs),
            *("--bind", lay.verifier_logs, Layout.VERIFIER_LOGS_PATH),
            *self._ca_cert(),
        ]

    def path_of(self, phase: Phase, host_path: str) -> str:
        return host_path  # every folder is also seen at its host path

    # -- the holders ----------------------------------------------------------------
    def _holder(self, prefix: list[str], unshare: list[str], view: list[str]) -> _Holder:
        read, write = os.pipe()
        # The holder's program is `cat` on a pipe only this process writes to: if the
        # executor dies (even by SIGKILL), cat sees EOF and the whole sandbox ends.
        life_read, life_write = os.pipe()
        try:
            proc = subprocess.Popen(
                [
                    *prefix,
                    "bwrap",
                    *unshare,
                    "--die-with-parent",
                    *view,
                    *("--chdir", self.layout.workspace),
                    *("--info-fd", str(write)),
                    "--",
                    "cat",
                ],
                stdin=life_read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(write,),
                start_new_session=True,
            )
        except OSError:
            os.close(read)
            os.close(life_write)
            raise
        finally:
            os.close(write)
            os.close(life_read)
        return _Holder(proc, read, life_write)

    def start(self) -> None:
        # Created empty now: only the verifier's namespace ever sees them.
        Path(self.layout.tests).mkdir(parents=True, exist_ok=True)
        Path(self.layout.verifier_logs).mkdir(parents=True, exist_ok=True)
        own = ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        if self.network is None:
            self._subject = self._holder([], [*own, "--unshare-net"], self._subject_view())
        else:
            # The executor's namespace, with its policy already loaded.
            join = ["nsenter", f"--net={self.network.namespace}", "--"]
            self._subject = self._holder(join, own, self._subject_view())
        self._verifier = self._verifier_holder(self._subject.ready())

    def _verifier_holder(self, target: int) -> _Holder:
        """A verifier's holder, in the network namespace of the holder `target`."""
        return self._holder(
            ["nsenter", "--target", str(target), "--net", "--"],
            ["--unshare-pid", "--unshare-ipc", "--unshare-uts"],
            self._verifier_view(),
        )

    def next_step(self) -> None:
        subject, verifier = self._subject, self._verifier
        if subject is None or not subject.alive():
            # Cut off by its timeout: new namespaces, in the same network namespace (the
            # verifier's holder kept it), over the same workspace.
            if verifier is None or not verifier.alive():
                raise OSError("the sandbox's namespaces are gone; the next step cannot run")
            own = ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
            join = ["nsenter", "--target", str(verifier.ready()), "--net", "--"]
            self._subject = subject = self._holder(join, own, self._subject_view())
        # Ready first: it has joined the network namespace before the verifier that
        # kept it goes.
        target = subject.ready()
        if verifier is not None:
            verifier.end()  # with whatever the last verifier left running
        Path(self.layout.tests).mkdir(parents=True, exist_ok=True)
        Path(self.layout.verifier_logs).mkdir(parents=True, exist_ok=True)
        self._verifier = self._verifier_holder(target)

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
        # and no process in the sandbox can reach the one reporting it. Root and working
        # directory (the workspace) are the holder's.
        # (The verifier's holder lives in the subject's network namespace.)
        namespaces = ("--pid", "--mount", "--ipc", "--uts", "--net")
        command = ["nsenter", "--target", str(target), *namespaces, "-r", "-w", "--"]
        if phase is Phase.SUBJECT:
            keep = "".join(f",+{cap}" for cap in SUBJECT_CAPS)
            command += ["setpriv", "--inh-caps=-all", "--ambient-caps=-all"]
            command += [f"--bounding-set=-all{keep}", "--"]
        command += argv
        proc = self.supervisor.spawn(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
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
        holders = [h for h in (self._subject, self._verifier) if h is not None]
        for holder in holders:  # both die at once, then both are reaped
            holder.kill()
        for holder in holders:
            holder.end()
        self.supervisor.end_attempt(self.attempt_id)


def _etc_target(path: str) -> str:
    """Where to mount over a file of /etc: its target when it is a link (e.g. into /run,
    which the sandbox makes anew)."""
    return os.path.realpath(path) if os.path.islink(path) else path


def make_sandbox(
    isolation: Isolation,
    supervisor: ProcessSupervisor,
    attempt_id: str,
    layout: Layout,
    network: Network | None = None,
) -> PlainProcesses | Namespaces:
    """The process backend the plan asks for. Plain processes cannot join `network`:
    they run in this machine's namespace, and the relay's gate refuses to start them."""
    if isolation is Isolation.NAMESPACES:
        return Namespaces(supervisor, attempt_id, layout, network)
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
