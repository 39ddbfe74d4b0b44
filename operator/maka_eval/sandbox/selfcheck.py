"""The conformance kit for sandbox backends: run one attempt's worth of real calls
against a backend and check each answer against the `Sandbox` contract.

Any backend, maka-eval's own or a third party's, runs it the same way:

    python -m maka_eval.sandbox.selfcheck process            # this machine, namespaces
    python -m maka_eval.sandbox.selfcheck process --isolation none
    python -m maka_eval.sandbox.selfcheck container --image debian:bookworm
    python -m maka_eval.sandbox.selfcheck my-backend          # registered by entry point

or from a test: `assert_conforms(run(backend, ...))`. The calls follow the relay's own
order (start, the subject's programs, a subject cut off by its timeout and by
cancellation, the next step, the verifier, artifacts, stop), so a backend that passes
can run attempts. Checks of what the subject must NOT see (the tests, hidden folders)
apply to backends that claim isolation; a backend with `Isolation.NONE` skips them, as
the record then says nothing was hidden.

Programs run are POSIX `sh`, `cat`, `ls`, `sleep`, `ln` and `head`: any Linux image has them.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from maka_eval.engine.modes import Isolation
from maka_eval.processes.supervisor import MARKER_VARIABLE, CancelToken, ProcessSupervisor, WaitEnd
from maka_eval.sandbox.backends import SandboxBackend, SandboxRequest, load
from maka_eval.sandbox.base import Layout, Phase, Sandbox

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CANARY = "MAKA_EVAL_SELFCHECK_CANARY"
"""Set in this process only: a sandbox whose programs see it leaks the host's environment."""
WAIT_SEC = 60.0
"""How long a program that should end by itself may take (a hang guard, not a budget)."""
CUT_OFF_SEC = 0.5
"""The timeout a program that never ends is given."""
DOWNLOAD_CAP = 50_000
GONE_SEC = 10.0
"""How long killed programs may take to disappear (a hang guard, not a budget)."""


@dataclass(frozen=True)
class CheckResult:
    """One rule of the contract and what the backend did."""

    name: str
    passed: bool | None
    """None: not applicable to this backend (said in `detail`)."""
    detail: str = ""


@dataclass
class SelfCheckReport:
    """Every check run against one backend, in order."""

    kind: str
    isolation: str = ""
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        """The checks that failed."""
        return [r for r in self.results if r.passed is False]

    def text(self) -> str:
        """The report as aligned lines: PASS/FAIL/SKIP, the rule, what was seen."""
        width = max((len(r.name) for r in self.results), default=0)
        lines = [f"sandbox backend '{self.kind}' (isolation: {self.isolation or '?'})"]
        for r in self.results:
            mark = {True: "PASS", False: "FAIL", None: "SKIP"}[r.passed]
            lines.append(f"  {mark}  {r.name.ljust(width)}  {r.detail}".rstrip())
        failed = len(self.failures)
        lines.append(f"{len(self.results) - failed} of {len(self.results)} checks did not fail")
        return "\n".join(lines)


def assert_conforms(report: SelfCheckReport) -> None:
    """AssertionError naming every failed check (for a backend's own test suite)."""
    if report.failures:
        raise AssertionError(report.text())


class _Failed(Exception):
    """A check saw the backend break the contract."""


def _layout(root: Path) -> Layout:
    names = ("workspace", "home", "tmp", "agent", "tests", "verifier", "vhome", "vtmp", "ev")
    for name in names:
        (root / name).mkdir(parents=True)
    (root / "instruction.md").write_text("selfcheck\n")
    (root / "hidden").mkdir()
    (root / "hidden" / "secret.txt").write_text("hidden-from-subjects\n")
    return Layout(
        workspace=str(root / "workspace"),
        home=str(root / "home"),
        tmp=str(root / "tmp"),
        frame_dir=None,
        instruction=str(root / "instruction.md"),
        agent_logs=str(root / "agent"),
        tests=str(root / "tests"),
        verifier_logs=str(root / "verifier"),
        hidden=(str(root / "hidden"),),
        verifier_home=str(root / "vhome"),
        verifier_tmp=str(root / "vtmp"),
        evidence_dir=str(root / "ev"),
    )


