"""The container backend: the attempt runs in the task's image, through a Docker Engine
API (Docker, or Podman's compatible socket). One idea per module:

- `engine`: finding an engine that answers, its SDK client, creating a container;
- `images`: the task's image, pulled or built under a tag of its folder's content;
- `archive`: tar archives in and out of a container, never following a link;
- `shell`: the shell programs run in the container (scripts/*.sh, package data);
- `image_facts`: what an image holds, read from the holder's report;
- `verifier_argv`: the toolbox's bash for the verifier's bash script;
- `sandbox`: `ContainerSandbox`, one attempt in one container;
- `removal`: removing containers in the background, and what a dead run left;
- `backend`: the `container` kind in the sandbox registry.

This package exports the public API; code inside maka-eval imports from the modules.
"""

from maka_eval.sandbox.container.engine import EngineInfo, EngineProbe, client_for, engine_info
from maka_eval.sandbox.container.images import (
    ImageError,
    build_tag,
    ensure_image,
    forget_images,
    image_builds,
)
from maka_eval.sandbox.container.removal import (
    drain_removals,
    leftover_containers,
    remove_leftovers,
)
from maka_eval.sandbox.container.sandbox import ContainerSandbox

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
