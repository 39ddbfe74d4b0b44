"""Talking to Harbor's interpreter: staging the bridge, probing, and the trial worker.

Harbor runs in its own Python (MAKA_EVAL_HARBOR_PYTHON), never in maka-eval's. The
bridge package (`bridge/`, stdlib and Harbor only) is copied to a private folder as
`maka_eval_harbor` and put on that interpreter's PYTHONPATH, beside the standard-library
part of `maka_eval` it reads the attempt plan with (`PLAN_READER`: the relay's own plan
reader and the layout, the same files the relay runs with in a Pod). One worker process
per run runs the attempts' trials concurrently (bridge/worker.py has the protocol).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from maka_eval import strict_json

BRIDGE_DIR = Path(__file__).resolve().parent / "bridge"
MAKA_EVAL_DIR = Path(__file__).resolve().parents[1]
PACKAGE = "maka_eval_harbor"
PLAN_READER = (
    "__init__.py",
    "layout.py",
    "strict_json.py",
    "engine/__init__.py",
    "engine/classify.py",
    "engine/environment.py",
    "engine/launch.py",
    "engine/modes.py",
    "engine/status.py",
    "engine/task_settings.py",
    "engine/usage.py",
    "metering/__init__.py",
    "metering/pricing.py",
    "relay/__init__.py",
    "relay/plan.py",
    "sandbox/__init__.py",
    "sandbox/plans.py",
)
"""What `maka_eval.relay.plan` (AttemptPlan.from_json) and `maka_eval.layout` load, all
standard library only: staged as `maka_eval` so the bridge reads the plan with the
relay's reader (tests/harbor/test_bridge.py checks this is exactly what they load)."""
PROBE_TIMEOUT_SEC = 120.0
READY_TIMEOUT_SEC = 120.0


class WorkerError(RuntimeError):
    """Harbor's interpreter could not be started or stopped answering."""


def stage_bridge(folder: Path) -> Path:
    """Copy the bridge into `folder` as the package `maka_eval_harbor`, and the plan
    reader as `maka_eval`; return the folder to put on PYTHONPATH."""
    package = folder / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    for source in sorted(BRIDGE_DIR.glob("*.py")):
        shutil.copyfile(source, package / source.name)
    for name in PLAN_READER:
        target = folder / "maka_eval" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MAKA_EVAL_DIR / name, target)
    return folder


def harbor_environment_variables(
    python: str, pythonpath: Path, host_env: Mapping[str, str], withheld: Iterable[str]
) -> dict[str, str]:
    """The environment of Harbor's process: this machine's (an environment provider's
    own settings, such as DOCKER_HOST or a cloud API key, come from it) minus every
    credential the experiment declares (those reach only their subject, out of band),
    with Harbor's virtualenv first on PATH (podman-compose lives there)."""
    hidden = set(withheld)
    env = {k: v for k, v in host_env.items() if k not in hidden and not k.startswith("PYTHON")}
    bin_dir = str(Path(python).parent)
    env["PATH"] = os.pathsep.join([bin_dir, host_env.get("PATH") or os.defpath])
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Harbor's model-price table is fetched from the internet by default (with retries).
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return env


def probe(
    python: str,
    environment: Mapping[str, Any],
    host_env: Mapping[str, str],
    withheld: Iterable[str] = (),
    preflight: bool = True,
) -> dict[str, Any]:
    """Harbor's version and its problems with `environment` (its models, the
    environment's options and preflight), asked of Harbor's own interpreter."""
    folder = Path(tempfile.mkdtemp(prefix="maka-eval-harbor-probe-"))
    try:
        path = stage_bridge(folder)
        proc = subprocess.run(
            [python, "-m", f"{PACKAGE}.worker", "probe"],
            input=json.dumps({"environment": dict(environment), "preflight": preflight}),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_SEC,
            env=harbor_environment_variables(python, path, host_env, withheld),
            cwd=folder,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:])[:400]
        raise WorkerError(
            f"{python} could not run the Harbor probe (exit {proc.returncode}): {tail}"
        )
    answer = strict_json.loads(lines[-1])
    if not isinstance(answer, dict):
        raise WorkerError("the Harbor probe answered something that is not an object")
    return answer


