"""Harbor-format task directories: what a task is made of, read from disk.

A task directory holds `instruction.md`, an optional `task.toml`, an optional
`environment/` (a Dockerfile building the task's image, or files placed in the
workspace), `tests/test.sh` (the verifier) and an optional `solution/solve.sh` (for the
oracle). A multi-step task (`[[steps]]`) has, per step, `steps/<name>/instruction.md` and
optionally its own `tests/`, `workdir/` and `solution/` (TaskStep). Every task.toml field
Harbor honours is read here; a field Harbor knows that
maka-eval does not honour, and a field nobody knows, is a warning naming it and the file
(Harbor itself ignores unknown fields silently, which hides typos).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import tomllib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from maka_eval.egress.policy import allowed_host_entry
from maka_eval.engine.environment import Healthcheck, TaskArtifact
from maka_eval.engine.modes import NetworkMode
from maka_eval.errors import Problem, TaskError

if TYPE_CHECKING:
    # Only `load_tasks` reads an experiment: the relay in a Pod reads one task with
    # `load_task` and must not load pydantic (relay.plan.with_task_dir).
    from maka_eval.spec.experiment import Experiment

IMAGE_BUILD_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml", "compose.yaml")
COMPOSE_FILES = IMAGE_BUILD_FILES[1:]
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
NETWORK_MODES = tuple(mode.value for mode in NetworkMode)


@dataclass(frozen=True)
class TaskDefinition:
    """One task as found on disk, with a digest of its whole directory."""

    id: str
    root: Path
    instruction_file: Path
    tests_dir: Path
    environment_dir: Path | None
    solution_dir: Path | None
    agent_timeout_sec: float | None
    verifier_timeout_sec: float | None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)
    docker_image: str | None = None
    image_build_file: str | None = None
    digest: str = ""
    environment_digest: str | None = None
    """Digest of the environment/ folder: names the image built from its Dockerfile."""
    agent_user: str | None = None
    """`[agent] user`: who the subject runs as in the task's container (image default)."""
    verifier_user: str | None = None
    """`[verifier] user`: who tests/test.sh runs as in the task's container."""
    environment_env: Mapping[str, str] = field(default_factory=dict)
    """`[environment] env`, templates filled: set in the task's container for everyone."""
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int = 0
    build_timeout_sec: float = DEFAULT_BUILD_TIMEOUT_SEC
    workdir: str | None = None
    network_mode: NetworkMode = NetworkMode.PUBLIC
    """Harbor's `public` (the default), `no-network` (also `allow_internet = false`) or
    `allowlist`."""
    allowed_hosts: tuple[str, ...] = ()
    """`[environment] allowed_hosts` of an `allowlist` task, in Harbor's normal form (host
    names, `*.` wildcards, IP addresses and networks): the only hosts it may reach."""
    healthcheck: Healthcheck | None = None
    """`[environment.healthcheck]`: run once the sandbox is up, before any subject; an
    environment that never becomes healthy is an infrastructure failure."""
    artifacts: tuple[TaskArtifact, ...] = ()
    """task.toml `artifacts`: collected from the environment after the subject."""
    warnings: tuple[str, ...] = ()
    """Fields of task.toml that are unknown or not honoured, each naming the file."""
    steps: tuple[TaskStep, ...] = ()
    """`[[steps]]`: a multi-step task (empty: a single-step task)."""
    step_reward_strategy: str = "mean"
    """`multi_step_reward_strategy`: `mean` (per-key means over the steps that were
    verified, a missing key counting 0) or `final` (the last step's rewards)."""

    @property
    def needs_image(self) -> bool:
        """Whether the task runs in a container image (a Dockerfile or `docker_image`)."""
        return self.image_build_file is not None or self.docker_image is not None


def directory_digest(root: Path) -> str:
    """sha256 over every file's relative path, executable bit and content, in path order.

    Symlinks are followed (a linked `tests/` folder is part of the task: a changed
    verifier must change the digest); a link back to a folder above it is recorded, not
    followed. Only regular files are read: a FIFO or device is recorded by its type.
    """
    digest = hashlib.sha256()
    info = root.stat()
    _digest_folder(digest, root, "", frozenset({(info.st_dev, info.st_ino)}))
    return "sha256:" + digest.hexdigest()


