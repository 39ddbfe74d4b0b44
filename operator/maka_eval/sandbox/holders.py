"""The namespaces of the process sandbox: bubblewrap holders, what they show, and a
pool of them made ahead of their attempts.

A holder is a bubblewrap process that keeps a set of namespaces alive while its program
(`cat` on a pipe) waits; programs are entered into them with nsenter. What a holder
shows is fixed when it is made: the machine's files read-only, fresh /proc, /dev, /run,
/tmp, and the attempt's folders at fixed places (`WORKSPACE_PATH`, `HOME_PATH`, ...),
the same in every attempt.

Making a pair of holders (the subject's and the verifier's) costs about as much as the
whole rest of an attempt's overhead. `NamespacePool` makes them while other attempts run,
over a *slot*: empty mount points under a shared mount (sandbox.mounts). When an attempt
takes a pair, its folders are bound onto the slot's mount points on the host, and mount
propagation shows them inside the pair's namespaces, and nowhere else. The pair is used
by one attempt only and dies with it; only the slot is reused, once unmounted.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from maka_eval import strict_json
from maka_eval.layout import (
    FRAME_PATH,
    HOME_PATH,
    HOST_ETC_VIEWS_DIR,
    INSTRUCTION_PATH,
    TMP_PATH,
    WORKSPACE_PATH,
)
from maka_eval.processes.supervisor import ProcessSupervisor
from maka_eval.sandbox.base import Layout, Network
from maka_eval.sandbox.mounts import SlotTree

SYSTEM_FOLDERS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
"""The machine's top-level folders a sandbox shows (read-only): its runtime, nothing
else. Not /home, /root, /srv, /opt, /var, /mnt, /sys or any folder that may hold a
benchmark's repository, a run folder, or a user's files."""
_FRESH = frozenset({"proc", "dev", "tmp", "run", "lost+found", "attempt", "logs"})
"""In a task image's view (a Pod): top-level folders made anew instead of shown (/attempt
holds the attempt's folders; not /maka, which is the relay's own in a Pod)."""
CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
"""The whole environment of a holder (bubblewrap and its init, PID 1 of the sandbox):
nothing of the executor's, whose environment holds every subject's credentials."""
HOLDER_START_TIMEOUT = 10.0
OUTER_EXIT_TIMEOUT = 2.0
"""How long the outer bubblewrap may take to reap its killed init and exit."""
TMP_BYTES = 1 << 30
"""Size of a sandbox's own /tmp (memory-backed); TMPDIR points at the attempt's folder."""
POOL_MOST = 8
"""The most pairs a pool keeps ready per view."""
VERIFIER_HOME = "/tmp/home"
"""The verifier's HOME, in its own /tmp (a tmpfs of its mount namespace alone): nothing
the subject wrote is on its way (no ~/.local site-packages, no dotfiles)."""
VERIFIER_TMP = "/tmp"
"""The verifier's TMPDIR: its own /tmp."""


@dataclass(frozen=True)
class View:
    """What a run's sandboxes show besides the attempt's folders (the same for every
    attempt with the same subject): a pool keeps pairs ready per view."""

    hidden: tuple[str, ...]
    """Host folders no sandbox may see (the run folder, every workspace, the tasks)."""
    visible: tuple[str, ...]
    """Host paths under a hidden folder the subject still needs (its own program)."""
    frame: bool
    """Whether the subject gets a result-frame folder (protocol v1)."""
    subject_dirs: tuple[str, ...]
    """Where the subject's extra folders are seen (the oracle's /solution)."""
    image: bool = False
    """Whether the machine is the task's own image (the relay in a Pod): then every
    folder of it is shown but the hidden ones; else (this machine) only its runtime
    folders, SYSTEM_FOLDERS."""


