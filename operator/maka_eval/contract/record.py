"""The attempt record: the result kernel plus the attempt's identity.

One file per attempt in the file store, written once; on a cluster the same identity
is the Attempt's spec and the kernel its status. Parsed strictly: unknown fields,
a cell id that does not match its parts, or an inconsistent kernel are refused.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from maka_eval.contract.fields import ContractError, Fields, load_bounded
from maka_eval.contract.kernel import ResultKernel, plain_floats, plain_kernel
from maka_eval.engine.expand import cell_id as make_cell_id
from maka_eval.engine.status import AttemptStatus, Trigger
from maka_eval.engine.usage import Usage

RECORD_FORMAT = "maka.eval.attempt.v2"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_RECORD_BYTES = 64 * 1024
_TRIGGERS = {t.value: t for t in Trigger}

_KEYS = frozenset(
    {
        "format",
        "runId",
        "experimentId",
        "cellId",
        "taskId",
        "repetition",
        "subjectId",
        "attempt",
        "attemptId",
        "trigger",
        "request",
        "startedAt",
        "subjectStartedAt",
        "finishedAt",
        "result",
        "timings",
        "host",
        "makaEvalVersion",
        "egressPolicyDigest",
    }
)


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of one cell: who, when, why it ran, and its result kernel."""

    run_id: str
    experiment_id: str
    cell_id: str
    task_id: str
    repetition: int
    subject_id: str
    attempt: int
    """Numbered per cell from 1."""
    attempt_id: str
    """Unique across runs: every process of the attempt carries it."""
    trigger: Trigger
    started_at: datetime
    subject_started_at: datetime | None
    finished_at: datetime
    result: ResultKernel
    timings: Mapping[str, float] = field(default_factory=dict)
    host: str = ""
    maka_eval_version: str = ""
    request: str | None = None
    """The manual request (`--cell` invocation or rerun token) this attempt answers."""
    egress_policy_digest: str | None = None
    """sha256 of the egress policy the attempt's network was policed with (None: no
    policy was declared; records written before egress enforcement have none)."""

    def __post_init__(self) -> None:
        if self.cell_id != make_cell_id(self.task_id, self.repetition, self.subject_id):
            raise ContractError(
                f"cellId: '{self.cell_id}' does not match taskId, repetition and subjectId"
            )
        if self.attempt < 1 or self.repetition < 1:
            raise ContractError("attempt and repetition count from 1")

    # -- what selection, the reconciler and summaries need --------------------------
    @property
    def number(self) -> int:
        return self.attempt

    @property
    def status(self) -> AttemptStatus:
        return self.result.status

    def spending(self) -> tuple[Usage | None, float | None]:
        """(usage, cost) this attempt spent, for the shared budget."""
        return self.result.usage, self.result.cost_usd

    # -- the wire form ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": RECORD_FORMAT,
            "runId": self.run_id,
            "experimentId": self.experiment_id,
            "cellId": self.cell_id,
            "taskId": self.task_id,
            "repetition": self.repetition,
            "subjectId": self.subject_id,
            "attempt": self.attempt,
            "attemptId": self.attempt_id,
            "trigger": self.trigger.value,
            "request": self.request,
            "startedAt": self.started_at.isoformat(),
            "subjectStartedAt": (
                self.subject_started_at.isoformat() if self.subject_started_at else None
            ),
            "finishedAt": self.finished_at.isoformat(),
            "result": self.result.to_dict(),
            "timings": dict(self.timings),
            "host": self.host,
            "makaEvalVersion": self.maka_eval_version,
        }
        if self.egress_policy_digest is not None:
            out["egressPolicyDigest"] = self.egress_policy_digest
        return out

    def to_json_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: str | bytes) -> AttemptRecord:
        """Parse a stored record; ContractError names what is wrong."""
        return cls.from_dict(load_bounded(data, MAX_RECORD_BYTES, "the record"))

    @classmethod
    def from_dict(cls, obj: Any) -> AttemptRecord:
        """Validate a decoded record; ContractError names what is wrong."""
        if type(obj) is dict:
            plain = plain_record(obj)
            if plain is not None:
                return plain
        return cls.from_fields(obj)

    @classmethod
    def from_fields(cls, obj: Any) -> AttemptRecord:
        """`from_dict` field by field: the rules for every input, each failure naming
        its field (`from_dict` first tries `plain_record`, which only accepts)."""
        f = Fields(obj, "", _KEYS)
        if f.raw("format") != RECORD_FORMAT:
            found = f.raw("format")
            raise ContractError(
                f"format: expected '{RECORD_FORMAT}', found {json.dumps(found)[:60]}"
                + (
                    " (written by an older maka-eval; run it into a new --out directory)"
                    if isinstance(found, str) and found.startswith("maka.eval.attempt.")
                    else ""
                )
            )
        try:
            trigger = _TRIGGERS[f.required("trigger")]
        except (KeyError, TypeError):  # TypeError: an unhashable value (a list, an object)
            raise ContractError(f"trigger: must be one of {', '.join(_TRIGGERS)}") from None
        timings = f.numbers("timings")
        text = f.text
        started = f.timestamp("startedAt")
        finished = f.timestamp("finishedAt")
        assert started is not None and finished is not None
        # Names that every record of a run repeats are kept once (interned): a report's
        # 100,000 records share them, and its reader's helper process sends each once.
        return cls(
            run_id=sys.intern(text("runId", 512)),
            experiment_id=sys.intern(text("experimentId", 512)),
            cell_id=text("cellId", 512),
            task_id=sys.intern(text("taskId", 512)),
            repetition=f.integer("repetition", minimum=1) or 1,
            subject_id=sys.intern(text("subjectId", 512)),
            attempt=f.integer("attempt", minimum=1) or 1,
            attempt_id=text("attemptId", 512),
            trigger=trigger,
            request=f.string("request", optional=True, limit=256),
            started_at=started,
            subject_started_at=f.timestamp("subjectStartedAt", optional=True),
            finished_at=finished,
            result=ResultKernel.from_fields(f.required("result"), "result"),
            timings=timings,
            host=sys.intern(text("host", 512)),
            maka_eval_version=sys.intern(text("makaEvalVersion", 512)),
            egress_policy_digest=_digest(f.string("egressPolicyDigest", optional=True, limit=64)),
        )


