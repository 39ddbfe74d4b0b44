"""A small kubelet for the fake node: it runs the Pods the real scheduler binds to it.

The tests play the kubelet and only the kubelet. For every Pod bound to the fake node
this agent:
- makes each emptyDir volume a folder and each Secret volume a folder holding the
  Secret's keys as files (read from the API, as a kubelet does), and builds each
  container's file system as a mount namespace (bubblewrap): a fresh root holding this
  machine's /usr and /etc (the "base image"), the image's own folders from `images`
  (e.g. the relay bundle at /opt/maka-eval, the experiment folder at /benchmark), the
  volumes at their mountPaths, an /etc/hosts with the Pod's hostAliases, and a
  termination-message file at terminationMessagePath;
- runs the init containers in order, then the main container, as local processes in
  their own PID namespace, with the container's env (secretKeyRef values read from the
  API, as a kubelet does) and workingDir. An init container with restartPolicy Always
  is a native sidecar: it starts in the background, the next container waits for its
  exec startupProbe to pass, and it is stopped (SIGTERM, then SIGKILL) once the main
  container has ended -- it never decides the Pod's phase;
- writes the Pod's phase and the container's state (running, then terminated with exit
  code, reason and the termination message, capped at 4096 bytes like the kubelet)
  back to Pod status;
- on a Pod deleted (or evicted) while it runs, kills its processes and removes the Pod
  for good (grace period 0), as a kubelet does once its containers have stopped;
- gives a Pod with a native sidecar a network namespace of its own (loopback only, the
  sidecar's `--upstream` on this machine's loopback bridged in: `PodNetwork`), so that
  several Pods' egress sidecars can all listen on 127.0.0.1:15080; other Pods share this
  machine's network;
- claims a Pod before running it (`_claim`): test sessions running at the same time on
  one control plane each have an agent for the same node, and a Pod runs once.

Everything else is the real API server, scheduler and controller manager.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

MESSAGE_LIMIT = 4096
BASE_DIRS = ("/usr", "/etc")
BASE_LINKS = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SIDECAR_STOP_GRACE_SEC = 5.0
CLAIM_ANNOTATION = "node-agent.maka-eval.test/claimed-by"


@dataclass
class RunningPod:
    uid: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    killed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class PortBridge:
    """Listens on 127.0.0.1:PORT inside a Pod's network namespace and relays each
    connection to 127.0.0.1:PORT of this machine (the egress gateway of the tests)."""

    def __init__(self, namespace: str, port: int) -> None:
        self.port = port
        made: list[socket.socket | BaseException] = []

        def listen() -> None:  # a thread of its own: setns changes the calling thread only
            try:
                with open(namespace, "rb") as ns:
                    _setns(ns.fileno())
                listener = socket.socket()
                listener.bind(("127.0.0.1", port))
                listener.listen(16)
                made.append(listener)
            except BaseException as exc:
                made.append(exc)

        thread = threading.Thread(target=listen)
        thread.start()
        thread.join()
        if isinstance(made[0], BaseException):
            raise made[0]
        self.listener = made[0]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(inside,), daemon=True).start()

    def _relay(self, inside: socket.socket) -> None:
        try:
            outside = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError:
            inside.close()
            return
        outside.settimeout(None)

        def pump(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)

        other = threading.Thread(target=pump, args=(outside, inside), daemon=True)
        other.start()
        pump(inside, outside)
        other.join()
        inside.close()
        outside.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


@dataclass
class PodNetwork:
    """A Pod's own network namespace (loopback only), as a kubelet gives every Pod, for
    Pods with an egress sidecar: two of them at once would both listen on 127.0.0.1:15080
    in this machine's network. The sidecar's upstream (the gateway on this machine's
    loopback) is bridged in; nothing else of this machine is reachable."""

    name: str
    bridges: list[PortBridge] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    @classmethod
    def for_pod(cls, pod: client.V1Pod) -> PodNetwork | None:
        sidecars = [c for c in pod.spec.init_containers or () if c.restart_policy == "Always"]
        if not sidecars:
            return None
        network = cls(f"mka-{pod.metadata.uid[:12]}")
        subprocess.run(["ip", "netns", "add", network.name], check=True, capture_output=True)
        try:
            subprocess.run(
                ["ip", "-n", network.name, "link", "set", "lo", "up"],
                check=True,
                capture_output=True,
            )
            for container in sidecars:
                args = list(container.args or ())
                if "--upstream" in args:
                    upstream = urllib.parse.urlsplit(args[args.index("--upstream") + 1])
                    if upstream.hostname == "127.0.0.1" and upstream.port:
                        network.bridges.append(PortBridge(network.path, upstream.port))
        except BaseException:
            network.remove()
            raise
        return network

    def remove(self) -> None:
        for bridge in self.bridges:
            bridge.close()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


class ProbeFailed(Exception):
    """A native sidecar's startupProbe did not pass within its failure threshold."""


