"""The relay program: `python -m maka_eval.relay --plan plan.json [--result PATH]`.

This is what a task container runs as its entrypoint (the local executor runs the same
code in-process). It becomes the subreaper of everything the subject starts, runs one
attempt, writes the result kernel (bounded JSON) to --result -- in a pod, the
termination message path -- and exits 0 only when the attempt completed.
SIGTERM and SIGINT cancel the attempt: the subject's whole tree is quiesced first.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from maka_eval.engine.status import AttemptStatus
from maka_eval.relay.attempt import run_attempt
from maka_eval.relay.plan import AttemptPlan, PlanError
from maka_eval.relay.processes import CancelToken, ProcessSupervisor

EXIT_NOT_COMPLETED = 1
EXIT_BAD_PLAN = 2


def main(argv: list[str] | None = None) -> int:
    """Run one attempt from a plan file; return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m maka_eval.relay", description=__doc__)
    parser.add_argument("--plan", required=True, type=Path, help="AttemptPlan JSON file")
    parser.add_argument(
        "--result",
        type=Path,
        default=None,
        help="where to write the result kernel (default: stdout)",
    )
    args = parser.parse_args(argv)
    try:
        plan = AttemptPlan.from_json(args.plan.read_text(encoding="utf-8"))
    except (OSError, PlanError) as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return EXIT_BAD_PLAN

    supervisor = ProcessSupervisor(exclusive=True)
    cancel = CancelToken()

    def on_signal(signum: int, frame: Any) -> None:
        cancel.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    outcome = run_attempt(plan, supervisor, cancel)
    body = outcome.kernel.to_json()
    if args.result is None:
        sys.stdout.write(body + "\n")
    else:
        args.result.write_text(body, encoding="utf-8")
    return 0 if outcome.classification.status is AttemptStatus.COMPLETED else EXIT_NOT_COMPLETED


if __name__ == "__main__":
    sys.exit(main())