class _Session:
    """One sandbox under test and the helpers the checks share."""

    def __init__(self, sandbox: Sandbox, attempt_id: str, layout: Layout, scratch: Path) -> None:
        self.sandbox = sandbox
        self.sandbox_id = attempt_id
        self.layout = layout
        self.scratch = scratch
        self._outputs = 0

    def seen(self, phase: Phase, host_path: str) -> str:
        return self.sandbox.path_of(phase, host_path)

    def run(
        self,
        script: str,
        phase: Phase = Phase.SUBJECT,
        *,
        timeout: float = WAIT_SEC,
        cancel: CancelToken | None = None,
        env: dict[str, str] | None = None,
    ) -> tuple[WaitEnd, int, str, str]:
        """Run `sh -c script`: how the wait ended, the exit code, stdout and stderr."""
        self._outputs += 1
        out_path = self.scratch / f"out-{self._outputs}"
        err_path = self.scratch / f"err-{self._outputs}"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = self.sandbox.spawn(
                phase,
                ["sh", "-c", script],
                # As the relay gives it: the attempt's marker finds what the program
                # leaves behind in backends without a namespace of their own.
                env={"PATH": PATH, MARKER_VARIABLE: self.sandbox_id, **(env or {})},
                cwd=self.seen(phase, self.layout.workspace),
                stdout=out,
                stderr=err,
            )
            end = self.sandbox.wait(proc, timeout, cancel or CancelToken())
            if end is not WaitEnd.EXITED:
                self.sandbox.quiesce(phase, proc)
            code = self.sandbox.release(proc)
        return (
            end,
            code,
            out_path.read_text(errors="replace"),
            err_path.read_text("utf-8", "replace"),
        )

    def ok(self, script: str, phase: Phase = Phase.SUBJECT, **kw: Any) -> str:
        """stdout of a program that must exit 0."""
        end, code, out, err = self.run(script, phase, **kw)
        if end is not WaitEnd.EXITED or code != 0:
            raise _Failed(f"`{script}` ended {end.value}, exit {code}: {err.strip()[-300:]}")
        return out


Check = Callable[[_Session], str | None]
"""A check: what it saw (passed), or raises _Failed; None from an isolation-only check
means skipped."""


def _env_and_cwd(s: _Session) -> str:
    out = s.ok(
        'echo "cwd=$(pwd)"; echo "mine=$MINE"; echo "canary=${' + CANARY + '-}"',
        env={"MINE": "given"},
    )
    cwd = s.seen(Phase.SUBJECT, s.layout.workspace)
    if f"cwd={cwd}" not in out:
        raise _Failed(f"the program did not start in {cwd}: {out!r}")
    if "mine=given" not in out:
        raise _Failed(f"the environment given to spawn was not the program's: {out!r}")
    if "canary=\n" not in out and not out.endswith("canary="):
        raise _Failed(f"the program saw {CANARY} from the host's environment: {out!r}")
    return f"cwd {cwd}, env exactly as given"


def _exit_and_output(s: _Session) -> str:
    end, code, out, err = s.run("echo to-out; echo to-err >&2; exit 7")
    if end is not WaitEnd.EXITED or code != 7:
        raise _Failed(f"`exit 7` ended {end.value} with exit {code}")
    if out != "to-out\n" or err != "to-err\n":
        raise _Failed(f"stdout {out!r} and stderr {err!r} were not kept apart")
    return "exit code 7, stdout and stderr apart"


def _workspace_kept(s: _Session) -> str:
    s.ok("echo from-subject > made.txt")
    out = s.ok("cat made.txt")
    if out != "from-subject\n":
        raise _Failed(
            f"a file the subject wrote in its workspace is gone for its next program: {out!r}"
        )
    return "the workspace is kept from one program to the next"


