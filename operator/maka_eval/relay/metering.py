"""Metered work from the egress proxy's signed checkpoint, read once the subject ended.

When the plan names a checkpoint (the cell's traffic goes through a metering proxy),
the relay settles the proxy and reads the checkpoint after every attempt, accepting it
only when its HMAC verifies with the result token. The figure comes from
`metering.checkpoint.derive`, the same function the proxy calls, priced with the spec's
prices (`spec.metering.prices`).

What it is used for is decided in engine.classify, nowhere else: a self-reported
figure never outranks this meter. It is the attempt's usage and cost whatever a valid
protocol-v1 frame reports (the frame's own figures are kept beside it in a note, which
says "suspected misreport" when they disagree, and in the result-frame.json artifact);
an exit-code subject has no other figure; and when a protocol-v1 frame is missing or
invalid -- the wrapper was killed rather than asked to stop -- admitted work makes the
attempt a failed subject. A figure is attributed only when the proxy saw a model
request: one that saw none says nothing about a subject that called a provider it
cannot read (usage stays null, or the frame's own).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from maka_eval.engine.classify import Frame, MeteredWork, ResultContract, self_report
from maka_eval.metering.checkpoint import (
    Checkpoint,
    CheckpointRejected,
    MeteredUsage,
    derive,
    read_checkpoint,
)
from maka_eval.metering.pricing import Prices
from maka_eval.metering.settle import request_settlement, wait_settled
from maka_eval.relay.plan import MeteringPlan

MAX_TOKEN_BYTES = 4096
PRICES_FIELD = "spec.metering.prices"


@dataclass(frozen=True)
class Recovery:
    """Metered work for the classifier (None: nothing on record) and notes for the reader."""

    metered: MeteredWork | None
    notes: tuple[str, ...] = ()


NOTHING = Recovery(None)


def read_token(metering: MeteringPlan, host_env: Mapping[str, str]) -> str | None:
    """The result token: from `token_file` (at most 4 KiB, no symlink) or `token_env`."""
    if metering.token_file is None:
        return host_env.get(metering.token_env) or None
    try:
        fd = os.open(metering.token_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_TOKEN_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    token = raw.decode("utf-8", "replace").strip()
    return token if token and len(raw) <= MAX_TOKEN_BYTES else None


def cost_note(figure: MeteredUsage, prices: Prices | None) -> str | None:
    """Why a figure with tokens has no cost, or None when it has one (or needs none)."""
    if figure.cost_usd is not None or figure.usage.total_tokens == 0:
        return None
    if prices is None:
        return f"no cost: the experiment sets no model prices ({PRICES_FIELD})"
    unpriced = prices.unpriced(figure.usage_by_model)
    if unpriced:
        listed = ", ".join(f"'{model}' ({why})" for model, why in unpriced.items())
        return f"no cost: {PRICES_FIELD} cannot price {listed}"
    return "no cost: the token count is a lower bound"


def _settle(
    metering: MeteringPlan, token: str, settle: Callable[[], object] | None
) -> tuple[Checkpoint | CheckpointRejected, str | None]:
    """Settle the proxy (the executor's callable, or over HTTP) and read the checkpoint."""
    path = Path(metering.checkpoint)
    problem = None
    try:
        if settle is not None:
            settle()
        elif metering.settle_proxy:
            request_settlement(metering.settle_proxy)
            return wait_settled(path, token), None
    except Exception as exc:  # never raises: the figure is then a lower bound
        problem = f"the metering proxy could not be settled: {exc}"
    return read_checkpoint(path, token), problem


def recover_metered(
    metering: MeteringPlan | None,
    contract: ResultContract,
    frame: Frame,
    host_env: Mapping[str, str],
    settle: Callable[[], object] | None = None,
) -> Recovery:
    """Read the checkpoint when the plan names one; never raises.

    `settle` (the local executor's proxy handle) tells the proxy the subject is done, so
    that a figure with every admitted request's usage can be complete; without it the
    plan's `settle_proxy` is asked over HTTP.
    """
    if metering is None:
        return NOTHING
    frame_lost = contract is ResultContract.PROTOCOL_V1 and not frame.valid
    token = read_token(metering, host_env)
    if not token:
        source = metering.token_file or metering.token_env
        return Recovery(
            None,
            (f"the result token ({source}) is not available; usage was not metered",),
        )
    notes: list[str] = []
    found, problem = _settle(metering, token, settle)
    if problem:
        notes.append(problem)  # the figure is then a lower bound, which derive says
    if isinstance(found, CheckpointRejected):
        if not found.suspicious:
            notes.append("the provider-usage checkpoint is missing; no metered work is on record")
        else:
            notes.append(
                f"suspected tampering: the provider-usage checkpoint was ignored "
                f"({found.reason.value}: {found.detail})"
            )
        return Recovery(None, tuple(notes))
    prices = Prices.from_dict(metering.prices) if metering.prices else None
    figure = derive(found, prices)
    if figure.requests == 0:
        return Recovery(None, tuple(notes))
    if frame_lost:
        notes.append(f"usage recovered from the provider-usage checkpoint: {figure.describe()}")
    else:
        notes.append(f"usage metered by the egress proxy: {figure.describe()}")
    why = cost_note(figure, prices)
    if why:
        notes.append(why)
    metered = MeteredWork(
        admitted_requests=figure.admitted,
        usage=figure.usage,
        cost_usd=figure.cost_usd,
        complete=figure.complete,
    )
    beside = self_report(frame, metered)
    if beside is not None:
        notes.insert(0, beside)  # evidence first: a record keeps the first few notes
    return Recovery(metered, tuple(notes))
