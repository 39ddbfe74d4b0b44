"""The run document (experiment.json): the frozen experiment and its identity.

Attempt records are the result contract's `AttemptRecord` (maka_eval.contract.record).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

RUN_FORMAT = "maka.eval.run.v1"


def run_document(
    run_id: str, identity: dict[str, Any], version: str, key_id: str | None = None
) -> dict[str, Any]:
    """The content of experiment.json: the frozen experiment and what else identifies it,
    and the id of the key its records are sealed with (store/seal.py; runs written
    before records were sealed have none)."""
    document = {
        "format": RUN_FORMAT,
        "runId": run_id,
        "createdAt": datetime.now(tz=UTC).isoformat(),
        "makaEvalVersion": version,
    }
    if key_id is not None:
        document["keyId"] = key_id
    return {**document, **identity}
