"""The container backend: the attempt runs in the task's image, through a Docker Engine API.

Harbor's way, on Docker or on Podman's compatible socket:

- `start` resolves the image (task.toml's `docker_image`, pulled when missing; or built
  from environment/Dockerfile under `maka-eval-task/<task>:<environment digest>` and
  reused while that folder is unchanged), creates a container that only sleeps (PID 1;
  or, as Harbor, runs the image's ENTRYPOINT given `sh -c "sleep infinity"`), with the
  task's resources, network mode, env and workdir, and uploads what the subject
  may see: the workspace into the workdir, the instruction, `/logs/agent`.
- `upload` and `download` copy files in and out through the engine's archive API (a
  multi-step task's workdir files in, `/logs/agent` out); `next_step` readies the
  container for a multi-step task's next step.
- Programs run in it by exec. `spawn` returns a host process (`maka_eval.sandbox.exec`)
  that is the exec for the relay: its output, its exit code, killing it. `/solution`
  (the oracle) and the subject's own program (a path in the spec: /maka/bin/) are
  uploaded right before the subject; `/tests` only when the verifier is due.
- Quiescing the subject kills the helper and every process in the container but PID 1
  and what started before the verifier's holder (the entrypoint's services).
  When the subject exits on its own, what it left running stays up (a server the
  verifier queries) until `stop`. `stop` freezes every process of the container at once
  (the engine's pause: the cgroup freezer, about 12 ms here) and removes it in the
  background (about 270 ms on Podman, off the attempt's path: the next attempt starts
  meanwhile). An attempt that joins the same network namespace waits for the removal
  first (a frozen server still holds its port); the executor waits for every removal
  before it returns (`drain_removals`). Where the engine cannot pause the container, it
  is removed at once.
- With a policed network (`Network`: the cell's egress enforcement) the container joins
  the executor's network namespace (Podman's `ns:` network mode; Docker has none),
  without NET_RAW and NET_ADMIN, with the proxy's name as an extra host, a resolv.conf
  that names no server, and the proxy's CA certificate at /maka/egress/ca.pem, all
  read-only.
- The verifier runs in a private mount namespace inside the container (a privileged exec
  that drops back to the container's capabilities and the verifier's user before
  tests/test.sh runs): its `/tests` and `/logs/verifier` are its own tmpfs, so nothing the
  subject left running can change the tests or write a reward. What it wrote is handed
  out as a tar whose digest travels on the wrapper's stderr, under a marker only the
  wrapper and the helper know. Where the engine cannot make that namespace, the
  verifier runs plainly in fresh shared folders and the record says so.
- What runs in the container for the sandbox (those scripts, the verifier's bash) comes
  from the toolbox (`sandbox.toolbox`: static programs of this machine, read-only at
  /.maka-tools), never from the image the subject may have changed; the verifier has a
  HOME, a TMPDIR and Python settings of its own (VERIFIER_ENV). The engine's list of the
  container's changes against its image is read at start, before each verifier and at
  the end (`tampering`): every change outside the working folders becomes evidence, and
  one the verifier's start-up depends on (`sandbox.changes`) fails the attempt; found
  before a verifier, that verifier does not run.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import posixpath
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from maka_eval import strict_json
from maka_eval.engine.modes import Isolation, NetworkMode
from maka_eval.processes.output import OutputCapture
from maka_eval.processes.supervisor import MARKER_VARIABLE as ATTEMPT_MARKER
from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor, WaitEnd
from maka_eval.sandbox import changes, toolbox
from maka_eval.sandbox import exec as exec_helper
from maka_eval.sandbox.base import Layout, Network, Phase, mapped
from maka_eval.sandbox.ldcache import CacheError, read_cache
from maka_eval.sandbox.plans import ContainerPlan

ENGINE_SOCKETS = (
    "unix:///run/maka-eval/podman.sock",
    "unix:///var/run/docker.sock",
    "unix:///run/podman/podman.sock",
)

if TYPE_CHECKING:
    from maka_eval.sandbox.backends import SandboxRequest
"""Where an engine is looked for when DOCKER_HOST is not set (hack/podman.sh's first)."""
LABEL = "dev.maka.eval"
BUILD_REPOSITORY = "maka-eval-task"
DEFAULT_WORKDIR = "/"
"""Where programs run when neither task.toml nor the image names a workdir: the engine's
own default, as under Harbor (`docker exec` without `-w`)."""
PROGRAM_DIR = "/maka/bin"
FRAME_DIR = "/maka/frame"
INSTRUCTION_PATH = "/maka/instruction.md"
CLIENT_TIMEOUT = 120
PROBE_TIMEOUT = 3.0
STATE_TIMEOUT = 10.0
"""How long a container that refused an exec may still be called running by the engine."""
MAX_FRAME_BYTES = 1 << 20
TMP_BYTES = 1 << 30
"""Size of an attempt's /tmp (a tmpfs, as in the process sandbox)."""
MAX_VERIFIER_BYTES = 256 << 20
AGENT_REPORT_BYTES = 1 << 20
"""/logs/agent up to this size (as a tar) comes back with the verifier's reports."""
"""What is taken of /logs/verifier (the rewards, and any report test.sh wrote)."""
CA_CERT_PATH = "/maka/egress/ca.pem"
"""Where a policed container sees the egress proxy's CA certificate (read-only)."""
SUBJECT_CAP_DROP = ("NET_RAW", "NET_ADMIN")
"""Dropped from a policed container (every process in it, the subject included): with
them a process could write beneath the namespace's nftables policy or rewrite it."""
HOST_ONLY_ENV = ("PATH", "HOME", "TMPDIR")
"""The relay's values for these name host folders: in the container, the image's PATH,
the exec user's HOME and the image's TMPDIR apply, as in Harbor (the verifier's HOME and
TMPDIR are its own: VERIFIER_ENV)."""
VERIFIER_ENV = {
    "HOME": f"{toolbox.PRIVATE}/home",
    "TMPDIR": f"{toolbox.PRIVATE}/tmp",
    "PYTHONSAFEPATH": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONPYCACHEPREFIX": f"{toolbox.PRIVATE}/pycache",
}
"""Set for the verifier in a container, over what the relay passes: a HOME and a TMPDIR
of its own (the holder's tmpfs: no configuration the subject left in /root or /tmp is
read), no module from the working folder or the user's site-packages, and Python's
compiled files kept in a private folder (never those the subject could plant beside the
sources). /tmp stays shared: tests read what the subject left there."""
EVIDENCE_FILE = "container-changes.txt"
"""What the subject changed outside its working folders (evidence/ artifact)."""
MAX_CHANGES_BYTES = 32 << 20
"""The engine's list of a container's changes is read up to this size (about half a
million paths); a longer list is the subject's doing and fails the attempt."""
MAX_CONTENT_FILES = 256
"""At most this many files are read for the rules (entry points, the loader's cache)."""
MAX_CONTENT_BYTES = 16 << 20
RELAY_FOLDERS = ("/logs", "/tmp", "/maka", "/tests", "/solution", toolbox.MOUNT)
"""Folders of the relay and the engine (with the workdir: the subject's working folders),
whose changes are the attempt's own work, not evidence."""

image_builds: Counter[str] = Counter()
"""Image tag -> builds this process made (a second run of an unchanged task makes none)."""


# -- the engine ---------------------------------------------------------------------------
_diff_caveats: dict[str, str | None] = {}
"""Engine url -> what its list of a container's changes may miss (`diff_caveat`)."""


@dataclass(frozen=True)
class EngineInfo:
    """A Docker Engine API that answered."""

    url: str
    kind: str
    """'Docker' or 'Podman'."""
    version: str
    api_version: str
    gpus: bool
    """Whether the engine has an NVIDIA runtime (tasks with `gpus > 0` need one)."""

    def describe(self) -> str:
        return f"{self.kind} {self.version} (API {self.api_version}) at {self.url}"


@dataclass(frozen=True)
class EngineProbe:
    """The engine found, or what was tried."""

    engine: EngineInfo | None
    tried: tuple[str, ...]

    def why_none(self) -> str:
        return "no container engine answered (tried " + "; ".join(self.tried) + ")"


def engine_candidates(host_env: Mapping[str, str]) -> tuple[str, ...]:
    """DOCKER_HOST when set (never second-guessed, as the docker CLI does), else the
    usual sockets of Podman and Docker."""
    configured = host_env.get("DOCKER_HOST", "").strip()
    return (configured,) if configured else ENGINE_SOCKETS


def _probe(url: str) -> tuple[EngineInfo | None, str]:
    if url.startswith("unix://") and not os.path.exists(url.removeprefix("unix://")):
        return None, f"{url}: no such socket"
    if not url.startswith(("unix://", "tcp://", "http://")):
        return None, f"{url}: not a unix:// or tcp:// address"
    try:
        status, version = exec_helper.request(url, "GET", "/version", timeout=PROBE_TIMEOUT)
        if status != 200 or not isinstance(version, dict):
            return None, f"{url}: answered {status} to /version"
        _, info = exec_helper.request(url, "GET", "/info", timeout=PROBE_TIMEOUT)
    except OSError as exc:
        return None, f"{url}: {exc.strerror or exc}"
    _diff_caveats[url] = _caveat_of(info)
    components = [c.get("Name", "") for c in version.get("Components") or []]
    kind = "Podman" if any("Podman" in name for name in components) else "Docker"
    runtimes = info.get("Runtimes") if isinstance(info, dict) else None
    return (
        EngineInfo(
            url=url,
            kind=kind,
            version=str(version.get("Version", "?")),
            api_version=str(version.get("ApiVersion", "?")),
            gpus=isinstance(runtimes, dict) and "nvidia" in runtimes,
        ),
        f"{url}: {kind}",
    )


def engine_info(host_env: Mapping[str, str] | None = None) -> EngineProbe:
    """The first container engine that answers (standard library only, no SDK)."""
    env = os.environ if host_env is None else host_env
    tried = []
    for url in engine_candidates(env):
        engine, said = _probe(url)
        tried.append(said)
        if engine is not None:
            return EngineProbe(engine, tuple(tried))
    return EngineProbe(None, tuple(tried))


def build_tag(task_id: str, environment_digest: str) -> str:
    """The image an environment/ folder is built under: the same folder, the same tag."""
    name = re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("._-") or "task"
    digest = environment_digest.removeprefix("sha256:")[:16]
    return f"{BUILD_REPOSITORY}/{name}:{digest}"


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()
_image_locks: dict[str, threading.Lock] = {}


def client_for(engine: str) -> Any:
    """One docker SDK client per engine, shared by the attempts of this process."""
    with _clients_lock:
        client = _clients.get(engine)
        if client is None:
            import docker  # the SDK takes about a second to import: only when needed

            # Always a client timeout: an attached call has been seen to hang on Podman.
            client = docker.DockerClient(base_url=engine, timeout=CLIENT_TIMEOUT)
            _clients[engine] = client
        return client


def _image_lock(image: str) -> threading.Lock:
    with _clients_lock:
        return _image_locks.setdefault(image, threading.Lock())


class ImageError(RuntimeError):
    """The task's image cannot be had (build failed or timed out, pull failed)."""


def _api_message(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()[:800]


_resolved: dict[tuple[str, str], dict[str, Any]] = {}
"""Images resolved in this run, by engine and name: their inspection (`ensure_image`)."""


def forget_images() -> None:
    """Resolve every image again (the executor calls this when a run starts): within a
    run an image is resolved once, and its containers are created from that image by
    id, so a tag moved during the run changes none of its attempts."""
    with _clients_lock:
        _resolved.clear()


def ensure_image(plan: ContainerPlan, task_id: str) -> dict[str, Any]:
    """The image's inspection, after building or pulling it if the engine lacks it;
    inspected once per run (`forget_images`)."""
    import docker.errors

    key = (plan.engine, plan.image)
    known = _resolved.get(key)
    if known is not None:
        return known
    client = client_for(plan.engine)
    with _image_lock(plan.image):
        try:
            info: dict[str, Any] = client.api.inspect_image(plan.image)
        except docker.errors.ImageNotFound:
            if plan.build_dir is not None:
                _build(plan, task_id)
            else:
                _pull(plan)
            info = client.api.inspect_image(plan.image)
        with _clients_lock:
            _resolved[key] = info
        return info


def _forget_image(plan: ContainerPlan) -> None:
    with _clients_lock:
        _resolved.pop((plan.engine, plan.image), None)


def _build(plan: ContainerPlan, task_id: str) -> None:
    import docker
    import docker.errors
    import requests.exceptions

    assert plan.build_dir is not None
    where = f"{plan.build_dir}/Dockerfile"
    deadline = time.monotonic() + plan.build_timeout_sec
    log: deque[str] = deque(maxlen=25)
    # Its own client: the read timeout is the build's whole allowance.
    api = docker.APIClient(base_url=plan.engine, timeout=plan.build_timeout_sec)
    try:
        for chunk in api.build(
            path=plan.build_dir,
            tag=plan.image,
            rm=True,
            forcerm=True,
            pull=False,  # FROM images come from the engine's store when present
            decode=True,
            labels={f"{LABEL}.task-id": task_id},
        ):
            if "stream" in chunk:
                log.extend(str(chunk["stream"]).rstrip("\n").splitlines())
            if "error" in chunk:
                tail = "\n".join(log)
                raise ImageError(f"building {where} failed: {chunk['error']}\n{tail}".strip())
            if time.monotonic() > deadline:
                raise ImageError(
                    f"building {where} took longer than build_timeout_sec "
                    f"({plan.build_timeout_sec:g}s in task.toml); stopped"
                )
    except requests.exceptions.ReadTimeout:
        raise ImageError(
            f"building {where} took longer than build_timeout_sec "
            f"({plan.build_timeout_sec:g}s in task.toml); stopped"
        ) from None
    except (docker.errors.APIError, docker.errors.BuildError) as exc:
        raise ImageError(f"building {where} failed: {_api_message(exc)}") from None
    finally:
        api.close()
    image_builds[plan.image] += 1


def _pull(plan: ContainerPlan) -> None:
    import docker
    import docker.errors
    import requests.exceptions

    def failed(why: str) -> ImageError:
        return ImageError(
            f"the image {plan.image} (task.toml docker_image) is not in the engine and could "
            f"not be pulled: {why[:300]}; pull or load it (docker pull / podman load), or "
            "build it from environment/Dockerfile by removing docker_image"
        )

    api = docker.APIClient(base_url=plan.engine, timeout=plan.build_timeout_sec)
    try:
        repository, tag = _split_reference(plan.image)
        # Errors come inside the progress stream, with a 200.
        for event in api.pull(repository, tag=tag, stream=True, decode=True):
            if isinstance(event, dict) and event.get("error"):
                raise failed(str(event["error"]))
        api.inspect_image(plan.image)
    except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
        raise failed(_api_message(exc)) from None
    finally:
        api.close()


def _split_reference(reference: str) -> tuple[str, str | None]:
    if "@" in reference:
        return reference, None
    name, _, tag = reference.rpartition(":")
    if name and "/" not in tag:
        return name, tag
    return reference, "latest"


# -- tar archives -------------------------------------------------------------------------
class _Tar:
    """A tar archive built in memory (uid/gid 0: what the relay puts in is root's)."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.archive = tarfile.TarFile(fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT)
        self.empty = True

    def folder(self, name: str, mode: int) -> None:
        info = tarfile.TarInfo(name.strip("/") + "/")
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
        self.archive.addfile(info)
        self.empty = False

    def data(self, name: str, content: bytes, mode: int) -> None:
        info = tarfile.TarInfo(name.strip("/"))
        info.size, info.mode, info.mtime = len(content), mode, int(time.time())
        self.archive.addfile(info, io.BytesIO(content))
        self.empty = False

    def tree(self, source: Path, prefix: str) -> None:
        """A host folder's content under `prefix` (links kept as links)."""
        for path in sorted(source.rglob("*")):
            name = f"{prefix.strip('/')}/{path.relative_to(source).as_posix()}".strip("/")
            info = self.archive.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with path.open("rb") as handle:
                    self.archive.addfile(info, handle)
            elif info.isdir() or info.issym():
                self.archive.addfile(info)
            self.empty = False

    def file(self, source: Path, name: str, mode: int) -> None:
        self.data(name, source.read_bytes(), mode)  # links followed: the program itself

    def bytes(self) -> bytes:
        self.archive.close()
        return self.buffer.getvalue()


def _safe_members(archive: tarfile.TarFile, strip: int) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """Regular files and folders with a plain relative name, `strip` leading parts off."""
    for member in archive:
        if member.name.startswith("/"):
            continue
        parts = PurePosixPath(member.name).parts[strip:]
        if not parts or ".." in parts:
            continue
        if member.isreg() or member.isdir():
            yield member, "/".join(p for p in parts if p != ".")


def extract_into(data: bytes, target: Path, strip: int, limit: int) -> int:
    """Unpack the files of a tar into `target` (never following or making links)."""
    written = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member, name in _safe_members(archive, strip):
            if not name:
                continue
            path = target / name
            if member.isdir():
                path.mkdir(parents=True, exist_ok=True)
                continue
            if written + member.size > limit:
                break
            source = archive.extractfile(member)
            if source is None:
                continue
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            except OSError:
                continue  # a name twice, or a file where a folder was: the first one stands
            with os.fdopen(fd, "wb") as handle:
                handle.write(source.read())
            written += member.size
    return written


def _tar_bytes(chunks: Any, limit: int) -> bytes:
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > limit + (1 << 20):
            break
    return bytes(data)


def _is_root(user: str | None) -> bool:
    return (user or "").split(":", 1)[0] in ("", "root", "0")


# -- the scripts run in the container ------------------------------------------------------
# Every script runs in the toolbox's busybox sh (`sandbox.toolbox`, read-only at
# /.maka-tools): applets are preferred over PATH, so no script ever runs a program of the
# container, which the subject may have replaced; users and groups are read from
# /etc/passwd and /etc/group with awk (no name service, whose modules the container
# holds), and privileges are dropped by the toolbox's static maka-setpriv.
#
# The verifier gets its own /tests and /logs/verifier, and its own HOME and TMPDIR: tmpfs
# mounts in a mount namespace that a holder process keeps. The holder is made by a
# privileged exec at start, while the container holds only the image and what the relay
# uploaded. It then drops to the container's own capabilities, which include
# CAP_WAKE_ALARM (added for this and harmless); the subject runs with that one dropped
# from its bounding set, so neither it nor anything it leaves behind may look into the
# holder's /proc entries (the kernel requires the looker to hold every capability the
# target holds), while the verifier, an ordinary exec, can chroot into /proc/HOLDER/root
# and sees the private folders there. A verifier that is not root keeps that one
# capability (ambient), so that a process the subject left behind, even one that became
# the verifier's user, can neither trace it nor look into it. Secrets travel in the
# environment, never in argv.
MARKER_CAP = 35
"""CAP_WAKE_ALARM: held by the holder and the verifier, dropped by the subject."""


def _sh(script: str, name: str, *args: str) -> list[str]:
    """argv that runs `script` in the toolbox's shell."""
    return [toolbox.BUSYBOX, "sh", "-c", script, name, *args]


USER_IDS = r"""
# $u (user[:group], names or numbers) -> $ids (maka-setpriv options), $uid, $gid, $home.
ids= uid=0 gid=0 home=/root
if [ -n "$u" ]; then
  user=${u%%:*} group=
  case $u in *:*) group=${u#*:} ;; esac
  entry=$(awk -F: -v k="$user" '$1 == k { print; exit }' /etc/passwd)
  case $user in
    *[!0-9]*) [ -n "$entry" ] || { echo "maka-eval: unknown user: $user" >&2; exit 126; } ;;
    *) [ -n "$entry" ] || entry=$(awk -F: -v k="$user" '$3 == k { print; exit }' /etc/passwd) ;;
  esac
  uid=$user name=
  [ -z "$entry" ] || { uid=$(echo "$entry" | cut -d: -f3); name=${entry%%:*}; }
  if [ -n "$group" ]; then
    gid=$(awk -F: -v k="$group" '$1 == k { print $3; exit }' /etc/group)
    [ -n "$gid" ] || gid=$group
  else
    gid=$(echo "$entry" | cut -d: -f4); [ -n "$gid" ] || gid=$uid
  fi
  case "$uid$gid" in *[!0-9]*|'') echo "maka-eval: unknown user or group: $u" >&2; exit 126 ;; esac
  groups=
  [ -z "$name" ] || groups=$(awk -F: -v u="$name" -v g="$gid" '
    { n = split($4, m, ","); for (i = 1; i <= n; i++) if (m[i] == u && $3 != g) printf ",%s", $3 }
  ' /etc/group)
  home=$(echo "$entry" | cut -d: -f6)
  ids="--uid $uid --gid $gid --groups $gid$groups"
fi
"""

FACTS = r"""
# What the image holds (`sandbox.changes.ImageFacts`): the PATH folders, resolved, and
# their names; the links PATH and the libraries go through; Python's installed modules.
facts() {
  old=$IFS; IFS=:
  for d in $PATH; do
    IFS=$old
    case $d in /*) ;; *) continue ;; esac
    real=$(readlink -f "$d" 2>/dev/null) || real=$d
    [ -n "$real" ] || real=$d
    [ "$real" = "$d" ] || echo "link $d"
    echo "in $real"
    [ ! -d "$real" ] || ls -A "$real" | sed 's/^/- /'
  done
  IFS=$old
  for l in /bin /sbin /lib /lib32 /lib64 /libx32 /usr/lib64 /usr/local/bin /usr/local/lib; do
    [ ! -L "$l" ] || echo "link $l"
  done
  for s in /usr/lib/python3*/*-packages /usr/local/lib/python3*/*-packages \
      /opt/*/lib/python3*/site-packages; do
    [ ! -d "$s" ] || ls -A "$s" | sed 's/^/m /'
  done
  c=/etc/ld.so.cache
  [ ! -f $c ] || [ -L $c ] || echo "ldcache $(head -c 16777216 $c | base64 -w 0)"
}
"""

READ = r"""
# Regular files of the container, for the rules of sandbox.changes: `file BASE64 PATH`,
# or `none - PATH` (missing, a link, not a file).
for f; do
  if [ -f "$f" ] && [ ! -L "$f" ]; then
    echo "file $(head -c 16777217 "$f" | base64 -w 0) $f"
  else
    echo "none - $f"
  fi
done
"""

HOLDER = (
    FACTS
    + r"""
u=$MAKA_EVAL_H_USER want=$MAKA_EVAL_H_FACTS
unset MAKA_EVAL_H_USER MAKA_EVAL_H_FACTS
T=/.maka-tools/bin
[ -x $T/maka-setpriv ] || { echo "fail the verifier's toolbox is not in the container"; exit 0; }
if [ $# != 0 ] && [ -n "$u" ]; then (
"""
    + USER_IDS
    + r"""
  chown -R -- "$uid:$gid" "$@"
) >/dev/null 2>&1; fi
[ -z "$want" ] || facts
out=$(unshare -m --propagation private true 2>&1) \
  || { echo "fail the engine refused a mount namespace: $out" | head -c 300; exit 0; }
# The holder lives on in the background and answers on fd 3, which it closes before it
# sleeps: this exec's output ends, and the exec with it, as soon as the holder is ready.
answer=$(unshare -m --propagation private $T/busybox sh -c '
  T=/.maka-tools/bin
  mkdir -p /tests /logs/verifier \
    && mount -t tmpfs -o mode=0755 maka-tests /tests \
    && mount -t tmpfs -o mode=0755 maka-verifier /logs/verifier \
    && mount -t tmpfs -o mode=0755 maka-private /.maka-tools/private \
    || { echo "fail cannot mount a tmpfs in the container" >&3; exit 0; }
  hex=0
  while read -r key value; do [ "$key" = CapBnd: ] && hex=$value; done </proc/1/status
  echo "ready $$ $(stat -c %d /tests) $(stat -c %d /logs/verifier)" >&3
  exec 3>&-
  exec $T/maka-setpriv --keep-bounding "$hex" -- $T/busybox sleep infinity' \
  3>&1 </dev/null >/dev/null 2>&1 &)
echo "$answer"
"""
)

SUBJECT_WRAPPER = (
    r"""
u=$MAKA_EVAL_S_USER; unset MAKA_EVAL_S_USER
"""
    + USER_IDS
    + f"""
[ -z "$u" ] || export HOME="${{home:-/}}"
exec /.maka-tools/bin/maka-setpriv $ids --drop-bounding {MARKER_CAP} -- "$@"
"""
)

CHOWN = (
    r"""
u=$1; shift
"""
    + USER_IDS
    + r"""
chown -R -- "$uid:$gid" "$@"
"""
)
"""Hand uploaded files to a user (a later step's workdir files)."""

VERIFIER_WRAPPER = (
    r"""
m=$MAKA_EVAL_EXEC_MARKER d=$MAKA_EVAL_V_DIR sum=$MAKA_EVAL_V_SHA u=$MAKA_EVAL_V_USER
h=$MAKA_EVAL_V_HOLDER w=$MAKA_EVAL_V_WORKDIR reset=$MAKA_EVAL_V_RESET
unset MAKA_EVAL_EXEC_MARKER MAKA_EVAL_V_DIR MAKA_EVAL_V_SHA MAKA_EVAL_V_USER
unset MAKA_EVAL_V_HOLDER MAKA_EVAL_V_WORKDIR MAKA_EVAL_V_RESET
say() { printf '\n%s %s\n' "$m" "$*" >&2; }
fail() { say fail "$*"; exit 202; }
set -- $h "$@"; h=$1 dt=$2 dl=$3; shift 3
r=/proc/$h/root
p=$r/.maka-tools/private
# The private folders are the holder's tmpfs mounts (their devices): not if the holder
# was killed, nor if the subject removed the folders they are mounted on.
private() {
  [ "$(stat -c %d "$r/tests" 2>/dev/null)" = "$dt" ] \
    && [ "$(stat -c %d "$r/logs/verifier" 2>/dev/null)" = "$dl" ]
}
private || { say tampered "the verifier's private folders were taken away"; exit 201; }
# A later step's verifier: the previous one's tests, output, HOME and TMPDIR go first.
empty() { for f; do rm -rf -- "$f"/* "$f"/.[!.]* "$f"/..?* || return 1; done; }
[ -z "$reset" ] || empty "$r/tests" "$r/logs/verifier" "$p" \
  || fail "cannot empty the previous step's /tests and /logs/verifier"
left=$(ls -A /logs/verifier 2>/dev/null | head -n 20 | tr '\n' ' ')
[ -z "$left" ] || { say stale "$left"; empty /logs/verifier 2>/dev/null; }
cp "$d/tests.tar" "$r/tests/.maka-tests.tar" || fail "the tests were not uploaded"
rm -f "$d/tests.tar"
printf '%s  %s\n' "$sum" "$r/tests/.maka-tests.tar" | sha256sum -c -s - \
  || { say tampered "the tests changed between upload and use"; exit 201; }
tar -xf "$r/tests/.maka-tests.tar" -C "$r/tests" && rm -f "$r/tests/.maka-tests.tar" \
  || fail "cannot unpack the tests"
"""
    + USER_IDS
    + f"""
mkdir -p "$p/home" "$p/tmp" "$p/pycache" && chmod 0700 "$p/home" "$p/tmp" "$p/pycache" \\
  || fail "cannot make the verifier's HOME and TMPDIR"
if [ -n "$ids" ]; then
  chown "$uid:$gid" "$r/logs/verifier" "$p/home" "$p/tmp" "$p/pycache"
  ids="$ids --ambient {MARKER_CAP}"
fi
say ready
/.maka-tools/bin/maka-setpriv --root "$r" --cd "$w" $ids -- "$@"
"""
    + r"""
rc=$?
private || { say tampered "the verifier's private folders were taken away as it ran"; exit 201; }
tar -C "$r/logs/verifier" -cf "$d/verifier.tar" . || fail "cannot pack /logs/verifier"
set -- $(sha256sum "$d/verifier.tar")
say done "$1"
# A small result travels with the reports: no second trip to the engine to fetch it.
if [ "$(stat -c %s "$d/verifier.tar")" -le 1048576 ]; then
  say tar "$(base64 -w 0 "$d/verifier.tar" 2>/dev/null)"
fi
# So does what the subject left in /logs/agent (the relay fetches it when this is cut).
if [ -n "$(ls -A /logs/agent 2>/dev/null)" ]; then
  say agent "$(tar -C /logs/agent -cf - . 2>/dev/null | head -c 1048577 | base64 -w 0)"
fi
late=$(ls -A /logs/verifier 2>/dev/null | head -n 20 | tr '\n' ' ')
[ -z "$late" ] || say decoy "$late"
exit $rc
"""
)

SHARED_VERIFIER_SETUP = r"""
d=$1 sum=$2
left=$(ls -A /logs/verifier 2>/dev/null | head -n 20 | tr '\n' ' ')
[ -z "$left" ] || echo "stale $left"
rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier && chmod 0777 /logs/verifier \
  || { echo "fail cannot make /tests and /logs/verifier"; exit 0; }
printf '%s  %s\n' "$sum" "$d/tests.tar" | sha256sum -c -s - \
  || { echo "tampered the tests changed between upload and use"; exit 0; }
tar -xf "$d/tests.tar" -C /tests && rm -f "$d/tests.tar" || echo "fail cannot unpack the tests"
"""

# Everything but PID 1, this script, the holder and what the image's ENTRYPOINT started
# before it (its services: a lower pid than the holder's, which is made before anything
# the subject runs; pids only grow in a new namespace): frozen first (nothing forks away
# while the list is walked), then killed; what is spared runs on.
QUIESCE = r"""
h=$1
kill -STOP -1 2>/dev/null
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  [ "$p" = $$ ] || [ "$p" = 1 ] || { [ -n "$h" ] && [ "$p" -le "$h" ]; } \
    || kill -KILL "$p" 2>/dev/null
done
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  [ "$p" = $$ ] || kill -CONT "$p" 2>/dev/null
done
true
"""
HARBOR_COMMAND = ("sh", "-c", "sleep infinity")
"""The command Harbor gives a task container whose image has an ENTRYPOINT."""


def trusted_argv(argv: Sequence[str], head: bytes) -> tuple[list[str], str | None]:
    """The verifier's argv with the toolbox's bash when its script is a bash script (no
    `#!`: the relay names `bash`; or a `#!` naming bash, directly or through env), and
    the image's interpreter it runs with otherwise (None: none of the image's)."""
    argv = list(argv)
    if argv and argv[0] == "bash":
        return [toolbox.BASH, *argv[1:]], None
    if not head.startswith(b"#!"):
        return argv, None
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
    interpreter, _, option = line.partition(" ")
    option = option.strip()
    name = posixpath.basename(interpreter)
    if name == "env" and option and " " not in option and not option.startswith("-"):
        name, option = option, ""
    if name == "bash":
        return [toolbox.BASH, *([option] if option else []), *argv], None
    return argv, interpreter or None


# -- the sandbox --------------------------------------------------------------------------
class ContainerSandbox:
    """One attempt in one container of the task's image (see the module docstring)."""

    isolation = Isolation.CONTAINER

    def __init__(
        self,
        supervisor: ProcessSupervisor,
        attempt_id: str,
        layout: Layout,
        plan: ContainerPlan,
        *,
        task_id: str,
        labels: Mapping[str, str] | None = None,
        network: Network | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.network = network
        """The executor's policed namespace the container joins (Podman's `ns:` mode)."""
        self.attempt_id = attempt_id
        self.layout = layout
        self.plan = plan
        self.task_id = task_id
        self.labels = {f"{LABEL}.attempt-id": attempt_id, f"{LABEL}.task-id": task_id}
        self.labels.update({f"{LABEL}.{k}": v for k, v in (labels or {}).items()})
        self.notes: list[str] = []
        self.container_id: str | None = None
        self.workdir = plan.workdir or DEFAULT_WORKDIR
        self.image_user = ""
        self.private_view: str | None = "the container was not started"
        """Why the verifier cannot have private folders here (None: it has them)."""
        self._holder: str | None = None
        """The holder's pid and the devices of its /tests and /logs/verifier mounts."""
        self._phases: dict[int, tuple[Phase, str | None, str | None]] = {}
        """helper pid -> (phase, the verifier's upload folder, its reports file)."""
        self._client: Any = None
        self._paths: dict[str, str] = {}
        self._program = f"{PROGRAM_DIR}/{Path(plan.program).name}" if plan.program else None
        self._renewed = False
        """Whether a step ended since the last verifier (its private folders are emptied)."""
        self._agent_logs_taken = False
        """Whether /logs/agent came back with the last verifier's reports, no subject
        having run since."""
        self._image_id = plan.image
        self._facts = changes.ImageFacts()
        """What the image held (`sandbox.changes`), read when the container started."""
        self._baseline: frozenset[changes.Change] = frozenset()
        """The container's changes before the subject ran (the relay's uploads, the
        engine's mount points, what the image's ENTRYPOINT wrote)."""
        self._interpreter: str | None = None
        """The image's interpreter test.sh runs with (None: the toolbox's bash)."""
        self._checked = False
        """Whether the changes were checked before a verifier started."""
        self._before: set[str] = set()
        """Critical paths found before a verifier started (the others: while one ran)."""
        self._sabotage: list[str] = []
        """What the verifier's wrapper found done to its private folders, its tests or
        its output (the subject's doing: the attempt fails)."""

    # -- paths ------------------------------------------------------------------------
    def _mapping(self) -> dict[str, str]:
        lay = self.layout
        paths = {
            lay.workspace: self.workdir,
            lay.instruction: INSTRUCTION_PATH,
            lay.agent_logs: Layout.AGENT_LOGS_PATH,
            lay.tests: Layout.TESTS_PATH,
            lay.verifier_logs: Layout.VERIFIER_LOGS_PATH,
            **dict(lay.subject_dirs),
        }
        if lay.frame_dir is not None:
            paths[lay.frame_dir] = FRAME_DIR
        if self.plan.program and self._program:
            paths[self.plan.program] = self._program
        if self.network is not None and self.network.ca_cert is not None:
            paths[self.network.ca_cert] = CA_CERT_PATH
        return paths

    def path_of(self, phase: Phase, host_path: str) -> str:
        """Harbor's path for a folder of the layout (or a file in one)."""
        if not self._paths:
            self._paths = self._mapping()
        return mapped(self._paths, host_path)

    # -- the container ----------------------------------------------------------------
    def start(self) -> None:
        import docker.errors
        import docker.types

        plan = self.plan
        image = ensure_image(plan, self.task_id)
        self._image_id = str(image.get("Id") or plan.image)
        config = image.get("Config") or {}
        self.workdir = plan.workdir or config.get("WorkingDir") or DEFAULT_WORKDIR
        self.image_user = str(config.get("User") or "")
        self._paths = self._mapping()
        client = self._client = client_for(plan.engine)
        caveat = diff_caveat(plan.engine)
        if caveat is not None:
            self.notes.append(caveat)
        try:
            tools = toolbox.toolbox()
        except (toolbox.ToolboxError, OSError) as exc:
            raise OSError(f"the verifier's toolbox cannot be made: {exc}") from None
        # Read-only, right under /: see sandbox.toolbox.
        volumes: dict[str, dict[str, str]] = {str(tools): {"bind": toolbox.MOUNT, "mode": "ro"}}
        kwargs: dict[str, Any] = {
            # PID 1 only sleeps: quiescing spares it, and SIGKILL stops it at once (a
            # sleeping PID 1 ignores SIGTERM: about 10 s per stop).
            "entrypoint": ["sleep"],
            "command": ["infinity"],
            "stop_signal": "SIGKILL",
            "cap_add": ["WAKE_ALARM"],
            "working_dir": self.workdir,
            # The attempt's own /tmp, in memory (charged to its memory limit) and capped:
            # filling it hurts no one else and not the engine's disk.
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,mode=1777,size={TMP_BYTES}"},
            "labels": self.labels,
            "environment": dict(plan.env),
            "name": "maka-eval-" + hashlib.sha256(self.attempt_id.encode()).hexdigest()[:16],
            "detach": True,
            "volumes": volumes,
        }
        if plan.network == NetworkMode.NO_NETWORK:
            kwargs["network_mode"] = "none"
        elif plan.network == NetworkMode.ALLOWLIST and self.network is None:
            # Its allowlist is kept by the cell's proxy: never the open network instead.
            raise OSError("the task's allowlist needs the cell's policed network, which it lacks")
        elif self.network is not None:
            net = self.network
            # A previous attempt's frozen container in this namespace may still hold the
            # ports this attempt's programs will want.
            _removals.wait_for(net.namespace)
            # Podman joins a namespace by path; there is no resolver in it, so the proxy's
            # name is pinned in /etc/hosts and resolv.conf names no server.
            kwargs["network_mode"] = f"ns:{net.namespace}"
            kwargs["extra_hosts"] = dict(net.hosts)
            kwargs["cap_drop"] = list(SUBJECT_CAP_DROP)
            volumes[net.resolv_file] = {"bind": "/etc/resolv.conf", "mode": "ro"}
            if net.ca_cert is not None:
                volumes[net.ca_cert] = {"bind": CA_CERT_PATH, "mode": "ro"}
        keeps_entrypoint = bool(config.get("Entrypoint"))
        if keeps_entrypoint:
            # As Harbor: the image's ENTRYPOINT runs, given `sh -c "sleep infinity"` (an
            # entrypoint that starts services and then execs its arguments starts them
            # here too; quiescing spares what it started, see QUIESCE).
            del kwargs["entrypoint"]
            kwargs["command"] = list(HARBOR_COMMAND)
        if plan.cpus:
            kwargs["nano_cpus"] = int(plan.cpus * 1e9)
        if plan.memory_mb:
            kwargs["mem_limit"] = kwargs["memswap_limit"] = f"{plan.memory_mb}m"
        if plan.gpus:
            kwargs["device_requests"] = [
                docker.types.DeviceRequest(count=plan.gpus, capabilities=[["gpu"]])
            ]
        if plan.storage_mb:
            kwargs["storage_opt"] = {"size": f"{plan.storage_mb}m"}
        try:
            try:
                self.container_id = _create(client, str(image.get("Id") or plan.image), kwargs)
            except docker.errors.ImageNotFound:  # removed since it was resolved: again
                _forget_image(plan)
                image = ensure_image(plan, self.task_id)
                self.container_id = _create(client, str(image.get("Id") or plan.image), kwargs)
        except docker.errors.APIError as exc:
            if "storage_opt" not in kwargs or "storage" not in _api_message(exc).lower():
                raise OSError(f"cannot create the container: {_api_message(exc)}") from None
            # A disk quota needs e.g. overlay on xfs with pquota: run without, and say so.
            del kwargs["storage_opt"]
            why = _api_message(exc).splitlines()[-1].rsplit(": ", 1)[-1].strip('")')
            self.notes.append(f"storage_mb={plan.storage_mb} was not enforced: {why[:200]}")
            self.container_id = _create(client, str(image.get("Id") or plan.image), kwargs)
        self._start_created()
        if not keeps_entrypoint:  # PID 1 sleeps
            self._start_holder(self._upload_workspace())
            return
        try:
            self._start_holder(self._upload_workspace())
            refused = False
        except OSError:  # an entrypoint that ended: see below
            refused = True
        # Asked once the holder is up: whether the container ended before, while or
        # after the holder started, it is seen here. One that refused an upload or an
        # exec has ended, even while the engine still calls it running for a moment.
        deadline = time.monotonic() + STATE_TIMEOUT
        while True:
            try:
                state = client.api.inspect_container(self.container_id).get("State") or {}
            except docker.errors.APIError as exc:
                raise OSError(f"cannot inspect the container: {_api_message(exc)}") from None
            if not (refused and state.get("Running", True)) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not state.get("Running", True):
            self._without_entrypoint(client, image, kwargs, state)
            self._start_holder(self._upload_workspace())

    def _without_entrypoint(
        self,
        client: Any,
        image: Mapping[str, Any],
        kwargs: dict[str, Any],
        state: Mapping[str, Any],
    ) -> None:
        """The container again, PID 1 sleeping, in place of one whose image's ENTRYPOINT
        ended (it does not run its arguments, or failed); the record says so. The task
        still runs, as it would have before entrypoints were kept."""
        import docker.errors

        assert self.container_id is not None
        logs = b""
        with contextlib.suppress(docker.errors.APIError):
            logs = client.api.logs(self.container_id, tail=3) or b""
        _remove_now(client, self.container_id)
        output = " ".join(logs.decode(errors="replace").split())[:200]
        self.notes.append(
            f"the image's ENTRYPOINT ended at once (exit status {state.get('ExitCode')}) "
            f'when given Harbor\'s command `sh -c "sleep infinity"`'
            f"{': ' + output if output else ''}; the container ran without it"
        )
        self._holder = None
        kwargs["entrypoint"] = ["sleep"]
        kwargs["command"] = ["infinity"]
        try:
            self.container_id = _create(client, str(image.get("Id") or self.plan.image), kwargs)
        except docker.errors.APIError as exc:
            raise OSError(f"cannot create the container: {_api_message(exc)}") from None
        self._start_created()

    def _start_created(self) -> None:
        import docker.errors

        try:
            self._client.api.start(self.container_id)
        except docker.errors.APIError as exc:
            raise OSError(f"cannot start the container: {_api_message(exc)}") from None

    def _upload_workspace(self) -> list[str]:
        """The instruction, Harbor's log folders and the workspace; the paths put into
        the workdir."""
        lay = self.layout
        tar = _Tar()
        tar.folder("maka", 0o755)
        tar.folder(PROGRAM_DIR, 0o755)
        tar.data(INSTRUCTION_PATH, Path(lay.instruction).read_bytes(), 0o644)
        if lay.frame_dir is not None:
            tar.folder(FRAME_DIR, 0o777)
        tar.folder("logs", 0o755)
        tar.folder(Layout.AGENT_LOGS_PATH, 0o777)
        workspace = Path(lay.workspace)
        tar.tree(workspace, self.workdir)
        self._put("/", tar.bytes())
        return [f"{self.workdir.rstrip('/')}/{p.name}" for p in sorted(workspace.iterdir())]

    def _start_holder(self, uploaded: list[str]) -> None:
        """The verifier's private folders, made while the container is still pristine
        (and what the image holds, read then: `sandbox.changes`); the workspace handed to
        a non-root agent user on the way."""
        agent = self.plan.agent_user or self.image_user
        key = (self._image_id, self.plan.env.get("PATH", ""))
        facts = _image_facts.get(key)
        env = {"MAKA_EVAL_H_USER": agent, "MAKA_EVAL_H_FACTS": "" if facts else "1"}
        owned = uploaded if uploaded and not _is_root(agent) else []
        argv = _sh(HOLDER, "maka-holder", *owned)
        api = self._client.api
        out = b""
        try:
            # One attached exec: it ends once the holder (left in the background) is ready.
            created = api.exec_create(
                self.container_id, argv, user="0", privileged=True, environment=env, workdir="/"
            )
            out = api.exec_start(created["Id"], demux=True)[0] or b""
        except Exception as exc:  # an engine that refuses privileged execs
            self.private_view = f"the engine refused a privileged exec: {_api_message(exc)}"
        else:
            lines = out.decode(errors="replace").splitlines()
            answer = next((ln for ln in lines if ln.startswith(("ready ", "fail "))), "")
            if answer.startswith("ready ") and len(answer.split()) == 4:
                self._holder = answer.removeprefix("ready ")
                self.private_view = None
            elif answer.startswith("fail "):
                self.private_view = answer.removeprefix("fail ")[:300]
            else:
                tail = out.decode(errors="replace").strip()[-200:]
                self.private_view = f"the holder did not start: {tail or 'no answer'}"
        lines = out.decode(errors="replace").splitlines()
        if "the verifier's toolbox" in (self.private_view or ""):
            raise OSError(f"{self.private_view} (the engine did not mount it)")
        if facts is None:
            if not any(line.startswith("in ") for line in lines):
                code, more = self._run_root(_sh(FACTS + "facts", "maka-facts"))
                lines = more.decode(errors="replace").splitlines()
                if code != 0 or not any(line.startswith("in ") for line in lines):
                    said = more.decode(errors="replace").strip()[-200:]
                    raise OSError(f"cannot read what the image holds: {said or 'no answer'}")
            facts = _parse_facts(lines)
            _image_facts[key] = facts
        self._facts = facts
        self._baseline = frozenset(self._changes())

    def _read_many(self, paths: Sequence[str]) -> dict[str, bytes | None]:
        """Regular files of the container (None: missing, a link, too big), read with the
        toolbox in one exec."""
        found: dict[str, bytes | None] = dict.fromkeys(paths)
        if not paths:
            return found
        _, out = self._run_root(_sh(READ, "maka-read", *paths))
        for line in out.decode(errors="replace").splitlines():
            word, _, rest = line.partition(" ")
            packed, _, path = rest.partition(" ")
            if word != "file" or path not in found:
                continue
            with contextlib.suppress(ValueError):
                data = base64.b64decode(packed, validate=True)
                found[path] = data if len(data) <= MAX_CONTENT_BYTES else None
        return found

    def _changes(self) -> list[changes.Change]:
        """The container's changes against its image, as the engine lists them (a list
        too long to read is _Unlistable)."""
        import requests.exceptions

        api = self._client.api
        try:
            response = api._get(api._url("/containers/{0}/changes", self.container_id), stream=True)
            response.raise_for_status()
            data = response.raw.read(MAX_CHANGES_BYTES + 1, decode_content=True)
        except requests.exceptions.ReadTimeout:
            raise _Unlistable("the engine took too long to list the container's changes") from None
        except requests.exceptions.HTTPError as exc:
            raise OSError(f"the engine would not list the container's changes: {exc}") from None
        if len(data) > MAX_CHANGES_BYTES:
            raise _Unlistable(
                f"the container's changes are too many to list (over {MAX_CHANGES_BYTES >> 20} "
                "MiB of paths)"
            )
        try:
            return changes.parse_changes(strict_json.loads(data) if data.strip() else [])
        except ValueError:
            raise OSError("the engine's list of the container's changes is not JSON") from None

    def _put(self, path: str, data: bytes) -> None:
        import docker.errors

        try:
            self._client.api.put_archive(self.container_id, path, data)
        except docker.errors.APIError as exc:
            raise OSError(f"cannot upload into the container: {_api_message(exc)}") from None

    def _get(self, path: str, limit: int) -> bytes | None:
        import docker.errors

        try:
            stream, _ = self._client.api.get_archive(self.container_id, path)
        except docker.errors.NotFound:
            return None
        return _tar_bytes(stream, limit)

    def _run_root(self, argv: Sequence[str]) -> tuple[int, bytes]:
        """Run a short program as root, waiting for it: exit code and stdout."""
        import docker.errors

        api = self._client.api
        try:
            created = api.exec_create(self.container_id, list(argv), user="0", workdir="/")
            out, _ = api.exec_start(created["Id"], demux=True)
            code = api.exec_inspect(created["Id"]).get("ExitCode")
        except docker.errors.APIError as exc:
            return 255, _api_message(exc).encode()
        return (code if isinstance(code, int) else 255), out or b""

    # -- programs ---------------------------------------------------------------------
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
        if self.container_id is None:
            raise OSError(f"the {phase.value}'s container is not running")
        inside = {k: v for k, v in env.items() if k not in HOST_ONLY_ENV}
        if phase is Phase.VERIFIER:
            return self._spawn_verifier(argv, inside, cwd, stdout, stderr, user)
        self._upload_subject_files()
        self._agent_logs_taken = False  # the subject may write /logs/agent again
        agent = user or self.plan.agent_user
        if self.private_view is None:
            # Without the one capability that lets a process look into the holder.
            user = agent or self.image_user
            wrapped = _sh(SUBJECT_WRAPPER, "maka-subject", *argv)
            env_user = {**inside, "MAKA_EVAL_S_USER": "" if _is_root(user) else user}
            exec_id = self._exec(wrapped, user="0", env=env_user, cwd=cwd)
        else:
            exec_id = self._exec(argv, user=agent, env=inside, cwd=cwd)
        return self._helper(phase, exec_id, stdout, stderr)

    def upload(self, host_path: str, sandbox_path: str, user: str | None = None) -> None:
        """Put a host file or folder's content at `sandbox_path`; what is put there is
        handed to `user` (default: the agent's) when that is not root."""
        if self.container_id is None:
            raise OSError("the container is not running")
        source = Path(host_path)
        tar = _Tar()
        if source.is_dir():
            tar.folder(sandbox_path, 0o755)
            tar.tree(source, sandbox_path)
            names = [f"{sandbox_path.rstrip('/')}/{p.name}" for p in sorted(source.iterdir())]
        else:
            tar.data(sandbox_path, source.read_bytes(), stat.S_IMODE(source.stat().st_mode))
            names = [sandbox_path]
        self._put("/", tar.bytes())
        owner = user or self.plan.agent_user or self.image_user
        if names and not _is_root(owner):
            code, out = self._run_root(_sh(CHOWN, "maka-chown", owner, *names))
            if code != 0:
                raise OSError(f"cannot hand {sandbox_path} to {owner}: {out.decode()[-200:]}")

    def download(self, sandbox_path: str, host_path: str, max_bytes: int) -> None:
        if self.container_id is None:
            return
        taken = self._agent_logs_taken and host_path == self.layout.agent_logs
        if sandbox_path == Layout.AGENT_LOGS_PATH and taken:
            return  # the verifier's wrapper brought it back already
        data = self._get(sandbox_path, max_bytes)
        if data:
            Path(host_path).mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(tarfile.TarError, OSError):
                extract_into(data, Path(host_path), 1, max_bytes)

    def collect(self, source: str, target: Path, max_bytes: int) -> str | None:
        import docker.errors

        if self.container_id is None:
            return "the container is gone"
        try:
            data = self._get(source, max_bytes)
        except docker.errors.APIError as exc:
            return _api_message(exc)
        if data is None:
            return "it does not exist"
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
                first = archive.next()
                if first is None:
                    return "it is empty"
                if first.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    extract_into(data, target, 1, max_bytes)
                    return None
                if not first.isreg():
                    return "it is a link or a special file (links are never followed)"
                if first.size > max_bytes:
                    return f"it holds {first.size} bytes, more than the {max_bytes} allowed"
                content = archive.extractfile(first)
                if content is None:
                    return "it could not be read"
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("xb") as sink:
                    sink.write(content.read())
                return None
        except (tarfile.TarError, OSError) as exc:
            return f"its archive could not be read: {exc}"

    def next_step(self) -> None:
        """What the last verifier left in the container goes; its private folders are
        emptied when the next verifier starts."""
        if self.container_id is None:
            raise OSError("the container is gone; the next step cannot run")
        self._run_root(_sh("rm -rf /maka/.v-*", "maka-next-step"))
        self._renewed = True

    def _upload_subject_files(self) -> None:
        """/solution (the oracle's) and the subject's own program, now and not before."""
        tar = _Tar()
        for host, inside in self.layout.subject_dirs.items():
            tar.folder(inside, 0o755)
            tar.tree(Path(host), inside)
        if self.plan.program and self._program:
            tar.file(Path(self.plan.program), self._program, 0o755)
        if not tar.empty:
            self._put("/", tar.bytes())

    def _exec(
        self, argv: Sequence[str], *, user: str | None, env: Mapping[str, str], cwd: str
    ) -> str:
        import docker.errors

        try:
            created = self._client.api.exec_create(
                self.container_id, list(argv), environment=dict(env), workdir=cwd, user=user or ""
            )
        except docker.errors.APIError as exc:
            raise OSError(f"the engine refused to run {argv[0]!r}: {_api_message(exc)}") from None
        return str(created["Id"])

    def _helper(
        self,
        phase: Phase,
        exec_id: str,
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
        *,
        marker: str | None = None,
        box: str | None = None,
    ) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "maka_eval.sandbox.exec"]
        argv += ["--engine", self.plan.engine, "--exec", exec_id]
        reports: str | None = None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), ATTEMPT_MARKER: self.attempt_id}
        if marker is not None:
            reports = str(Path(self.layout.verifier_logs).parent / f"reports-{exec_id[:16]}")
            argv += ["--status", reports]
            env[exec_helper.MARKER_VARIABLE] = marker
        proc = self.supervisor.spawn(argv, cwd="/", env=env, stdout=stdout, stderr=stderr)
        self._phases[proc.pid] = (phase, box, reports)
        return proc

    def _spawn_verifier(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
        step_user: str | None = None,
    ) -> subprocess.Popen[bytes]:
        argv, self._interpreter = trusted_argv(argv, self._host_head(argv))
        # A container the subject changed under the verifier is not verified at all.
        try:
            found = self._assess()
        except _Unlistable as exc:
            raise OSError(f"the verifier did not run: {exc}") from None
        self._checked = True
        if found.critical:
            self._before.update(f.change.path for f in found.critical)
            raise OSError(
                f"the verifier did not run: the subject changed what it runs on: {found.reason()}"
            )
        box = f"/maka/.v-{secrets.token_hex(16)}"
        tests = _Tar()
        tests.tree(Path(self.layout.tests), "")
        payload = tests.bytes()
        digest = hashlib.sha256(payload).hexdigest()
        upload = _Tar()
        upload.folder(box, 0o700)
        upload.data(f"{box}/tests.tar", payload, 0o600)
        self._put("/", upload.bytes())
        verifier_user = step_user or self.plan.verifier_user
        user = verifier_user or self.image_user
        if self.private_view is None:
            marker = secrets.token_hex(16)
            secret_env = {
                **env,
                **VERIFIER_ENV,
                exec_helper.MARKER_VARIABLE: marker,
                "MAKA_EVAL_V_DIR": box,
                "MAKA_EVAL_V_SHA": digest,
                "MAKA_EVAL_V_USER": "" if _is_root(user) else user,
                "MAKA_EVAL_V_HOLDER": str(self._holder),
                "MAKA_EVAL_V_WORKDIR": cwd,
                "MAKA_EVAL_V_RESET": "1" if self._renewed else "",
            }
            self._renewed = False
            wrapper = _sh(VERIFIER_WRAPPER, "maka-verifier", *argv)
            exec_id = self._exec(wrapper, user="0", env=secret_env, cwd=cwd)
            return self._helper(Phase.VERIFIER, exec_id, stdout, stderr, marker=marker, box=box)
        # No private folders here: fresh shared ones, then the plain verifier.
        _, out = self._run_root(_sh(SHARED_VERIFIER_SETUP, "maka-setup", box, digest))
        self._take_reports(out.decode(errors="replace").splitlines())
        self.notes.append(
            "the verifier ran without a private /tests and /logs/verifier "
            f"({self.private_view}): processes the subject left running could reach them"
        )
        own = {**VERIFIER_ENV, "HOME": f"{box}/home", "TMPDIR": f"{box}/tmp"}
        own["PYTHONPYCACHEPREFIX"] = f"{box}/pycache"
        exec_id = self._exec(argv, user=verifier_user, env={**env, **own}, cwd=cwd)
        return self._helper(Phase.VERIFIER, exec_id, stdout, stderr, box=box)

    def _host_head(self, argv: Sequence[str]) -> bytes:
        """The first line of the verifier's script (tests/test.sh), read on the host."""
        for arg in argv:
            if arg.startswith(Layout.TESTS_PATH + "/"):
                host = Path(self.layout.tests) / arg[len(Layout.TESTS_PATH) + 1 :]
                with contextlib.suppress(OSError), host.open("rb") as handle:
                    return handle.readline(4096)
                return b""
        return b""

    def _working(self) -> list[str]:
        """The subject's working folders: its changes there are its work."""
        folders = [self.workdir, *RELAY_FOLDERS, *self.layout.subject_dirs.values()]
        return list(dict.fromkeys(folders))

    def _assess(self) -> changes.Assessment:
        """The container's changes since it started, and which of them the verifier's
        start-up depends on (`sandbox.changes`)."""
        found = [c for c in self._changes() if c not in self._baseline]
        working = self._working()
        contents = self._read_many(changes.wanted(found, working)[:MAX_CONTENT_FILES])
        return changes.assess(
            found, self._facts, working=working, interpreter=self._interpreter, contents=contents
        )

    def _write_evidence(self, found: changes.Assessment, during: set[str]) -> None:
        if not found.outside or self.layout.evidence_dir is None:
            return
        folders = ", ".join(w for w in self._working() if w.strip("/"))
        header = (
            "What the subject changed in its container outside its working folders "
            f"({folders}):\nthe engine's list of the container's changes against its image, "
            "taken when the attempt ended."
        )
        if during:
            header += "\nChanged while the verifier ran: " + ", ".join(sorted(during))
        target = Path(self.layout.evidence_dir)
        target.mkdir(parents=True, exist_ok=True)
        (target / EVIDENCE_FILE).write_text(found.evidence(header), encoding="utf-8")

    def _take_reports(self, lines: Sequence[str]) -> str | None:
        """Turn the wrapper's reports into notes; the digest of what the verifier wrote."""
        done: str | None = None
        for line in lines:
            word, _, rest = line.strip().partition(" ")
            rest = rest.strip()
            if word == "stale":
                self.notes.append(
                    f"suspected tampering: /logs/verifier held {rest} when the subject ended; "
                    "discarded, never read"
                )
            elif word == "decoy":
                self.notes.append(
                    f"suspected tampering: something the subject left running wrote {rest} "
                    "to /logs/verifier while the verifier ran; not read (the verifier "
                    "wrote to its own)"
                )
            elif word == "tampered":
                self.notes.append(f"suspected tampering: {rest}; the verifier did not run")
                self._sabotage.append(rest)
            elif word == "fail":
                self.notes.append(f"the verifier could not be set up in the container: {rest}")
            elif word == "done":
                done = rest
        return done

    # -- waiting and ending -----------------------------------------------------------
    def wait(
        self,
        proc: subprocess.Popen[bytes],
        timeout: float,
        cancel: CancelToken,
        captures: Sequence[OutputCapture] = (),
    ) -> WaitEnd:
        return self.supervisor.wait(proc, timeout, cancel, captures)

    def release(self, proc: subprocess.Popen[bytes]) -> int:
        code = self.supervisor.release(proc)
        phase, box, reports = self._phases.pop(proc.pid, (Phase.SUBJECT, None, None))
        if self.container_id is None:
            return code
        if phase is Phase.SUBJECT:
            self._download_frame()
        elif reports is not None:
            self._collect_private(box, reports)
        else:
            self._collect_shared()
        return code

    def _download_frame(self) -> None:
        if self.layout.frame_dir is None:
            return
        data = self._get(f"{FRAME_DIR}/result.json", MAX_FRAME_BYTES)
        if data:
            # A later step's subject: the frame it leaves replaces the last step's.
            with contextlib.suppress(OSError):
                (Path(self.layout.frame_dir) / "result.json").unlink()
            with contextlib.suppress(tarfile.TarError, OSError):
                extract_into(data, Path(self.layout.frame_dir), 0, MAX_FRAME_BYTES)

    def _collect_private(self, box: str | None, reports: str) -> None:
        try:
            lines = Path(reports).read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        done = self._take_reports(lines)
        if done is None or box is None:
            return
        inner: bytes | None = None
        packed = next((line.strip()[4:] for line in lines if line.startswith("tar ")), "")
        with contextlib.suppress(ValueError):
            inner = base64.b64decode(packed, validate=True) if packed else None
        if inner is None:  # too big for the reports: fetched from the container
            data = self._get(f"{box}/verifier.tar", MAX_VERIFIER_BYTES)
            inner = _inner_file(data, MAX_VERIFIER_BYTES) if data else None
        if inner is None or hashlib.sha256(inner).hexdigest() != done:
            self.notes.append(
                "suspected tampering: what the verifier wrote was changed before the relay "
                "read it; not read"
            )
            if inner is not None:
                self._sabotage.append("what the verifier wrote was changed before it was read")
            return
        with contextlib.suppress(tarfile.TarError, OSError):
            extract_into(inner, Path(self.layout.verifier_logs), 0, MAX_VERIFIER_BYTES)
        self._take_agent_logs(lines)

    def _take_agent_logs(self, lines: Sequence[str]) -> None:
        """/logs/agent as the verifier's wrapper packed it (none: it was empty), when
        it was small enough to travel with the reports; `download` then has it."""
        packed = next((line.strip()[6:] for line in lines if line.startswith("agent ")), "")
        try:
            data = base64.b64decode(packed, validate=True)
        except ValueError:
            return
        if len(data) > AGENT_REPORT_BYTES:
            return  # cut short: fetched from the container when the attempt ends
        target = Path(self.layout.agent_logs)
        with contextlib.suppress(OSError):
            shutil.rmtree(target)  # the relay's own folder: the last packing is whole
        target.mkdir(parents=True, exist_ok=True)
        if data:
            with contextlib.suppress(tarfile.TarError, OSError):
                extract_into(data, target, 0, AGENT_REPORT_BYTES)
        self._agent_logs_taken = True

    def _collect_shared(self) -> None:
        data = self._get(Layout.VERIFIER_LOGS_PATH, MAX_VERIFIER_BYTES)
        if data:
            with contextlib.suppress(tarfile.TarError, OSError):
                extract_into(data, Path(self.layout.verifier_logs), 1, MAX_VERIFIER_BYTES)

    def quiesce(self, phase: Phase, proc: subprocess.Popen[bytes]) -> None:
        """Kill the helper, then every process in the container but PID 1 and the
        verifier's holder."""
        self.supervisor.quiesce([proc.pid], self.attempt_id)
        if self.container_id is not None:
            holder = self._holder.split()[0] if self._holder is not None else ""
            self._run_root(_sh(QUIESCE, "maka-quiesce", holder))

    def processes(self) -> list[int]:
        return sorted(self.supervisor.members([], self.attempt_id))

    def verifier_dirs(self) -> tuple[str, str] | None:
        """The container's own (HOME and TMPDIR from the relay are not passed in)."""
        return None

    def tampering(self) -> str | None:
        """The container's changes, once the verifiers ran: every one outside the working
        folders goes to the evidence file; those the verifier's start-up depends on (before
        or while it ran: a change stays listed) make the reason."""
        if self.container_id is None:
            return None
        said = list(dict.fromkeys(self._sabotage))
        try:
            found = self._assess()
        except _Unlistable as exc:
            return "; ".join([*said, str(exc)])
        critical = {f.change.path for f in found.critical}
        during = critical - self._before if self._checked else set()
        self._write_evidence(found, during)
        reason = found.reason(during=during)
        if reason is not None:
            said.append(f"{reason} (every change: evidence/{EVIDENCE_FILE})")
        return "; ".join(said) or None

    def stop(self) -> None:
        """Freeze every process of the container and remove it in the background (at once
        if it cannot be paused); end the helpers."""
        try:
            if self.container_id is not None:
                namespace = self.network.namespace if self.network is not None else None
                _removals.remove(self._client, self.container_id, namespace)
                self.container_id = None
        finally:
            self.supervisor.end_attempt(self.attempt_id)