def _digest_folder(
    digest: Any, folder: Path, prefix: str, ancestors: frozenset[tuple[int, int]]
) -> None:
    # The files of a folder, then its subfolders, each in name order (the order os.walk
    # gave before links were followed, so digests of link-free tasks did not change).
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        digest.update(f"{prefix}\0unreadable\0".encode())
        return
    files: list[tuple[str, os.stat_result | None]] = []
    folders: list[tuple[str, os.stat_result]] = []
    for name in names:
        try:
            info: os.stat_result | None = (folder / name).stat()
        except OSError:  # a dangling link or a link loop
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode):
            folders.append((name, info))
        else:
            files.append((name, info))
    for name, info in files:
        path = folder / name
        digest.update(f"{prefix}{name}\0{int(os.access(path, os.X_OK))}\0".encode())
        if info is None:
            target = os.readlink(path) if path.is_symlink() else ""
            digest.update(b"dangling\0" + target.encode())
        elif stat.S_ISREG(info.st_mode):
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 16), b""):
                    digest.update(chunk)
        else:
            digest.update(f"special\0{stat.S_IFMT(info.st_mode):o}".encode())
        digest.update(b"\0")
    for name, info in folders:
        key = (info.st_dev, info.st_ino)
        if key in ancestors:
            digest.update(f"{prefix}{name}/\0cycle\0".encode())
            continue
        _digest_folder(digest, folder / name, f"{prefix}{name}/", ancestors | {key})


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def fill_templates(value: str, host_env: Mapping[str, str]) -> tuple[str, list[str]]:
    """`${VAR}` and `${VAR:-default}` filled from `host_env`, as Harbor does; the names
    of the variables that are unset and have no default."""
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = host_env.get(name)
        if default is not None:
            return found or default  # shell semantics: unset or empty takes the default
        if found is None:
            missing.append(name)
            return ""
        return found

    return _TEMPLATE.sub(substitute, value), missing


