"""Cell -> relay plan: one attempt of one cell, laid out on this machine."""

from __future__ import annotations

from pathlib import Path

from maka_eval.egress.policy import EgressPolicy
from maka_eval.engine.expand import Cell
from maka_eval.engine.launch import SOLUTION_DIR_NAME
from maka_eval.engine.modes import EgressMode, Isolation, NetworkMode, container_network
from maka_eval.engine.modes import egress_mode as decide_egress
from maka_eval.executors.plan import plan_attempt
from maka_eval.local.prerequisites import RUNTIME_HOST, ResolvedCommands
from maka_eval.relay.plan import AttemptPlan, EgressPlan
from maka_eval.sandbox.container.images import build_tag
from maka_eval.sandbox.holders import SYSTEM_FOLDERS
from maka_eval.sandbox.plans import ContainerPlan
from maka_eval.spec.egress import policy_of
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.subjects import ExternalSubject, MakaSubject, Subject, subject_launch
from maka_eval.spec.task_directory import TaskDefinition


def attempt_plan(
    *,
    experiment: Experiment,
    cell: Cell,
    task: TaskDefinition,
    commands: ResolvedCommands,
    run_id: str,
    attempt_id: str,
    attempt_root: Path,
    artifacts_dir: Path,
    hidden: tuple[str, ...] = (),
    egress: EgressPlan | None = None,
) -> AttemptPlan:
    """The relay plan for one attempt of `cell`; `egress` is the cell's policed network
    when `egress_mode` says 'proxy' (without it, such a cell gets no network at all)."""
    spec = experiment.spec
    subject = experiment.subject(cell.subject_id)
    host = spec.runtime_host
    in_container = task.id in commands.containers
    program = commands.subjects.get(subject.id)
    spelled = commands.spelled.get(RUNTIME_HOST if isinstance(subject, MakaSubject) else subject.id)
    named = _named_command(subject, host.command if host is not None else None)
    upload: str | None = None
    if in_container and named is not None:
        # A command named by a path is a file of this machine, uploaded to /maka/bin/;
        # one named without a path is the image's (its PATH finds it).
        if "/" in named and program is not None:
            upload = str(program)
        else:
            program = None
    argv0 = str(program) if program is not None else named
    launch = subject_launch(
        subject,
        program=argv0,
        runtime_host_args=host.args if host is not None else (),
        solution_dir=str(task.solution_dir) if task.solution_dir else None,
        solution_script=str(attempt_root / SOLUTION_DIR_NAME / "solve.sh"),
        solution_env=task.solution_env,
    )
    config = spec.executor_egress
    spec_egress = EgressMode(config.mode) if config is not None else None
    mode = egress_mode(experiment, task)
    # A registered backend is given the task's image too, when it ships one.
    wants_image = (in_container and commands.engine is not None) or (
        commands.sandbox is not None and task.needs_image
    )
    container = (
        _container_plan(
            task,
            commands,
            upload,
            network=container_network(mode, egress is not None, task.network_mode),
        )
        if wants_image
        else None
    )
    return plan_attempt(
        experiment,
        cell,
        run_id=run_id,
        attempt_id=attempt_id,
        root=str(attempt_root),
        artifacts_dir=str(artifacts_dir),
        subject=launch,
        isolation=(
            Isolation.CONTAINER
            if container is not None and commands.sandbox is None
            else commands.isolation
        ),
        task=task,
        task_dir=str(task.root),
        spec_egress=spec_egress,
        hidden=hidden,
        visible=program_view(launch.argv[0], hidden, spelled),
        container=container,
        egress=egress,
        sandbox=commands.sandbox,
    )


def program_view(
    program: str, hidden: tuple[str, ...], spelled: Path | None = None
) -> tuple[str, ...]:
    """What of this machine a subject sees besides its runtime folders: its program's
    folder (a virtualenv's whole folder for a program in its bin/), or the program
    alone when that folder holds something hidden (the tasks, the run or work folder:
    an agent script beside the benchmark it is measured on). Nothing for a program in
    the runtime folders (/usr/bin/...) or found by name. `spelled` is the program as
    the spec named it, links kept (a virtualenv's bin/python links to /usr/bin): it is
    shown the same way."""
    shown: list[str] = []
    for path in (Path(program), spelled):
        if path is None or "/" not in str(path):
            continue
        folder = path.parent
        if (folder.parent / "pyvenv.cfg").is_file():
            folder = folder.parent
        if any(_under(str(folder), f"/{name}") for name in SYSTEM_FOLDERS):
            continue
        view = str(path) if any(_under(h, str(folder)) for h in hidden) else str(folder)
        if view not in shown:
            shown.append(view)
    return tuple(shown)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def egress_mode(experiment: Experiment, task: TaskDefinition) -> EgressMode | None:
    """How the cells of `task` reach the network under executor.config.egress
    (engine.modes.egress_mode): PROXY (a policed namespace), NONE (loopback only) or
    None (no policy declared)."""
    config = experiment.spec.executor_egress
    return decide_egress(config.mode if config is not None else None, task.network_mode)


def egress_policy(
    experiment: Experiment, task: TaskDefinition, spec_policy: EgressPolicy | None = None
) -> EgressPolicy | None:
    """The policy the proxy of a cell of `task` enforces (None: no proxy): the spec's
    blocklist (`spec_policy`, when already compiled), and for an 'allowlist' task its
    allowed_hosts on top."""
    if egress_mode(experiment, task) is not EgressMode.PROXY:
        return None
    config = experiment.spec.executor_egress
    if task.network_mode is not NetworkMode.ALLOWLIST:
        return spec_policy or policy_of(config)
    if config is None:
        return EgressPolicy("none", (), task.allowed_hosts)
    return EgressPolicy(config.preset, config.block, task.allowed_hosts)


def _named_command(subject: Subject, runtime_host: str | None) -> str | None:
    """The command the spec names for the subject's program (None: the oracle, nop)."""
    if isinstance(subject, ExternalSubject):
        return subject.config.command
    if isinstance(subject, MakaSubject):
        return runtime_host
    return None


def _container_plan(
    task: TaskDefinition, commands: ResolvedCommands, program: str | None, network: NetworkMode
) -> ContainerPlan:
    """How the task's container is made: its image, and task.toml's settings (`engine`
    empty when no engine answered here: a registered backend brings its own)."""
    if task.docker_image is not None:
        image, build_dir = task.docker_image, None
    else:
        assert task.environment_dir is not None and task.environment_digest is not None
        image = build_tag(task.id, task.environment_digest)
        build_dir = str(task.environment_dir)
    return ContainerPlan(
        engine=commands.engine.url if commands.engine is not None else "",
        image=image,
        build_dir=build_dir,
        build_timeout_sec=task.build_timeout_sec,
        workdir=task.workdir,
        agent_user=task.agent_user,
        verifier_user=task.verifier_user,
        cpus=task.cpus,
        memory_mb=task.memory_mb,
        storage_mb=task.storage_mb,
        gpus=task.gpus,
        network=network,
        env=dict(task.environment_env),
        program=program,
    )
