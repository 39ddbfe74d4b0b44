"""The verifier's toolbox: static programs of this machine, shown read-only in every container.

The subject is root in its container and may replace any program of the image. What runs
after it with more power than it has -- the verifier's wrapper (which checks the tests,
makes the verifier's private folders, packs its rewards), the shell test.sh runs in, the
program that drops privileges -- must not be the subject's. So they come from this
machine, built once into a cache folder and bind-mounted read-only at `/.maka-tools` in
every container: a mount point right under `/` cannot be renamed, removed, written,
remounted or unmounted by a subject without CAP_SYS_ADMIN, and the verifier's holder
(its private mount namespace) keeps it.

Static programs only: a dynamically linked one would start through the container's
loader, libraries and /etc/ld.so.preload. The toolbox holds:

- `bin/busybox` (Debian busybox-static): sh and the tools of the sandbox's scripts
  (applets are preferred over PATH, so a script never runs the container's `tar`);
- `bin/bash` (Debian bash-static): the shell test.sh runs in when it is a bash script;
- `bin/maka-setpriv` (`setpriv.c` beside this file, compiled with `cc -static`):
  capabilities, users and chroot (busybox's setpriv cannot set users or the bounding set);
- `private/`: empty; the verifier's own HOME and TMPDIR are a tmpfs mounted on it in the
  holder's namespace only.

The cache folder is `$MAKA_EVAL_CACHE/toolbox/<key>` (default `~/.cache/maka-eval`), the
key a digest of what goes in: a new busybox, bash or setpriv.c makes a new folder. Each
program is checked to be a static ELF program for this machine before it is used.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

MOUNT = "/.maka-tools"
"""Where containers see the toolbox (read-only)."""
BIN = f"{MOUNT}/bin"
BUSYBOX = f"{BIN}/busybox"
BASH = f"{BIN}/bash"
SETPRIV = f"{BIN}/maka-setpriv"
PRIVATE = f"{MOUNT}/private"
"""The verifier's tmpfs (HOME, TMPDIR, Python's compiled files), in the holder only."""

BUSYBOX_SOURCES = ("/bin/busybox", "/usr/bin/busybox")
BASH_SOURCES = ("/bin/bash-static", "/usr/bin/bash-static")
SETPRIV_SOURCE = Path(__file__).with_name("setpriv.c")
PACKAGES = "busybox-static bash-static gcc libc6-dev"
"""The Debian packages the toolbox is made from (`apt-get install` them)."""
APPLETS = frozenset(
    {
        *("sh", "awk", "base64", "cat", "chmod", "chown", "cp", "cut", "find", "head", "kill"),
        *("ls", "mkdir", "mount", "readlink", "rm", "sed", "sha256sum", "sleep", "stat"),
        *("tar", "tr", "unshare"),
    }
)
"""The busybox applets the sandbox's scripts use."""

_ELF_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}
_PT_INTERP = 3
_lock = threading.Lock()
_ready: dict[str, Path] = {}


class ToolboxError(RuntimeError):
    """The toolbox cannot be made on this machine (the message says what to install)."""


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """Where built things are kept (as hack/podman.sh keeps its images)."""
    env = os.environ if env is None else env
    configured = env.get("MAKA_EVAL_CACHE")
    if configured:
        return Path(configured)
    return Path(env.get("HOME") or "/root") / ".cache" / "maka-eval"


