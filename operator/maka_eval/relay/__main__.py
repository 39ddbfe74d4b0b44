"""The relay program: `python -m maka_eval.relay --plan plan.json [--result PATH]`.

This is what a task container runs as its entrypoint (the local executor runs the same
code in-process). It becomes the subreaper of everything the subject starts, runs one
attempt, writes the result kernel (bounded JSON) to --result -- in a pod, the
termination message path -- and exits 0 only when the attempt completed.
SIGTERM and SIGINT cancel the attempt: the subject's whole tree is quiesced first.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from maka_eval.engine.modes import Isolation
from maka_eval.engine.status import AttemptStatus
from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor
from maka_eval.relay.attempt import run_attempt
from maka_eval.relay.plan import OWN_NETWORK, AttemptPlan, PlanError, with_task_dir

EXIT_NOT_COMPLETED = 1
EXIT_BAD_PLAN = 2


def main(argv: list[str] | None = None) -> int:
    """Run one attempt from a plan file; return the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m maka_eval.relay", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", type=Path, help="AttemptPlan JSON file")
    source.add_argument(
        "--plan-json", help="the AttemptPlan JSON itself (a Pod passes it as an argument)"
    )
    parser.add_argument(
        "--result",
        type=Path,
        default=None,
        help="where to write the result kernel (default: stdout)",
    )
    args = parser.parse_args(argv)
    try:
        text = args.plan_json if args.plan is None else args.plan.read_text(encoding="utf-8")
        plan = AttemptPlan.from_json(text)
    except (OSError, PlanError) as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return EXIT_BAD_PLAN
    if plan.isolation is Isolation.AUTO:
        # In a Pod: namespaces where the container may make them, else plain processes
        # (the Pod itself is then the boundary); the kernel records which.
        from maka_eval.sandbox.process import namespaces_unavailable

        isolation = Isolation.NAMESPACES if namespaces_unavailable() is None else Isolation.NONE
        plan = replace(plan, isolation=isolation)
    pod_network = plan.egress is not None and plan.egress.namespace == OWN_NETWORK
    if plan.egress is not None and pod_network:
        # A Pod's network is policed as a whole: the subject stays in it, and the gate
        # checks that it is in the namespace the relay itself runs in.
        own = os.stat(OWN_NETWORK)
        plan = replace(
            plan, egress=replace(plan.egress, namespace_identity=f"{own.st_dev}:{own.st_ino}")
        )
    try:
        plan = with_task_dir(plan)
    except PlanError as exc:
        # No result kernel: the executor sees a relay that ended without one, which is
        # an infrastructure failure (retried), and this line in the container's log.
        print(f"relay: {exc}", file=sys.stderr)
        return EXIT_BAD_PLAN
    if pod_network and plan.egress is None and plan.isolation is not Isolation.NAMESPACES:
        # Never run unenforced: without a namespace of its own the subject would still
        # reach the Pod's egress proxy on loopback.
        print(
            "relay: the task allows no network, but this container cannot give the subject "
            "a network namespace of its own (the Pod's egress proxy would stay reachable); "
            "not running it",
            file=sys.stderr,
        )
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
