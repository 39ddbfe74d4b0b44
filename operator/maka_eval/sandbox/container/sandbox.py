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
import os
import posixpath
import secrets
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from maka_eval import strict_json
from maka_eval.engine.modes import Isolation, NetworkMode
from maka_eval.layout import (
    CONTAINER_CA_CERT_PATH,
    CONTAINER_FRAME_DIR,
    CONTAINER_INSTRUCTION_PATH,
    LOGS_ROOT,
    PROGRAM_DIR,
    RELAY_ROOT,
    SOLUTION_PATH,
    TESTS_PATH,
    VERIFIER_BOX_PREFIX,
)
from maka_eval.processes.supervisor import MARKER_VARIABLE as ATTEMPT_MARKER
from maka_eval.processes.supervisor import ProcessSupervisor
from maka_eval.sandbox import changes, toolbox
from maka_eval.sandbox import exec as exec_helper
from maka_eval.sandbox.base import Layout, Network, Phase, SandboxBase, mapped
from maka_eval.sandbox.container import image_facts, shell
from maka_eval.sandbox.container.archive import TarBuilder, extract_into, inner_file, read_stream
from maka_eval.sandbox.container.engine import (
    LABEL,
    api_message,
    client_for,
    create_container,
    diff_caveat,
)
from maka_eval.sandbox.container.images import ensure_image, forget_image
from maka_eval.sandbox.container.removal import removals, remove_now
from maka_eval.sandbox.container.verifier_argv import trusted_argv
from maka_eval.sandbox.plans import ContainerPlan

DEFAULT_WORKDIR = "/"
"""Where programs run when neither task.toml nor the image names a workdir: the engine's
own default, as under Harbor (`docker exec` without `-w`)."""
STATE_TIMEOUT = 10.0
"""How long a container that refused an exec may still be called running by the engine."""
MAX_FRAME_BYTES = 1 << 20
TMP_BYTES = 1 << 30
"""Size of an attempt's /tmp (a tmpfs, as in the process sandbox)."""
MAX_VERIFIER_BYTES = 256 << 20
"""What is taken of /logs/verifier (the rewards, and any report test.sh wrote)."""
AGENT_REPORT_BYTES = 1 << 20
"""/logs/agent up to this size (as a tar) comes back with the verifier's reports."""
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
RELAY_FOLDERS = (
    LOGS_ROOT,
    "/tmp",
    RELAY_ROOT,
    TESTS_PATH,
    SOLUTION_PATH,
    toolbox.MOUNT,
)
"""Folders of the relay and the engine (with the workdir: the subject's working folders),
whose changes are the attempt's own work, not evidence."""
HARBOR_COMMAND = ("sh", "-c", "sleep infinity")
"""The command Harbor gives a task container whose image has an ENTRYPOINT."""


def _is_root(user: str | None) -> bool:
    return (user or "").split(":", 1)[0] in ("", "root", "0")


class Unlistable(Exception):
    """The engine cannot list the container's changes in time or in size: the subject
    made its container impossible to check, which fails the attempt."""


