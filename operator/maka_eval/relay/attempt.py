"""Run ONE attempt of one cell: prepare, launch the subject, quiesce if it is cut off,
verify the environment it left, classify.

The same code runs in-process in the local executor and as the relay program injected
into a task container; it imports only the standard library and the pure engine rules.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import functools
import os
import posixpath
import shutil
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from maka_eval import layout as paths
from maka_eval.artifacts import NAME_MAX_BYTES, Redactor, artifact_name, copy_artifact
from maka_eval.contract.kernel import ARTIFACT_NAME_LIMIT, ArtifactEntry
from maka_eval.engine.classify import (
    NO_FRAME,
    NOT_VERIFIED,
    Execution,
    ExecutionEnd,
    Frame,
    ResultContract,
    Verification,
    classify,
)
from maka_eval.engine.environment import Healthcheck, TaskArtifact
from maka_eval.engine.modes import Isolation
from maka_eval.printable import escaped
from maka_eval.processes.output import DiskFull, OutputCapture
from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor, WaitEnd
from maka_eval.processes.table import RUN_MARKER
from maka_eval.relay import multistep
from maka_eval.relay.environment import (
    RESOLV_CONF,
    base_environment,
    egress_environment,
    host_environment,
    hosts_file,
    resolve_credentials,
    subject_environment,
    verifier_environment,
)
from maka_eval.relay.frame import MAX_FRAME_BYTES, read_frame
from maka_eval.relay.gate import PROBE_TIMEOUT_SEC, probe_argv, read_evidence, refusal
from maka_eval.relay.metering import recover_metered
from maka_eval.relay.outcome import AttemptOutcome, build_kernel
from maka_eval.relay.plan import AttemptPlan, EgressPlan
from maka_eval.relay.verifier import read_reward
from maka_eval.sandbox import backends
from maka_eval.sandbox.backends import SandboxRequest
from maka_eval.sandbox.base import Layout, Network, Phase, Sandbox
from maka_eval.sandbox.holders import NamespacePool, runtime_path
from maka_eval.sandbox.process import interpreted

LOW_DISK_BYTES = 1 << 20
"""Below this much free space a file system counts as full: nothing an attempt wrote
there (output, rewards, records) can be trusted to be whole."""

SETUP_OUTPUT_BYTES = 2000
"""What of a failed setup's or healthcheck's output the record quotes."""


def _file_digest(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when a file is rewritten (inode, size, mtime, ctime)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def full_file_system(*paths: str) -> str | None:
    """The first of `paths` whose file system is (nearly) full, or None."""
    for path in paths:
        try:
            info = os.statvfs(path)
        except OSError:
            continue
        if info.f_bavail * info.f_frsize < LOW_DISK_BYTES:
            return path
    return None


@dataclass(frozen=True)
class AttemptLayout:
    """The attempt-private directory tree."""

    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def instruction(self) -> Path:
        return self.root / "instruction.md"

    @property
    def frame_dir(self) -> Path:
        return self.root / "frame"

    @property
    def tests(self) -> Path:
        return self.root / "tests"

    @property
    def verifier_logs(self) -> Path:
        return self.root / "logs" / "verifier"

    @property
    def agent_logs(self) -> Path:
        return self.root / "logs" / "agent"

    @property
    def verifier_home(self) -> Path:
        """The verifier's HOME where the sandbox has no private one (plain processes)."""
        return self.root / "verifier" / "home"

    @property
    def verifier_tmp(self) -> Path:
        return self.root / "verifier" / "tmp"

    @property
    def evidence(self) -> Path:
        """What the sandbox found for the record (files become `evidence/` artifacts)."""
        return self.root / "evidence"

    @property
    def egress(self) -> Path:
        """The policed sandbox's /etc/hosts and /etc/resolv.conf (shown read-only)."""
        return self.root / "egress"

    def step_dir(self, name: str) -> Path:
        """What a step of a multi-step task left (its output, its verifier's logs)."""
        return self.root / "steps" / name

    @property
    def output(self) -> Path:
        """Where the relay writes captured output (never inside the workspace)."""
        return self.root

    def create(self, *, frame: bool, agent_logs: bool) -> None:
        self.root.mkdir(parents=True, exist_ok=False)
        for path in (self.workspace, self.home, self.tmp):
            path.mkdir()
        if agent_logs:  # only a sandbox shows it (at /logs/agent)
            self.agent_logs.mkdir(parents=True)
        if frame:
            self.frame_dir.mkdir()


