"""The task's image: pulled when task.toml names one the engine lacks, or built from
environment/Dockerfile under a tag of the folder's content (`build_tag`: the same folder,
the same tag, so an unchanged task is never built again); inspected once per run."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter, deque
from typing import Any

from maka_eval.sandbox.container.engine import LABEL, api_message, client_for
from maka_eval.sandbox.plans import ContainerPlan

BUILD_REPOSITORY = "maka-eval-task"

image_builds: Counter[str] = Counter()
"""Image tag -> builds this process made (a second run of an unchanged task makes none)."""

_lock = threading.Lock()
_image_locks: dict[str, threading.Lock] = {}
_resolved: dict[tuple[str, str], dict[str, Any]] = {}
"""Images resolved in this run, by engine and name: their inspection (`ensure_image`)."""


class ImageError(RuntimeError):
    """The task's image cannot be had (build failed or timed out, pull failed)."""


def build_tag(task_id: str, environment_digest: str) -> str:
    """The image an environment/ folder is built under: the same folder, the same tag."""
    name = re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("._-") or "task"
    digest = environment_digest.removeprefix("sha256:")[:16]
    return f"{BUILD_REPOSITORY}/{name}:{digest}"


def _image_lock(image: str) -> threading.Lock:
    with _lock:
        return _image_locks.setdefault(image, threading.Lock())


def forget_images() -> None:
    """Resolve every image again (the executor calls this when a run starts): within a
    run an image is resolved once, and its containers are created from that image by
    id, so a tag moved during the run changes none of its attempts."""
    with _lock:
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
        with _lock:
            _resolved[key] = info
        return info


def forget_image(plan: ContainerPlan) -> None:
    """Resolve the plan's image again next time (it was removed since it was resolved)."""
    with _lock:
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
        raise ImageError(f"building {where} failed: {api_message(exc)}") from None
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
        raise failed(api_message(exc)) from None
    finally:
        api.close()


def _split_reference(reference: str) -> tuple[str, str | None]:
    if "@" in reference:
        return reference, None
    name, _, tag = reference.rpartition(":")
    if name and "/" not in tag:
        return name, tag
    return reference, "latest"