@dataclass(frozen=True)
class Sources:
    """The host folders a sandbox shows at its fixed places: an attempt's own, or a
    slot's mount points."""

    workspace: str
    home: str
    tmp: str
    frame: str | None
    instruction: str
    agent_logs: str
    tests: str
    verifier_logs: str
    subject_dirs: tuple[tuple[str, str], ...]
    """(where it is seen, host folder) for each of the subject's extra folders."""

    @classmethod
    def of(cls, lay: Layout) -> Sources:
        return cls(
            workspace=lay.workspace,
            home=lay.home,
            tmp=lay.tmp,
            frame=lay.frame_dir,
            instruction=lay.instruction,
            agent_logs=lay.agent_logs,
            tests=lay.tests,
            verifier_logs=lay.verifier_logs,
            subject_dirs=tuple(sorted((inside, host) for host, inside in lay.subject_dirs.items())),
        )

    @classmethod
    def slot(cls, folder: str, view: View) -> Sources:
        """A slot's mount points for `view`, made (empty) if missing."""
        dirs = {"workspace", "home", "tmp", "agent", "tests", "verifier"}
        if view.frame:
            dirs.add("frame")
        extra = tuple((inside, f"{folder}/extra{n}") for n, inside in enumerate(view.subject_dirs))
        for name in dirs:
            os.makedirs(f"{folder}/{name}", 0o700, exist_ok=True)
        for _, point in extra:
            os.makedirs(point, 0o700, exist_ok=True)
        Path(folder, "instruction.md").touch()
        return cls(
            workspace=f"{folder}/workspace",
            home=f"{folder}/home",
            tmp=f"{folder}/tmp",
            frame=f"{folder}/frame" if view.frame else None,
            instruction=f"{folder}/instruction.md",
            agent_logs=f"{folder}/agent",
            tests=f"{folder}/tests",
            verifier_logs=f"{folder}/verifier",
            subject_dirs=extra,
        )

    def pairs(self) -> list[tuple[str, str, bool]]:
        """(host source, where it is seen, read-only) for everything shown."""
        shown = [
            (self.workspace, WORKSPACE_PATH, False),
            (self.home, HOME_PATH, False),
            (self.tmp, TMP_PATH, False),
            (self.instruction, INSTRUCTION_PATH, True),
            (self.agent_logs, Layout.AGENT_LOGS_PATH, False),
            (self.tests, Layout.TESTS_PATH, False),
            (self.verifier_logs, Layout.VERIFIER_LOGS_PATH, False),
            *((host, inside, True) for inside, host in self.subject_dirs),
        ]
        if self.frame is not None:
            shown.append((self.frame, FRAME_PATH, False))
        return shown


def seen_at(lay: Layout) -> dict[str, str]:
    """Host folder (or file) of the attempt -> where a holder shows it."""
    return {host: inside for host, inside, _ in Sources.of(lay).pairs()}


def _system_binds() -> tuple[str, ...]:
    with _ETC_VIEW_LOCK:
        return _system_binds_once()


@cache
def _system_binds_once() -> tuple[str, ...]:
    """The machine's runtime folders, read-only (symlinks kept as symlinks), with an
    /etc in which nothing is that others may not read (`etc_view`)."""
    args: list[str] = []
    for name in SYSTEM_FOLDERS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif name == "etc":
            view = _etc_view(ETC_VIEWS)
            if view is not None:
                args += ["--ro-bind", view, path]
            else:  # masked in place: slower (a mount per entry), the same view
                args += ["--ro-bind", path, path]
                for hidden, is_dir in unreadable_files(path):
                    if is_dir:
                        args += ["--tmpfs", hidden, "--remount-ro", hidden]
                    else:
                        args += ["--ro-bind", "/dev/null", hidden]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


ETC_VIEWS = HOST_ETC_VIEWS_DIR
"""Where each process keeps its copy of /etc for the sandboxes (`etc_view`); /run is
never shown to a sandbox."""


_ETC_VIEW_LOCK = threading.Lock()


def etc_view(views: str = ETC_VIEWS) -> str | None:
    """The sandboxes' /etc (`_etc_view`), made once however many attempts ask at once."""
    with _ETC_VIEW_LOCK:
        return _etc_view(views)


@cache
def _etc_view(views: str) -> str | None:
    """A copy of /etc without what others may not read (shadow files, private keys,
    sudoers, keytabs: the machine's credentials, which a root subject could otherwise
    read), made once per process and shown as the sandbox's /etc in one mount (masking
    each such entry in place would cost a mount each, in every sandbox, and name them in
    its mount table). A snapshot: /etc as it was when the first sandbox was made. None
    when it cannot be made (the sandboxes then mask in place)."""
    try:
        os.makedirs(views, mode=0o700, exist_ok=True)
        _sweep_views(views)
        target = os.path.join(views, f"{os.getpid()}.{time.monotonic_ns()}")
        _copy_readable("/etc", target)
    except OSError:
        return None
    atexit.register(shutil.rmtree, target, True)
    return target