def _copy_tree(src: str, dst: Path) -> None:
    try:
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    except shutil.Error as exc:
        # copytree gathers per-file errors into a list; report the first one plainly.
        failures = [item for item in exc.args[0] if isinstance(item, tuple)]
        full = next((item for item in failures if "[Errno 28]" in str(item[-1])), None)
        if full is not None:
            raise OSError(errno.ENOSPC, "no space left on device", str(full[1])) from None
        first = failures[0] if failures else ("?", str(dst), str(exc))
        raise OSError(errno.EIO, f"cannot copy {first[0]}: {first[-1]}", str(first[1])) from None


MAX_AGENT_FILES = 256
"""At most this many files of /logs/agent become artifacts."""
MAX_TASK_ARTIFACT_FILES = 256
"""At most this many collected task artifact files become artifacts (a record lists
each; a collected folder may hold any number)."""


def _files_as_artifacts(
    root: Path,
    prefix: str,
    most: int,
    max_bytes: float = float("inf"),
    too_long: list[str] | None = None,
) -> list[tuple[str, Path]]:
    """The regular files under `root`, as `<prefix>/<path>` artifacts named by
    `artifact_name` (escaped): the first `most` in path order, at most `max_bytes` in
    all, links never followed. A file whose name a record cannot hold is left out, its
    name's start added to `too_long`."""
    found: list[tuple[str, Path]] = []
    total = 0
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            try:
                info = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or total + info.st_size > max_bytes:
                continue
            relative = path.relative_to(root).as_posix()
            artifact = artifact_name(prefix, relative)
            if artifact is None:
                if too_long is not None:
                    too_long.append(f"{prefix}/{escaped(relative)[:60]}...")
                continue
            if len(found) == most:
                return found
            total += info.st_size
            found.append((artifact, path))
    return found


def _drop_excluded(folder: Path, patterns: Sequence[str]) -> None:
    """Remove the files of `folder` whose path in it, or name, matches a pattern (the
    task's `exclude`: Harbor gives them to tar --exclude)."""
    for parent, _dirs, files in os.walk(folder, followlinks=False):
        for name in files:
            path = Path(parent) / name
            relative = path.relative_to(folder).as_posix()
            if any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(name, p) for p in patterns):
                path.unlink()


def _make_executable(path: Path) -> None:
    mode = path.stat().st_mode
    path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


_END = {
    WaitEnd.EXITED: ExecutionEnd.EXITED,
    WaitEnd.TIMED_OUT: ExecutionEnd.TIMED_OUT,
    WaitEnd.CANCELLED: ExecutionEnd.CANCELLED,
}


