"""A Pod's end -> the attempt's result kernel.

The relay writes the kernel to the subject container's termination message; it is parsed
by the same `ResultKernel.from_json` as everywhere else. When there is no kernel, the
Pod's own evidence says what happened, and every such end is an infrastructure failure
(a new Attempt, up to the spec's cap; never a container restart):

- the Pod was deleted or evicted, or its node was lost;
- an image could not be pulled within `imagePullDeadlineSec`;
- an init container (relay bundle, experiment folder) failed;
- the relay ended without a kernel -- including OOMKilled, where the whole container hit
  its memory limit: retried like any infrastructure failure, so at most
  `maxInfraRetries` more times, never forever (the reason says to raise the limit).

A framework timeout is not among them: the relay cuts the subject off itself and
reports a scored subject_failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ResultKernel, infra_failure
from maka_eval.k8s.render import SUBJECT_CONTAINER

IMAGE_PULL_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)


class EndCause(StrEnum):
    """What the operator found when an attempt ended without the relay's kernel: the
    `reason` label of maka_eval_attempts_total (a kernel the relay wrote is labelled by
    its status source instead). Few values: a label, not the reason's text."""

    POD_GONE = "pod-gone"
    IMAGE_PULL = "image-pull"
    OOM_KILLED = "oom-killed"
    INIT_CONTAINER = "init-container"
    NO_RESULT = "no-result"
    BAD_RESULT = "bad-result"
    POD_ENDED = "pod-ended"
    API_REFUSED = "api-refused"


@dataclass(frozen=True)
class PodEnd:
    """How an attempt's Pod ended: the kernel to write once into Attempt status."""

    kernel: ResultKernel
    finished_at: datetime
    started_at: datetime | None = None
    cause: str = ""
    """An EndCause, or (the relay's kernel) its status source."""


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the API server, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _container(statuses: Any, name: str) -> Mapping[str, Any] | None:
    for status in statuses or ():
        if isinstance(status, Mapping) and status.get("name") == name:
            return status
    return None


def _duration(start: datetime | None, end: datetime | None) -> float:
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds())


def pod_end(pod: Mapping[str, Any], now: datetime) -> PodEnd | None:
    """The result of a Pod that has ended, or None while it still runs."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    started = parse_time(status.get("startTime"))
    subject = _container(status.get("containerStatuses"), SUBJECT_CONTAINER)
    terminated = (subject or {}).get("state", {}).get("terminated") if subject else None
    if isinstance(terminated, Mapping):
        finished = parse_time(terminated.get("finishedAt")) or now
        message = terminated.get("message") or ""
        if message.strip():
            try:
                kernel = ResultKernel.from_json(message)
            except ContractError as exc:
                return PodEnd(
                    infra_failure(
                        f"the relay's termination message is not a valid result kernel: {exc}",
                        _duration(started, finished),
                    ),
                    finished,
                    started,
                    EndCause.BAD_RESULT,
                )
            return PodEnd(kernel, finished, started, kernel.status_source.value)
        code = terminated.get("exitCode")
        why = terminated.get("reason") or "Error"
        cause = EndCause.NO_RESULT
        if why == "OOMKilled":
            cause = EndCause.OOM_KILLED
            reason = (
                "OOMKilled: the subject container hit its memory limit before the relay "
                "wrote a result; raise executor.config.resources.limits.memory"
            )
        else:
            reason = f"the relay ended ({why}, exit code {code}) without writing a result kernel"
        return PodEnd(infra_failure(reason, _duration(started, finished)), finished, started, cause)
    if phase in ("Failed", "Succeeded"):
        # Ended without the subject container ending: evicted, an init container
        # failed, or the node was lost.
        why = status.get("reason") or ""
        message = status.get("message") or ""
        for init in status.get("initContainerStatuses") or ():
            state = (init.get("state") or {}).get("terminated") or {}
            if state and state.get("exitCode", 0) != 0:
                # Its termination message says why (the relay bundle check names the
                # expected and the actual digest).
                said = " ".join(str(state.get("message") or "").split())
                return PodEnd(
                    infra_failure(
                        f"init container {init.get('name')} failed "
                        f"({state.get('reason') or 'Error'}, exit code {state.get('exitCode')})"
                        + (f": {said}" if said else ""),
                    ),
                    now,
                    started,
                    EndCause.INIT_CONTAINER,
                )
        text = f"{why}: {message}" if why and message else (why or message or "no reason given")
        return PodEnd(
            infra_failure(f"the Pod ended before its relay did ({text})", _duration(started, now)),
            now,
            started,
            EndCause.POD_ENDED,
        )
    return None


def image_pull_waiting_since(pod: Mapping[str, Any]) -> datetime | None:
    """When the Pod was created, if any of its containers waits on an image pull."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or ():
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMAGE_PULL_WAITING:
                return parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or (
                    datetime.now(UTC)
                )
    return None


def pod_gone(duration_sec: float = 0.0) -> ResultKernel:
    """The kernel of an attempt whose Pod disappeared before it ended."""
    return infra_failure(
        "the attempt's Pod is gone before it ended (deleted, evicted, or its node was lost)",
        duration_sec,
    )


def image_pull_failed(waited_sec: float) -> ResultKernel:
    """The kernel of an attempt whose image could not be pulled in time."""
    return infra_failure(
        f"an image of the attempt's Pod could not be pulled within {waited_sec:g}s "
        "(executor.config.imagePullDeadlineSec)",
        waited_sec,
    )
