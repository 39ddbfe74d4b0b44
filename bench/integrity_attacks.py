"""Every integrity attack, for real: blocked or not, in which sandbox, and what each
defence costs per attempt.

The attacks are the tests of tests/attacks/ (subjects that want reward 1 without doing
the task, another arm's credential, a record rewritten; a gateway fed smuggled requests):
this script runs them through pytest and prints one row per attack with the sandbox it
ran in (each module's SANDBOX, refined by a parameter such as `policed` or `container`)
and whether it was blocked (the test passed). Attacks that cannot run on this machine
(no root, no Podman) are listed as skipped with the reason.

Then it times each defence on its own, in ms per attempt, on this machine:
- the allowlist view: a subject's namespaces (bubblewrap holder) showing this machine's
  runtime folders only, against the same holder showing every top-level folder;
- the verifier's capabilities cut (setpriv in front of each verifier program);
- redaction of the encoded forms of credentials (base64, hex, ...), over an attempt's
  usual output (4 streams of 256 KiB) with two credentials;
- the environment built from nothing and the non-dumpable executor cost nothing per
  attempt (a smaller environment; one prctl per run) and are not timed;
- the record seal (an HMAC) and its ledger line (an fdatasync) per commit;
- the container's change list (the engine's diff against the image, three per attempt),
  when an engine answers.
The process sandbox's whole cost per attempt, before and after, is bench/sandbox_overhead.py.

Exit status: 0 when every attack that ran was blocked, 1 otherwise.

    .venv/bin/python bench/integrity_attacks.py
    .venv/bin/python bench/integrity_attacks.py --only-costs --runs 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pytest  # noqa: E402
from tests.sandbox.test_container import PYTHON_IMAGE  # noqa: E402

from maka_eval.artifacts import Redactor, encoded_forms  # noqa: E402
from maka_eval.sandbox import holders  # noqa: E402
from maka_eval.sandbox.container.engine import client_for, engine_info  # noqa: E402
from maka_eval.sandbox.process import SUBJECT_CAPS, namespaces_unavailable  # noqa: E402
from maka_eval.store.ledger import LedgerWriter  # noqa: E402
from maka_eval.store.seal import SealKey, record_place  # noqa: E402

REFINED = {"policed": "process sandbox, policed egress", "container": "container sandbox"}


class Outcomes:
    """A pytest plugin that keeps each attack test's outcome."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.rows.append(self._row(report))

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        self._modules = {item.nodeid: item.module for item in items}

    def _row(self, report: Any) -> tuple[str, str, str, str]:
        module = self._modules.get(report.nodeid)
        sandbox = getattr(module, "SANDBOX", "?")
        klass = getattr(module, "ATTACK_CLASS", "?")
        name = report.nodeid.split("::", 1)[1]
        for word, where in REFINED.items():
            if f"[{word}" in name or f"-{word}" in name or f"{word}]" in name:
                sandbox = where
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "skipped"
            verdict = f"skipped ({str(reason).removeprefix('Skipped: ')[:60]})"
        else:
            verdict = "blocked" if report.passed else "NOT BLOCKED"
        return klass, name.removeprefix("test_").replace("_", " "), sandbox, verdict


def run_attacks(extra: list[str]) -> Outcomes:
    outcomes = Outcomes()
    code = pytest.main(
        [str(REPO / "tests" / "attacks"), "-q", "-p", "no:cacheprovider", "--no-header", *extra],
        plugins=[outcomes],
    )
    if code not in (0, 1):
        raise SystemExit(f"pytest could not run the attacks (exit {code})")
    return outcomes


def ms(seconds: float) -> float:
    return seconds * 1000