def _upload(s: _Session) -> str:
    source = s.scratch / "upload"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "given.txt").write_text("uploaded\n")
    target = s.seen(Phase.SUBJECT, s.layout.workspace) + "/given"
    s.sandbox.upload(str(source), target)
    out = s.ok(f"cat '{target}/sub/given.txt'")
    if out != "uploaded\n":
        raise _Failed(f"an uploaded folder's file reads {out!r}")
    return "a folder's content reaches the subject"


def _instruction(s: _Session) -> str:
    seen = s.seen(Phase.SUBJECT, s.layout.instruction)
    s.sandbox.upload(s.layout.instruction, seen)
    out = s.ok(f"cat '{seen}'")
    if out != "selfcheck\n":
        raise _Failed(f"the instruction at {seen} reads {out!r}")
    return f"the instruction is at {seen}"


def _tests_out_of_sight(s: _Session) -> str | None:
    if s.sandbox.isolation is Isolation.NONE:
        return None
    Path(s.layout.tests, "probe.txt").write_text("tests-only\n")
    try:
        for phase in (Phase.SUBJECT, Phase.VERIFIER):
            where = s.seen(phase, s.layout.tests)
            _, _, out, _ = s.run(f"cat '{where}/probe.txt' 2>/dev/null")
            if "tests-only" in out:
                raise _Failed(f"the subject read the verifier's tests at {where}")
    finally:
        Path(s.layout.tests, "probe.txt").unlink()
    return "the subject cannot read the tests"


def _hidden_out_of_sight(s: _Session) -> str | None:
    if s.sandbox.isolation is Isolation.NONE:
        return None
    for folder in s.layout.hidden:
        _, _, out, _ = s.run(f"cat '{folder}/secret.txt' 2>/dev/null; ls '{folder}' 2>/dev/null")
        if "hidden-from-subjects" in out or "secret.txt" in out:
            raise _Failed(f"the subject read the hidden host folder {folder}")
    return "hidden host folders are out of sight"


def _cancelled(s: _Session) -> str:
    cancel = CancelToken()
    timer = threading.Timer(0.2, cancel.cancel)
    timer.start()
    try:
        end, _, _, _ = s.run("sleep 300", cancel=cancel)
    finally:
        timer.cancel()
        s.sandbox.next_step()
    if end is not WaitEnd.CANCELLED:
        raise _Failed(f"a program waited on while the attempt was cancelled ended {end.value}")
    return "cancellation ends the wait"