class Attempt:
    """One attempt's phases; `run_attempt` is the entry point. A multi-step task's steps
    are run by relay.multistep through the public methods."""

    def __init__(
        self,
        plan: AttemptPlan,
        supervisor: ProcessSupervisor,
        cancel: CancelToken,
        host_env: Mapping[str, str],
        start_gate: Callable[[], None] | None,
        settle_metering: Callable[[], object] | None = None,
        pool: NamespacePool | None = None,
    ) -> None:
        self.plan = plan
        self._pool = pool
        self._start_gate = start_gate
        self._settle_metering = settle_metering
        self.supervisor = supervisor
        self.cancel = cancel
        self.host_env = host_env
        self.layout = AttemptLayout(Path(plan.root))
        self.timings: dict[str, float] = {}
        self.credentials: dict[str, str] = {}
        self.subject_started_at: float | None = None
        self.base_env: dict[str, str] = {}
        self.captures: dict[str, OutputCapture] = {}
        self.disk_full: str | None = None
        self.notes: list[str] = []
        self.tampered: str | None = None
        """What the subject changed of the verifier's start-up (the sandbox's finding)."""
        self.step_metrics: dict[str, float] = {}
        """A multi-step attempt's per-step rewards (`step.<name>.<key>`)."""
        self._rewards_read: list[tuple[Path, tuple[int, int, int, int] | None]] = []
        """Each reward file read, and its digest when it was read."""
        self.sandbox = self._make_sandbox()
        # Every credential of the experiment, whichever subject declared it: a subject
        # that got hold of another's value must not carry it out of the attempt.
        self.redactor = Redactor.of(
            {name: host_env[name] for name in plan.redact if host_env.get(name)}
        )

    def _make_sandbox(self) -> Sandbox:
        plan, layout = self.plan, self.layout
        sandbox_layout = Layout(
            workspace=str(layout.workspace),
            home=str(layout.home),
            tmp=str(layout.tmp),
            frame_dir=(
                str(layout.frame_dir)
                if plan.subject.contract is ResultContract.PROTOCOL_V1
                else None
            ),
            instruction=str(layout.instruction),
            agent_logs=str(layout.agent_logs),
            tests=str(layout.tests),
            verifier_logs=str(layout.verifier_logs),
            subject_dirs={str(layout.root / name): f"/{name}" for name in plan.subject.extra_dirs},
            hidden=plan.hidden,
            visible=plan.visible,
            in_task_image=plan.in_task_image,
            verifier_home=str(layout.verifier_home),
            verifier_tmp=str(layout.verifier_tmp),
            evidence_dir=str(layout.evidence),
        )
        # The backend by registry: maka-eval's own (process, container) or an installed
        # one the plan names (maka_eval.sandbox.backends).
        return backends.load(plan.sandbox_kind).create(
            SandboxRequest(
                supervisor=self.supervisor,
                attempt_id=plan.attempt_id,
                layout=sandbox_layout,
                isolation=plan.isolation,
                network=self._network(),
                container=plan.container,
                task_id=plan.task_id,
                labels={"cell-id": plan.cell_id, "run-id": plan.run_id},
                pool=self._pool,
            )
        )

    def _network(self) -> Network | None:
        """The executor's policed namespace for the sandbox to join (None: no policy)."""
        egress = self.plan.egress
        if egress is None:
            return None
        return Network(
            namespace=egress.namespace,
            hosts={egress.proxy_name: egress.proxy_address},
            hosts_file=str(self.layout.egress / "hosts"),
            resolv_file=str(self.layout.egress / "resolv.conf"),
            ca_cert=egress.ca_cert,
        )

    def inside(self, phase: Phase, path: Path | str) -> str:
        """Where `phase` sees a host path of the attempt (the same path, but in a
        container: Harbor's)."""
        return self.sandbox.path_of(phase, str(path))

    def _argv(self, phase: Phase, argv: Sequence[str]) -> list[str]:
        """The program as `phase` starts it: a script without `#!` through bash, paths
        of the attempt as the sandbox shows them."""
        shell = "bash" if self.sandbox.isolation is Isolation.CONTAINER else None
        return [self.inside(phase, arg) for arg in interpreted(argv, shell)]

    # -- phases ---------------------------------------------------------------------
    def pass_gate(self) -> None:
        """Wait until every arm of the task group is prepared (called exactly once)."""
        gate, self._start_gate = self._start_gate, None
        if gate is not None:
            gate()

    def prepare(self) -> None:
        plan, layout = self.plan, self.layout
        layout.create(
            frame=plan.subject.contract is ResultContract.PROTOCOL_V1,
            agent_logs=self.sandbox.isolation is not Isolation.NONE,
        )
        if plan.environment_dir:
            _copy_tree(plan.environment_dir, layout.workspace)
        shutil.copyfile(plan.instruction_file, layout.instruction)
        for name, source in plan.subject.extra_dirs.items():
            _copy_tree(source, layout.root / name)
            for script in (layout.root / name).glob("*.sh"):
                _make_executable(script)
        if plan.egress is not None:
            layout.egress.mkdir()
            pinned = {plan.egress.proxy_name: plan.egress.proxy_address}
            (layout.egress / "hosts").write_text(hosts_file(pinned), encoding="utf-8")
            (layout.egress / "resolv.conf").write_text(RESOLV_CONF, encoding="utf-8")
        self.credentials = resolve_credentials(plan.subject.credentials, self.host_env)
        shows_runtime = self.sandbox.isolation is Isolation.NAMESPACES and not plan.in_task_image
        self.base_env = base_environment(
            attempt_id=plan.attempt_id,
            home=self.inside(Phase.SUBJECT, layout.home),
            tmp=self.inside(Phase.SUBJECT, layout.tmp),
            host_env=self.host_env,
            # Only the machine's runtime folders are there to search.
            path=runtime_path(self.host_env.get("PATH")) if shows_runtime else None,
        )

    def _capture(self, prefix: str) -> tuple[OutputCapture, OutputCapture]:
        limit = self.plan.output_limit_bytes
        out = OutputCapture(self.layout.output / f"{prefix}.stdout", limit)
        err = OutputCapture(self.layout.output / f"{prefix}.stderr", limit)
        self.captures[f"{prefix}.stdout"] = out
        self.captures[f"{prefix}.stderr"] = err
        return out, err

    def attempt_vars(self) -> dict[str, str]:
        """The attempt's MAKA_EVAL_* values (and the run marker), paths as the subject
        sees them: what the subject and the programs set up for it are given."""
        plan, layout = self.plan, self.layout
        inside = functools.partial(self.inside, Phase.SUBJECT)
        values = {
            RUN_MARKER: plan.run_id,
            paths.CELL_ID_ENV: plan.cell_id,
            paths.TASK_ID_ENV: plan.task_id,
            paths.REPETITION_ENV: str(plan.repetition),
            paths.SUBJECT_ID_ENV: plan.subject_id,
            paths.WORKSPACE_ENV: inside(layout.workspace),
            paths.INSTRUCTION_FILE_ENV: inside(layout.instruction),
        }
        if plan.subject.contract is ResultContract.PROTOCOL_V1:
            values[paths.RESULT_FILE_ENV] = inside(layout.frame_dir / "result.json")
        for name in plan.subject.extra_dirs:
            values[paths.subject_dir_env(name)] = inside(layout.root / name)
        return values

    def collect_artifacts(self, entries: Sequence[TaskArtifact], into: Path) -> None:
        """task.toml `artifacts`, once the subject is done and before the verifier, as
        Harbor collects them: each source (relative ones in the workdir) into `into`,
        at its destination or else its own path; best effort, what could not be
        collected is noted."""
        workdir = self.inside(Phase.SUBJECT, self.layout.workspace)
        for entry in entries:
            source = posixpath.normpath(posixpath.join(workdir, entry.source))
            # At its destination, else at its source path as written (Harbor's mirror).
            mirror = posixpath.normpath(entry.source).lstrip("/")
            target = into / (entry.destination or (mirror if mirror != "." else "root"))
            if target.exists():
                self.notes.append(f"artifact {entry.source}: skipped, {target.name} is taken")
                continue
            why = self.sandbox.collect(source, target, self.plan.output_limit_bytes)
            if why is not None:
                self.notes.append(f"artifact {entry.source}: not collected ({why})")
            elif entry.exclude and target.is_dir():
                _drop_excluded(target, entry.exclude)

    def _egress_environment(self, phase: Phase, egress: EgressPlan) -> dict[str, str]:
        """The proxy's variables and its CA, as `phase` sees them."""
        ca = egress.ca_cert
        return egress_environment(
            f"http://{egress.proxy_name}:{egress.proxy_port}",
            self.inside(phase, ca) if ca is not None else None,
        )

    def run_subject(
        self, timeout: float | None = None, user: str | None = None, prefix: str = "subject"
    ) -> Execution:
        """Run the subject to its end (the task's agent timeout unless `timeout`), its
        output captured as `<prefix>.stdout`/`.stderr`; how it ended."""
        plan, layout = self.plan, self.layout
        timeout = plan.agent_timeout_sec if timeout is None else timeout
        if self.cancel.is_set():
            return Execution(ExecutionEnd.CANCELLED)
        env = subject_environment(
            self.base_env, self.attempt_vars(), plan.subject.env, self.credentials
        )
        if plan.egress is not None:
            env.update(self._egress_environment(Phase.SUBJECT, plan.egress))
        out, err = self._capture(prefix)
        try:
            proc = self.sandbox.spawn(
                Phase.SUBJECT,
                self._argv(Phase.SUBJECT, plan.subject.argv),
                cwd=self.inside(Phase.SUBJECT, layout.workspace),
                env=env,
                stdout=out.child_fd,
                stderr=err.child_fd,
                user=user,
            )
        except OSError as exc:
            return Execution(
                ExecutionEnd.THREW,
                error=f"cannot start {plan.subject.argv[0]!r}: {exc.strerror}",
            )
        finally:
            out.started()
            err.started()
        if self.subject_started_at is None:
            self.subject_started_at = time.time()
        end = self.sandbox.wait(proc, timeout, self.cancel, tuple(self.captures.values()))
        if end is not WaitEnd.EXITED:
            self.sandbox.quiesce(Phase.SUBJECT, proc)
        code = self.sandbox.release(proc)
        self.disk_full = self.disk_full or full_file_system(str(layout.root))
        return Execution(
            _END[end],
            exit_code=code if end is WaitEnd.EXITED else None,
            timeout_sec=timeout if end is WaitEnd.TIMED_OUT else None,
        )

    def check_gate(self) -> str | None:
        """With a policed network: why the subject must not start (relay.gate), from a
        probe started exactly as the subject will be; None when it may."""
        egress = self.plan.egress
        if egress is None:
            return None
        with open(self.layout.root / "gate.out", "w+b") as out:
            try:
                proc = self.sandbox.spawn(
                    Phase.SUBJECT,
                    probe_argv(),
                    env=self.base_env,
                    cwd=self.inside(Phase.SUBJECT, self.layout.workspace),
                    stdout=out,
                    stderr=out,
                )
            except OSError as exc:
                return f"the egress gate could not start its probe: {exc.strerror or exc}"
            end = self.sandbox.wait(proc, PROBE_TIMEOUT_SEC, self.cancel)
            if end is not WaitEnd.EXITED:
                self.sandbox.quiesce(Phase.SUBJECT, proc)
            self.sandbox.release(proc)
            if end is WaitEnd.CANCELLED:
                return None  # the subject is not started: the run is cancelled
            out.seek(0)
            seen = out.read(1 << 16).decode(errors="replace")
        return refusal(read_evidence(seen), egress.namespace_identity)

    def read_frame(self) -> Frame:
        if self.plan.subject.contract is not ResultContract.PROTOCOL_V1:
            return NO_FRAME
        fd = os.open(self.layout.frame_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return read_frame(fd, scrub=self.redactor.scrub)
        finally:
            os.close(fd)

    def verify(
        self,
        tests_dirs: Sequence[str] | None = None,
        *,
        timeout_sec: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        output: str = "verifier",
    ) -> Verification | None:
        """Run tests/test.sh in the environment the subject left; None if cancelled.

        By default with the task's tests, timeout and env; a step's verifier passes its
        own (`tests_dirs` copied into /tests in order) and `output`, the name its
        output is captured under."""
        plan, layout = self.plan, self.layout
        # Tests reach the attempt only now, after the subject has stopped.
        for tests_dir in tests_dirs if tests_dirs is not None else (plan.tests_dir,):
            _copy_tree(tests_dir, layout.tests)
        self._fresh_verifier_logs()
        script = layout.tests / "test.sh"
        _make_executable(script)
        inside = functools.partial(self.inside, Phase.VERIFIER)
        timeout = plan.verifier_timeout_sec if timeout_sec is None else timeout_sec
        verifier_env = verifier_environment(
            self.base_env,
            plan.verifier_env if env is None else env,
            self.sandbox.verifier_dirs(),
        )
        verifier_env.update(
            {
                paths.WORKSPACE_ENV: inside(layout.workspace),
                paths.TESTS_DIR_ENV: inside(layout.tests),
                paths.VERIFIER_LOGS_DIR_ENV: inside(layout.verifier_logs),
                paths.TASK_ID_ENV: plan.task_id,
            }
        )
        if plan.egress is not None and plan.egress.verifier_uses_proxy:
            verifier_env.update(self._egress_environment(Phase.VERIFIER, plan.egress))
        out, err = self._capture(output)
        try:
            proc = self.sandbox.spawn(
                Phase.VERIFIER,
                self._argv(Phase.VERIFIER, [str(script)]),
                cwd=inside(layout.workspace),
                env=verifier_env,
                stdout=out.child_fd,
                stderr=err.child_fd,
                user=user,
            )
        except OSError as exc:
            return Verification(None, f"cannot start tests/test.sh: {exc.strerror or exc}")
        finally:
            out.started()
            err.started()
        end = self.sandbox.wait(proc, timeout, self.cancel, tuple(self.captures.values()))
        if end is not WaitEnd.EXITED:
            self.sandbox.quiesce(Phase.VERIFIER, proc)
        self.sandbox.release(proc)
        self.disk_full = self.disk_full or full_file_system(str(layout.root), plan.artifacts_dir)
        if end is WaitEnd.CANCELLED:
            return None
        if end is WaitEnd.TIMED_OUT:
            return Verification(None, f"the verifier timed out after {timeout:g}s")
        verification, source = read_reward(
            str(layout.verifier_logs), plan.score_key, scrub=self.redactor.scrub
        )
        if source is not None:
            path = layout.verifier_logs / source
            self._rewards_read.append((path, _file_digest(path)))
        return verification

    # -- healthchecks ----------------------------------------------------------------
    def healthy(
        self,
        check: Healthcheck,
        what: str,
        user: str | None = None,
        folder: Path | None = None,
    ) -> str | None:
        """Harbor's healthcheck loop (Docker HEALTHCHECK semantics): `bash -c command` in
        the subject's sandbox until it exits 0. Failures within the start period do not
        count; `retries` consecutive ones after it mean the environment is not healthy.
        Why it is not (or the run was cancelled meanwhile), or None."""
        start_period_end = time.monotonic() + check.start_period_sec
        failures = 0
        env = {**self.base_env, **self.attempt_vars()}
        output = (folder or self.layout.root) / "healthcheck.out"
        while True:
            in_start_period = time.monotonic() < start_period_end
            code, said = self._check_once(check, env, user, output)
            if code == 0:
                return None
            if code is None and self.cancel.is_set():
                return f"the run was cancelled during {what}"
            if in_start_period:
                pause = check.start_interval_sec
            else:
                failures += 1
                if failures >= check.retries:
                    return (
                        f"{what} failed {failures} time(s) in a row, the environment never "
                        f"became healthy ({check.command!r}: {said})"
                    )
                pause = check.interval_sec
            if self.cancel.wait(pause):
                return f"the run was cancelled during {what}"

    def _check_once(
        self, check: Healthcheck, env: Mapping[str, str], user: str | None, path: Path
    ) -> tuple[int | None, str]:
        """One run of the healthcheck's command: its exit code (None: it did not end in
        time, or the run was cancelled) and what it said last (or why it failed)."""
        with open(path, "w+b") as out:
            try:
                proc = self.sandbox.spawn(
                    Phase.SUBJECT,
                    ["bash", "-c", check.command],
                    env=env,
                    cwd=self.inside(Phase.SUBJECT, self.layout.workspace),
                    stdout=out,
                    stderr=out,
                    user=user,
                )
            except OSError as exc:
                return 127, f"it could not start: {exc.strerror or exc}"
            end = self.sandbox.wait(proc, max(check.timeout_sec, 0.001), self.cancel)
            if end is not WaitEnd.EXITED:
                with contextlib.suppress(OSError):
                    proc.kill()  # what it started is ended with the sandbox
            code = self.sandbox.release(proc)
            if end is WaitEnd.TIMED_OUT:
                return None, f"timed out after {check.timeout_sec:g}s"
            if end is WaitEnd.CANCELLED:
                return None, "cancelled"
            said = self.quote_output(out)
        return code, f"exit code {code}" + (f", {said}" if said else "")

    def quote_output(self, out: BinaryIO) -> str:
        """The end of what a program set up for the subject wrote to `out` (a file
        opened for reading), redacted: what the record quotes of it."""
        out.seek(0)
        said = self.redactor.text(out.read(1 << 16).decode(errors="replace").strip())
        return said[-SETUP_OUTPUT_BYTES:]

    def reset_verifier_files(self, keep_logs_in: Path) -> None:
        """Between the steps of a multi-step task: the verifier's logs move to
        `keep_logs_in` (a reward file read there is still checked for changes after the
        run) and /tests goes, so the next verifier starts from empty folders."""
        layout = self.layout
        if layout.verifier_logs.is_dir() and not layout.verifier_logs.is_symlink():
            os.replace(layout.verifier_logs, keep_logs_in)
            self._rewards_read = [
                (keep_logs_in / path.name if path.parent == layout.verifier_logs else path, digest)
                for path, digest in self._rewards_read
            ]
        if layout.tests.is_dir() and not layout.tests.is_symlink():
            shutil.rmtree(layout.tests)

    def refill_subject_dir(self, name: str, source: str) -> None:
        """Empty the subject's extra folder `name` in place (the sandbox shows it) and
        copy `source` into it, its scripts made executable: a step's own solution."""
        folder = self.layout.root / name
        for entry in list(folder.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        _copy_tree(source, folder)
        for script in folder.glob("*.sh"):
            _make_executable(script)

    def _fresh_verifier_logs(self) -> None:
        """The verifier's log folder is made empty now, after the subject has finished;
        anything already there was put there by the subject: moved aside and noted."""
        logs = self.layout.verifier_logs
        if self.sandbox.isolation is Isolation.NAMESPACES:
            # Made empty with the sandbox, seen by the verifier's namespace alone.
            if any(logs.iterdir()):
                self.notes.append("suspected tampering: the verifier's log folder was not empty")
            return
        if logs.exists() or logs.is_symlink():
            aside = logs.with_name("verifier.before-verifier")
            os.replace(logs, aside)
            found = sorted(p.name for p in aside.iterdir()) if aside.is_dir() else [logs.name]
            self.notes.append(
                "suspected tampering: the verifier's log folder existed before the verifier "
                f"started ({', '.join(found)[:120] or 'empty'}); it was set aside, not read"
            )
        logs.mkdir(parents=True)

    def _check_reward_unchanged(self) -> None:
        """After everything stopped: a reward file that changed since the verifier exited
        was touched by something else; the value read at the verifier's exit stands."""
        for path, digest in self._rewards_read:
            if _file_digest(path) != digest:
                name = path.relative_to(self.layout.root).as_posix().replace("logs/verifier/", "")
                self.notes.append(
                    f"suspected tampering: {name} changed after the verifier exited; the value "
                    "read when it exited was used"
                )

    def cleanup(self) -> None:
        """The attempt is over: nothing of it may outlive it; close its output."""
        try:
            if self.sandbox.isolation is not Isolation.NONE:
                with contextlib.suppress(Exception):
                    self.sandbox.download(
                        self.inside(Phase.SUBJECT, self.layout.agent_logs),
                        str(self.layout.agent_logs),
                        self.plan.output_limit_bytes,
                    )
            try:
                self.tampered = self.sandbox.tampering()
            except Exception as exc:  # the check is evidence; its failure is said
                self.notes.append(f"what the subject changed could not be checked: {exc}")
            self.sandbox.stop()
            self._check_reward_unchanged()
        finally:
            self.notes.extend(n for n in self.sandbox.notes if n not in self.notes)
            for capture in self.captures.values():
                try:
                    capture.finish()
                except DiskFull as exc:
                    self.disk_full = self.disk_full or str(Path(str(exc.filename)).parent)

    def store_artifacts(self) -> tuple[ArtifactEntry, ...]:
        """Copy what the attempt left into the artifacts folder, redacted and digested.

        Empty files are not stored: an artifact always has content.
        """
        layout = self.layout
        # Captured streams that wrote nothing left no file: no need to look for them.
        candidates = [
            (name, layout.output / name)
            for name, capture in self.captures.items()
            if capture.written
        ]
        candidates += [
            (f"verifier/{name}", layout.verifier_logs / name)
            for name in ("reward.json", "reward.txt")
        ]
        candidates += [
            (f"steps/{step.name}/verifier/{name}", layout.step_dir(step.name) / "verifier" / name)
            for step in self.plan.steps
            for name in ("reward.json", "reward.txt")
        ]
        # task.toml `artifacts`, as collected (the task's, each step's), at most
        # MAX_TASK_ARTIFACT_FILES in all.
        most = MAX_TASK_ARTIFACT_FILES + 1  # one more: to know whether any were left
        too_long: list[str] = []
        collected = _files_as_artifacts(
            layout.root / "artifacts", "artifacts", most, too_long=too_long
        )
        for step in self.plan.steps:
            folder = layout.step_dir(step.name) / "artifacts"
            left = most - len(collected)
            collected += _files_as_artifacts(
                folder, f"steps/{step.name}/artifacts", left, too_long=too_long
            )
        if len(collected) > MAX_TASK_ARTIFACT_FILES:
            del collected[MAX_TASK_ARTIFACT_FILES:]
            self.notes.append(
                f"task artifacts: only the first {MAX_TASK_ARTIFACT_FILES} files were kept"
            )
        candidates += collected
        # What the last run of a healthcheck said (the environment's, each step's).
        candidates.append(("healthcheck.out", layout.root / "healthcheck.out"))
        candidates += [
            (f"steps/{step.name}/healthcheck.out", layout.step_dir(step.name) / "healthcheck.out")
            for step in self.plan.steps
            if step.healthcheck is not None
        ]
        candidates.append(("result-frame.json", layout.frame_dir / "result.json"))
        candidates += _files_as_artifacts(
            layout.evidence, "evidence", MAX_AGENT_FILES, too_long=too_long
        )
        candidates += _files_as_artifacts(
            layout.agent_logs, "agent", MAX_AGENT_FILES, self.plan.output_limit_bytes, too_long
        )
        if too_long:
            self.notes.append(
                f"{len(too_long)} file(s) not stored: their names, escaped, are too long "
                f"(at most {ARTIFACT_NAME_LIMIT} characters, {NAME_MAX_BYTES} bytes a "
                f"folder or file), e.g. {too_long[0]}"
            )
        target_root = Path(self.plan.artifacts_dir)
        if not target_root.is_dir():
            target_root.mkdir(parents=True)
        made = {target_root}
        entries: list[ArtifactEntry] = []
        cap = self.plan.max_artifact_files
        dropped: list[str] = []
        for name, path in candidates:
            try:
                info = path.lstat()
            except OSError:
                continue
            limit = MAX_FRAME_BYTES if name == "result-frame.json" else info.st_size
            if not (stat.S_ISREG(info.st_mode) and 0 < info.st_size <= limit):
                continue
            if cap is not None and len(entries) >= cap:
                # execution.maxArtifactFiles: the first ones in this order are kept (the
                # streams and the rewards come first, the subject's own files last).
                dropped.append(name)
                continue
            target = target_root / name
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            digest = copy_artifact(path, target, self.redactor)
            capture = self.captures.get(name)
            entries.append(
                ArtifactEntry(
                    name, digest.bytes, digest.sha256, bool(capture and capture.truncated)
                )
            )
        if dropped:
            self.notes.append(
                f"execution.maxArtifactFiles is {cap}: {len(dropped)} artifact file(s) not "
                f"kept: {', '.join(dropped)}"
            )
        return tuple(entries)

    # -- the whole attempt ------------------------------------------------------------
    def run(self) -> AttemptOutcome:
        started_at = time.time()
        t0 = time.perf_counter()
        execution: Execution
        frame: Frame = NO_FRAME
        verification: Verification = NOT_VERIFIED
        t_prepared = t_subject = t_verified = t0
        try:
            self.prepare()
            self.sandbox.start()
            refused = self.check_gate()
            if refused is None and self.plan.healthcheck is not None:
                # Before the group's gate: its subjects start together once all are up.
                refused = self.healthy(self.plan.healthcheck, "healthcheck")
            t_prepared = time.perf_counter()
            self.pass_gate()
            if refused is not None:
                # Nothing of the subject started; an infrastructure failure says why.
                execution = Execution(ExecutionEnd.THREW, error=refused)
            elif self.plan.steps:
                execution, verification = multistep.run_steps(self)
            else:
                execution = self.run_subject()
                if execution.end in (ExecutionEnd.EXITED, ExecutionEnd.TIMED_OUT):
                    self.collect_artifacts(self.plan.artifacts, self.layout.root / "artifacts")
            t_subject = time.perf_counter()
            frame = self.read_frame()
            # (A multi-step attempt was verified step by step.)
            if not self.plan.steps and execution.end in (
                ExecutionEnd.EXITED,
                ExecutionEnd.TIMED_OUT,
            ):
                result = self.verify()
                if result is None:
                    execution = Execution(ExecutionEnd.CANCELLED)
                else:
                    verification = result
            t_verified = time.perf_counter()
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                self.disk_full = self.disk_full or str(exc.filename or self.layout.root)
            execution = Execution(ExecutionEnd.THREW, error=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):
                self.pass_gate()  # the other arms must not wait for this one
            now = time.perf_counter()
            t_prepared = max(t_prepared, t0)
            t_subject = max(t_subject, t_prepared)
            t_verified = now
        finally:
            with contextlib.suppress(Exception):
                self.cleanup()
        artifacts: tuple[ArtifactEntry, ...] = ()
        try:
            artifacts = self.store_artifacts()
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self.disk_full = self.disk_full or self.plan.artifacts_dir
            else:
                execution = Execution(
                    ExecutionEnd.THREW, error=f"storing the artifacts failed: {exc}"
                )
        recovery = recover_metered(
            self.plan.metering,
            self.plan.subject.contract,
            frame,
            self.host_env,
            self._settle_metering,
        )
        self.notes.extend(recovery.notes)
        t_end = time.perf_counter()
        classification = classify(
            self.plan.subject.contract,
            execution,
            frame,
            verification,
            metered=recovery.metered,
            disk_full=self.disk_full,
            tampered=self.tampered,
        )
        if self.plan.steps:
            # The steps interleave the phases: each phase's time is the sum over them.
            step_times = self.timings
            t_subject = t_prepared + multistep.subject_seconds(step_times)
            t_verified = max(t_verified, t_subject)
        else:
            step_times = {}
        self.timings = {
            "prepareSec": t_prepared - t0,
            "subjectSec": max(0.0, t_subject - t_prepared),
            "verifierSec": max(0.0, t_verified - t_subject),
            "cleanupSec": t_end - t_verified,
            "totalSec": t_end - t0,
            **step_times,
        }
        return AttemptOutcome(
            classification=classification,
            execution=execution,
            frame=frame,
            verification=replace(
                verification, metrics={**verification.metrics, **self.step_metrics}
            )
            if self.step_metrics
            else verification,
            artifacts=artifacts,
            started_at=started_at,
            finished_at=time.time(),
            subject_started_at=self.subject_started_at,
            timings=self.timings,
            kernel=build_kernel(
                classification,
                replace(verification, metrics={**verification.metrics, **self.step_metrics}),
                self.timings["subjectSec"],
                artifacts,
                self.redactor,
                isolation=self.sandbox.isolation.value,
                notes=tuple(self.notes),
            ),
        )


def run_attempt(
    plan: AttemptPlan,
    supervisor: ProcessSupervisor,
    cancel: CancelToken,
    host_env: Mapping[str, str] | None = None,
    start_gate: Callable[[], None] | None = None,
    settle_metering: Callable[[], object] | None = None,
    pool: NamespacePool | None = None,
) -> AttemptOutcome:
    """Run one attempt to its end; never raises for anything the subject or task does.

    `start_gate` is called after preparation and before the subject starts: the local
    executor passes a barrier so all arms of a task group start at the same moment.
    `settle_metering` (the cell's ProxyHandle.settle) is called once the subject has
    stopped, before metered usage is recovered from the provider-usage checkpoint.
    `pool` (the local executor's) hands the process sandbox namespaces made ahead.
    """
    env = host_env if host_env is not None else host_environment()
    return Attempt(plan, supervisor, cancel, env, start_gate, settle_metering, pool).run()