def median_ms(work: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return ms(statistics.median(times))


def _sources(root: Path) -> holders.Sources:
    for name in ("workspace", "home", "tmp", "agent", "tests", "verifier"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "instruction.md").write_text("x")
    return holders.Sources(
        workspace=str(root / "workspace"),
        home=str(root / "home"),
        tmp=str(root / "tmp"),
        frame=None,
        instruction=str(root / "instruction.md"),
        agent_logs=str(root / "agent"),
        tests=str(root / "tests"),
        verifier_logs=str(root / "verifier"),
        subject_dirs=(),
    )


def holder_ms(view: holders.View, src: holders.Sources, runs: int) -> float:
    def once() -> None:
        holder = holders.make_holder(
            [],
            [*holders.OWN_NAMESPACES, "--unshare-net"],
            holders.subject_args(view, src, None),
        )
        holder.ready()
        holder.end()

    once()
    return median_ms(once, runs)


def enter_ms(target: int, capped: bool, runs: int) -> float:
    keep = "".join(f",+{cap}" for cap in SUBJECT_CAPS)
    argv = ["nsenter", "--target", str(target), "--pid", "--mount", "--ipc", "--uts", "--"]
    if capped:
        argv += ["setpriv", "--inh-caps=-all", "--ambient-caps=-all"]
        argv += [f"--bounding-set=-all{keep}", "--"]
    argv.append("true")
    return median_ms(lambda: subprocess.run(argv, check=True), runs)


def redaction_ms(runs: int) -> tuple[float, float]:
    secrets = {"KEY_A": "sk-alpha-0123456789abcdef0123", "KEY_B": "sk-bravo-fedcba98765432"}
    raw_only = Redactor({v.encode(): f"[redacted:{k}]".encode() for k, v in secrets.items()})
    every = Redactor.of(secrets)
    stream = os.urandom(192 << 10).hex().encode()[: 256 << 10]

    def scrub(redactor: Redactor) -> Callable[[], object]:
        return lambda: [redactor.scrub(stream) for _ in range(4)]

    return median_ms(scrub(raw_only), runs), median_ms(scrub(every), runs)


def defence_costs(runs: int) -> list[tuple[str, str]]:
    """(defence, what it costs per attempt)."""
    rows: list[tuple[str, str]] = []
    why = namespaces_unavailable()
    if why is None:
        with tempfile.TemporaryDirectory() as scratch:
            src = _sources(Path(scratch))
            view = holders.View(hidden=(), visible=(), frame=False, subject_dirs=())
            whole = holders.View(hidden=(), visible=(), frame=False, subject_dirs=(), image=True)
            allow, machine = holder_ms(view, src, runs), holder_ms(whole, src, runs)
            rows.append(
                (
                    "allowlist view (one holder; an attempt makes two, ahead of time)",
                    f"{allow - machine:+.2f} ms ({allow:.2f} vs {machine:.2f}, whole machine)",
                )
            )
            holder = holders.make_holder(
                [], list(holders.OWN_NAMESPACES), holders.subject_args(view, src, None)
            )
            try:
                target = holder.ready()
                plain, capped = enter_ms(target, False, runs), enter_ms(target, True, runs)
            finally:
                holder.end()
            rows.append(
                (
                    "verifier's capabilities cut (setpriv per verifier program)",
                    f"{capped - plain:+.2f} ms ({capped:.2f} vs {plain:.2f})",
                )
            )
    else:
        rows.append(("process sandbox defences", f"not timed: {why}"))
    raw, every = redaction_ms(runs)
    forms = len(encoded_forms("sk-alpha-0123456789abcdef0123"))
    rows.append(
        (
            f"redaction of {forms} encoded forms per credential (1 MiB of output, 2 credentials)",
            f"{every - raw:+.2f} ms ({every:.2f} vs {raw:.2f} for the raw value only)",
        )
    )
    rows += seal_costs(runs)
    rows += change_list_cost(runs)
    rows.append(
        ("environment built from nothing; non-dumpable executor", "0 (nothing per attempt)")
    )
    return rows


def seal_costs(runs: int) -> list[tuple[str, str]]:
    """The record seal: the HMAC of a record, and its ledger line (written, fdatasync'd)
    with the head moved on, as a commit does."""
    key = SealKey(os.urandom(32))
    body = os.urandom(1200).hex().encode()  # about a record's size
    place = record_place("run-bench", "t1::1::s")
    seal_ms = median_ms(lambda: [key.seal(place, n, body) for n in range(1000)], runs) / 1000
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "heads").mkdir()
        ledger = LedgerWriter.create(root, "run-bench", key, "0" * 64, root / "heads")
        try:
            seal = key.seal(place, 1, body)
            counter = iter(range(1, 10**9))
            line_ms = median_ms(lambda: ledger.append("t1::1::s", next(counter), seal), runs)
        finally:
            ledger.close()
    return [
        ("record seal (HMAC-SHA256 of a record)", f"+{seal_ms:.4f} ms"),
        ("ledger line (fdatasync) and head, per commit", f"+{line_ms:.2f} ms"),
    ]


def change_list_cost(runs: int) -> list[tuple[str, str]]:
    """The container's change list (the engine's diff against the image), which the
    container sandbox takes three times per attempt; needs an answering engine."""
    probe = engine_info()
    if probe.engine is None:
        return [("container change list (engine diff)", f"not timed: {probe.why_none()}")]
    client = client_for(probe.engine.url)
    try:
        container = client.containers.run(PYTHON_IMAGE, ["sleep", "60"], detach=True)
    except Exception as exc:  # no such image here: say so rather than fail the bench
        return [("container change list (engine diff)", f"not timed: {exc}")]
    try:
        container.exec_run(["sh", "-c", "mkdir -p /opt/x && echo hi > /opt/x/f && touch /etc/x"])
        diff_ms = median_ms(lambda: client.api.diff(container.id), runs)
    finally:
        container.remove(force=True)
    return [("container change list (engine diff), x3 per attempt", f"+{3 * diff_ms:.2f} ms")]


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timings per defence (median)")
    parser.add_argument("--only-costs", action="store_true", help="skip the attacks")
    parser.add_argument("-k", default=None, help="only the attacks matching (pytest -k)")
    args = parser.parse_args()
    blocked_all = True
    if not args.only_costs:
        outcomes = run_attacks(["-k", args.k] if args.k else [])
        print()
        table(("class", "attack", "sandbox", "verdict"), sorted(outcomes.rows))
        blocked_all = all(r[3] != "NOT BLOCKED" for r in outcomes.rows)
        ran = [r for r in outcomes.rows if not r[3].startswith("skipped")]
        print(f"\n{sum(r[3] == 'blocked' for r in ran)} of {len(ran)} attacks blocked")
    print()
    table(("defence", "cost per attempt"), defence_costs(args.runs))
    sys.exit(0 if blocked_all else 1)


if __name__ == "__main__":
    main()
