"""The result kernel: score, usage, cost, duration, status and artifacts of one attempt.

It is what a result is; nothing else is part of it (logs and output are artifacts,
named here with their size and digest). Next to the kernel travel the evidence that
decided the status (its source, a short reason, the exit code when it decided) and the
verifier's metrics. In a pod the relay writes it as the container's termination
message, so its JSON is hard-bounded by MAX_KERNEL_BYTES; the relay fits what it
writes into RELAY_BUDGET_BYTES, leaving room for metered usage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from math import isfinite
from typing import Any, TypeVar

from maka_eval.contract.fields import ContractError, Fields, finite, load_bounded
from maka_eval.engine.modes import RECORDED_ISOLATIONS
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.engine.usage import MAX_TOKENS, USAGE_FIELDS, Usage, UsageError

KERNEL_FORMAT = "maka.eval.kernel.v1"
MAX_KERNEL_BYTES = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""
RELAY_BUDGET_BYTES = 3072
"""What the relay fills; the rest is reserved for metered usage (the egress proxy)."""
REASON_LIMIT = 400
MAX_NOTES = 4
NOTE_LIMIT = 240
MAX_METRICS = 32
METRIC_NAME_LIMIT = 64
ARTIFACT_NAME_LIMIT = 200
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

_KERNEL_KEYS = frozenset(
    {
        "format",
        "status",
        "score",
        "metrics",
        "usage",
        "costUsd",
        "durationSec",
        "artifacts",
        "artifactsOmitted",
        "isolation",
        "notes",
        "statusSource",
        "reason",
        "exitCode",
    }
)
_ARTIFACT_KEYS = frozenset({"name", "bytes", "sha256", "truncated"})


@dataclass(frozen=True)
class ArtifactEntry:
    """One stored artifact: its name (a relative path), size and sha256."""

    name: str
    bytes: int
    sha256: str
    truncated: bool = False
    """The output was longer than the attempt's output limit and was cut."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}
        if self.truncated:
            out["truncated"] = True
        return out

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> ArtifactEntry:
        f = Fields(obj, where, _ARTIFACT_KEYS)
        name = f.string("name", limit=ARTIFACT_NAME_LIMIT)
        assert name is not None
        parts = name.split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ContractError(f"{f.path('name')}: must be a relative path without '..'")
        sha = f.string("sha256", limit=64)
        assert sha is not None
        if not _SHA256.fullmatch(sha):
            raise ContractError(f"{f.path('sha256')}: must be 64 lowercase hex digits")
        size = f.integer("bytes")
        assert size is not None
        return cls(name, size, sha, f.boolean("truncated"))