def _sweep_views(views: str) -> None:
    """Remove the copies of processes that are gone (even killed with SIGKILL)."""
    for name in os.listdir(views):
        pid = name.split(".", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(views, name), ignore_errors=True)


def _copy_readable(source: str, target: str) -> None:
    """Copy what others may read of `source` (regular files, folders, links kept as
    links; modes and owners kept) into the new folder `target`."""
    info = os.lstat(source)
    os.mkdir(target, 0o700)
    for entry in os.scandir(source):
        path, copy = entry.path, os.path.join(target, entry.name)
        try:
            mode = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(path), copy)
            continue
        if not mode.st_mode & stat.S_IROTH:
            continue  # the machine's credentials: not in the sandbox's /etc at all
        if entry.is_dir(follow_symlinks=False):
            _copy_readable(path, copy)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(path, copy, follow_symlinks=False)
            os.chmod(copy, stat.S_IMODE(mode.st_mode))
            os.chown(copy, mode.st_uid, mode.st_gid, follow_symlinks=False)
    os.chmod(target, stat.S_IMODE(info.st_mode))
    os.chown(target, info.st_uid, info.st_gid)


def runtime_path(path: str | None) -> str:
    """`path` (a PATH) without the folders a sandbox on this machine does not show (a
    user's ~/.local/bin, pyenv's shims in /root, /opt/...): what a program is looked for
    in, by the executor and inside the sandbox alike."""
    kept = [
        entry
        for entry in (path or "").split(":")
        if entry.startswith("/") and any(_inside(entry, f"/{n}") for n in SYSTEM_FOLDERS)
    ]
    return ":".join(dict.fromkeys(kept)) or CLEAN_ENV["PATH"]


@cache
def _image_binds() -> tuple[str, ...]:
    """A task image's top-level folders, read-only (symlinks kept as symlinks)."""
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


def unreadable_files(root: str) -> list[tuple[str, bool]]:
    """(path, is a folder) of what under `root` others may not read: shadow files,
    private keys, sudoers, keytabs -- the machine's credentials, which a root subject
    could otherwise read. A masked folder's content is not listed again."""
    found: list[tuple[str, bool]] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs):
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if not os.lstat(path).st_mode & stat.S_IROTH:
                    found.append((path, True))
        dirs[:] = [d for d in dirs if (os.path.join(folder, d), True) not in found]
        for name in sorted(files):
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if stat.S_ISREG(mode) and not mode & stat.S_IROTH:
                    found.append((path, False))
    return found