class ContainerSandbox(SandboxBase):
    """One attempt in one container of the task's image (see the module docstring).
    Waiting, the attempt's processes and the verifier's folders (its own, in the
    container: HOME and TMPDIR from the relay are not passed in) are SandboxBase's."""

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
        super().__init__(supervisor, attempt_id, layout)
        self.network = network
        """The executor's policed namespace the container joins (Podman's `ns:` mode)."""
        self.plan = plan
        self.task_id = task_id
        self.labels = {f"{LABEL}.attempt-id": attempt_id, f"{LABEL}.task-id": task_id}
        self.labels.update({f"{LABEL}.{k}": v for k, v in (labels or {}).items()})
        self.container_id: str | None = None
        self._through_link = False
        """Whether the last `_get` refused a path that the engine reached through a link."""
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
            lay.instruction: CONTAINER_INSTRUCTION_PATH,
            lay.agent_logs: Layout.AGENT_LOGS_PATH,
            lay.tests: Layout.TESTS_PATH,
            lay.verifier_logs: Layout.VERIFIER_LOGS_PATH,
            **dict(lay.subject_dirs),
        }
        if lay.frame_dir is not None:
            paths[lay.frame_dir] = CONTAINER_FRAME_DIR
        if self.plan.program and self._program:
            paths[self.plan.program] = self._program
        if self.network is not None and self.network.ca_cert is not None:
            paths[self.network.ca_cert] = CONTAINER_CA_CERT_PATH
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
            removals.wait_for(net.namespace)
            # Podman joins a namespace by path; there is no resolver in it, so the proxy's
            # name is pinned in /etc/hosts and resolv.conf names no server.
            kwargs["network_mode"] = f"ns:{net.namespace}"
            kwargs["extra_hosts"] = dict(net.hosts)
            kwargs["cap_drop"] = list(SUBJECT_CAP_DROP)
            volumes[net.resolv_file] = {"bind": "/etc/resolv.conf", "mode": "ro"}
            if net.ca_cert is not None:
                volumes[net.ca_cert] = {"bind": CONTAINER_CA_CERT_PATH, "mode": "ro"}
        keeps_entrypoint = bool(config.get("Entrypoint"))
        if keeps_entrypoint:
            # As Harbor: the image's ENTRYPOINT runs, given `sh -c "sleep infinity"` (an
            # entrypoint that starts services and then execs its arguments starts them
            # here too; quiescing spares what it started, see scripts/quiesce.sh).
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
                self.container_id = create_container(
                    client, str(image.get("Id") or plan.image), kwargs
                )
            except docker.errors.ImageNotFound:  # removed since it was resolved: again
                forget_image(plan)
                image = ensure_image(plan, self.task_id)
                self.container_id = create_container(
                    client, str(image.get("Id") or plan.image), kwargs
                )
        except docker.errors.APIError as exc:
            if "storage_opt" not in kwargs or "storage" not in api_message(exc).lower():
                raise OSError(f"cannot create the container: {api_message(exc)}") from None
            # A disk quota needs e.g. overlay on xfs with pquota: run without, and say so.
            del kwargs["storage_opt"]
            why = api_message(exc).splitlines()[-1].rsplit(": ", 1)[-1].strip('")')
            self.notes.append(f"storage_mb={plan.storage_mb} was not enforced: {why[:200]}")
            self.container_id = create_container(client, str(image.get("Id") or plan.image), kwargs)
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
                raise OSError(f"cannot inspect the container: {api_message(exc)}") from None
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
        remove_now(client, self.container_id)
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
            self.container_id = create_container(
                client, str(image.get("Id") or self.plan.image), kwargs
            )
        except docker.errors.APIError as exc:
            raise OSError(f"cannot create the container: {api_message(exc)}") from None
        self._start_created()

    def _start_created(self) -> None:
        import docker.errors

        try:
            self._client.api.start(self.container_id)
        except docker.errors.APIError as exc:
            raise OSError(f"cannot start the container: {api_message(exc)}") from None

    def _upload_workspace(self) -> list[str]:
        """The instruction, Harbor's log folders and the workspace; the paths put into
        the workdir."""
        lay = self.layout
        tar = TarBuilder()
        tar.folder("maka", 0o755)
        tar.folder(PROGRAM_DIR, 0o755)
        tar.data(CONTAINER_INSTRUCTION_PATH, Path(lay.instruction).read_bytes(), 0o644)
        if lay.frame_dir is not None:
            tar.folder(CONTAINER_FRAME_DIR, 0o777)
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
        facts = image_facts.known.get(key)
        env = {"MAKA_EVAL_H_USER": agent, "MAKA_EVAL_H_FACTS": "" if facts else "1"}
        owned = uploaded if uploaded and not _is_root(agent) else []
        argv = shell.argv("maka-holder", *owned)
        api = self._client.api
        out = b""
        try:
            # One attached exec: it ends once the holder (left in the background) is ready.
            created = api.exec_create(
                self.container_id, argv, user="0", privileged=True, environment=env, workdir="/"
            )
            out = api.exec_start(created["Id"], demux=True)[0] or b""
        except Exception as exc:  # an engine that refuses privileged execs
            self.private_view = f"the engine refused a privileged exec: {api_message(exc)}"
        else:
            lines = out.decode(errors="replace").splitlines()
            answer = next((ln for ln in lines if ln.startswith(("ready ", "fail "))), "")
            if answer.startswith("ready ") and len(answer.split()) == 4:
                self._holder = answer.removeprefix("ready ")
                self.private_view = None
            elif answer.startswith("fail "):
                self.private_view = answer.removeprefix("fail ")[:300]
            else:
                # The engine ran the privileged exec but the holder never said ready or
                # why not: a transient failure, before any subject ran. Retried as such;
                # never a verifier without private folders (only an engine that cannot
                # give them, the two cases above, runs one, with a note).
                tail = out.decode(errors="replace").strip()[-200:]
                raise OSError(
                    f"the verifier's holder did not start: {tail or 'no answer'} "
                    "(an infrastructure failure: the attempt runs again)"
                )
        lines = out.decode(errors="replace").splitlines()
        if "the verifier's toolbox" in (self.private_view or ""):
            raise OSError(f"{self.private_view} (the engine did not mount it)")
        if facts is None:
            if not any(line.startswith("in ") for line in lines):
                code, more = self._run_root(shell.argv("maka-facts"))
                lines = more.decode(errors="replace").splitlines()
                if code != 0 or not any(line.startswith("in ") for line in lines):
                    said = more.decode(errors="replace").strip()[-200:]
                    raise OSError(f"cannot read what the image holds: {said or 'no answer'}")
            facts = image_facts.parse_facts(lines)
            image_facts.known[key] = facts
        self._facts = facts
        self._baseline = frozenset(self._changes())

    def _read_many(self, paths: Sequence[str]) -> dict[str, bytes | None]:
        """Regular files of the container (None: missing, a link, too big), read with the
        toolbox in one exec."""
        found: dict[str, bytes | None] = dict.fromkeys(paths)
        if not paths:
            return found
        _, out = self._run_root(shell.argv("maka-read", *paths))
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
        too long to read is Unlistable)."""
        import requests.exceptions

        api = self._client.api
        try:
            response = api._get(api._url("/containers/{0}/changes", self.container_id), stream=True)
            response.raise_for_status()
            data = response.raw.read(MAX_CHANGES_BYTES + 1, decode_content=True)
        except requests.exceptions.ReadTimeout:
            raise Unlistable("the engine took too long to list the container's changes") from None
        except requests.exceptions.HTTPError as exc:
            raise OSError(f"the engine would not list the container's changes: {exc}") from None
        if len(data) > MAX_CHANGES_BYTES:
            raise Unlistable(
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
            raise OSError(f"cannot upload into the container: {api_message(exc)}") from None

    def _get(self, path: str, limit: int, *, resolve: bool = False) -> bytes | None:
        """The archive of what is at `path`; None when it is gone, or when reaching it
        meant following a link (`_through_link` says which, for `collect`). `resolve`:
        also look for links inside the path first (one exec more), for paths a task names
        in the subject's folders."""
        import docker.errors

        self._through_link = False
        if resolve and self._resolves_elsewhere(path):
            self._through_link = True
            return None
        try:
            stream, stat = self._client.api.get_archive(self.container_id, path)
        except docker.errors.NotFound:
            return None
        if _followed_a_link(path, stat):
            stream.close()
            self._through_link = True
            return None
        return read_stream(stream, limit)

    def _resolves_elsewhere(self, path: str) -> bool:
        """Whether a link inside `path` leads somewhere else (the toolbox's readlink -f).
        The engine resolves every folder on the way to a path, and the stat it answers
        with describes only the last one (`_followed_a_link`). A process the subject left
        running could still swap a folder for a link between this look and the copy:
        the copy is then of a file the container holds, as root; the verifier's private
        folders are in a mount namespace the copy does not enter."""
        if not path.startswith("/"):
            return False
        _, out = self._run_root(shell.argv("maka-resolve", path))
        for line in out.decode(errors="replace").splitlines():
            asked, _, resolved = line.partition("\t")
            if asked == path and resolved:
                return posixpath.normpath(resolved) != _normalized(path)
        return False

    def _run_root(self, argv: Sequence[str]) -> tuple[int, bytes]:
        """Run a short program as root, waiting for it: exit code and stdout."""
        import docker.errors

        api = self._client.api
        try:
            created = api.exec_create(self.container_id, list(argv), user="0", workdir="/")
            out, _ = api.exec_start(created["Id"], demux=True)
            code = api.exec_inspect(created["Id"]).get("ExitCode")
        except docker.errors.APIError as exc:
            return 255, api_message(exc).encode()
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
            wrapped = shell.argv("maka-subject", *argv)
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
        tar = TarBuilder()
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
            code, out = self._run_root(shell.argv("maka-chown", owner, *names))
            if code != 0:
                raise OSError(f"cannot hand {sandbox_path} to {owner}: {out.decode()[-200:]}")

    def download(self, sandbox_path: str, host_path: str, max_bytes: int) -> None:
        if self.container_id is None:
            return
        taken = self._agent_logs_taken and host_path == self.layout.agent_logs
        if sandbox_path == Layout.AGENT_LOGS_PATH and taken:
            return  # the verifier's wrapper brought it back already
        data = self._get(sandbox_path, max_bytes, resolve=True)
        if data:
            Path(host_path).mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(tarfile.TarError, OSError):
                extract_into(data, Path(host_path), 1, max_bytes)

    def collect(self, source: str, target: Path, max_bytes: int) -> str | None:
        import docker.errors

        if self.container_id is None:
            return "the container is gone"
        try:
            data = self._get(source, max_bytes, resolve=True)
        except docker.errors.APIError as exc:
            return api_message(exc)
        if data is None and self._through_link:
            return "it is a link, or lies behind one (links are never followed)"
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
        self._run_root(shell.argv("maka-next-step"))
        self._renewed = True

    def _upload_subject_files(self) -> None:
        """/solution (the oracle's) and the subject's own program, now and not before."""
        tar = TarBuilder()
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
            raise OSError(f"the engine refused to run {argv[0]!r}: {api_message(exc)}") from None
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
        except Unlistable as exc:
            raise OSError(f"the verifier did not run: {exc}") from None
        self._checked = True
        if found.critical:
            self._before.update(f.change.path for f in found.critical)
            raise OSError(
                f"the verifier did not run: the subject changed what it runs on: {found.reason()}"
            )
        box = f"{VERIFIER_BOX_PREFIX}{secrets.token_hex(16)}"
        tests = TarBuilder()
        tests.tree(Path(self.layout.tests), "")
        payload = tests.bytes()
        digest = hashlib.sha256(payload).hexdigest()
        upload = TarBuilder()
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
            wrapper = shell.argv("maka-verifier", *argv)
            exec_id = self._exec(wrapper, user="0", env=secret_env, cwd=cwd)
            return self._helper(Phase.VERIFIER, exec_id, stdout, stderr, marker=marker, box=box)
        # No private folders here: fresh shared ones, then the plain verifier.
        _, out = self._run_root(shell.argv("maka-setup", box, digest))
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
        data = self._get(f"{CONTAINER_FRAME_DIR}/result.json", MAX_FRAME_BYTES)
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
            inner = inner_file(data, MAX_VERIFIER_BYTES) if data else None
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
            self._run_root(shell.argv("maka-quiesce", holder))

    def tampering(self) -> str | None:
        """The container's changes, once the verifiers ran: every one outside the working
        folders goes to the evidence file; those the verifier's start-up depends on (before
        or while it ran: a change stays listed) make the reason."""
        if self.container_id is None:
            return None
        said = list(dict.fromkeys(self._sabotage))
        try:
            found = self._assess()
        except Unlistable as exc:
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
                removals.remove(self._client, self.container_id, namespace)
                self.container_id = None
        finally:
            self.supervisor.end_attempt(self.attempt_id)


GO_MODE_SYMLINK = 1 << 27
"""Go's fs.ModeSymlink, in the mode of the engine's path stat (X-Docker-Container-Path-Stat)."""


def _normalized(path: str) -> str:
    """`path` without `.`, `..` and repeated slashes (POSIX keeps a leading `//`;
    readlink does not)."""
    return "/" + posixpath.normpath(path).lstrip("/")


def _followed_a_link(path: str, stat: Mapping[str, Any] | None) -> bool:
    """Whether the engine reached `path` through a link. Docker archives a link itself
    (a link member, refused by the callers), but Podman follows one, at the end of the
    path or inside it, and archives what it points at: its stat then says the path is a
    link, or names where it really went (linkTarget, the resolved path)."""
    if not stat:
        return False
    mode = stat.get("mode")
    if isinstance(mode, int) and mode & GO_MODE_SYMLINK:
        return True
    target = stat.get("linkTarget")
    if isinstance(target, str) and target and path.startswith("/"):
        return _normalized(target) != _normalized(path)
    return False
