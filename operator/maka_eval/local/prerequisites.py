"""What a local run needs on this machine, checked before anything starts.

Every missing piece is reported at once, naming the spec field or environment variable
and the fix; when any is missing, no run directory is created and no subject starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from maka_eval.egress.proxy import mitmdump_path
from maka_eval.engine.modes import Isolation, NetworkMode, needs_policing
from maka_eval.errors import PrerequisiteError, Problem
from maka_eval.local.netns import enforcement_unavailable
from maka_eval.sandbox import backends
from maka_eval.sandbox.backends import SandboxLoadError
from maka_eval.sandbox.container.engine import EngineInfo, engine_info
from maka_eval.sandbox.holders import runtime_path
from maka_eval.sandbox.process import namespaces_unavailable
from maka_eval.sandbox.toolbox import toolbox_problem
from maka_eval.spec.egress import EgressConfig
from maka_eval.spec.experiment import Experiment, LocalExecutor, LocalExecutorConfig, Task
from maka_eval.spec.load import LoadedExperiment
from maka_eval.spec.subjects import ExternalSubject, MakaSubject, OracleSubject
from maka_eval.spec.task_directory import COMPOSE_FILES, TaskDefinition

WORK_DIR_VARIABLE = "MAKA_EVAL_WORK_DIR"


def work_root_path(host_env: Mapping[str, str]) -> Path:
    """Where attempt workspaces live: $MAKA_EVAL_WORK_DIR, or a per-user folder in the
    system temp folder; never inside a run directory."""
    configured = host_env.get(WORK_DIR_VARIABLE)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"maka-eval-{os.getuid()}"


def resolve_command(command: str, base_dir: Path, path_env: str | None) -> Path | None:
    """The program a spec's command names: a path from the experiment's folder, or PATH."""
    if "/" in command:
        candidate = Path(command) if os.path.isabs(command) else base_dir / command
        return (
            candidate.resolve() if candidate.is_file() and os.access(candidate, os.X_OK) else None
        )
    found = shutil.which(command, path=path_env)
    return Path(found) if found else None


def _command_problem(
    command: str, where: str, base_dir: Path, isolation: Isolation = Isolation.NONE
) -> Problem:
    if "/" in command:
        path = Path(command) if os.path.isabs(command) else base_dir / command
        if path.is_file():
            return Problem(where, f"{path} is not executable; chmod +x it")
        return Problem(where, f"{path} does not exist (relative paths start at {base_dir})")
    if isolation is Isolation.NAMESPACES:
        return Problem(
            where,
            f"'{command}' is not on PATH (its folders that the process sandbox shows: /usr, "
            "/bin, ...; a user's own folders are not); install it there or give its path",
        )
    return Problem(where, f"'{command}' is not on PATH; install it or give its path")


@dataclass(frozen=True)
class ResolvedCommands:
    """Absolute programs for each subject id (and the Runtime Host), and what isolates
    the attempts here."""

    subjects: Mapping[str, Path]
    runtime_host: Path | None
    isolation: Isolation = Isolation.NONE
    """NAMESPACES or NONE: `executor.config.isolation` resolved on this machine, for
    the tasks that run as processes."""
    containers: frozenset[str] = frozenset()
    """Ids of the tasks that run in their container image (the container sandbox)."""
    engine: EngineInfo | None = None
    """The container engine found (whether or not any task needs it)."""
    engine_search: str = ""
    """What the engine search found or tried, for `validate` to say."""
    sandbox: str | None = None
    """An installed sandbox backend's kind (executor.config.sandbox) that runs every
    task; None: maka-eval's own, per task (`isolation`, `containers`)."""
    spelled: Mapping[str, Path] = field(default_factory=dict)
    """Subject id -> its program as the spec names it by path, made absolute but with
    its links kept (a virtualenv's bin/python, a link to an agent elsewhere): what the
    process sandbox shows besides the resolved program (local.plans.program_view)."""


def resolve_isolation(asked: str) -> Isolation:
    """'auto' becomes what this machine can do."""
    if Isolation(asked) is Isolation.AUTO:
        return Isolation.NAMESPACES if namespaces_unavailable() is None else Isolation.NONE
    return Isolation(asked)


def _prefix(loaded: LoadedExperiment) -> str:
    return "spec." if loaded.form == "kubernetes" else ""


