"""A small kubelet for the fake node: it runs the Pods the real scheduler binds to it.

The tests play the kubelet and only the kubelet. For every Pod bound to the fake node
this agent:
- makes each emptyDir volume a folder, and builds each container's file system as a
  mount namespace (bubblewrap): a fresh root holding this machine's /usr and /etc (the
  "base image"), the image's own folders from `images` (e.g. the relay bundle at
  /opt/maka-eval, the experiment folder at /benchmark), the volumes at their
  mountPaths, and a termination-message file at terminationMessagePath;
- runs the init containers in order, then the main container, as local processes in
  their own PID namespace, with the container's env (secretKeyRef values read from the
  API, as a kubelet does) and workingDir;
- writes the Pod's phase and the container's state (running, then terminated with exit
  code, reason and the termination message, capped at 4096 bytes like the kubelet)
  back to Pod status;
- on a Pod deleted (or evicted) while it runs, kills its processes and removes the Pod
  for good (grace period 0), as a kubelet does once its containers have stopped.

Everything else is the real API server, scheduler and controller manager.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
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


@dataclass
class RunningPod:
    uid: str
    process: subprocess.Popen[bytes] | None = None
    killed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


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
            running = RunningPod(uid)
            self.pods[uid] = running
            self.started += 1
            threading.Thread(
                target=self._run_pod,
                args=(pod, running),
                name=f"pod-{pod.metadata.name}",
                daemon=True,
            ).start()

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
            if running.process is not None and running.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(running.process.pid, signal.SIGKILL)

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
        root = (
            self.work_dir / pod.metadata.namespace / f"{pod.metadata.name}-{pod.metadata.uid[:8]}"
        )
        volumes = root / "volumes"
        volumes.mkdir(parents=True, exist_ok=True)
        for volume in pod.spec.volumes or ():
            (volumes / volume.name).mkdir(exist_ok=True)
        subject = pod.spec.containers[0]
        started = _now()
        init_statuses: list[dict[str, Any]] = []
        for init in pod.spec.init_containers or ():
            code, _ = self._run_container(pod, init, root, running)
            init_statuses.append(self._terminated(init, code, "", started))
            if code != 0:
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
        if running.killed:
            return
        reason = "Completed" if code == 0 else "Error"
        self._patch_status(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [self._terminated(subject, code, message, started, reason)],
            },
        )

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
                import base64

                env[var.name] = base64.b64decode((secret.data or {})[ref.key]).decode()
        return env

    def _run_container(
        self, pod: client.V1Pod, container: Any, root: Path, running: RunningPod
    ) -> tuple[int, str]:
        overlays = self.images.get(container.image)
        if overlays is None:
            return 1, f"image {container.image} is not known to the node agent"
        message_file = root / f"{container.name}.termination-log"
        message_file.write_bytes(b"")
        argv = [
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
        path = container.termination_message_path or "/dev/termination-log"
        argv += ["--bind", str(message_file), path]
        if container.working_dir:
            argv += ["--chdir", container.working_dir]
        argv += ["--", *(container.command or ()), *(container.args or ())]
        log = root / f"{container.name}.log"
        with running.lock:
            if running.killed:
                return 137, ""
            with log.open("ab") as out:
                running.process = subprocess.Popen(
                    argv,
                    env=self._env(pod, container),
                    stdout=out,
                    stderr=out,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        code = running.process.wait()
        message = message_file.read_bytes()[:MESSAGE_LIMIT].decode("utf-8", "replace")
        return (code if code >= 0 else 128 - code), message


def relay_bundle(directory: Path) -> Path:
    """A relay image's /opt/maka-eval: bin/maka-relay runs this checkout's relay."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "maka-relay"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m maka_eval.relay "$@"\n')
    script.chmod(0o755)
    return directory


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None and os.geteuid() == 0