def _marked_sleeps(seconds: int) -> list[int]:
    """Host pids of `sleep <seconds>` (a number no other program uses), from /proc: what
    a backend left running, whatever it counts as its own. A backend whose programs run
    on another machine has none here, and passes on its `processes()` alone."""
    wanted = b"sleep\0" + str(seconds).encode() + b"\0"
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                    if handle.read().endswith(wanted):
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def _gone_or_left(seconds: int) -> list[int]:
    """The marked sleeps still alive once they had `GONE_SEC` to die (a kill is not
    instant: the kernel ends a namespace's processes after its init)."""
    deadline = time.monotonic() + GONE_SEC
    while (left := _marked_sleeps(seconds)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _unique_seconds() -> int:
    return 100_000 + secrets.randbelow(800_000)


def _cut_off(s: _Session) -> str:
    seconds = _unique_seconds()
    end, _, _, _ = s.run(f"sleep {seconds} & sleep {seconds} & wait", timeout=CUT_OFF_SEC)
    left = _gone_or_left(seconds)
    s.sandbox.next_step()
    if end is not WaitEnd.TIMED_OUT:
        raise _Failed(f"a program that never ends was not cut off at its timeout: {end.value}")
    if left:
        raise _Failed(f"quiesce left the program's children running (host pids {left})")
    out = s.ok("echo again")
    if out != "again\n":
        raise _Failed("after next_step the subject could not run again")
    return "timeout, quiesce ends the whole tree, next_step runs again"


def _verifier(s: _Session) -> str:
    Path(s.layout.tests, "check.txt").write_text("for-the-verifier\n")
    dirs = s.sandbox.verifier_dirs()
    tests = s.seen(Phase.VERIFIER, s.layout.tests)
    logs = s.seen(Phase.VERIFIER, s.layout.verifier_logs)
    env = {"HOME": dirs[0], "TMPDIR": dirs[1]} if dirs is not None else {}
    out = s.ok(
        f"cat '{tests}/check.txt' made.txt; echo 1 > '{logs}/reward.txt'", Phase.VERIFIER, env=env
    )
    if out != "for-the-verifier\nfrom-subject\n":
        raise _Failed(f"the verifier did not read its tests and the subject's workspace: {out!r}")
    reward = Path(s.layout.verifier_logs, "reward.txt")
    if not reward.is_file() or reward.read_text() != "1\n":
        raise _Failed(f"what the verifier wrote at {logs} is not in the host's verifier logs")
    if dirs is not None:
        home_seen = s.seen(Phase.SUBJECT, s.layout.home)
        if home_seen in dirs:
            raise _Failed(f"the verifier's HOME/TMPDIR {dirs} is the subject's {home_seen}")
    return "the verifier reads its tests and the workspace, its reward reaches the host"


def _download(s: _Session) -> str:
    s.ok("mkdir -p out && echo small > out/a.txt && head -c 200000 /dev/zero > out/big.bin")
    target = s.scratch / "downloaded"
    s.sandbox.download(
        s.seen(Phase.SUBJECT, s.layout.workspace) + "/out", str(target), DOWNLOAD_CAP
    )
    if not (target / "a.txt").is_file() or (target / "a.txt").read_text() != "small\n":
        raise _Failed("a downloaded folder lacks its small file")
    total = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    if total > DOWNLOAD_CAP:
        raise _Failed(f"download copied {total} bytes past its cap of {DOWNLOAD_CAP}")
    return f"a folder comes back, {total} bytes within the cap"


def _collect(s: _Session) -> str:
    s.ok("echo report > report.txt; ln -s /etc/passwd leak.txt")
    inside = s.seen(Phase.SUBJECT, s.layout.workspace)
    target = s.scratch / "artifacts" / "report.txt"
    target.parent.mkdir()
    why = s.sandbox.collect(f"{inside}/report.txt", target, DOWNLOAD_CAP)
    if why is not None or target.read_text() != "report\n":
        raise _Failed(f"a regular file was not collected: {why}")
    s.ok("ln -s /etc etc-link")
    for name, source in (("leak.txt", "leak.txt"), ("behind", "etc-link/passwd")):
        leak = s.scratch / "artifacts" / name
        s.sandbox.collect(f"{inside}/{source}", leak, DOWNLOAD_CAP)
        if leak.is_symlink() or (leak.is_file() and "root" in leak.read_text(errors="replace")):
            raise _Failed(f"collect followed (or copied) a link the subject left: {source}")
    return "a file is collected, a link is not followed (at the end of a path or in it)"


def _no_false_tampering(s: _Session) -> str:
    found = s.sandbox.tampering()
    if found is not None:
        raise _Failed(
            f"tampering reported where the subject changed nothing outside its folders: {found}"
        )
    return "no tampering reported for a well-behaved subject"


def _stop(s: _Session) -> str:
    seconds = _unique_seconds()
    s.ok(f"(sleep {seconds} >/dev/null 2>&1 &) ; echo left")
    s.sandbox.stop()
    left = sorted({*s.sandbox.processes(), *_gone_or_left(seconds)})
    if left:
        raise _Failed(f"after stop, processes of the attempt are alive (host pids {left})")
    return "nothing survives stop"


CHECKS: Sequence[tuple[str, Check]] = (
    ("environment and working folder", _env_and_cwd),
    ("exit code and output", _exit_and_output),
    ("workspace kept between programs", _workspace_kept),
    ("upload", _upload),
    ("instruction", _instruction),
    ("tests out of the subject's sight", _tests_out_of_sight),
    ("hidden folders out of sight", _hidden_out_of_sight),
    ("cancellation", _cancelled),
    ("timeout and quiesce", _cut_off),
    ("verifier", _verifier),
    ("download", _download),
    ("collect", _collect),
    ("tampering", _no_false_tampering),
    ("stop", _stop),
)
"""In the relay's order: each check may rely on what the ones before it left."""


@contextmanager
def _canary() -> Iterator[None]:
    had = os.environ.get(CANARY)
    os.environ[CANARY] = "host-only"
    try:
        yield
    finally:
        if had is None:
            os.environ.pop(CANARY, None)
        else:
            os.environ[CANARY] = had


def run(
    backend: SandboxBackend | str,
    *,
    customize: Callable[[SandboxRequest], SandboxRequest] | None = None,
    supervisor: ProcessSupervisor | None = None,
    root: Path | None = None,
) -> SelfCheckReport:
    """Run every check against a new sandbox of `backend` (an object or a registered
    kind). `customize` fills what the backend needs in its request (an isolation, a
    container plan, options); the folders are made under `root` (default: a temporary
    folder, removed afterwards)."""
    chosen = load(backend) if isinstance(backend, str) else backend
    report = SelfCheckReport(chosen.kind)
    base = Path(tempfile.mkdtemp(prefix="maka-selfcheck-", dir=root))
    try:
        layout = _layout(base / "attempt")
        scratch = base / "scratch"
        scratch.mkdir()
        request = SandboxRequest(
            supervisor=supervisor or ProcessSupervisor(),
            attempt_id=f"selfcheck-{base.name}",
            layout=layout,
            task_id="selfcheck",
            labels={"cell-id": "selfcheck::1::selfcheck", "run-id": "selfcheck"},
        )
        if customize is not None:
            request = customize(request)
        why = chosen.unavailable(request)
        if why is not None:
            report.results.append(CheckResult("available here", False, why))
            return report
        sandbox = chosen.create(request)
        report.isolation = str(sandbox.isolation.value)
        session = _Session(sandbox, request.attempt_id, request.layout, scratch)
        with _canary():
            try:
                sandbox.start()
            except Exception as exc:
                report.results.append(CheckResult("start", False, f"{type(exc).__name__}: {exc}"))
                return report
            report.results.append(CheckResult("start", True, "made"))
            stopped = False
            try:
                for name, check in CHECKS:
                    try:
                        said = check(session)
                    except _Failed as exc:
                        report.results.append(CheckResult(name, False, str(exc)))
                    except Exception as exc:
                        report.results.append(
                            CheckResult(name, False, f"raised {type(exc).__name__}: {exc}")
                        )
                    else:
                        skipped = "not applicable: the backend claims no isolation"
                        report.results.append(
                            CheckResult(name, said is not None, said or skipped)
                            if said is not None
                            else CheckResult(name, None, skipped)
                        )
                    stopped = stopped or check is _stop
            finally:
                if not stopped:
                    sandbox.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m maka_eval.sandbox.selfcheck KIND`: 0 when every check passes."""
    parser = argparse.ArgumentParser(
        prog="python -m maka_eval.sandbox.selfcheck",
        description="Run the sandbox conformance checks against a backend.",
    )
    parser.add_argument("kind", help="a sandbox backend kind: process, container, or installed")
    parser.add_argument(
        "--isolation",
        choices=[i.value for i in Isolation],
        default=Isolation.NAMESPACES.value,
        help="what to ask of the process backend (default: namespaces)",
    )
    parser.add_argument("--image", help="the image the container backend runs")
    parser.add_argument("--engine", help="the Docker Engine API address (default: DOCKER_HOST)")
    args = parser.parse_args(argv)

    def customize(request: SandboxRequest) -> SandboxRequest:
        request = replace(request, isolation=Isolation(args.isolation))
        if args.image:
            from maka_eval.sandbox.container import engine_info
            from maka_eval.sandbox.plans import ContainerPlan

            engine = args.engine
            if engine is None:
                probe = engine_info()
                engine = probe.engine.url if probe.engine is not None else ""
            request = replace(request, container=ContainerPlan(engine=engine, image=args.image))
        return request

    try:
        report = run(args.kind, customize=customize)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    print(report.text())
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