def check_prerequisites(
    loaded: LoadedExperiment, tasks: Mapping[str, TaskDefinition], host_env: Mapping[str, str]
) -> ResolvedCommands:
    """Check everything the local executor needs; PrerequisiteError lists what is missing."""
    experiment: Experiment = loaded.experiment
    spec = experiment.spec
    prefix = _prefix(loaded)
    executor = spec.executor
    if not isinstance(executor, LocalExecutor):
        raise PrerequisiteError(
            "this experiment is not for the local executor; nothing was started:",
            [
                Problem(
                    f"{prefix}executor.kind",
                    f"is '{executor.kind}': apply it to a cluster running the maka-eval "
                    "operator (kubectl apply -f), or set executor.kind: local to run it here",
                )
            ],
        )
    base = loaded.base_dir
    isolation = resolve_isolation(executor.config.isolation)
    path_env = host_env.get("PATH")
    if isolation is Isolation.NAMESPACES:
        # A program named without a path is looked for where the sandbox shows it.
        path_env = runtime_path(path_env)
    problems: list[Problem] = []
    commands: dict[str, Path] = {}
    probe = engine_info(host_env)
    containers = _task_sandboxes(
        spec.tasks, tasks, executor.config.sandbox, probe.engine, probe.why_none(), prefix, problems
    )
    registered = _registered_backend(executor.config, spec.tasks, tasks, prefix, problems)
    if containers:
        why = toolbox_problem()
        if why is not None:
            problems.append(
                Problem(
                    f"{prefix}executor.config.sandbox",
                    f"tasks {', '.join(sorted(containers))} run in containers, whose verifier "
                    f"runs static tools of this machine (the verifier's toolbox), which cannot "
                    f"be made: {why}",
                )
            )
    # A command named without a path runs from the image's PATH in a container: this
    # machine needs it only when some task runs here as processes.
    host_needed = any(task.id not in containers for task in spec.tasks)

    host_path: Path | None = None
    spelled: dict[str, Path] = {}
    host = executor.config.runtime_host
    if host is not None:
        host_path = resolve_command(host.command, base, path_env)
        if host_path is not None and "/" in host.command:
            spelled[RUNTIME_HOST] = _spelled(host.command, base)
        if host_path is None and (host_needed or "/" in host.command):
            problems.append(
                _command_problem(
                    host.command, f"{prefix}executor.config.runtimeHost.command", base, isolation
                )
            )

    for i, subject in enumerate(spec.subjects):
        where = f"{prefix}subjects[{i}]"
        for j, name in enumerate(subject.credentials):
            if not host_env.get(name):
                problems.append(
                    Problem(
                        f"{where}.credentials[{j}]",
                        f"the environment variable {name} is not set; export it before "
                        f"running (its value goes only to subject '{subject.id}')",
                    )
                )
        if isinstance(subject, ExternalSubject):
            command = subject.config.command
            resolved = resolve_command(command, base, path_env)
            if resolved is not None:
                commands[subject.id] = resolved
                if "/" in command:
                    spelled[subject.id] = _spelled(command, base)
            elif host_needed or "/" in command:
                problems.append(
                    _command_problem(command, f"{where}.config.command", base, isolation)
                )
        elif isinstance(subject, MakaSubject) and host_path is not None:
            commands[subject.id] = host_path
        elif isinstance(subject, OracleSubject):
            for t, task in enumerate(spec.tasks):
                definition = tasks.get(task.id)
                if definition is not None and definition.solution_dir is None:
                    step = next((s for s in definition.steps if s.solution_dir is None), None)
                    script = (
                        f"{definition.root}/steps/{step.name}/solution/solve.sh (or the "
                        "task's solution/solve.sh)"
                        if step is not None
                        else f"{definition.root}/solution/solve.sh"
                    )
                    problems.append(
                        Problem(
                            f"{prefix}tasks[{t}]",
                            f"{script} is missing; subject '{subject.id}' (the oracle) runs it",
                        )
                    )

    if Isolation(executor.config.isolation) is Isolation.NAMESPACES:
        why = namespaces_unavailable()
        if why is not None:
            problems.append(
                Problem(
                    f"{prefix}executor.config.isolation",
                    f"'namespaces' was asked for, but {why}; nothing runs unisolated when "
                    "isolation is asked for (set isolation: auto or none to run anyway)",
                )
            )

    if executor.config.egress is not None:
        problems += _egress_problems(
            executor.config.egress,
            spec.tasks,
            tasks,
            containers,
            executor.config.isolation,
            probe.engine,
            prefix,
        )
    else:
        problems += _allowlist_problems(
            spec.tasks, tasks, containers, executor.config.isolation, probe.engine, prefix
        )

    work = host_env.get(WORK_DIR_VARIABLE)
    if work and not (Path(work).is_dir() and os.access(work, os.W_OK)):
        problems.append(
            Problem(WORK_DIR_VARIABLE, f"{work} is not a writable directory; create it or unset it")
        )

    if problems:
        raise PrerequisiteError(
            f"{len(problems)} prerequisite(s) missing; nothing was started:", problems
        )
    return ResolvedCommands(
        commands,
        host_path,
        isolation,
        containers=frozenset(containers),
        engine=probe.engine,
        engine_search=probe.engine.describe() if probe.engine else probe.why_none(),
        sandbox=registered,
        spelled=spelled,
    )


