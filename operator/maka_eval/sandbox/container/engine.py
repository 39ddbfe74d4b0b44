"""The Docker Engine API (Docker, or Podman's compatible socket): finding an engine that
answers, one SDK client per engine, creating a container, and what the engine's list of a
container's changes may miss."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maka_eval import layout
from maka_eval.sandbox import exec as exec_helper

ENGINE_SOCKETS = (
    f"unix://{layout.HOST_PODMAN_SOCKET}",
    "unix:///var/run/docker.sock",
    "unix:///run/podman/podman.sock",
)
"""Where an engine is looked for when DOCKER_HOST is not set (hack/podman.sh's first)."""
LABEL = "dev.maka.eval"
"""The prefix of the labels maka-eval puts on the containers and images it makes."""
CLIENT_TIMEOUT = 120
PROBE_TIMEOUT = 3.0

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


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


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


def api_message(exc: Exception) -> str:
    """What the engine said in an SDK error, short enough for a note."""
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()[:800]


def create_container(client: Any, image: str, kwargs: dict[str, Any]) -> str:
    """Create a container; its id. The SDK's `containers.create` inspects what it made, one
    more round trip to the engine: this is the same call without it."""
    from docker.models.containers import _create_container_args

    args = _create_container_args({**kwargs, "image": image, "version": client.api._version})
    return str(client.api.create_container(**args)["Id"])


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
