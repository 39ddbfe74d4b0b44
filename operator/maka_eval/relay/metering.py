"""Metered work recovered from the egress proxy's checkpoint when the frame is unusable.

A protocol-v1 subject reports its usage in its result frame. When that frame is missing
or invalid -- the wrapper was killed rather than asked to stop -- the relay falls back
to the provider-usage checkpoint the proxy wrote, accepted only when its HMAC verifies
with the result token. The figure comes from `metering.checkpoint.derive`, the same
function the proxy calls. What it means for the status (admitted work makes a missing
frame a subject failure) is decided in engine.classify, nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from maka_eval.engine.classify import Frame, MeteredWork, ResultContract
from maka_eval.metering.checkpoint import CheckpointRejected, derive, read_checkpoint
from maka_eval.metering.pricing import Prices
from maka_eval.relay.plan import MeteringPlan


@dataclass(frozen=True)
class Recovery:
    """Metered work for the classifier (None: nothing on record) and notes for the reader."""

    metered: MeteredWork | None
    notes: tuple[str, ...] = ()


NOTHING = Recovery(None)


def recover_metered(
    metering: MeteringPlan | None,
    contract: ResultContract,
    frame: Frame,
    host_env: Mapping[str, str],
    settle: Callable[[], object] | None = None,
) -> Recovery:
    """Read the checkpoint when the plan names one and a protocol-v1 frame is unusable.

    `settle` (the local executor's proxy handle) tells the proxy the subject is done, so
    that a figure with every admitted request's usage can be complete. Never raises.
    """
    if metering is None or contract is not ResultContract.PROTOCOL_V1 or frame.valid:
        return NOTHING
    token = host_env.get(metering.token_env, "")
    if not token:
        return Recovery(
            None,
            (
                f"the result token ({metering.token_env}) is not set; the provider-usage "
                "checkpoint was not read",
            ),
        )
    notes: list[str] = []
    if settle is not None:
        try:
            settle()
        except Exception as exc:  # the figure is then a lower bound, which derive says
            notes.append(f"the metering proxy could not be settled: {exc}")
    found = read_checkpoint(Path(metering.checkpoint), token)
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
    notes.append(f"usage recovered from the provider-usage checkpoint: {figure.describe()}")
    return Recovery(
        MeteredWork(
            admitted_requests=figure.admitted,
            usage=figure.usage,
            cost_usd=figure.cost_usd,
            complete=figure.complete,
        ),
        tuple(notes),
    )
