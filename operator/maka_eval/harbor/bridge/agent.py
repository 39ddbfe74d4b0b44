"""The relay Agent: Harbor's Agent.run() invokes exactly one maka-eval subject.

Harbor prepares the task environment, calls `setup()` then `run()`, and runs its native
verifier afterwards. The subject is one of:

- `external`: its command inside the task environment (a program named by a path on
  maka-eval's machine is uploaded to /maka/bin/ first), with its declared non-secret
  env, its declared credentials, and the MAKA_EVAL_* variables the local relay gives;
- `maka`: the Runtime Host command, the same way, with a protocol-v1 result frame;
- `oracle`: Harbor's own oracle agent (the task's solution/solve.sh);
- `nop`: nothing.

The plan comes from a file maka-eval wrote in the attempt's private folder (its path is
the agent's only kwarg, so Harbor's config.json holds no subject secret); the file is
removed as soon as it is read (bridge/plan_file.py: the attempt plan every executor
makes, read with the relay's own reader, and beside it the credentials' values, which
the plan never holds). Credentials travel into the container as a file the subject's
wrapper sources and deletes before the subject starts: never on a command line, never in
Harbor's config or logs. What the relay saw (how the subject ended, its exit code, its
result frame) is written to `maka-relay.json` in the agent's logs folder, for maka-eval
to classify with the verifier's reward. The subject's stdout and stderr are kept there
too, capped at the plan's output limit, with every credential value replaced by
`[redacted:NAME]`.

Standard library, Harbor and the staged plan reader only: this module runs in Harbor's
interpreter.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shlex
import shutil
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

# Staged beside this package in Harbor's environment (harbor.worker.PLAN_READER).
from maka_eval import layout
from maka_eval.engine.classify import ResultContract
from maka_eval.engine.launch import FIXED_ENV
from maka_eval.relay.plan import AttemptPlan

from .plan_file import PlanFile

RECORD_NAME = "maka-relay.json"
RECORD_FORMAT = "maka.eval.harbor-relay.v1"
OUTPUT_ENV = f"{layout.ENV_PREFIX}OUT"
"""Where the subject's wrapper writes its output (this bridge's own variable)."""
QUIESCE_TIMEOUT_SEC = 30

GateHook = Callable[[str], Awaitable[None]]
gate_hook: GateHook | None = None
"""Set by the trial worker: waits until every arm of the attempt's task group is ready
(maka-eval's groups start together). Without a worker (Harbor run by hand), no wait."""

# The subject's wrapper: credentials sourced then deleted, the workspace recorded, the
# subject exec'd with its output in files (never in Harbor's logs).
WRAPPER = f"""
f=$1; shift
if [ -f "$f" ]; then set -a; . "$f"; set +a; rm -f "$f"; fi
export {layout.WORKSPACE_ENV}="$PWD"
exec "$@" >"${OUTPUT_ENV}/stdout" 2>"${OUTPUT_ENV}/stderr" </dev/null
"""

# Quiescing a subject cut off by the timeout: every process carrying the attempt's marker.
QUIESCE = rf"""
id=$1
for p in /proc/[0-9]*; do
  pid=${{p#/proc/}}
  [ "$pid" = "$$" ] && continue
  if tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qx "{layout.ATTEMPT_ID_ENV}=$id"; then
    kill -KILL "$pid" 2>/dev/null
  fi
done
true
"""


def _quote(text: str) -> str:
    return shlex.quote(text)


def _env_file(values: Mapping[str, str]) -> str:
    return "".join(f"{name}={_quote(value)}\n" for name, value in values.items())


def _read_regular(path: Path, limit: int) -> tuple[bytes | None, int]:
    """At most `limit` bytes of a regular file and its size; None when it is missing or
    not a regular file (a link the subject planted is never followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None, 0
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None, 0
        return handle.read(limit), info.st_size


def _frame(path: Path) -> dict[str, Any]:
    data, size = _read_regular(path, layout.MAX_FRAME_BYTES)
    if data is None:
        return {"state": "absent"}
    if size > layout.MAX_FRAME_BYTES:
        return {"state": "oversized", "bytes": size}
    return {"state": "present", "data": base64.b64encode(data).decode()}


class Redact:
    """Replaces every credential value by [redacted:NAME] (longest first)."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.pairs = sorted(
            ((v, k) for k, v in secrets.items() if v), key=lambda p: len(p[0]), reverse=True
        )

    def __call__(self, data: bytes) -> bytes:
        for value, name in self.pairs:
            data = data.replace(value.encode(), f"[redacted:{name}]".encode())
        return data

    def text(self, text: str) -> str:
        return self(text.encode()).decode("utf-8", "replace")