@dataclass(frozen=True)
class ResultKernel:
    """What one attempt produced (see the module docstring)."""

    status: AttemptStatus
    score: float | None
    usage: Usage | None
    cost_usd: float | None
    duration_sec: float
    artifacts: tuple[ArtifactEntry, ...]
    status_source: StatusSource
    reason: str | None = None
    exit_code: int | None = None
    """Present only when the exit code decided the status, so that a frame status and an
    exit code can never disagree in a record."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Every value the verifier reported (reward.json), the score among them."""
    artifacts_omitted: int = 0
    """Artifacts left out of the kernel to keep it within its bound."""
    isolation: str | None = None
    """What separated the subject from the host and other cells ('namespaces',
    'container', 'none'); None when the executor did not say."""
    notes: tuple[str, ...] = ()
    """What the relay noticed that a reader must know (suspected tampering)."""

    def __post_init__(self) -> None:
        check(self)

    # -- the wire form ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": KERNEL_FORMAT,
            "status": self.status.value,
            "score": self.score,
            "usage": self.usage.to_json() if self.usage is not None else None,
            "costUsd": self.cost_usd,
            "durationSec": self.duration_sec,
            "artifacts": [a.to_dict() for a in self.artifacts],
            "statusSource": self.status_source.value,
            "reason": self.reason,
        }
        if self.metrics:
            out["metrics"] = dict(self.metrics)
        if self.exit_code is not None:
            out["exitCode"] = self.exit_code
        if self.artifacts_omitted:
            out["artifactsOmitted"] = self.artifacts_omitted
        if self.isolation is not None:
            out["isolation"] = self.isolation
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def to_json(self) -> str:
        """Compact JSON; ContractError if it exceeds MAX_KERNEL_BYTES."""
        text = json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > MAX_KERNEL_BYTES:
            raise ContractError(f"the result kernel is larger than {MAX_KERNEL_BYTES} bytes")
        return text

    @classmethod
    def from_json(cls, data: str | bytes) -> ResultKernel:
        """Parse the wire form strictly (size bound, known fields, consistent status)."""
        return cls.from_dict(load_bounded(data, MAX_KERNEL_BYTES, "the result kernel"))

    @classmethod
    def from_dict(cls, obj: Any, where: str = "") -> ResultKernel:
        """Validate an already-decoded kernel (the in-process path skips only the bytes)."""
        if type(obj) is dict:
            plain = plain_kernel(obj)
            if plain is not None:
                return plain
        return cls.from_fields(obj, where)

    @classmethod
    def from_fields(cls, obj: Any, where: str = "") -> ResultKernel:
        """`from_dict` field by field: the rules for every input, each failure naming
        its field (`from_dict` first tries `plain_kernel`, which only accepts)."""
        f = Fields(obj, where, _KERNEL_KEYS)
        if f.raw("format") != KERNEL_FORMAT:
            raise ContractError(f"{f.path('format')}: must be '{KERNEL_FORMAT}'")
        status = _member(_STATUSES, f, "status")
        source = _member(_SOURCES, f, "statusSource")
        usage = None
        if f.has("usage"):
            try:
                usage = Usage.from_json(f.raw("usage"))
            except UsageError as exc:
                raise ContractError(f"{f.path('usage')}: {exc}") from None
        artifacts_raw = f.required("artifacts")
        if not isinstance(artifacts_raw, list):
            raise ContractError(f"{f.path('artifacts')}: must be a list")
        artifacts = tuple(
            ArtifactEntry.from_dict(a, f"{f.path('artifacts')}[{i}]")
            for i, a in enumerate(artifacts_raw)
        )
        metrics = f.numbers("metrics")
        try:
            return cls(
                status=status,
                score=f.number("score", optional=True),
                usage=usage,
                cost_usd=f.number("costUsd", optional=True, minimum=0),
                duration_sec=f.number("durationSec", minimum=0) or 0.0,
                artifacts=artifacts,
                status_source=source,
                reason=f.string("reason", optional=True, limit=REASON_LIMIT),
                exit_code=f.integer("exitCode", optional=True, minimum=-(2**31)),
                metrics=metrics,
                artifacts_omitted=f.integer("artifactsOmitted", optional=True) or 0,
                isolation=f.string("isolation", optional=True, limit=32),
                notes=_notes(f),
            )
        except ContractError as exc:
            raise ContractError(f"{where + ': ' if where else ''}{exc}") from None

    def fitted(self, budget: int = RELAY_BUDGET_BYTES) -> ResultKernel:
        """This kernel made to fit `budget` bytes: artifacts are dropped from the end
        (counted in artifacts_omitted), then metrics."""
        kernel = self
        while len(json.dumps(kernel.to_dict(), separators=(",", ":"))) > budget:
            if kernel.artifacts:
                kernel = replace(
                    kernel,
                    artifacts=kernel.artifacts[:-1],
                    artifacts_omitted=kernel.artifacts_omitted + 1,
                )
            elif kernel.metrics:
                kept = dict(list(kernel.metrics.items())[: len(kernel.metrics) // 2])
                kernel = replace(kernel, metrics=kept)
            else:
                break
        return kernel


E = TypeVar("E", AttemptStatus, StatusSource)

# Looked up by value: calling the enum class costs more than the rest of a field's check.
_STATUSES = {m.value: m for m in AttemptStatus}
_SOURCES = {m.value: m for m in StatusSource}


def plain_kernel(obj: dict[str, Any]) -> ResultKernel | None:
    """The kernel of a wire form in which every field has its plain valid form (a float
    score, no unknown field, ...), read in a few steps; None for anything else.

    A store reads 100,000 kernels at a time, nearly all of them such. It accepts only
    what `ResultKernel.from_fields` accepts, as the same kernel (a test holds them to
    it); what it declines, `from_fields` reads or refuses, naming the field. Written
    flat (one lookup per key, the instance's fields set one by one, no helper calls on
    the common path): this is half of what reading a record costs."""
    if not _KERNEL_KEYS.issuperset(obj):
        return None
    get = obj.get
    if get("format") != KERNEL_FORMAT:
        return None
    status = get("status")
    source = get("statusSource")
    if type(status) is not str or type(source) is not str:
        return None
    status = _STATUSES.get(status)
    source = _SOURCES.get(source)
    score = get("score")
    cost = get("costUsd")
    duration = get("durationSec")
    if (
        status is None
        or source is None
        or not (score is None or (type(score) is float and isfinite(score)))
        or not (cost is None or (type(cost) is float and isfinite(cost) and cost >= 0))
        or type(duration) is not float
        or not isfinite(duration)
        or not duration >= 0
    ):
        return None
    usage = get("usage")
    if usage is not None:
        usage = _plain_usage(usage)
        if usage is None:
            return None
    artifacts = get("artifacts")
    metrics = get("metrics")
    reason = get("reason")
    exit_code = get("exitCode")
    omitted = get("artifactsOmitted")
    isolation = get("isolation")
    notes = get("notes") or ()
    if (
        type(artifacts) is not list
        or not (reason is None or (type(reason) is str and len(reason) <= REASON_LIMIT))
        or not (exit_code is None or (type(exit_code) is int and exit_code >= -(2**31)))
        or not (omitted is None or (type(omitted) is int and omitted >= 0))
        or not (isolation is None or (type(isolation) is str and len(isolation) <= 32))
    ):
        return None
    if not metrics:  # None or an empty object; any other falsy value is refused
        if metrics is not None and type(metrics) is not dict:
            return None
        metrics = {}
    elif type(metrics) is dict and plain_floats(metrics):
        metrics = dict(metrics)
    else:
        return None
    if notes:
        if type(notes) is not list or not all(isinstance(n, str) for n in notes):
            return None
        notes = tuple(notes)
    try:
        entries = (
            tuple(ArtifactEntry.from_dict(a, f"artifacts[{i}]") for i, a in enumerate(artifacts))
            if artifacts
            else ()
        )
        # Made as `plain_record` makes a record: no __init__, every field in order.
        kernel = _new(ResultKernel)
        own = kernel.__dict__
        own["status"] = status
        own["score"] = score
        own["usage"] = usage
        own["cost_usd"] = cost
        own["duration_sec"] = duration or 0.0
        own["artifacts"] = entries
        own["status_source"] = source
        own["reason"] = reason
        own["exit_code"] = exit_code
        own["metrics"] = metrics
        own["artifacts_omitted"] = omitted or 0
        own["isolation"] = isolation
        own["notes"] = notes
        if metrics or notes or len(entries) > 1 or isolation is not None:
            check(kernel)  # what __post_init__ checks
        elif (score is None) is status.is_result or (exit_code is None) is (
            source is StatusSource.EXIT_CODE
        ):
            return None  # the rest of check() is what the reads above made sure of
    except ContractError:  # broke a rule: from_fields names it
        return None
    return kernel


def plain_floats(mapping: dict[Any, Any]) -> bool:
    """Whether every key is a string and every value a finite float (a plain metrics or
    timings object)."""
    for key, value in mapping.items():
        if type(key) is not str or type(value) is not float or not isfinite(value):
            return False
    return True


_new = object.__new__
_USAGE_KEYS = frozenset(USAGE_FIELDS) | {"totalTokens"}


def _plain_usage(obj: Any) -> Usage | None:
    """`Usage.from_json` for an object of plain whole numbers in range; None for
    anything else."""
    if type(obj) is not dict or not _USAGE_KEYS.issuperset(obj):
        return None
    get = obj.get
    input_tokens = get("inputTokens", 0)
    cached = get("cachedInputTokens", 0)
    cache_write = get("cacheWriteTokens", 0)
    output = get("outputTokens", 0)
    if not (
        type(input_tokens) is int
        and type(cached) is int
        and type(cache_write) is int
        and type(output) is int
        and 0 <= input_tokens <= MAX_TOKENS
        and 0 <= cached <= MAX_TOKENS
        and 0 <= cache_write <= MAX_TOKENS
        and 0 <= output <= MAX_TOKENS
    ):
        return None
    total = get("totalTokens")
    if total is not None and (
        type(total) is not int or total != input_tokens + cached + cache_write + output
    ):
        return None
    usage = _new(Usage)
    own = usage.__dict__
    own["input_tokens"] = input_tokens
    own["cached_input_tokens"] = cached
    own["cache_write_tokens"] = cache_write
    own["output_tokens"] = output
    return usage


def _member(members: Mapping[str, E], f: Fields, key: str) -> E:
    value = f.required(key)
    try:
        return members[value]
    except (KeyError, TypeError):  # TypeError: an unhashable value (a list, an object)
        raise ContractError(f"{f.path(key)}: must be one of {', '.join(members)}") from None


def _notes(f: Fields) -> tuple[str, ...]:
    raw = f.raw("notes")
    if not raw:
        return ()
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise ContractError(f"{f.path('notes')}: must be a list of strings")
    return tuple(raw)


def check(kernel: ResultKernel) -> None:
    """The kernel's own consistency rules; ContractError names the first one broken."""
    status = kernel.status
    if status.is_result:
        if kernel.score is None:
            raise ContractError(f"score: a {status.value} attempt must have a score")
    elif kernel.score is not None:
        raise ContractError(f"score: a {status.value} attempt has no score")
    if kernel.score is not None:
        finite(kernel.score, "score")
    if kernel.cost_usd is not None:
        finite(kernel.cost_usd, "costUsd", 0)
    finite(kernel.duration_sec, "durationSec", 0)
    if (kernel.exit_code is not None) != (kernel.status_source is StatusSource.EXIT_CODE):
        raise ContractError(
            "exitCode: present exactly when the exit code decided the status "
            f"(statusSource is {kernel.status_source.value})"
        )
    if kernel.reason is not None and len(kernel.reason) > REASON_LIMIT:
        raise ContractError(f"reason: longer than {REASON_LIMIT} characters")
    if len(kernel.metrics) > MAX_METRICS:
        raise ContractError(f"metrics: more than {MAX_METRICS} values")
    for name, value in kernel.metrics.items():
        if not name or len(name) > METRIC_NAME_LIMIT:
            raise ContractError(f"metrics: names are 1 to {METRIC_NAME_LIMIT} characters")
        finite(value, f"metrics.{name}")
    if len(kernel.artifacts) > 1 and len({a.name for a in kernel.artifacts}) != len(
        kernel.artifacts
    ):
        raise ContractError("artifacts: names must be unique")
    if kernel.isolation is not None and kernel.isolation not in RECORDED_ISOLATIONS:
        *others, last = (f"'{i.value}'" for i in RECORDED_ISOLATIONS)
        raise ContractError(f"isolation: must be {', '.join(others)} or {last}")
    if kernel.notes and (
        len(kernel.notes) > MAX_NOTES or any(len(n) > NOTE_LIMIT for n in kernel.notes)
    ):
        raise ContractError(f"notes: at most {MAX_NOTES}, each at most {NOTE_LIMIT} characters")
    if kernel.artifacts_omitted < 0:
        raise ContractError("artifactsOmitted: must be at least 0")


def failure_kernel(
    status: AttemptStatus,
    reason: str,
    duration_sec: float = 0.0,
    artifacts: tuple[ArtifactEntry, ...] = (),
) -> ResultKernel:
    """The one constructor of a kernel without a score: `infra_failed` (retried) or
    `cancelled` (run again on resume), its reason cut to the kernel's bound."""
    if status.is_result:
        raise ValueError("a failure kernel has no score: use ResultKernel for results")
    source = (
        StatusSource.CANCELLATION
        if status is AttemptStatus.CANCELLED
        else StatusSource.INFRASTRUCTURE
    )
    return ResultKernel(
        status=status,
        score=None,
        usage=None,
        cost_usd=None,
        duration_sec=max(0.0, duration_sec),
        artifacts=tuple(artifacts),
        status_source=source,
        reason=reason[:REASON_LIMIT],
    )


def infra_failure(reason: str, duration_sec: float = 0.0) -> ResultKernel:
    """The kernel of an attempt that produced no result because of the infrastructure."""
    return failure_kernel(AttemptStatus.INFRA_FAILED, reason, duration_sec)