def static_problem(path: Path) -> str | None:
    """Why `path` is not a static ELF program for this machine (None: it is one)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return f"{path} is not a 64-bit little-endian ELF program"
            kind, machine = struct.unpack_from("<HH", head, 16)
            wanted = _ELF_MACHINES.get(platform.machine().lower())
            if kind not in (2, 3) or (wanted is not None and machine != wanted):
                return f"{path} is not a program for this machine ({platform.machine()})"
            (phoff,) = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            handle.seek(phoff)
            table = handle.read(phentsize * phnum)
    except OSError as exc:
        return f"{path} cannot be read: {exc.strerror or exc}"
    for i in range(phnum):
        if len(table) < (i + 1) * phentsize:
            return f"{path} is cut short"
        (kind,) = struct.unpack_from("<I", table, i * phentsize)
        if kind == _PT_INTERP:
            return f"{path} is linked dynamically (it would start through the container's loader)"
    return None


def _first(candidates: tuple[str, ...], package: str) -> Path:
    for candidate in candidates:
        path = Path(candidate)
        if path.is_file() and static_problem(path) is None:
            return path
    found = next((c for c in candidates if Path(c).is_file()), None)
    why = static_problem(Path(found)) if found else f"none of {', '.join(candidates)} exists"
    raise ToolboxError(f"{why}; install Debian's {package} (apt-get install {PACKAGES})")


def _compiler() -> tuple[str, str]:
    for name in ("cc", "gcc"):
        found = shutil.which(name)
        if found:
            try:
                out = subprocess.run(
                    [found, "--version"], capture_output=True, text=True, timeout=30
                ).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            return found, out.splitlines()[0] if out else name
    raise ToolboxError(f"no C compiler (cc) to build maka-setpriv; apt-get install {PACKAGES}")


def _digest(*parts: bytes) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(hashlib.sha256(part).digest())
    return sha.hexdigest()[:16]


def _check(folder: Path) -> str | None:
    """Why a toolbox folder cannot be used (None: it can)."""
    for name in ("busybox", "bash", "maka-setpriv"):
        why = static_problem(folder / "bin" / name)
        if why is not None:
            return why
    if not (folder / "private").is_dir():
        return f"{folder}/private is missing"
    return None


def _build(target: Path, busybox: Path, bash: Path, compiler: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        (work / "bin").mkdir()
        (work / "private").mkdir()
        shutil.copyfile(busybox, work / "bin" / "busybox")
        shutil.copyfile(bash, work / "bin" / "bash")
        built = subprocess.run(
            [compiler, "-static", "-O2", "-s", "-o", str(work / "bin" / "maka-setpriv"),
             str(SETPRIV_SOURCE)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if built.returncode != 0:
            raise ToolboxError(
                f"{compiler} -static could not build maka-setpriv: "
                f"{built.stderr.strip()[-500:]}; apt-get install {PACKAGES}"
            )
        for path in (work, work / "bin", work / "private", *(work / "bin").iterdir()):
            path.chmod(0o755)
        applets = subprocess.run(
            [str(work / "bin" / "busybox"), "--list"], capture_output=True, text=True, timeout=30
        ).stdout.split()
        missing = sorted(APPLETS - set(applets))
        if missing:
            raise ToolboxError(f"{busybox} lacks the applets {', '.join(missing)}")
        why = _check(work)
        if why is not None:
            raise ToolboxError(why)
        try:
            work.rename(target)
        except OSError:
            if _check(target) is not None:  # not another builder's finished folder
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def toolbox(env: Mapping[str, str] | None = None) -> Path:
    """The toolbox folder for this machine, built on first use (ToolboxError: it cannot
    be; the message names the Debian packages to install)."""
    root = cache_root(env) / "toolbox"
    with _lock:
        known = _ready.get(str(root))
        if known is not None:
            return known
        busybox = _first(BUSYBOX_SOURCES, "busybox-static")
        bash = _first(BASH_SOURCES, "bash-static")
        compiler, version = _compiler()
        key = _digest(
            busybox.read_bytes(), bash.read_bytes(), SETPRIV_SOURCE.read_bytes(), version.encode()
        )
        target = root / key
        if _check(target) is not None:
            if target.exists():
                shutil.rmtree(target)  # a broken folder (a build that died): again
            _build(target, busybox, bash, compiler)
        _ready[str(root)] = target
        return target


def toolbox_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why the toolbox cannot be made here (None: it is ready)."""
    try:
        toolbox(env)
    except (ToolboxError, OSError) as exc:
        return str(exc)
    return None


__all__ = [
    "BASH",
    "BIN",
    "BUSYBOX",
    "MOUNT",
    "PACKAGES",
    "PRIVATE",
    "SETPRIV",
    "ToolboxError",
    "cache_root",
    "static_problem",
    "toolbox",
    "toolbox_problem",
]