def plain_record(obj: dict[str, Any]) -> AttemptRecord | None:
    """The record of a wire form in which every field has its plain valid form, read in
    a few steps; None for anything else.

    A report reads 100,000 records, nearly all of them such. It accepts only what
    `AttemptRecord.from_fields` accepts, as the same record (a test holds them to it);
    what it declines, `from_fields` reads or refuses, naming the field. Written flat, as
    `plain_kernel` is."""
    # Pays: without plain_record/plain_kernel the read takes 5.8 s CPU instead of 5.1 s
    # (reader + helper; bench/report_scale.py, medians of 3 interleaved runs).
    if not _KEYS.issuperset(obj):
        return None
    get = obj.get
    if get("format") != RECORD_FORMAT:
        return None
    # The strings of at most 512 characters every record has.
    run_id = get("runId")
    experiment_id = get("experimentId")
    cell = get("cellId")
    task_id = get("taskId")
    subject_id = get("subjectId")
    attempt_id = get("attemptId")
    host = get("host")
    version = get("makaEvalVersion")
    if not (
        type(run_id) is str
        and type(experiment_id) is str
        and type(cell) is str
        and type(task_id) is str
        and type(subject_id) is str
        and type(attempt_id) is str
        and type(host) is str
        and type(version) is str
        and len(run_id) <= 512
        and len(experiment_id) <= 512
        and len(cell) <= 512
        and len(task_id) <= 512
        and len(subject_id) <= 512
        and len(attempt_id) <= 512
        and len(host) <= 512
        and len(version) <= 512
    ):
        return None
    trigger = get("trigger")
    repetition = get("repetition")
    attempt = get("attempt")
    request = get("request")
    digest = get("egressPolicyDigest")
    if (
        type(trigger) is not str
        or (trigger := _TRIGGERS.get(trigger)) is None
        or type(repetition) is not int
        or repetition < 1
        or type(attempt) is not int
        or attempt < 1
        or not (request is None or (type(request) is str and len(request) <= 256))
        or not (digest is None or (type(digest) is str and _SHA256.fullmatch(digest)))
    ):
        return None
    started = _plain_time(get("startedAt"))
    finished = _plain_time(get("finishedAt"))
    subject_started = get("subjectStartedAt")
    if subject_started is not None:
        subject_started = _plain_time(subject_started)
        if subject_started is None:
            return None
    timings = get("timings") or {}
    result = get("result")
    if (
        started is None
        or finished is None
        or type(timings) is not dict
        or (timings and not plain_floats(timings))
        or type(result) is not dict
        # what __post_init__ checks (the numbers were checked above)
        or cell != make_cell_id(task_id, repetition, subject_id)
    ):
        return None
    kernel = plain_kernel(result)
    if kernel is None:
        return None
    # Made without __init__ (a frozen dataclass's costs several µs: a report makes
    # 100,000s), every field set key by key in field order: the instance's dict then
    # shares its keys with every other record's, as the constructor's does (a copied
    # dict would not: 60% more memory for 100,000 records).
    record = _new(AttemptRecord)
    own = record.__dict__
    own["run_id"] = _intern(run_id)
    own["experiment_id"] = _intern(experiment_id)
    own["cell_id"] = cell
    own["task_id"] = _intern(task_id)
    own["repetition"] = repetition
    own["subject_id"] = _intern(subject_id)
    own["attempt"] = attempt
    own["attempt_id"] = attempt_id
    own["trigger"] = trigger
    own["started_at"] = started
    own["subject_started_at"] = subject_started
    own["finished_at"] = finished
    own["result"] = kernel
    own["timings"] = dict(timings)
    own["host"] = _intern(host)
    own["maka_eval_version"] = _intern(version)
    own["request"] = request
    own["egress_policy_digest"] = digest
    return record


_new = object.__new__
_intern = sys.intern
_fromisoformat = datetime.fromisoformat


def _plain_time(value: Any) -> datetime | None:
    """A timestamp with a time zone, as `Fields.timestamp` reads it; None otherwise."""
    if type(value) is not str or len(value) > 64:
        return None
    try:
        parsed = _fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _digest(value: str | None) -> str | None:
    if value is not None and not _SHA256.fullmatch(value):
        raise ContractError("egressPolicyDigest: must be 64 lowercase hex digits")
    return value


def utc_from_epoch(seconds: float) -> datetime:
    """A timezone-aware UTC datetime."""
    return datetime.fromtimestamp(seconds, tz=UTC)