RUNTIME_HOST = ""
"""The key of the Runtime Host's program in `ResolvedCommands.spelled`."""


BUILT_IN_SANDBOXES = ("auto", "process", "container")
"""executor.config.sandbox values that are maka-eval's own choice per task."""


def _registered_backend(
    config: LocalExecutorConfig,
    spec_tasks: tuple[Task, ...],
    tasks: Mapping[str, TaskDefinition],
    prefix: str,
    problems: list[Problem],
) -> str | None:
    """The installed sandbox backend executor.config.sandbox names (None: a built-in
    choice); why it cannot run these tasks here is added to `problems`."""
    asked = config.sandbox
    if asked in BUILT_IN_SANDBOXES:
        return None
    where = f"{prefix}executor.config.sandbox"
    unknown = backends.kind_problem(asked)
    if unknown is not None:
        problems.append(Problem(where, f"{unknown}; or set it to auto, process or container"))
        return None
    try:
        backend = backends.load(asked)
    except SandboxLoadError as exc:
        problems.append(Problem(where, str(exc)))
        return None
    why = backend.unavailable()
    if why is not None:
        problems.append(Problem(where, f"the sandbox backend '{asked}' cannot run here: {why}"))
    # The cell's policed network is a namespace of this machine that maka-eval's own
    # sandboxes join; a registered backend is not asked to (nor trusted to) join it.
    if config.egress is not None:
        problems.append(
            Problem(
                f"{prefix}executor.config.egress",
                f"egress is enforced in maka-eval's own sandboxes only; the sandbox backend "
                f"'{asked}' cannot join a cell's policed network: remove egress or set "
                "executor.config.sandbox to auto",
            )
        )
    for t, task in enumerate(spec_tasks):
        definition = tasks.get(task.id)
        if definition is not None and definition.network_mode is NetworkMode.ALLOWLIST:
            problems.append(
                Problem(
                    f"{prefix}tasks[{t}]",
                    f"task.toml allows only some hosts (network_mode = 'allowlist'), which "
                    f"maka-eval's own sandboxes enforce; the sandbox backend '{asked}' cannot: "
                    "set executor.config.sandbox to auto, or leave the task out",
                )
            )
    return asked


def _spelled(command: str, base_dir: Path) -> Path:
    return Path(os.path.abspath(command if os.path.isabs(command) else base_dir / command))


def _task_sandboxes(
    spec_tasks: tuple[Task, ...],
    tasks: Mapping[str, TaskDefinition],
    asked: str,
    engine: EngineInfo | None,
    no_engine: str,
    prefix: str,
    problems: list[Problem],
) -> set[str]:
    """The ids of the tasks that run in a container; what stops the others is added to
    `problems`."""
    containers: set[str] = set()
    for t, task in enumerate(spec_tasks):
        definition = tasks.get(task.id)
        if definition is None:
            continue
        where = f"{prefix}tasks[{t}]"
        what = (
            f"{definition.root}/environment/{definition.image_build_file} builds a container image"
            if definition.image_build_file
            else f"task.toml asks for container image '{definition.docker_image}'"
        )
        if not definition.needs_image:
            if asked == "container":
                problems.append(
                    Problem(
                        where,
                        f"{definition.root} has no environment/Dockerfile and no docker_image, "
                        "but executor.config.sandbox is 'container'; set it to auto to run "
                        "such tasks as processes",
                    )
                )
            continue
        if definition.image_build_file in COMPOSE_FILES:
            problems.append(
                Problem(
                    where,
                    f"{what}: multi-container tasks (docker compose) are not supported by "
                    "maka-eval's container sandbox yet; run this task with Harbor itself, or "
                    "leave it out of the experiment",
                )
            )
        elif asked not in BUILT_IN_SANDBOXES:
            continue  # a registered backend runs every task (see _registered_backend)
        elif asked == "process":
            problems.append(
                Problem(
                    where,
                    f"{what}, but executor.config.sandbox is 'process', which runs tasks "
                    "directly on this machine; set it to auto or container",
                )
            )
        elif engine is None:
            problems.append(
                Problem(
                    where,
                    f"{what}, which needs Docker or Podman, but {no_engine}; start one "
                    "(hack/podman.sh up) or point DOCKER_HOST at it",
                )
            )
        elif definition.gpus and not engine.gpus:
            problems.append(
                Problem(
                    where,
                    f"task.toml asks for gpus = {definition.gpus}, but {engine.describe()} has "
                    "no NVIDIA runtime; run it on a machine with GPUs, or leave it out",
                )
            )
        else:
            containers.add(task.id)
    return containers


