"""`executor.config` of `executor.kind: harbor`, and the pinned Harbor version.

    executor:
      kind: harbor
      config:
        environment: {type: podman, delete: false}   # any Harbor environment + options

`environment` is Harbor's own environment config, passed through: the keys of Harbor's
`EnvironmentConfig` (type, import_path, force_build, delete, override_cpus, ...) as they
are, and any other key as an option of that environment type (Harbor's `kwargs`, e.g.
`keep_containers` for docker and podman). Harbor's interpreter validates it against the
pinned version's own models before any trial starts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from maka_eval.spec.base import SpecModel
from maka_eval.spec.experiment import RuntimeHost

HARBOR_VERSION = "0.26"
"""The Harbor release line this executor drives (any 0.26.x)."""
PYTHON_ENV = "MAKA_EVAL_HARBOR_PYTHON"
"""The machine-path variable naming Harbor's Python interpreter."""

ENVIRONMENT_CONFIG_KEYS = frozenset(
    {
        "type",
        "import_path",
        "force_build",
        "delete",
        "stream",
        "cpu_enforcement_policy",
        "memory_enforcement_policy",
        "override_cpus",
        "override_memory_mb",
        "override_storage_mb",
        "override_gpus",
        "override_tpu",
        "mounts",
        "extra_docker_compose",
        "env",
        "kwargs",
        "extra_allowed_hosts",
    }
)
"""Harbor 0.26's EnvironmentConfig fields; other keys are the environment's options."""

OFFLINE_PODMAN = "maka_eval_harbor.environment:OfflinePodmanEnvironment"


class HarborExecutorConfig(SpecModel):
    """Settings of the Harbor executor: every attempt is one Harbor trial."""

    environment: dict[str, Any] = Field(
        default_factory=lambda: {"type": "docker"},
        description=(
            "Harbor's environment: `type` (docker, podman, daytona, modal, gke, ...; "
            "Harbor's default: docker) or `import_path`, Harbor's environment settings "
            "(delete, force_build, override_cpus, ...) and that environment's options."
        ),
    )
    harbor_version: Literal["0.26"] = Field(
        default="0.26",
        description="The Harbor release line the experiment is frozen with (0.26.x).",
    )
    runtime_host: RuntimeHost | None = Field(
        default=None,
        description="Runtime Host command inside the task environment; required for 'maka'.",
    )

    @field_validator("environment")
    @classmethod
    def _environment(cls, value: dict[str, Any]) -> dict[str, Any]:
        kind, path = value.get("type"), value.get("import_path")
        if kind is None and path is None:
            raise ValueError("give `type` (e.g. podman, docker, daytona) or `import_path`")
        for key, found in (("type", kind), ("import_path", path)):
            if found is not None and (not isinstance(found, str) or not found.strip()):
                raise ValueError(f"`{key}` must be a non-empty string")
        options = value.get("kwargs")
        if options is not None and not isinstance(options, dict):
            raise ValueError("`kwargs` must be a mapping of the environment's options")
        return value


def harbor_environment(config: HarborExecutorConfig) -> dict[str, Any]:
    """Harbor's EnvironmentConfig for `config.environment`: its own fields kept, other
    keys moved into `kwargs`; `podman` gets the offline-capable Podman environment."""
    given = dict(config.environment)
    options = dict(given.pop("kwargs", None) or {})
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key in ENVIRONMENT_CONFIG_KEYS:
            out[key] = value
        else:
            options[key] = value
    if options:
        out["kwargs"] = options
    if out.get("type") == "podman" and "import_path" not in out:
        # The same environment, which also runs no-network tasks without a registry.
        del out["type"]
        out["import_path"] = OFFLINE_PODMAN
    return out