class _Removals:
    """Containers being removed in the background, each frozen first (see the module
    docstring): a thread per container, joined by `drain` and by an attempt that joins
    the same network namespace (`wait_for`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[threading.Thread, str | None] = {}

    def remove(self, client: Any, container_id: str, namespace: str | None) -> None:
        import docker.errors

        try:
            client.api.pause(container_id)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:  # no freezer, already stopped...: remove it now
            _remove_now(client, container_id)
            return
        thread = threading.Thread(
            target=self._remove,
            args=(client, container_id),
            name=f"maka-eval-remove-{container_id[:12]}",
        )
        with self._lock:
            self._pending[thread] = namespace
        thread.start()

    def _remove(self, client: Any, container_id: str) -> None:
        try:
            _remove_now(client, container_id)
        except Exception:  # the engine went away: remove_leftovers finds it next run
            pass
        finally:
            with self._lock:
                self._pending.pop(threading.current_thread(), None)

    def wait_for(self, namespace: str) -> None:
        """Wait until no container that joined `namespace` is left to remove."""
        with self._lock:
            threads = [t for t, ns in self._pending.items() if ns == namespace]
        for thread in threads:
            thread.join()

    def drain(self) -> None:
        """Wait until every container stopped so far is removed."""
        with self._lock:
            threads = list(self._pending)
        for thread in threads:
            thread.join()


def _remove_now(client: Any, container_id: str) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_container(container_id, force=True, v=True)


_removals = _Removals()


class _Unlistable(Exception):
    """The engine cannot list the container's changes in time or in size: the subject
    made its container impossible to check, which fails the attempt."""


def diff_caveat(engine: str) -> str | None:
    """What the engine's list of a container's changes may miss (None: nothing known):
    overlay's native diff lists every file of the writable layer; without it the engine
    compares each file's size and times with the image's. Known from the engine's /info,
    asked once (the engine search asks it: `engine_info`)."""
    if engine not in _diff_caveats:
        answer: Any = None
        with contextlib.suppress(OSError):
            status, answer = exec_helper.request(engine, "GET", "/info", timeout=PROBE_TIMEOUT)
            answer = answer if status == 200 else None
        _diff_caveats[engine] = _caveat_of(answer)
    return _diff_caveats[engine]


def _caveat_of(info: Any) -> str | None:
    pairs = info.get("DriverStatus") if isinstance(info, dict) else None
    native = dict(p for p in pairs or [] if isinstance(p, list) and len(p) == 2)
    if str(native.get("Native Overlay Diff", "")).lower() != "false":
        return None
    return (
        "the engine lists a container's changes by comparing sizes and times (no native "
        "overlay diff): a file the subject rewrote with its size and time kept would not "
        "be seen"
    )


_image_facts: dict[tuple[str, str], changes.ImageFacts] = {}
"""(image id, the task's PATH) -> what the image holds: an image never changes."""


def _parse_facts(lines: Sequence[str]) -> changes.ImageFacts:
    """FACTS' report (`in FOLDER`, `- name`, `link PATH`, `m module`, `ldcache BASE64`)
    as ImageFacts."""
    libraries: Mapping[str, frozenset[str]] | None = {}
    dirs: list[str] = []
    commands: dict[str, set[str]] = {}
    links: set[str] = set()
    modules: set[str] = set()
    folder: str | None = None
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "in" and rest.startswith("/"):
            folder = posixpath.normpath(rest)
            if folder not in commands:
                dirs.append(folder)
                commands[folder] = set()
        elif word == "-" and folder is not None and rest:
            commands[folder].add(rest)
        elif word == "link" and rest.startswith("/"):
            links.add(posixpath.normpath(rest))
        elif word == "m" and rest and not rest.endswith((".dist-info", ".egg-info", ".pth")):
            modules.add(rest.split(".", 1)[0])
        elif word == "ldcache":
            try:
                libraries = read_cache(base64.b64decode(rest, validate=True))
            except (ValueError, CacheError):
                libraries = None
    return changes.ImageFacts(
        path_dirs=tuple(dirs),
        commands={d: frozenset(names) for d, names in commands.items()},
        links=frozenset(links),
        site_modules=frozenset(modules - {"__pycache__", ""}),
        libraries=None if libraries is None else dict(libraries),
    )


def drain_removals() -> None:
    """Wait until every container a sandbox stopped has been removed (the executor calls
    this before it returns; a container whose removal failed is a leftover that the next
    run of the same run folder removes)."""
    _removals.drain()


def _create(client: Any, image: str, kwargs: dict[str, Any]) -> str:
    """Create a container; its id. The SDK's `containers.create` inspects what it made, one
    more round trip to the engine: this is the same call without it."""
    from docker.models.containers import _create_container_args

    args = _create_container_args({**kwargs, "image": image, "version": client.api._version})
    return str(client.api.create_container(**args)["Id"])


def _inner_file(data: bytes, limit: int) -> bytes | None:
    """The one regular file a get_archive of a file holds."""
    with (
        contextlib.suppress(tarfile.TarError),
        tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive,
    ):
        for member in archive:
            if member.isreg() and member.size <= limit:
                handle = archive.extractfile(member)
                return handle.read() if handle is not None else None
    return None


def leftover_containers(engine: str, run_id: str | None = None) -> list[str]:
    """Ids of the containers maka-eval made (for one run) that still exist."""
    label = f"{LABEL}.run-id={run_id}" if run_id else f"{LABEL}.attempt-id"
    filters = urllib.parse.quote(json.dumps({"label": [label]}))
    status, found = exec_helper.request(engine, "GET", f"/containers/json?all=1&filters={filters}")
    if status != 200 or not isinstance(found, list):
        return []
    return [str(c.get("Id")) for c in found]


def remove_leftovers(engine: str, run_id: str) -> int:
    """Remove the containers a writer of this run left when it died (their PID 1 sleeps
    forever); how many. Only the run's writer, holding its lock, may call this."""
    removed = 0
    for container_id in leftover_containers(engine, run_id):
        with contextlib.suppress(OSError):
            status, _ = exec_helper.request(
                engine, "DELETE", f"/containers/{container_id}?force=1&v=1"
            )
            removed += status in (200, 204)
    return removed


__all__ = [
    "ContainerSandbox",
    "EngineInfo",
    "EngineProbe",
    "ImageError",
    "build_tag",
    "client_for",
    "drain_removals",
    "engine_info",
    "ensure_image",
    "forget_images",
    "image_builds",
    "leftover_containers",
    "remove_leftovers",
]


class ContainerBackend:
    """The `container` backend: the task's image through a Docker Engine API."""

    kind = "container"

    def unavailable(self, request: SandboxRequest | None = None) -> str | None:
        """Why no engine answers (at the plan's address, else at the usual ones)."""
        env = {"DOCKER_HOST": request.container.engine} if request and request.container else None
        probe = engine_info(env)
        return None if probe.engine is not None else probe.why_none()

    def create(self, request: SandboxRequest) -> ContainerSandbox:
        """A container sandbox for the request's container plan."""
        if request.container is None:
            raise ValueError("the container sandbox needs the task's container plan")
        return ContainerSandbox(
            request.supervisor,
            request.attempt_id,
            request.layout,
            request.container,
            task_id=request.task_id,
            labels=request.labels,
            network=request.network,
        )


BACKEND = ContainerBackend()
