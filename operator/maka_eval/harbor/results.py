"""A Harbor trial folder -> the evidence maka-eval classifies -> the result kernel.

Harbor's verifier scored the trial (`result.json`: `verifier_result.rewards`); the relay
Agent recorded how the subject ended (`agent/maka-relay.json`). The engine's status
rules (engine.classify) decide the status from both, as for every other executor:

- Harbor's AgentTimeoutError: the framework timeout, `subject_failed`, the reward kept;
- no reward (RewardFileNotFoundError, an empty or unreadable reward, a verifier timeout):
  an infrastructure failure, retried;
- anything else Harbor raised (the environment did not build or start, agent setup,
  the worker) and a missing relay record: an infrastructure failure, retried;
- a cancelled trial: `cancelled`.

The whole trial folder is kept as one artifact, `harbor-trial.tar.gz`, with its bytes
and sha256.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import os
import tarfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from maka_eval import strict_json
from maka_eval.artifacts import Redactor, digest_file
from maka_eval.contract.kernel import ArtifactEntry, ResultKernel
from maka_eval.engine.classify import (
    NO_FRAME,
    Execution,
    ExecutionEnd,
    Frame,
    FrameState,
    ResultContract,
    Verification,
    classify,
)
from maka_eval.relay.frame import parse_frame
from maka_eval.relay.outcome import build_kernel

RESULT_FILE = "result.json"
RELAY_RECORD = Path("agent") / "maka-relay.json"
TRIAL_ARTIFACT = "harbor-trial.tar.gz"
MAX_RESULT_BYTES = 32 * 1024 * 1024
MAX_RECORD_BYTES = 256 * 1024

VERIFIER_ERRORS = frozenset(
    {
        "RewardFileNotFoundError",
        "RewardFileEmptyError",
        "VerifierOutputParseError",
        "VerifierTimeoutError",
        "DownloadVerifierDirError",
        "AddTestsDirError",
    }
)
"""Harbor 0.26's exceptions that mean the verifier produced no usable reward."""


def _read_json(path: Path, limit: int) -> Any:
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path.name} is larger than {limit} bytes")
    return strict_json.loads(data)


def _seconds(timing: Any) -> float:
    if not isinstance(timing, dict):
        return 0.0
    try:
        start = datetime.fromisoformat(str(timing["started_at"]))
        end = datetime.fromisoformat(str(timing["finished_at"]))
    except (KeyError, TypeError, ValueError):
        return 0.0
    return max(0.0, (end - start).total_seconds())


def _frame(record: Mapping[str, Any]) -> Frame:
    raw = record.get("frame")
    if not isinstance(raw, dict) or raw.get("state") == "absent":
        return Frame(FrameState.ABSENT)
    if raw.get("state") == "oversized":
        return Frame(FrameState.OVERSIZED, error=f"{raw.get('bytes')} bytes")
    try:
        return parse_frame(base64.b64decode(str(raw.get("data", "")), validate=True))
    except (binascii.Error, ValueError):
        return Frame(FrameState.MALFORMED, error="the relay could not carry the frame")