class NodeAgent:
    """Runs Pods bound to `node` until `stop()`."""

    def __init__(
        self,
        kubeconfig: Path,
        node: str,
        images: Mapping[str, Mapping[str, Path]],
        work_dir: Path,
        *,
        extra_ro: tuple[Path, ...] = (),
        fail_images: frozenset[str] = frozenset(),
    ) -> None:
        self.api_client = config.new_client_from_config(str(kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.node = node
        self.images = images
        self.work_dir = work_dir
        self.extra_ro = extra_ro
        self.fail_images = fail_images
        self.pods: dict[str, RunningPod] = {}
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.networks: dict[str, PodNetwork] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="node-agent", daemon=True)
        self.started = 0

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> NodeAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for running in list(self.pods.values()):
            self._kill(running)
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=f"spec.nodeName={self.node}",
                    timeout_seconds=5,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    self._on_event(event["type"], event["object"])
            except Exception as exc:  # keep watching, like a kubelet
                if not self._stop.is_set():
                    print(f"node-agent: watch failed: {exc}", file=sys.stderr)
                    time.sleep(0.5)

    def _on_event(self, kind: str, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        running = self.pods.get(uid)
        if kind == "DELETED":
            if running is not None:
                self._kill(running)
            return
        if pod.metadata.deletion_timestamp is not None:
            if running is not None:
                self._kill(running)
            self._finalize_delete(pod)
            return
        if running is None and (pod.status.phase or "Pending") == "Pending":
            if not self._claim(pod):
                return
            running = RunningPod(uid)
            self.pods[uid] = running
            self.started += 1
            threading.Thread(
                target=self._run_pod,
                args=(pod, running),
                name=f"pod-{pod.metadata.name}",
                daemon=True,
            ).start()

    def _claim(self, pod: client.V1Pod) -> bool:
        """Whether this agent runs the Pod. Test sessions running at the same time on one
        control plane each have an agent for the same node: the first to annotate the
        Pod (a patch conditional on its resourceVersion) runs it, the others leave it."""
        owner = (pod.metadata.annotations or {}).get(CLAIM_ANNOTATION)
        if owner is not None:
            return owner == self.id
        patch = {
            "metadata": {
                "annotations": {CLAIM_ANNOTATION: self.id},
                "resourceVersion": pod.metadata.resource_version,
            }
        }
        try:
            self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, patch)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def _finalize_delete(self, pod: client.V1Pod) -> None:
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                body=client.V1DeleteOptions(grace_period_seconds=0),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _kill(self, running: RunningPod) -> None:
        with running.lock:
            running.killed = True
            for process in running.processes:
                if process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)

    # -- running a pod ----------------------------------------------------------------
    def _patch_status(self, pod: client.V1Pod, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, {"status": status}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _run_pod(self, pod: client.V1Pod, running: RunningPod) -> None:
        network = PodNetwork.for_pod(pod)
        if network is not None:
            self.networks[pod.metadata.uid] = network
        try:
            self._run_pod_containers(pod, running)
        finally:
            if network is not None:
                self.networks.pop(pod.metadata.uid, None)
                network.remove()

    def _run_pod_containers(self, pod: client.V1Pod, running: RunningPod) -> None:
        root = (
            self.work_dir / pod.metadata.namespace / f"{pod.metadata.name}-{pod.metadata.uid[:8]}"
        )
        volumes = root / "volumes"
        volumes.mkdir(parents=True, exist_ok=True)
        for volume in pod.spec.volumes or ():
            (volumes / volume.name).mkdir(exist_ok=True)
            if volume.secret is not None:
                self._fill_secret_volume(pod, volume.secret, volumes / volume.name)
        self._write_hosts(pod, root)
        subject = pod.spec.containers[0]
        started = _now()
        init_statuses: list[dict[str, Any]] = []
        sidecars: list[tuple[Any, subprocess.Popen[bytes]]] = []
        for init in pod.spec.init_containers or ():
            if init.restart_policy == "Always":
                process = self._spawn_container(pod, init, root, running)
                code = 0
                if process is None:
                    code = 137 if running.killed else 1
                else:
                    sidecars.append((init, process))
                    try:
                        self._wait_started(pod, init, root, process)
                    except ProbeFailed as exc:
                        print(f"node-agent: {exc}", file=sys.stderr)
                        code = process.poll() or 1
                if code == 0:
                    init_statuses.append(self._sidecar_running(init, started))
                    continue
                init_statuses.append(self._terminated(init, code, "", started))
            else:
                # Its termination message too, as a kubelet reports it (the relay bundle
                # check says there why it failed).
                code, message = self._run_container(pod, init, root, running)
                init_statuses.append(self._terminated(init, code, message, started))
            if code != 0:
                self._stop_sidecars(sidecars)
                self._patch_status(
                    pod,
                    {
                        "phase": "Failed",
                        "startTime": started,
                        "initContainerStatuses": init_statuses,
                        "containerStatuses": [self._waiting(subject, "PodInitializing")],
                    },
                )
                return
        self._patch_status(
            pod,
            {
                "phase": "Running",
                "startTime": started,
                "initContainerStatuses": init_statuses,
                "containerStatuses": [
                    {
                        "name": subject.name,
                        "image": subject.image,
                        "imageID": "",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": started}},
                    }
                ],
            },
        )
        if subject.image in self.fail_images:
            return
        code, message = self._run_container(pod, subject, root, running)
        stopped = self._stop_sidecars(sidecars)
        if running.killed:
            return
        reason = "Completed" if code == 0 else "Error"
        status: dict[str, Any] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [self._terminated(subject, code, message, started, reason)],
        }
        if sidecars:
            ended = {c.name: self._terminated(c, code, "", started) for c, code in stopped}
            status["initContainerStatuses"] = [ended.get(c["name"], c) for c in init_statuses]
        self._patch_status(pod, status)

    # -- native sidecars, volumes, /etc/hosts -------------------------------------------
    def _wait_started(
        self, pod: client.V1Pod, container: Any, root: Path, process: subprocess.Popen[bytes]
    ) -> None:
        """Return once the sidecar's exec startupProbe passes (at once without one)."""
        probe = container.startup_probe
        if probe is None:
            return
        if probe._exec is None or not probe._exec.command:
            raise ProbeFailed(f"{container.name}: only exec startup probes are supported here")
        period = float(probe.period_seconds or 10)
        attempts = int(probe.failure_threshold or 3)
        time.sleep(float(probe.initial_delay_seconds or 0))
        for _ in range(attempts):
            if process.poll() is not None:
                raise ProbeFailed(f"{container.name} exited ({process.returncode}) while starting")
            argv = self._bwrap_argv(pod, container, root, None)
            argv += ["--", *probe._exec.command]
            check = subprocess.run(
                argv,
                env=self._env(pod, container),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=float(probe.timeout_seconds or 1) + 5,
            )
            if check.returncode == 0:
                return
            time.sleep(period)
        raise ProbeFailed(f"{container.name}: startupProbe failed {attempts} times")

    def _stop_sidecars(
        self, sidecars: list[tuple[Any, subprocess.Popen[bytes]]]
    ) -> list[tuple[Any, int]]:
        """SIGTERM every sidecar, SIGKILL what is left after the grace period."""
        for _, process in sidecars:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + SIDECAR_STOP_GRACE_SEC
        codes = []
        for container, process in sidecars:
            try:
                code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
            codes.append((container, code if code >= 0 else 128 - code))
        return codes

    @staticmethod
    def _sidecar_running(container: Any, started: str) -> dict[str, Any]:
        return {
            "name": container.name,
            "image": container.image,
            "imageID": "",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": started}},
        }

    def _fill_secret_volume(self, pod: client.V1Pod, source: Any, folder: Path) -> None:
        secret = self.core.read_namespaced_secret(source.secret_name, pod.metadata.namespace)
        mode = source.default_mode if source.default_mode is not None else 0o644
        data = secret.data or {}
        # With `items`, only the keys listed, at their paths (as a kubelet projects them).
        items = [(i.key, i.path) for i in source.items] if source.items else None
        for key, name in items if items is not None else [(k, k) for k in data]:
            path = folder / name
            path.write_bytes(base64.b64decode(data[key]))
            path.chmod(mode)

    @staticmethod
    def _write_hosts(pod: client.V1Pod, root: Path) -> None:
        """The Pod's /etc/hosts: localhost, its own name, and its hostAliases."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines.append(f"127.0.1.1\t{pod.metadata.name}")
        for alias in pod.spec.host_aliases or ():
            lines.append(f"{alias.ip}\t{' '.join(alias.hostnames or ())}")
        (root / "hosts").write_text("\n".join(lines) + "\n")

    @staticmethod
    def _terminated(
        container: Any, code: int, message: str, started: str, reason: str | None = None
    ) -> dict[str, Any]:
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": started,
            "finishedAt": _now(),
        }
        if message:
            terminated["message"] = message
        return {
            "name": container.name,
            "image": container.image,
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }

    @staticmethod
    def _waiting(container: Any, reason: str) -> dict[str, Any]:
        return {
            "name": container.name,
            "image": container.image,
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": reason}},
        }

    def _env(self, pod: client.V1Pod, container: Any) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": pod.metadata.name,
            "HOME": "/root",
        }
        for var in container.env or ():
            if var.value is not None:
                env[var.name] = var.value
            elif var.value_from is not None and var.value_from.secret_key_ref is not None:
                ref = var.value_from.secret_key_ref
                secret = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                env[var.name] = base64.b64decode((secret.data or {})[ref.key]).decode()
        return env

    def _run_container(
        self, pod: client.V1Pod, container: Any, root: Path, running: RunningPod
    ) -> tuple[int, str]:
        if self.images.get(container.image) is None:
            return 1, f"image {container.image} is not known to the node agent"
        process = self._spawn_container(pod, container, root, running)
        if process is None:
            return 137, ""
        code = process.wait()
        message_file = root / f"{container.name}.termination-log"
        message = message_file.read_bytes()[:MESSAGE_LIMIT].decode("utf-8", "replace")
        return (code if code >= 0 else 128 - code), message

    def _spawn_container(
        self, pod: client.V1Pod, container: Any, root: Path, running: RunningPod
    ) -> subprocess.Popen[bytes] | None:
        """The container's process, started (None once the Pod is being killed or for an
        image the agent does not know)."""
        if self.images.get(container.image) is None:
            return None
        message_file = root / f"{container.name}.termination-log"
        message_file.write_bytes(b"")
        argv = self._bwrap_argv(pod, container, root, message_file)
        argv += ["--", *(container.command or ()), *(container.args or ())]
        log = root / f"{container.name}.log"
        with running.lock:
            if running.killed:
                return None
            with log.open("ab") as out:
                process = subprocess.Popen(
                    argv,
                    env=self._env(pod, container),
                    stdout=out,
                    stderr=out,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            running.processes.append(process)
        return process

    def _bwrap_argv(
        self, pod: client.V1Pod, container: Any, root: Path, message_file: Path | None
    ) -> list[str]:
        """bubblewrap arguments that build the container's file system (no command)."""
        overlays = self.images.get(container.image) or {}
        network = self.networks.get(pod.metadata.uid)
        argv = [
            *(["nsenter", f"--net={network.path}"] if network is not None else []),
            "bwrap",
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--tmpfs",
            "/",
            # /tmp first: a checkout under /tmp (extra_ro) is bound over it, not hidden.
            "--tmpfs",
            "/tmp",
        ]
        for base in BASE_DIRS:
            argv += ["--ro-bind", base, base]
        for link, target in BASE_LINKS.items():
            argv += ["--symlink", target, link]
        for path in self.extra_ro:
            argv += ["--ro-bind", str(path), str(path)]
        argv += ["--dev", "/dev", "--proc", "/proc", "--dir", "/root"]
        for inside, outside in overlays.items():
            argv += ["--ro-bind", str(outside), inside]
        for mount in container.volume_mounts or ():
            flag = "--ro-bind" if mount.read_only else "--bind"
            argv += [flag, str(root / "volumes" / mount.name), mount.mount_path]
        argv += ["--ro-bind", str(root / "hosts"), "/etc/hosts"]
        if message_file is not None:
            path = container.termination_message_path or "/dev/termination-log"
            argv += ["--bind", str(message_file), path]
        if container.working_dir:
            argv += ["--chdir", container.working_dir]
        return argv


def relay_bundle(directory: Path) -> Path:
    """A relay image's /opt/maka-eval: bin/maka-relay runs this checkout's relay."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "maka-relay"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m maka_eval.relay "$@"\n')
    script.chmod(0o755)
    # The manifest the Pod's init container checks its copy against (k8s/relay_bundle.py).
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    (directory / "checksums.sha256").write_text(f"{digest}  ./bin/maka-relay\n")
    return directory


def egress_image_bin(directory: Path) -> Path:
    """An egress image's /usr/local/bin: its python3 is this checkout's interpreter
    (maka_eval and mitmproxy, as the image holds them)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "python3"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    script.chmod(0o755)
    return directory


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None and os.geteuid() == 0