@dataclass(frozen=True)
class TrialDone:
    """Harbor finished a trial (or could not run it)."""

    trial_dir: Path | None
    error: str | None
    cancelled: bool


class _Pending:
    def __init__(self, on_gate: Callable[[], None]) -> None:
        self.on_gate = on_gate
        self.done = threading.Event()
        self.answer: TrialDone | None = None


class TrialWorker:
    """One Harbor process running the trials of one run."""

    def __init__(self, python: str, stage: Path, env: Mapping[str, str], log: Path) -> None:
        self.stage = stage
        self._log: IO[bytes] = log.open("ab")
        self._proc = subprocess.Popen(
            [python, "-m", f"{PACKAGE}.worker", "serve", str(stage)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=dict(env),
            cwd=stage,
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C reaches maka-eval, which cancels in order
        )
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._ready = threading.Event()
        self.harbor_version = ""
        self._reader = threading.Thread(target=self._read, name="harbor-worker", daemon=True)
        self._reader.start()
        if not self._ready.wait(READY_TIMEOUT_SEC) or self._proc.poll() is not None:
            self.stop()
            raise WorkerError(f"Harbor's worker did not start; see {log}")

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _send(self, message: Mapping[str, Any]) -> None:
        stdin = self._proc.stdin
        if stdin is None:
            raise WorkerError("Harbor's worker has no input")
        with self._lock:
            try:
                stdin.write(json.dumps(message) + "\n")
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise WorkerError(f"Harbor's worker is gone ({exc})") from None

    def _read(self) -> None:
        stdout = self._proc.stdout
        assert stdout is not None
        for line in stdout:
            try:
                message = strict_json.loads(line)
                op, key = message.get("op"), str(message.get("id", ""))
            except (ValueError, AttributeError):
                continue
            if op == "ready":
                self.harbor_version = str(message.get("harborVersion", ""))
                self._ready.set()
                continue
            with self._lock:
                pending = self._pending.get(key)
            if pending is None:
                continue
            if op == "gate":
                threading.Thread(
                    target=self._pass_gate, args=(key, pending), name="harbor-gate", daemon=True
                ).start()
            elif op == "done":
                trial_dir = message.get("trialDir")
                pending.answer = TrialDone(
                    Path(trial_dir) if trial_dir else None,
                    message.get("error"),
                    bool(message.get("cancelled")),
                )
                pending.done.set()
        # The process ended: every trial still waiting gets an answer.
        with self._lock:
            left = list(self._pending.values())
        for pending in left:
            if pending.answer is None:
                pending.answer = TrialDone(None, "Harbor's worker process ended", False)
            pending.done.set()

    def _pass_gate(self, key: str, pending: _Pending) -> None:
        with contextlib.suppress(Exception):
            pending.on_gate()
        with contextlib.suppress(WorkerError):
            self._send({"op": "go", "id": key})

    def run_trial(
        self,
        key: str,
        config: Mapping[str, Any],
        on_gate: Callable[[], None],
        cancelled: threading.Event,
        deadline: float,
    ) -> TrialDone:
        """Run one trial to its end; `on_gate` is called when its environment is up and
        its subject may start once it returns. Cancel (or the deadline) stops it."""
        pending = _Pending(on_gate)
        with self._lock:
            self._pending[key] = pending
        try:
            self._send({"op": "trial", "id": key, "config": dict(config)})
            asked_to_stop = False
            while not pending.done.wait(0.5):
                if not asked_to_stop and (cancelled.is_set() or time.time() > deadline):
                    asked_to_stop = True
                    self._send({"op": "cancel", "id": key})
            assert pending.answer is not None
            return pending.answer
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def stop(self) -> None:
        """Close the worker's input (it cancels what runs, then exits) and wait for it."""
        with contextlib.suppress(Exception):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._log.close()