class RelayAgent(BaseAgent):  # type: ignore[misc]
    """Runs the one subject its plan names (see the module docstring)."""

    def __init__(self, logs_dir: Path, plan: str = "", **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        self._plan_path = Path(plan)
        self._order: PlanFile | None = None
        self._gated = False

    @staticmethod
    def name() -> str:
        return "maka-eval-relay"

    def version(self) -> str:
        return "1"

    # -- the plan -------------------------------------------------------------------
    def _load_plan(self) -> PlanFile:
        if self._order is None:
            self._order = PlanFile.read(self._plan_path)
        return self._order

    async def setup(self, environment: BaseEnvironment) -> None:
        order = self._load_plan()
        if order.kind in ("external", "maka"):
            # Under Harbor's setup timeout, not the subject's: the subject's time limit
            # covers the subject alone, as under the local executor.
            await self._stage(environment, order)
        # The environment is up: wait for the other arms of the task group, so that the
        # subjects of a group start together.
        if gate_hook is not None and not self._gated:
            self._gated = True
            await gate_hook(order.plan.attempt_id)

    # -- run --------------------------------------------------------------------------
    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        order = self._load_plan()
        redact = Redact(order.credentials)
        started = time.time()
        record: dict[str, Any] = {"format": RECORD_FORMAT, "kind": order.kind}
        try:
            if order.kind == "nop":
                record.update(end="exited", exitCode=0)
            elif order.kind == "oracle":
                record.update(await self._oracle(environment, order))
            else:
                record.update(await self._command(environment, order, redact))
        except asyncio.CancelledError:
            # Harbor's agent timeout (or the run's cancellation): the subject has not
            # stopped, so it is quiesced before the verifier looks at the environment.
            record.update(end="cut_off")
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._quiesce(environment, order, redact))
            raise
        except Exception as exc:
            record.update(end="threw", error=redact.text(f"{type(exc).__name__}: {exc}")[:400])
        finally:
            record["subjectSec"] = round(time.time() - started, 6)
            self._write_record(record)

    def _write_record(self, record: Mapping[str, Any]) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / RECORD_NAME).write_text(json.dumps(record, sort_keys=True))

    async def _oracle(self, environment: BaseEnvironment, order: PlanFile) -> dict[str, Any]:
        from harbor.agents.oracle import OracleAgent
        from harbor.models.trial.paths import TrialPaths

        if order.task_dir is None:
            raise RuntimeError("the oracle needs the task's folder; the plan names none")
        oracle = OracleAgent(
            logs_dir=self.logs_dir,
            task_dir=Path(order.task_dir),
            trial_paths=TrialPaths(self.logs_dir.parent),
            agent_timeout_sec=None,  # Harbor's own timeout around run() applies
        )
        credentials = dict(order.credentials)
        scope = (
            environment.scoped_exec_env(credentials) if credentials else contextlib.nullcontext()
        )
        with scope:
            await oracle.run("", environment, AgentContext())
        code_file = self.logs_dir / "exit-code.txt"
        code = int(code_file.read_text().strip()) if code_file.is_file() else 0
        return {"end": "exited", "exitCode": code}

    async def _stage(self, environment: BaseEnvironment, order: PlanFile) -> None:
        """Put what the subject needs in the environment with one copy and one root exec
        (each call into the environment costs a compose round trip)."""
        stage = Path(order.plan.root) / "stage"

        def staged(path: str) -> Path:
            """Where a path of the layout's relay folder is staged (uploaded as a whole)."""
            return stage / PurePosixPath(path).relative_to(layout.RELAY_ROOT)

        for folder in (layout.PROGRAM_DIR, layout.BRIDGE_RUN_DIR, layout.BRIDGE_OUTPUT_DIR):
            staged(folder).mkdir(parents=True, exist_ok=True)
        staged(layout.CONTAINER_INSTRUCTION_PATH).write_text(order.instruction, encoding="utf-8")
        if order.upload:
            program = Path(order.upload)
            (staged(layout.PROGRAM_DIR) / program.name).write_bytes(program.read_bytes())
        secret = staged(layout.BRIDGE_CREDENTIALS_FILE)
        if order.credentials:
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(_env_file(order.credentials))
        try:
            await environment.upload_dir(stage, layout.RELAY_ROOT)
        finally:
            with contextlib.suppress(OSError):
                secret.unlink()
        # The credentials file is readable by the subject's user; the wrapper deletes it
        # before the subject runs.
        credentials = layout.BRIDGE_CREDENTIALS_FILE
        await self._root(
            environment,
            f"chmod 0755 {layout.RELAY_ROOT} {layout.PROGRAM_DIR} "
            f"&& chmod 0777 {layout.BRIDGE_RUN_DIR} {layout.BRIDGE_OUTPUT_DIR} "
            f"&& chmod 0644 {layout.CONTAINER_INSTRUCTION_PATH} "
            f"&& chmod -R a+rx {layout.PROGRAM_DIR} "
            f"&& {{ ! [ -f {credentials} ] || chmod 0644 {credentials}; }}",
        )

    async def _command(
        self, environment: BaseEnvironment, order: PlanFile, redact: Redact
    ) -> dict[str, Any]:
        plan = order.plan
        argv = list(plan.subject.argv)
        if order.upload:
            argv[0] = f"{layout.PROGRAM_DIR}/{Path(order.upload).name}"
        protocol = plan.subject.contract is ResultContract.PROTOCOL_V1
        env = {
            **plan.subject.env,
            **attempt_variables(plan),
            layout.INSTRUCTION_FILE_ENV: layout.CONTAINER_INSTRUCTION_PATH,
            OUTPUT_ENV: layout.BRIDGE_OUTPUT_DIR,
            **FIXED_ENV,
        }
        if protocol:
            env[layout.RESULT_FILE_ENV] = layout.BRIDGE_FRAME_FILE
        command = " ".join(
            _quote(p)
            for p in ("sh", "-c", WRAPPER, "maka-relay", layout.BRIDGE_CREDENTIALS_FILE, *argv)
        )
        result = await environment.exec(command=command, env=env)
        record: dict[str, Any] = {"end": "exited", "exitCode": result.return_code}
        out = Path(plan.root) / "out"
        try:
            await environment.download_dir(layout.BRIDGE_OUTPUT_DIR, out)
            self._keep_output(out, plan, redact)
            if protocol:
                record["frame"] = _frame(out / PurePosixPath(layout.BRIDGE_FRAME_FILE).name)
        finally:
            # The raw output may hold a credential the subject printed: only the
            # redacted copy in the agent's logs is kept.
            shutil.rmtree(out, ignore_errors=True)
        return record

    async def _root(self, environment: BaseEnvironment, command: str) -> None:
        result = await environment.exec(command=command, user="root", timeout_sec=120)
        if result.return_code != 0:
            raise RuntimeError(
                f"preparing the subject failed ({command[:80]}): exit {result.return_code}"
            )

    def _keep_output(self, out: Path, plan: AttemptPlan, redact: Redact) -> None:
        limit = plan.output_limit_bytes
        for stream in ("stdout", "stderr"):
            data, size = _read_regular(out / stream, limit)
            if data is None:
                continue
            data = redact(data)
            if size > limit:
                data += f"\n[maka-eval: {size - limit} more bytes cut]\n".encode()
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            (self.logs_dir / f"subject.{stream}").write_bytes(data)

    async def _quiesce(self, environment: BaseEnvironment, order: PlanFile, redact: Redact) -> None:
        """Stop every process of the attempt, then keep what it printed."""
        if order.kind not in ("external", "maka"):
            return
        plan = order.plan
        command = " ".join(
            _quote(p) for p in ("sh", "-c", QUIESCE, "maka-quiesce", plan.attempt_id)
        )
        await environment.exec(command=command, user="root", timeout_sec=QUIESCE_TIMEOUT_SEC)
        out = Path(plan.root) / "out"
        try:
            await environment.download_dir(layout.BRIDGE_OUTPUT_DIR, out)
            self._keep_output(out, plan, redact)
        finally:
            shutil.rmtree(out, ignore_errors=True)


def attempt_variables(plan: AttemptPlan) -> dict[str, str]:
    """The MAKA_EVAL_* variables that describe the attempt, as the local relay sets them
    (the workspace is the subject's working folder, set by its wrapper)."""
    return {
        layout.ATTEMPT_ID_ENV: plan.attempt_id,
        layout.RUN_ID_ENV: plan.run_id,
        layout.CELL_ID_ENV: plan.cell_id,
        layout.TASK_ID_ENV: plan.task_id,
        layout.REPETITION_ENV: str(plan.repetition),
        layout.SUBJECT_ID_ENV: plan.subject_id,
    }