def _allowlist_problems(
    spec_tasks: tuple[Task, ...],
    tasks: Mapping[str, TaskDefinition],
    containers: set[str],
    isolation: str,
    engine: EngineInfo | None,
    prefix: str,
) -> list[Problem]:
    """What stops this machine from keeping the allowlists of tasks whose task.toml says
    network_mode = 'allowlist': each cell's proxy keeps it, as it keeps a spec policy."""
    listed = tuple(
        t for t in spec_tasks if t.id in tasks and tasks[t.id].network_mode is NetworkMode.ALLOWLIST
    )
    if not listed:
        return []
    return _egress_problems(
        EgressConfig(mode="proxy"),
        listed,
        tasks,
        containers,
        isolation,
        engine,
        prefix,
        where=f"{prefix}tasks ({', '.join(t.id for t in listed)})",
        asked="network_mode = 'allowlist' (task.toml)",
        remedy="leave those tasks out",
    )


def _egress_problems(
    egress: EgressConfig,
    spec_tasks: tuple[Task, ...],
    tasks: Mapping[str, TaskDefinition],
    containers: set[str],
    isolation: str,
    engine: EngineInfo | None,
    prefix: str,
    *,
    where: str | None = None,
    asked: str | None = None,
    remedy: str = "remove executor.config.egress",
) -> list[Problem]:
    """What stops this machine from enforcing executor.config.egress (or, through
    `_allowlist_problems`, the tasks' allowlists): a declared policy never runs
    unenforced (DESIGN.md section 6)."""
    where = where or f"{prefix}executor.config.egress"
    asked = asked or f"mode '{egress.mode}'"
    known = [t.id for t in spec_tasks if t.id in tasks]
    # allow_internet = false in task.toml wins: those cells get no network, no proxy.
    policed = [tid for tid in known if needs_policing(tasks[tid].network_mode)]
    problems: list[Problem] = []
    if egress.mode == "proxy" and policed:
        why = enforcement_unavailable()
        if why is not None:
            problems.append(
                Problem(
                    where,
                    f"{asked} declares an egress policy, but {why}; a declared policy "
                    "never runs unenforced (run maka-eval as root on Linux with iproute2 and "
                    f"nftables, or {remedy})",
                )
            )
        if not mitmdump_path().is_file():
            problems.append(
                Problem(
                    where,
                    f"{asked} runs each cell's proxy with {mitmdump_path()}, which does "
                    "not exist; install maka-eval with its dependencies (mitmproxy) into this "
                    "environment",
                )
            )
        in_containers = [tid for tid in policed if tid in containers]
        if in_containers and engine is not None and engine.kind != "Podman":
            problems.append(
                Problem(
                    where,
                    f"{asked} puts each container in the cell's policed network "
                    f"namespace by path, which {engine.describe()} cannot do (only Podman "
                    f"has the ns: network mode); tasks {', '.join(in_containers)} need it: "
                    f"use Podman (hack/podman.sh up, DOCKER_HOST) or {remedy}",
                )
            )
    as_processes = [tid for tid in known if tid not in containers]
    if as_processes and resolve_isolation(isolation) is not Isolation.NAMESPACES:
        why = namespaces_unavailable() or "executor.config.isolation is 'none'"
        problems.append(
            Problem(
                where,
                f"{asked} needs every task run as processes "
                f"({', '.join(as_processes)}) to have its own network namespace, but {why}; "
                "set executor.config.isolation to namespaces (root, bubblewrap) or "
                f"{remedy}",
            )
        )
    return problems