def _verification(result: Mapping[str, Any], score_key: str, exception: str | None) -> Verification:
    verifier = result.get("verifier_result")
    rewards = verifier.get("rewards") if isinstance(verifier, dict) else None
    if isinstance(rewards, dict) and rewards:
        metrics = {
            str(k): float(v)
            for k, v in rewards.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if score_key in metrics:
            return Verification(metrics[score_key], metrics=metrics)
        return Verification(
            None,
            f"Harbor's rewards have no '{score_key}' ({', '.join(sorted(metrics))[:120]}); "
            "set verifier.config.scoreKey",
            metrics=metrics,
        )
    return Verification(None, exception or "Harbor recorded no reward for the trial")


def trial_evidence(
    trial_dir: Path | None,
    *,
    contract: ResultContract,
    score_key: str,
    agent_timeout_sec: float,
    error: str | None = None,
    cancelled: bool = False,
) -> tuple[Execution, Frame, Verification, float]:
    """How the subject ended, its frame, the verifier's reward and the subject's time."""
    result_path = trial_dir / RESULT_FILE if trial_dir is not None else None
    if result_path is None or not result_path.is_file():
        if cancelled:
            return Execution(ExecutionEnd.CANCELLED), NO_FRAME, Verification(None, None), 0.0
        why = error or "Harbor wrote no result.json for the trial"
        return (
            Execution(ExecutionEnd.THREW, error=f"Harbor: {why}"),
            NO_FRAME,
            Verification(None, "the verifier did not run"),
            0.0,
        )
    try:
        result = _read_json(result_path, MAX_RESULT_BYTES)
        if not isinstance(result, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        return (
            Execution(ExecutionEnd.THREW, error=f"Harbor's result.json cannot be read: {exc}"),
            NO_FRAME,
            Verification(None, "the verifier's result could not be read"),
            0.0,
        )
    info = result.get("exception_info")
    kind = str(info.get("exception_type")) if isinstance(info, dict) else None
    message = str(info.get("exception_message", ""))[:300] if isinstance(info, dict) else ""
    harbor_error = f"{kind}: {message}" if kind else None
    verification = _verification(
        result, score_key, harbor_error if kind in VERIFIER_ERRORS else None
    )
    duration = _seconds(result.get("agent_execution"))

    record: dict[str, Any] | None = None
    with contextlib.suppress(OSError, ValueError):
        loaded = _read_json(trial_dir / RELAY_RECORD, MAX_RECORD_BYTES)  # type: ignore[operator]
        record = loaded if isinstance(loaded, dict) else None
    if record is not None and isinstance(record.get("subjectSec"), int | float):
        duration = duration or float(record["subjectSec"])

    if cancelled or kind == "CancelledError":
        return Execution(ExecutionEnd.CANCELLED), NO_FRAME, verification, duration
    if kind == "AgentTimeoutError":
        execution = Execution(ExecutionEnd.TIMED_OUT, timeout_sec=agent_timeout_sec)
        return execution, NO_FRAME, verification, duration
    if kind is not None and kind not in VERIFIER_ERRORS:
        return (
            Execution(ExecutionEnd.THREW, error=f"Harbor: {harbor_error}"),
            NO_FRAME,
            verification,
            duration,
        )
    if record is None:
        why = "the relay Agent left no record"
        return (
            Execution(ExecutionEnd.THREW, error=f"{why} ({harbor_error or 'no error'})"),
            NO_FRAME,
            verification,
            duration,
        )
    if record.get("end") != "exited" or not isinstance(record.get("exitCode"), int):
        return (
            Execution(ExecutionEnd.THREW, error=f"the relay Agent failed: {record.get('error')}"),
            NO_FRAME,
            verification,
            duration,
        )
    execution = Execution(ExecutionEnd.EXITED, exit_code=int(record["exitCode"]))
    frame = _frame(record) if contract is ResultContract.PROTOCOL_V1 else NO_FRAME
    return execution, frame, verification, duration


def pack_trial(trial_dir: Path, artifacts_dir: Path) -> ArtifactEntry:
    """The trial folder as `harbor-trial.tar.gz` under the attempt's artifacts (files in
    name order, regular files and folders only), with its size and sha256."""
    target = artifacts_dir / TRIAL_ARTIFACT
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(trial_dir.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            name = f"{trial_dir.name}/{path.relative_to(trial_dir).as_posix()}"
            archive.add(str(path), arcname=name, recursive=False)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(buffer.getvalue())
    digest = digest_file(target)
    return ArtifactEntry(TRIAL_ARTIFACT, digest.bytes, digest.sha256)


def trial_kernel(
    trial_dir: Path | None,
    *,
    contract: ResultContract,
    score_key: str,
    agent_timeout_sec: float,
    artifacts_dir: Path,
    redactor: Redactor,
    error: str | None = None,
    cancelled: bool = False,
) -> ResultKernel:
    """The attempt's result kernel from Harbor's trial (classified by engine.classify)."""
    execution, frame, verification, duration = trial_evidence(
        trial_dir,
        contract=contract,
        score_key=score_key,
        agent_timeout_sec=agent_timeout_sec,
        error=error,
        cancelled=cancelled,
    )
    classification = classify(contract, execution, frame, verification, metered=None)
    artifacts: tuple[ArtifactEntry, ...] = ()
    if trial_dir is not None and trial_dir.is_dir():
        artifacts = (pack_trial(trial_dir, artifacts_dir),)
    return build_kernel(
        classification, verification, duration, artifacts, redactor, isolation="container"
    )
