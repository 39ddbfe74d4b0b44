"""The trial worker: one Harbor process per maka-eval run, one Harbor trial per attempt.

    python -m maka_eval_harbor.worker serve STAGE_DIR   run trials asked for on stdin
    python -m maka_eval_harbor.worker probe             check an environment config

`serve` speaks JSON lines. maka-eval sends `{"op": "trial", "id", "config"}` (a Harbor
TrialConfig), `{"op": "go", "id"}` (the attempt's task group is ready: its subject may
start) and `{"op": "cancel", "id"}`; the worker answers `{"op": "ready"}` once,
`{"op": "gate", "id"}` when a trial's environment is up, and `{"op": "done", "id",
"trialDir", "error", "cancelled"}` when Harbor has finished the trial (verifier and
teardown included). Trials run concurrently, as many as maka-eval starts: the schedule is
maka-eval's, Harbor's job queue and n_concurrent are not used. Harbor's own output goes
to stderr; answers go to the stdout the worker started with. The worker ends when stdin
closes or STAGE_DIR disappears (maka-eval removes it when the run ends).

`probe` reads `{"environment": {...}}` and prints the Harbor version and every problem
Harbor's own models and the environment's preflight find with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from maka_eval import strict_json  # staged beside this package (harbor.worker.PLAN_READER)

STAGE_POLL_SEC = 2.0


def harbor_version() -> str:
    try:
        return importlib.metadata.version("harbor")
    except importlib.metadata.PackageNotFoundError:
        return ""


class Worker:
    def __init__(self, stage_dir: Path, out: IO[str]) -> None:
        self.stage_dir = stage_dir
        self.out = out
        self.out_lock = threading.Lock()
        self.loop = asyncio.get_running_loop()
        self.trials: dict[str, asyncio.Task[None]] = {}
        self.gates: dict[str, asyncio.Future[None]] = {}
        self.stopping = asyncio.Event()

    def send(self, message: Mapping[str, Any]) -> None:
        with self.out_lock:
            self.out.write(json.dumps(message, sort_keys=True) + "\n")
            self.out.flush()

    # -- requests -------------------------------------------------------------------
    def handle(self, line: str) -> None:
        try:
            message = strict_json.loads(line)
            op, key = message["op"], str(message["id"])
        except (ValueError, KeyError, TypeError) as exc:
            print(f"maka-eval worker: bad request {line[:200]!r}: {exc}", file=sys.stderr)
            return
        if op == "trial":
            self.trials[key] = self.loop.create_task(self.run_trial(key, message["config"]))
        elif op == "go":
            gate = self.gates.pop(key, None)
            if gate is not None and not gate.done():
                gate.set_result(None)
        elif op == "cancel":
            task = self.trials.get(key)
            if task is not None:
                task.cancel()

    async def gate(self, key: str) -> None:
        future: asyncio.Future[None] = self.loop.create_future()
        self.gates[key] = future
        self.send({"op": "gate", "id": key})
        await future

    async def run_trial(self, key: str, raw: Mapping[str, Any]) -> None:
        from harbor.models.trial.config import TrialConfig
        from harbor.trial.trial import Trial

        answer: dict[str, Any] = {"op": "done", "id": key, "error": None, "cancelled": False}
        try:
            config = TrialConfig.model_validate(raw)
            answer["trialDir"] = str(Path(config.trials_dir) / config.trial_name)
            trial = await Trial.create(config)
            await trial.run()
        except asyncio.CancelledError:
            answer["cancelled"] = True
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            answer["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            self.trials.pop(key, None)
            self.gates.pop(key, None)
            self.send(answer)

    # -- lifetime -------------------------------------------------------------------
    def read_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip():
                self.loop.call_soon_threadsafe(self.handle, line)
        self.loop.call_soon_threadsafe(self.stopping.set)

    async def watch_stage(self) -> None:
        while not self.stopping.is_set():
            if not self.stage_dir.is_dir():
                self.stopping.set()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), STAGE_POLL_SEC)

    async def serve(self) -> None:
        from . import agent as relay_agent  # Harbor is imported here, not for `probe`

        relay_agent.gate_hook = self.gate
        threading.Thread(target=self.read_stdin, name="stdin", daemon=True).start()
        self.send({"op": "ready", "harborVersion": harbor_version(), "pid": os.getpid()})
        await self.watch_stage()
        # The run is over: cancel what is left (Harbor stops its environments).
        for task in list(self.trials.values()):
            task.cancel()
        if self.trials:
            await asyncio.gather(*self.trials.values(), return_exceptions=True)


def probe(request: Mapping[str, Any]) -> dict[str, Any]:
    """Harbor's verdict on an environment config (its model, options and preflight)."""
    problems: list[str] = []
    answer: dict[str, Any] = {
        "harborVersion": harbor_version(),
        "python": sys.version.split()[0],
        "problems": problems,
    }
    try:
        from harbor.environments.factory import EnvironmentFactory
        from harbor.models.trial.config import EnvironmentConfig
    except Exception as exc:
        problems.append(f"Harbor cannot be imported: {type(exc).__name__}: {exc}")
        return answer
    try:
        config = EnvironmentConfig.model_validate(request.get("environment") or {})
    except Exception as exc:
        problems.append(str(exc))
        return answer
    try:
        EnvironmentFactory.validate_options(config)
    except (Exception, SystemExit) as exc:
        problems.append(str(exc))
        return answer
    if request.get("preflight", True):
        try:
            EnvironmentFactory.run_preflight(
                type=config.type, import_path=config.import_path, kwargs=config.kwargs
            )
        except (Exception, SystemExit) as exc:
            problems.append(str(exc) or type(exc).__name__)
    return answer


def main(argv: list[str]) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if len(argv) >= 2 and argv[1] == "probe":
        out = sys.stdout
        sys.stdout = sys.stderr  # whatever Harbor prints stays off the answer
        answer = probe(strict_json.loads(sys.stdin.read() or "{}"))
        out.write(json.dumps(answer) + "\n")
        out.flush()
        return 0
    if len(argv) == 3 and argv[1] == "serve":
        # Answers go to the stdout we were given; everything else that writes to fd 1
        # (Harbor, its libraries, subprocesses) goes to stderr instead.
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

        async def serve() -> None:
            await Worker(Path(argv[2]), out).serve()

        asyncio.run(serve())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
