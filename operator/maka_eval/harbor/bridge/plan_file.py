"""The relay Agent's plan file: the attempt plan, and what only this attempt's bridge
may know.

maka-eval writes it (harbor.executor) in the attempt's private folder; the relay Agent
reads it in Harbor's interpreter and deletes it. The plan is the one every executor
makes (`executors.plan.plan_attempt`), in AttemptPlan's own JSON, read with the relay's
own reader. Beside it, never in it: the credentials' values (an AttemptPlan names
credentials, it never holds one), and what only Harbor's side uses (the subject's kind,
which picks Harbor's oracle agent or the subject's command; the program to upload; the
instruction text; the task folder Harbor's oracle reads).

Standard library and the staged plan reader only: both sides import it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from maka_eval import strict_json
from maka_eval.relay.plan import AttemptPlan, PlanError


@dataclass(frozen=True)
class PlanFile:
    """What the relay Agent of one attempt is given."""

    plan: AttemptPlan
    kind: str
    """The subject's kind: external, maka, oracle or nop."""
    credentials: Mapping[str, str] = field(default_factory=dict)
    """Target variable -> value, for this subject's declared credentials only."""
    upload: str | None = None
    """Host file of the subject's program, uploaded to /maka/bin/ (None: the image's)."""
    instruction: str = ""
    """What the subject is asked to do (maka-eval's TaskInput.instruction)."""
    task_dir: str | None = None
    """The task's folder on this machine (None: a dataset task Harbor fetched)."""

    def write(self, path: Path) -> None:
        """Write it readable by this user only (it holds credentials)."""
        data = {
            "plan": strict_json.loads(self.plan.to_json()),
            "kind": self.kind,
            "credentials": dict(self.credentials),
            "upload": self.upload,
            "instruction": self.instruction,
            "taskDir": self.task_dir,
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)

    @classmethod
    def read(cls, path: Path) -> PlanFile:
        """Read it and delete it (it may hold credentials: gone once read); PlanError
        names what is wrong."""
        try:
            data = strict_json.loads(path.read_bytes())
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        try:
            credentials = {str(k): str(v) for k, v in (data.get("credentials") or {}).items()}
            return cls(
                plan=AttemptPlan.from_json(json.dumps(data["plan"])),
                kind=str(data["kind"]),
                credentials=credentials,
                upload=data.get("upload"),
                instruction=str(data.get("instruction") or ""),
                task_dir=data.get("taskDir"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise PlanError(f"the relay Agent's plan file is malformed: {exc!r}") from None