def _etc_target(path: str) -> str:
    """Where to mount over a file of /etc: its target when it is a link (e.g. into /run,
    which the sandbox makes anew)."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _common(view: View, src: Sources, network: Network | None) -> list[str]:
    if view.image:
        # The relay in a task image (a Pod): the image is the task's machine, shown
        # whole but for the relay's own hidden folders.
        args = [*_image_binds(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
    else:
        # This machine: an allowlist, its runtime and fresh /proc, /dev, /run, /var;
        # everything else of it is simply not there (nothing is mounted over it, so the
        # mount table names nothing the host hides).
        args = [*_system_binds(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
        args += ["--tmpfs", "/var", "--perms", "1777", "--dir", "/var/tmp"]
    # /tmp is the attempt's own, in memory and capped: filling it hurts no one else.
    args += ["--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
    # The subject's own program, read-only at its host path (on this machine the plan
    # shows its folder only when that holds nothing hidden: local.plans.program_view);
    # a hidden folder inside what is shown is masked.
    mounts = [(p, ["--ro-bind", p, p]) for p in view.visible if os.path.exists(p)]
    masks = [
        hidden
        for hidden in view.hidden
        if os.path.isdir(hidden) and (view.image or any(_inside(hidden, p) for p in view.visible))
    ]
    mounts += [(hidden, ["--tmpfs", hidden]) for hidden in masks]
    # Outer folders first (hidden before visible at the same depth): a visible folder
    # that holds a hidden one must not show it again.
    for _, mount in sorted(mounts, key=lambda m: (len(Path(m[0]).parts), "--ro-bind" in m[1])):
        args += mount
    # The masks read-only last: a visible folder inside one (the program in the hidden
    # benchmark folder, in a Pod) needed its mount point made there first.
    for hidden in masks:
        args += ["--remount-ro", hidden]
    args += ["--bind", src.workspace, WORKSPACE_PATH]
    args += ["--bind", src.home, HOME_PATH, "--bind", src.tmp, TMP_PATH]
    if network is not None:
        # The policed namespace has no reachable resolver: the proxy's name is pinned.
        args += ["--ro-bind", network.hosts_file, _etc_target("/etc/hosts")]
        args += ["--ro-bind", network.resolv_file, _etc_target("/etc/resolv.conf")]
        if network.ca_cert is not None:  # public: both phases find it where it is
            args += ["--ro-bind", network.ca_cert, network.ca_cert]
    return args


def subject_args(view: View, src: Sources, network: Network | None) -> list[str]:
    """What the subject's holder shows: never the tests or the verifier's logs."""
    args = _common(view, src, network)
    if src.frame is not None:
        args += ["--bind", src.frame, FRAME_PATH]
    args += ["--ro-bind", src.instruction, INSTRUCTION_PATH]
    args += ["--bind", src.agent_logs, Layout.AGENT_LOGS_PATH]
    for inside, host in src.subject_dirs:
        args += ["--ro-bind", host, inside]
    return args


def verifier_args(view: View, src: Sources, network: Network | None) -> list[str]:
    """What the verifier's holder shows: the tests and its own logs besides the rest,
    and its own HOME in its own /tmp."""
    return [
        *_common(view, src, network),
        *("--perms", "0700", "--dir", VERIFIER_HOME),
        *("--bind", src.tests, Layout.TESTS_PATH),
        *("--bind", src.verifier_logs, Layout.VERIFIER_LOGS_PATH),
    ]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


OWN_NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts")


@dataclass
class Holder:
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
    """Its program: nsenter targets it (its root is the sandbox's)."""
    supervisor: ProcessSupervisor | None = None
    """Told of the holder while it lives (it is no orphan of an attempt)."""

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
        _await_exit(self.proc, OUTER_EXIT_TIMEOUT)
        try:
            self.proc.wait(timeout=OUTER_EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if self.supervisor is not None and self.proc.returncode is not None:
            self.supervisor.forget(self.proc.pid)


def _await_exit(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Return as soon as `proc` exits (or after `timeout`): Popen.wait with a timeout
    polls at growing intervals (1, 2, 4 ms...), which would add milliseconds to each
    attempt's end."""
    if proc.returncode is not None:
        return
    try:
        fd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        return  # reaped already, or no pidfd here: Popen.wait polls
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


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


def make_holder(
    prefix: Sequence[str],
    unshare: Sequence[str],
    shown: Sequence[str],
    supervisor: ProcessSupervisor | None = None,
) -> Holder:
    """Start a holder (`prefix` runs bubblewrap: nsenter into a network namespace)."""
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
                *shown,
                # Not the workspace: mounted later over a slot's empty folder, whose
                # covered content must be nobody's working directory.
                *("--chdir", "/"),
                *("--info-fd", str(write)),
                "--",
                "cat",
            ],
            stdin=life_read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(write,),
            start_new_session=True,
            env=CLEAN_ENV,
        )
    except OSError:
        os.close(read)
        os.close(life_write)
        raise
    finally:
        os.close(write)
        os.close(life_read)
    if supervisor is not None:
        supervisor.manage(proc.pid)
    return Holder(proc, read, life_write, supervisor=supervisor)


def verifier_holder(
    target: int,
    view: View,
    src: Sources,
    network: Network | None,
    supervisor: ProcessSupervisor | None = None,
) -> Holder:
    """A verifier's holder, in the network namespace of the holder `target`."""
    return make_holder(
        ["nsenter", "--target", str(target), "--net", "--"],
        OWN_NAMESPACES,
        verifier_args(view, src, network),
        supervisor,
    )


def end_together(*holders: Holder | None) -> None:
    """End holders at once (all killed, then all reaped): their teardowns overlap."""
    alive = [h for h in holders if h is not None]
    for holder in alive:
        holder.kill()
    for holder in alive:
        holder.end()


@dataclass
class Pair:
    """A subject's and a verifier's holders, made over `slot` (its mount points)."""

    subject: Holder
    verifier: Holder
    slot: str
    points: Sources

    def ready(self) -> bool:
        return self.subject.alive() and self.verifier.alive()

    def end(self) -> None:
        end_together(self.subject, self.verifier)


class NamespacePool:
    """Pairs of holders made ahead of their attempts, by one thread, per view asked for.

    `take` hands a ready pair to an attempt (None when there is none: the attempt makes
    its own, as without a pool), `give_back` unmounts a used slot for the next pair.
    Nothing is made for a view before an attempt asks for it, and at most `size` pairs
    are kept per view: about as many as attempts can start at once.
    """

    def __init__(self, size: int, supervisor: ProcessSupervisor | None = None) -> None:
        self.size = max(1, min(size, POOL_MOST))
        self.supervisor = supervisor
        self._cond = threading.Condition()
        self._ready: dict[View, list[Pair]] = {}
        self._free: list[str] = []
        self._used: list[str] = []
        """Slots whose pair is gone, with the attempt's folders still mounted."""
        self._closed = False
        self._tree: SlotTree | None = None
        self.broken: str | None = None
        """Why the pool stopped making pairs (the attempts then make their own)."""
        self._thread: threading.Thread | None = None

    def take(self, view: View) -> Pair | None:
        """A ready pair for `view`, or None; either way one is made for the next."""
        with self._cond:
            if self._closed or self.broken is not None:
                return None
            pairs = self._ready.setdefault(view, [])
            pair = pairs.pop() if pairs else None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._make, name="maka-eval-namespace-pool", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        if pair is not None and not pair.ready():
            pair.end()
            self.give_back(pair.slot)
            return None
        return pair

    def attach(self, pair: Pair, lay: Layout) -> None:
        """Show the attempt's folders in `pair` (bound onto its slot's mount points)."""
        tree = self._tree
        assert tree is not None
        sources = Sources.of(lay)
        for (host, _, read_only), (point, _, _) in zip(
            sources.pairs(), pair.points.pairs(), strict=True
        ):
            tree.attach(host, point, read_only=read_only)

    def give_back(self, slot: str) -> None:
        """The slot's pair is gone (its processes dead): what an attempt bound there is
        unmounted by the pool's thread, off the attempt's path, before the slot's reuse."""
        with self._cond:
            if not self._closed:
                self._used.append(slot)
                self._cond.notify_all()
                return
        self._clear([slot])  # no thread to do it any more

    def _clear(self, slots: list[str]) -> None:
        for slot in slots:
            try:
                SlotTree.clear(slot)
            except OSError:
                continue  # left out: the pool's close takes it down with the rest
            with self._cond:
                self._free.append(slot)

    def _wanted(self) -> View | None:
        for view, pairs in self._ready.items():
            if len(pairs) < self.size:
                return view
        return None

    def _make(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._used) and (view := self._wanted()) is None:
                    self._cond.wait()
                if self._closed:
                    return
                used, self._used = self._used, []
            if used:
                self._clear(used)
                continue
            with self._cond:
                view = self._wanted()
                if view is None:
                    continue
                slot = self._free.pop() if self._free else None
            try:
                if self._tree is None:
                    self._tree = SlotTree()
                if slot is None:
                    slot = self._tree.new_slot()
                pair = self._pair(view, slot)
            except OSError as exc:
                with self._cond:
                    self.broken = str(exc)
                return
            with self._cond:
                if self._closed:
                    pair.end()
                    return
                self._ready.setdefault(view, []).append(pair)

    def _pair(self, view: View, slot: str) -> Pair:
        points = Sources.slot(slot, view)
        unshare = [*OWN_NAMESPACES, "--unshare-net"]
        subject = make_holder([], unshare, subject_args(view, points, None), self.supervisor)
        try:
            verifier = verifier_holder(subject.ready(), view, points, None, self.supervisor)
            verifier.ready()
        except OSError:
            subject.end()
            raise
        return Pair(subject, verifier, slot, points)

    def close(self) -> None:
        """End every ready pair and take the slots down (the run is over)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=HOLDER_START_TIMEOUT * 2)
        with self._cond:
            pairs = [p for ps in self._ready.values() for p in ps]
            self._ready.clear()
        for pair in pairs:
            pair.end()
        if self._tree is not None:
            self._tree.close()


__all__ = [
    "HOME_PATH",
    "TMP_PATH",
    "WORKSPACE_PATH",
    "Holder",
    "NamespacePool",
    "Pair",
    "Sources",
    "View",
    "end_together",
    "make_holder",
    "seen_at",
    "subject_args",
    "verifier_args",
    "verifier_holder",
]