# task.toml, as Harbor 0.26 reads it (models/task/config.py). Per table: the fields
# maka-eval honours, and the fields Harbor knows that maka-eval does not honour (a
# warning when they hold a value). [task] and [metadata] are descriptive: never warned.
_HONOURED: dict[str, frozenset[str]] = {
    "": frozenset(
        {"schema_version", "version", "source", "task", "metadata", "agent", "verifier"}
        | {"solution", "environment", "steps", "artifacts", "multi_step_reward_strategy"}
    ),
    # A phase's network_mode/allowed_hosts: honoured when it is the environment's policy,
    # refused otherwise (`_TaskToml.phase_network`).
    "agent": frozenset({"timeout_sec", "user", "network_mode", "allowed_hosts"}),
    "verifier": frozenset({"timeout_sec", "env", "user", "network_mode", "allowed_hosts"}),
    "solution": frozenset({"env"}),
    "environment": frozenset(
        {"build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "gpus"}
        | {"env", "workdir", "network_mode", "allow_internet", "memory", "storage"}
        | {"allowed_hosts", "healthcheck"}
    ),
}
_NOT_HONOURED: dict[str, frozenset[str]] = {
    "verifier": frozenset({"environment_mode", "environment", "collect"}),
    "environment": frozenset({"gpu_types", "tpu", "mcp_servers", "skills_dir"}),
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*$", re.IGNORECASE)
_SIZE_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class _TaskToml:
    """Reads the fields of one task.toml, collecting problems and warnings."""

    def __init__(
        self,
        path: Path,
        config: Mapping[str, Any],
        host_env: Mapping[str, str],
        withheld: frozenset[str] = frozenset(),
    ):
        self.path = path
        self.config = config
        self.withheld = withheld
        """Credentials a subject declares: no task file is filled with them."""
        self.host_env = {k: v for k, v in host_env.items() if k not in withheld}
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def table(self, name: str) -> Mapping[str, Any]:
        value = self.config.get(name, {})
        if not isinstance(value, Mapping):
            self.problems.append(Problem(f"{self.path} [{name}]", "must be a table"))
            return {}
        return value

    def check_fields(self) -> None:
        """Warn about every field that is unknown, or known and not honoured."""
        for name in self.config:
            if name not in _HONOURED[""]:
                self._unknown(name)
        for section in ("agent", "verifier", "solution", "environment"):
            table = self.config.get(section)
            if not isinstance(table, Mapping):
                continue
            for name, value in table.items():
                if name in _HONOURED[section]:
                    continue
                if name in _NOT_HONOURED.get(section, ()):
                    if section == "verifier" and name == "environment_mode" and value == "shared":
                        continue
                    if value not in (None, "", [], {}):
                        self.warnings.append(
                            f"{self.path}: [{section}] {name} is not honoured by maka-eval; ignored"
                        )
                else:
                    self._unknown(f"[{section}] {name}")

    def _unknown(self, name: str) -> None:
        self.warnings.append(
            f"{self.path}: unknown field {name} (not a Harbor task.toml field; a typo?); ignored"
        )

    # -- typed fields -----------------------------------------------------------------
    def number(self, section: str, name: str, *, integer: bool = False) -> float | None:
        table = self.table(section)
        if name not in table:
            return None
        value = table[name]
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
            kind = "a positive whole number" if integer else "a positive number"
            self.problems.append(
                Problem(f"{self.path} [{section}]", f"{name} must be {kind}, got {value!r}")
            )
            return None
        return float(value)

    def user(self, section: str) -> str | None:
        value = self.table(section).get("user")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            self.problems.append(
                Problem(
                    f"{self.path} [{section}]",
                    f"user must be a user name or a numeric uid, got {value!r}",
                )
            )
            return None
        return str(value)

    def env(self, section: str) -> dict[str, str]:
        env = self.table(section).get("env", {})
        where = f"{self.path} [{section}.env]"
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            self.problems.append(Problem(where, "env must be a table of string values"))
            return {}
        filled: dict[str, str] = {}
        for key, raw in env.items():
            named = {m.group(1) for m in _TEMPLATE.finditer(raw)} & self.withheld
            for name in sorted(named):
                # The task's env reaches every arm's container (and a verifier): a
                # credential reaches only the subject that declares it.
                self.problems.append(
                    Problem(
                        where,
                        f"{key} = {raw!r} names {name}, a credential a subject declares: "
                        "task files never receive credentials (only the subjects that "
                        "declare them do); remove it, or name another variable",
                    )
                )
            if named:
                continue
            value, missing = fill_templates(raw, self.host_env)
            for name in missing:
                self.problems.append(
                    Problem(
                        where,
                        f"{key} = {raw!r} needs the environment variable {name}, which is "
                        f"not set; export it, or give a default: ${{{name}:-value}}",
                    )
                )
            filled[key] = value
        return filled

    def size_mb(self, name: str, legacy: str) -> int | None:
        """`memory_mb`, else Harbor's deprecated `memory = "4G"` (the same for storage)."""
        environment = self.table("environment")
        if name in environment:
            value = self.number("environment", name, integer=True)
            return int(value) if value is not None else None
        if legacy not in environment:
            return None
        raw = environment[legacy]
        match = _SIZE.match(raw) if isinstance(raw, str) else None
        if match is None:
            self.problems.append(
                Problem(
                    f"{self.path} [environment]",
                    f'{legacy} must be a size such as "512M" or "4G", got {raw!r} (or give {name})',
                )
            )
            return None
        return max(1, math.ceil(float(match.group(1)) * _SIZE_MB[match.group(2).upper()]))

    def network_mode(self) -> NetworkMode:
        environment = self.table("environment")
        mode = environment.get("network_mode", NetworkMode.PUBLIC.value)
        if mode not in NETWORK_MODES:
            self.problems.append(
                Problem(
                    f"{self.path} [environment]",
                    f"network_mode must be one of {', '.join(NETWORK_MODES)}, got {mode!r}",
                )
            )
            return NetworkMode.PUBLIC
        allow = environment.get("allow_internet")
        if allow is not None and not isinstance(allow, bool):
            self.problems.append(
                Problem(
                    f"{self.path} [environment]",
                    f"allow_internet must be true or false, got {allow!r}",
                )
            )
        elif allow is False and mode == NetworkMode.PUBLIC:
            return NetworkMode.NO_NETWORK  # Harbor maps the deprecated flag the same way
        return NetworkMode(mode)

    def allowed_hosts(self, mode: NetworkMode) -> tuple[str, ...]:
        """`[environment] allowed_hosts`, normalized; only with network_mode = allowlist."""
        hosts = self.table("environment").get("allowed_hosts")
        where = f"{self.path} [environment]"
        if hosts is None:
            return ()
        if mode is not NetworkMode.ALLOWLIST:
            message = (
                "allowed_hosts is only valid with network_mode = 'allowlist'; set it or remove them"
            )
            self.problems.append(Problem(where, message))
            return ()
        if not isinstance(hosts, list):
            self.problems.append(
                Problem(where, f"allowed_hosts must be a list of hosts, got {hosts!r}")
            )
            return ()
        found: list[str] = []
        for i, host in enumerate(hosts):
            try:
                found.append(allowed_host_entry(host))
            except ValueError as exc:
                self.problems.append(Problem(where, f"allowed_hosts[{i}]: {exc}"))
        return tuple(dict.fromkeys(found))

    def phase_network(self, section: str, mode: NetworkMode, hosts: tuple[str, ...]) -> None:
        """`[agent]`/`[verifier]` network_mode and allowed_hosts, Harbor's per-phase
        override: accepted when it is the environment's own policy (`mode`, `hosts`), a
        problem otherwise. Every phase of an attempt here has the environment's network;
        ignoring the override would give an agent a network its task denies it."""
        table = self.table(section)
        phase_mode, phase_hosts = table.get("network_mode"), table.get("allowed_hosts")
        if phase_mode is None and phase_hosts is None:
            return
        where = f"{self.path} [{section}]"
        if phase_mode is None:
            message = "allowed_hosts is only valid with network_mode = 'allowlist'; set it"
            self.problems.append(Problem(where, message))
            return
        if phase_mode not in NETWORK_MODES:
            self.problems.append(
                Problem(
                    where,
                    f"network_mode must be one of {', '.join(NETWORK_MODES)}, got {phase_mode!r}",
                )
            )
            return
        found: set[str] = set()
        if phase_hosts is not None:
            if phase_mode != NetworkMode.ALLOWLIST or not isinstance(phase_hosts, list):
                message = "allowed_hosts must be a list of hosts, with network_mode = 'allowlist'"
                self.problems.append(Problem(where, message))
                return
            for i, host in enumerate(phase_hosts):
                try:
                    found.add(allowed_host_entry(host))
                except ValueError as exc:
                    self.problems.append(Problem(where, f"allowed_hosts[{i}]: {exc}"))
                    return
        if (phase_mode, found) == (mode, set(hosts)):
            return  # the environment's own policy: nothing to switch
        phase = "agent" if section == "agent" else "verifier"
        allowlist = NetworkMode.ALLOWLIST
        own = f"{phase_mode!r}" + (f" with {sorted(found)}" if phase_mode == allowlist else "")
        base = f"{mode.value!r}" + (f" with {sorted(hosts)}" if mode is allowlist else "")
        self.problems.append(
            Problem(
                where,
                f"network_mode {own} differs from [environment] network_mode {base}; "
                f"maka-eval runs every phase of an attempt with the environment's network "
                f"and cannot give the {phase} one of its own: set [environment] "
                f"network_mode to what the task needs, or remove [{section}] network_mode",
            )
        )

    def string(self, section: str, name: str) -> str | None:
        value = self.table(section).get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.problems.append(
                Problem(
                    f"{self.path} [{section}]", f"{name} must be a non-empty string, got {value!r}"
                )
            )
            return None
        return value

    def workdir(self) -> str | None:
        value = self.string("environment", "workdir")
        if value is not None and not value.startswith("/"):
            self.problems.append(
                Problem(
                    f"{self.path} [environment]", f"workdir must be an absolute path, got {value!r}"
                )
            )
            return None
        return value

    def gpus(self) -> int:
        value = self.table("environment").get("gpus", 0)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.problems.append(
                Problem(
                    f"{self.path} [environment]", f"gpus must be a whole number >= 0, got {value!r}"
                )
            )
            return 0
        return value

    def check_os(self) -> None:
        value = self.table("environment").get("os", "linux")
        if value != "linux":
            self.problems.append(
                Problem(
                    f"{self.path} [environment]",
                    f"os = {value!r}: maka-eval runs Linux tasks only",
                )
            )


_STEP_NAME_INVALID = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_STEP_FIELDS = frozenset({"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"})
STEP_REWARD_STRATEGIES = ("mean", "final")


def _artifacts(value: object, where: str, problems: list[Problem]) -> tuple[TaskArtifact, ...]:
    """task.toml `artifacts`: strings (a source) or tables (source, destination, exclude;
    `service` only for the main container), checked as Harbor checks them."""
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append(Problem(where, f"artifacts must be a list, got {value!r}"))
        return ()
    found: list[TaskArtifact] = []
    for i, entry in enumerate(value):
        at = f"{where} artifacts[{i}]"
        table: Mapping[str, Any] = {"source": entry} if isinstance(entry, str) else entry
        if not isinstance(table, Mapping):
            problems.append(Problem(at, f"must be a path or a table, got {entry!r}"))
            continue
        unknown = sorted(set(table) - {"source", "destination", "exclude", "service"})
        source, destination = table.get("source"), table.get("destination") or None
        exclude = table.get("exclude", [])
        if unknown:
            problems.append(Problem(at, f"has unknown field(s) {', '.join(unknown)}"))
        elif table.get("service") not in (None, "main"):
            problems.append(
                Problem(
                    at,
                    f"service {table['service']!r}: artifacts of other compose services "
                    "cannot be collected (maka-eval runs no multi-container tasks)",
                )
            )
        elif not isinstance(source, str) or not source.strip():
            problems.append(Problem(at, f"source must be a path, got {source!r}"))
        elif ".." in PurePosixPath(source).parts:
            problems.append(Problem(at, f"source must not contain '..', got {source!r}"))
        elif destination is not None and (
            not isinstance(destination, str)
            or "\\" in destination
            or PurePosixPath(destination).is_absolute()
            or ".." in PurePosixPath(destination).parts
            or not PurePosixPath(destination).parts
        ):
            problems.append(
                Problem(
                    at,
                    f"destination must be a relative path without '..', got {destination!r}",
                )
            )
        elif not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
            problems.append(Problem(at, f"exclude must be a list of patterns, got {exclude!r}"))
        else:
            found.append(TaskArtifact(source, destination, tuple(exclude)))
    return tuple(found)


_HEALTHCHECK_NUMBERS = ("interval_sec", "timeout_sec", "start_period_sec", "start_interval_sec")


def _healthcheck(value: object, where: str, problems: list[Problem]) -> Healthcheck | None:
    """A `healthcheck` table, checked field by field (problems name the field)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        problems.append(Problem(where, f"healthcheck must be a table, got {value!r}"))
        return None
    found = len(problems)
    unknown = sorted(set(value) - {"command", "retries", *_HEALTHCHECK_NUMBERS})
    if unknown:
        problems.append(Problem(where, f"healthcheck has unknown field(s) {', '.join(unknown)}"))
    command = value.get("command")
    if not isinstance(command, str) or not command.strip():
        problems.append(
            Problem(where, f"healthcheck.command must be a shell command, got {command!r}")
        )
    numbers: dict[str, float] = {}
    for name in _HEALTHCHECK_NUMBERS:
        if name not in value:
            continue
        number = value[name]
        if (
            isinstance(number, bool)
            or not isinstance(number, int | float)
            or not (math.isfinite(number) and number >= 0)
        ):
            problems.append(
                Problem(
                    where, f"healthcheck.{name} must be a number of seconds >= 0, got {number!r}"
                )
            )
        else:
            numbers[name] = float(number)
    retries = value.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        problems.append(
            Problem(where, f"healthcheck.retries must be a whole number >= 0, got {retries!r}")
        )
    if len(problems) > found:
        return None
    assert isinstance(command, str) and isinstance(retries, int)
    return Healthcheck(command=command, retries=retries, **numbers)


@dataclass(frozen=True)
class TaskStep:
    """One `[[steps]]` entry of a multi-step task, as Harbor 0.26 defines it: run in
    order in the same sandbox, each with its own instruction, workdir files, setup,
    timeouts, users and verifier (the task's tests/ overlaid by the step's)."""

    name: str
    instruction_file: Path
    tests_dirs: tuple[Path, ...]
    """Copied into /tests in this order: the task's tests/, then steps/<name>/tests/
    (so the step's test.sh, when it has one, is the one that runs)."""
    workdir_dir: Path | None
    """steps/<name>/workdir/: uploaded into the workdir before the step (its setup.sh,
    if any, then runs with bash)."""
    solution_dir: Path | None
    """steps/<name>/solution/ when it holds solve.sh, else the task's solution/ (the
    oracle's, as in Harbor); None when neither has one."""
    agent_timeout_sec: float | None
    verifier_timeout_sec: float | None
    agent_user: str | None
    verifier_user: str | None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    """The task's [verifier] env with the step's on top (templates filled)."""
    min_reward: float | Mapping[str, float] | None = None
    """Abort the remaining steps when this step's rewards fall below it: a number gates
    `reward`, a table gates each of its keys (a missing key counts as -inf)."""
    healthcheck: Healthcheck | None = None
    """Run after the step's setup.sh, before its subject: an unhealthy environment ends
    the attempt there (Harbor's step healthcheck)."""
    artifacts: tuple[TaskArtifact, ...] = ()
    """Collected after the step's subject (with the task's own), before its verifier."""

    @property
    def setup_script(self) -> Path | None:
        setup = self.workdir_dir / "setup.sh" if self.workdir_dir is not None else None
        return setup if setup is not None and setup.is_file() else None


def _step_name_problem(name: object) -> str | None:
    """Harbor's rule for step names (models/task/step_name.py): one portable folder name."""
    if not isinstance(name, str):
        return f"name must be a string, got {name!r}"
    if (
        not name.strip()
        or name in {".", ".."}
        or name.endswith((".", " "))
        or _STEP_NAME_INVALID.search(name)
        or len(name.encode()) > 255
    ):
        return (
            f"name {name!r} is not a portable folder name (no path separators, control "
            "or reserved characters, trailing dots or spaces; at most 255 bytes)"
        )
    return None


def _min_reward(
    value: object, where: str, problems: list[Problem]
) -> float | Mapping[str, float] | None:
    def number(v: object) -> bool:
        return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)

    if value is None:
        return None
    if number(value):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and number(v) for k, v in value.items()
    ):
        return {k: float(v) for k, v in value.items()}
    problems.append(
        Problem(where, f"min_reward must be a number or a table of numbers, got {value!r}")
    )
    return None


def _steps(
    root: Path,
    toml: _TaskToml,
    task_verifier_env: Mapping[str, str],
    task_users: tuple[str | None, str | None],
    network: tuple[NetworkMode, tuple[str, ...]] | None,
) -> tuple[tuple[TaskStep, ...], str, list[Problem]]:
    """The `[[steps]]` of a task.toml, the reward strategy, and the problems found."""
    raw = toml.config.get("steps")
    problems: list[Problem] = []
    where = f"{toml.path} [[steps]]"
    if not isinstance(raw, list) or not raw or not all(isinstance(s, Mapping) for s in raw):
        problems.append(Problem(where, "steps must be a non-empty array of tables ([[steps]])"))
        return (), "mean", problems
    strategy = toml.config.get("multi_step_reward_strategy") or "mean"
    if strategy not in STEP_REWARD_STRATEGIES:
        problems.append(
            Problem(
                f"{toml.path} multi_step_reward_strategy",
                f"must be one of {', '.join(STEP_REWARD_STRATEGIES)}, got {strategy!r}",
            )
        )
    steps: list[TaskStep] = []
    seen: dict[str, int] = {}
    task_tests = root / "tests"
    task_solution = root / "solution"
    for index, table in enumerate(raw):
        at = f"{where}[{index}]"
        name = table.get("name")
        problem = _step_name_problem(name)
        if problem is not None:
            problems.append(Problem(at, problem))
            continue
        assert isinstance(name, str)
        key = unicodedata.normalize("NFC", name).casefold()
        if key in seen:
            problems.append(
                Problem(
                    at, f"name {name!r} is used by [[steps]][{seen[key]}] too; names are unique"
                )
            )
            continue
        seen[key] = index
        step = _TaskToml(
            Path(f"{toml.path} [[steps]][{index}]"), table, toml.host_env, toml.withheld
        )
        for field_name in table:
            if field_name not in _STEP_FIELDS:
                toml.warnings.append(
                    f"{toml.path}: unknown field [[steps]] {name} {field_name} (not a Harbor "
                    "task.toml field; a typo?); ignored"
                )
        folder = root / "steps" / name
        instruction = folder / "instruction.md"
        if not instruction.is_file():
            problems.append(Problem(at, f"{instruction} is missing; every step needs one"))
        elif not instruction.read_text(encoding="utf-8", errors="replace").strip():
            problems.append(Problem(at, f"{instruction} is empty; write the step's instruction"))
        tests = tuple(d for d in (task_tests, folder / "tests") if d.is_dir())
        if not any((d / "test.sh").is_file() for d in tests):
            problems.append(
                Problem(
                    at,
                    f"neither {folder / 'tests' / 'test.sh'} nor {task_tests / 'test.sh'} "
                    "exists; the step's verifier runs one of them",
                )
            )
        solution = next(
            (d for d in (folder / "solution", task_solution) if (d / "solve.sh").is_file()), None
        )
        verifier_env = {**task_verifier_env, **step.env("verifier")}
        agent_timeout = step.number("agent", "timeout_sec")
        verifier_timeout = step.number("verifier", "timeout_sec")
        agent_user, verifier_user = step.user("agent"), step.user("verifier")
        for section in ("agent", "verifier"):
            if network is not None:
                step.phase_network(section, *network)
        min_reward = _min_reward(table.get("min_reward"), at, problems)
        healthcheck = _healthcheck(table.get("healthcheck"), at, problems)
        artifacts = _artifacts(table.get("artifacts"), at, problems)
        problems += step.problems
        workdir = folder / "workdir"
        steps.append(
            TaskStep(
                name=name,
                instruction_file=instruction,
                tests_dirs=tests,
                workdir_dir=workdir if workdir.is_dir() else None,
                solution_dir=solution,
                agent_timeout_sec=agent_timeout,
                verifier_timeout_sec=verifier_timeout,
                agent_user=agent_user or task_users[0],
                verifier_user=verifier_user or task_users[1],
                verifier_env=verifier_env,
                min_reward=min_reward,
                healthcheck=healthcheck,
                artifacts=artifacts,
            )
        )
    return tuple(steps), str(strategy), problems


def load_task(
    task_id: str,
    root: Path,
    where: str,
    host_env: Mapping[str, str] | None = None,
    *,
    phase_networks: bool = True,
    withheld: frozenset[str] = frozenset(),
) -> tuple[TaskDefinition | None, list[Problem]]:
    """Read one task directory; return it (or None) and the problems found.

    `${VAR}` templates in task.toml's env tables are filled from `host_env` (default:
    this process's environment), as Harbor fills them from the host's, but never with
    a credential a subject declares (`withheld`: a problem names it).
    """
    problems: list[Problem] = []
    if not root.is_dir():
        return None, [Problem(where, f"task directory {root} does not exist; check the path")]
    config: dict[str, Any] = {}
    toml_path = root / "task.toml"
    if toml_path.is_file():
        try:
            config = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            problems.append(Problem(str(toml_path), f"not valid TOML: {exc}"))
    # A multi-step task's instructions and tests are its steps' (checked with them).
    multi_step = "steps" in config
    instruction = root / "instruction.md"
    if multi_step:
        pass
    elif not instruction.is_file():
        problems.append(Problem(where, f"{instruction} is missing; every task needs one"))
    elif not instruction.read_text(encoding="utf-8", errors="replace").strip():
        problems.append(Problem(where, f"{instruction} is empty; write the task's instruction"))
    test_script = root / "tests" / "test.sh"
    if not multi_step and not test_script.is_file():
        problems.append(Problem(where, f"{test_script} is missing; the verifier runs it"))

    toml = _TaskToml(toml_path, config, os.environ if host_env is None else host_env, withheld)
    toml.check_fields()
    toml.check_os()
    agent_timeout = toml.number("agent", "timeout_sec")
    verifier_timeout = toml.number("verifier", "timeout_sec")
    verifier_env = toml.env("verifier")
    solution_env = toml.env("solution")
    environment_env = toml.env("environment")
    build_timeout = toml.number("environment", "build_timeout_sec")
    cpus = toml.number("environment", "cpus")
    memory_mb = toml.size_mb("memory_mb", "memory")
    storage_mb = toml.size_mb("storage_mb", "storage")
    image = toml.string("environment", "docker_image")
    definition_fields: dict[str, Any] = {
        "agent_user": toml.user("agent"),
        "verifier_user": toml.user("verifier"),
        "workdir": toml.workdir(),
        "network_mode": toml.network_mode(),
        "gpus": toml.gpus(),
    }
    definition_fields["allowed_hosts"] = toml.allowed_hosts(definition_fields["network_mode"])
    network = (definition_fields["network_mode"], definition_fields["allowed_hosts"])
    if phase_networks:  # maka-eval runs the phases: a network of their own is refused
        for section in ("agent", "verifier"):
            toml.phase_network(section, *network)
    definition_fields["artifacts"] = _artifacts(
        toml.config.get("artifacts"), str(toml.path), toml.problems
    )
    definition_fields["healthcheck"] = _healthcheck(
        toml.table("environment").get("healthcheck"), f"{toml.path} [environment]", toml.problems
    )
    steps: tuple[TaskStep, ...] = ()
    strategy = "mean"
    if multi_step:
        users = (definition_fields["agent_user"], definition_fields["verifier_user"])
        steps, strategy, found = _steps(
            root, toml, verifier_env, users, network if phase_networks else None
        )
        problems += found
        if steps:
            instruction = steps[0].instruction_file
    problems += toml.problems

    environment_dir = root / "environment"
    build_file = next(
        (name for name in IMAGE_BUILD_FILES if (environment_dir / name).is_file()), None
    )
    solution_dir = root / "solution"
    if problems:
        return None, problems
    return (
        TaskDefinition(
            id=task_id,
            root=root,
            instruction_file=instruction,
            tests_dir=root / "tests",
            environment_dir=environment_dir if environment_dir.is_dir() else None,
            solution_dir=_oracle_solution(solution_dir, steps),
            agent_timeout_sec=agent_timeout,
            verifier_timeout_sec=verifier_timeout,
            verifier_env=verifier_env,
            solution_env=solution_env,
            docker_image=image,
            image_build_file=build_file,
            digest=directory_digest(root),
            environment_digest=(
                directory_digest(environment_dir) if build_file is not None else None
            ),
            environment_env=environment_env,
            cpus=cpus,
            memory_mb=memory_mb,
            storage_mb=storage_mb,
            build_timeout_sec=build_timeout or DEFAULT_BUILD_TIMEOUT_SEC,
            warnings=tuple(toml.warnings),
            steps=steps,
            step_reward_strategy=strategy,
            **definition_fields,
        ),
        [],
    )


def _oracle_solution(solution_dir: Path, steps: tuple[TaskStep, ...]) -> Path | None:
    """The solution folder the oracle starts from: the task's; for a multi-step task,
    the first step's (each step's own is put in its place when the step starts), and
    None unless every step has one."""
    if not steps:
        return solution_dir if (solution_dir / "solve.sh").is_file() else None
    if any(step.solution_dir is None for step in steps):
        return None
    return steps[0].solution_dir


def benchmark_root(experiment: Experiment, base_dir: Path) -> Path:
    """The folder holding the task directories."""
    # Inline tasks have no folder: nothing under the experiment's own folder is theirs.
    return (base_dir / (experiment.spec.benchmark.config.path or ".")).resolve()


def load_tasks(
    experiment: Experiment, base_dir: Path, prefix: str = ""
) -> dict[str, TaskDefinition]:
    """Read every task of the experiment; raise TaskError naming each problem."""
    if experiment.spec.benchmark.source == "inline":
        return {}  # inline tasks live in the document (their executor reads task.config)
    withheld = frozenset(c for s in experiment.spec.subjects for c in s.credentials)
    root = benchmark_root(experiment, base_dir)
    if not root.is_dir():
        raise TaskError(
            "the benchmark's task folder is missing:",
            [
                Problem(
                    f"{prefix}benchmark.config.path",
                    f"{root} is not a directory; the path is relative to the experiment file",
                )
            ],
        )
    tasks: dict[str, TaskDefinition] = {}
    problems: list[Problem] = []
    seen: dict[Path, int] = {}
    for index, task in enumerate(experiment.spec.tasks):
        where = f"{prefix}tasks[{index}]"
        folder = root / task.directory_name
        real = folder.resolve()  # symlinks too: the spec's lexical check cannot see them
        if real == root or not real.is_relative_to(root):
            problems.append(
                Problem(
                    f"{where}.path",
                    f"{folder} resolves to {real}, outside the benchmark folder {root}; "
                    "move the task inside it or fix the symlink",
                )
            )
            continue
        if real in seen:
            problems.append(
                Problem(
                    f"{where}.path",
                    f"{folder} is the same task directory as {prefix}tasks[{seen[real]}] "
                    f"(both are {real}); each task must be a different directory",
                )
            )
            continue
        seen[real] = index
        # Harbor itself runs the tasks of `executor.kind: harbor`, per-phase networks too.
        phase_networks = experiment.spec.executor.kind != "harbor"
        definition, found = load_task(
            task.id, real, where, phase_networks=phase_networks, withheld=withheld
        )
        problems += found
        if definition is not None:
            tasks[task.id] = definition
    if problems:
        raise TaskError(f"{len(problems)} problem(s) with the task directories:", problems)
    return tasks
