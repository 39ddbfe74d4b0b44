"""The full analysis of one run, or of two runs of one benchmark: `maka-eval report`.

One or two attempt sources go in; out come per-arm figures, every pair of arms compared
on re-paired observations, the infrastructure losses, and, for two runs, what differs
between them. `report_files.write_report` writes `summary.json`, `cells.csv` and `report.html`.

Arms are the subjects of a run. With two runs (A and B) an arm is named `A:subject`,
and the pairs compared are those across the runs (A's arms against B's), paired by
task id and repetition; the pairs within one run are what `report A` shows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from maka_eval import __version__
from maka_eval.analysis.arms import REASONING_NOTE, ArmSummary, summarize_arm
from maka_eval.analysis.comparison import PairComparison, compare
from maka_eval.analysis.losses import ArmLoss, LossWarning, arm_loss, loss_warning
from maka_eval.analysis.observations import PASS_SCORE, CellObservation, observations
from maka_eval.analysis.power import ALPHA, POWER
from maka_eval.analysis.provenance import RunInfo, run_differences, run_info
from maka_eval.analysis.source import AttemptSource
from maka_eval.analysis.statistics import CONFIDENCE, DEFAULT_RESAMPLES, Interval, holm
from maka_eval.analysis.summary import RunSummary, summarize_source
from maka_eval.analysis.variance import VarianceSplit
from maka_eval.store.attempts import collector_paused
from maka_eval.store.integrity import SealState

RUN_LABELS = ("A", "B")
SUMMARY_FORMAT = "maka.eval.report.v1"


@dataclass(frozen=True)
class Report:
    """Everything a report shows; built by `build_report`."""

    runs: tuple[RunInfo, ...]
    arms: tuple[ArmSummary, ...]
    pairs: tuple[PairComparison, ...]
    losses: tuple[ArmLoss, ...]
    loss_warnings: tuple[LossWarning, ...]
    run_differences: tuple[str, ...]
    """What differs between two runs (empty for one run)."""
    cells: tuple[CellObservation, ...] = field(repr=False)
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    generated_at: datetime = field(default_factory=lambda: datetime.now(tz=UTC))

    @property
    def partial(self) -> bool:
        """Whether any run is not complete: its figures cover the results so far."""
        return any(run.partial for run in self.runs)

    @property
    def two_runs(self) -> bool:
        return len(self.runs) == 2

    def loss(self, arm: str) -> ArmLoss:
        return next(loss for loss in self.losses if loss.arm == arm)

    def warnings(self) -> list[str]:
        """Every warning, most important first, as plain sentences."""
        found = []
        for run in self.runs:
            name = f"run {run.label} ({run.location})" if run.label else f"run {run.location}"
            if run.partial:
                found.append(
                    f"{name} is {run.state.value}: {run.detail}. Figures cover the "
                    f"{run.with_result} of {run.cells} cells with a result so far"
                )
            found += verification_warnings(name, run)
        if self.two_runs:
            differs = (
                "; they differ in: " + "; ".join(self.run_differences)
                if self.run_differences
                else "; their frozen experiments, versions and start dates agree, but "
                "the occasions still differ"
            )
            found.append(
                "runs A and B are separate runs, not a paired design: their arms did not "
                "start together, so whatever changed between the occasions is confounded "
                f"with the comparison{differs}"
            )
        for warning in self.loss_warnings:
            found.append(warning.message(self.loss(warning.first), self.loss(warning.second)))
        for pair in self.pairs:
            if pair.first_unmatched or pair.second_unmatched:
                found.append(
                    f"{pair.first} vs {pair.second}: {pair.first_unmatched} result(s) of "
                    f"{pair.first} and {pair.second_unmatched} of {pair.second} have no "
                    "partner and were left out of the comparison"
                )
        return found


MAX_NAMED_FAILURES = 5
"""Failed records a warning names (summary.json and the page list every one)."""


def verification_warnings(name: str, run: RunInfo) -> list[str]:
    """What the run's seals and ledger say, when it is not plainly 'verified'."""
    found = []
    if run.problems:
        kinds = Counter(failure["kind"] for failure in failures_json(run))
        named = "; ".join(str(p) for p in run.problems[:MAX_NAMED_FAILURES])
        more = len(run.problems) - MAX_NAMED_FAILURES
        found.append(
            f"{name}: {len(run.problems)} attempt record(s) FAILED VERIFICATION ("
            + ", ".join(f"{n} {kind}" for kind, n in kinds.items())
            + "); what they hold is left out of every figure: "
            + named
            + (f"; and {more} more (summary.json lists every one)" if more > 0 else "")
        )
    integrity = run.integrity
    if integrity is not None and integrity.state in (SealState.UNVERIFIED, SealState.UNSIGNED):
        found.append(f"{name}: {integrity.describe()}")
    return found


def failures_json(run: RunInfo) -> list[dict[str, str]]:
    """Every failure of a run: its kind (how it failed), its file and what was seen."""
    findings = run.integrity.findings if run.integrity is not None else ()
    listed = {finding.problem() for finding in findings}
    out = [{"kind": f.kind.value, "where": f.where, "detail": f.detail} for f in findings]
    out += [
        {"kind": "damaged", "where": p.where, "detail": p.message}
        for p in run.problems
        if p not in listed
    ]
    return out


def _integrity_json(run: RunInfo) -> dict[str, Any]:
    integrity = run.integrity
    if integrity is None:
        return {
            "state": "not sealed",
            "why": "a cluster: only the operator may write an Attempt's result",
            "failures": failures_json(run),
        }
    return {
        "state": integrity.state.value,
        "keyId": integrity.key_id,
        "verifiedRecords": integrity.verified,
        "failures": failures_json(run),
        "notes": list(integrity.notes),
        "summary": integrity.describe(),
    }


def build_report(
    sources: Sequence[AttemptSource],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    summaries: Sequence[RunSummary] | None = None,
    on_cells: Callable[[tuple[CellObservation, ...]], None] | None = None,
) -> Report:
    """Analyse one run, or two runs of the same benchmark (A, then B). `on_cells` is
    called with the per-cell observations as soon as they are known, before the arms
    are compared (`build_and_write_report` writes cells.csv from them meanwhile)."""
    if not 1 <= len(sources) <= 2:
        raise ValueError("a report covers one run or two")
    if resamples < 1:
        raise ValueError("the bootstrap needs at least one resample")
    summaries = list(summaries) if summaries is not None else [summarize_source(s) for s in sources]
    with collector_paused():  # a row per cell, no cycles
        return _analysed(sources, summaries, resamples, seed, on_cells)


def _analysed(
    sources: Sequence[AttemptSource],
    summaries: Sequence[RunSummary],
    resamples: int,
    seed: int,
    on_cells: Callable[[tuple[CellObservation, ...]], None] | None,
) -> Report:
    labels = RUN_LABELS if len(sources) == 2 else ("",)
    runs = tuple(
        run_info(source, summary, label)
        for source, summary, label in zip(sources, summaries, labels, strict=False)
    )
    cells: list[CellObservation] = []
    # Each arm's observations, the arms in order of first appearance (one pass).
    by_arm: dict[str, list[CellObservation]] = {}
    repetitions: dict[str, int] = {}
    for summary, label in zip(summaries, labels, strict=False):
        for observation in observations(summary, label):
            mine = by_arm.get(observation.arm)
            if mine is None:
                mine = by_arm[observation.arm] = []
                repetitions[observation.arm] = summary.expansion.repetitions
            mine.append(observation)
            cells.append(observation)
    all_cells = tuple(cells)
    if on_cells is not None:
        on_cells(all_cells)
    arm_order = list(by_arm)
    stream = iter(range(1_000_000))
    arms = tuple(
        summarize_arm(
            arm,
            by_arm[arm],
            repetitions=repetitions[arm],
            resamples=resamples,
            seed=seed,
            stream=next(stream),
        )
        for arm in arm_order
    )
    pairs = []
    for i, first in enumerate(arms):
        for second in arms[i + 1 :]:
            across = first.run != second.run
            if len(runs) == 2 and not across:
                continue
            pairs.append(
                compare(
                    first.arm,
                    by_arm[first.arm],
                    second.arm,
                    by_arm[second.arm],
                    across_runs=across,
                    resamples=resamples,
                    seed=seed,
                    stream=next(stream),
                )
            )
    pairs = _holm_adjusted(pairs)
    losses = tuple(arm_loss(arm, by_arm[arm]) for arm in arm_order)
    loss_by_arm = {loss.arm: loss for loss in losses}
    warnings = [
        w
        for pair in pairs
        if (w := loss_warning(loss_by_arm[pair.first], loss_by_arm[pair.second])) is not None
    ]
    return Report(
        runs=runs,
        arms=arms,
        pairs=tuple(pairs),
        losses=losses,
        loss_warnings=tuple(warnings),
        run_differences=tuple(run_differences(*runs)) if len(runs) == 2 else (),
        cells=all_cells,
        resamples=resamples,
        seed=seed,
    )


def _holm_adjusted(pairs: list[PairComparison]) -> list[PairComparison]:
    """Every tested pair with its p-value adjusted by Holm over the report's tests."""
    tested = [i for i, pair in enumerate(pairs) if pair.test is not None]
    adjusted = holm([pairs[i].test.p_value for i in tested])  # type: ignore[union-attr]
    out = list(pairs)
    for i, p_holm in zip(tested, adjusted, strict=True):
        out[i] = replace(pairs[i], p_holm=p_holm)
    return out


METHOD = {
    "unit": "task: each task's repetitions are averaged first, and every interval and "
    "test treats tasks, not cells, as the independent observations",
    "confidence": CONFIDENCE,
    "bootstrap": "percentile cluster bootstrap over tasks (whole tasks drawn with "
    "replacement; the statistic is the mean of the task means), seeded",
    "passAtK": f"Chen et al. 2021 unbiased estimator per task, averaged over tasks, "
    f"its interval by the same bootstrap over tasks; a result passes at score >= "
    f"{PASS_SCORE:g}; tasks with fewer than k results are left out",
    "pairing": "by task id and repetition; unmatched observations discarded",
    "test": "McNemar exact (two-sided binomial on discordant pairs) when every score "
    "is 0 or 1 and each task has one pair, else the two-sided sign test: on nonzero "
    "differences with one pair per task, on the tasks' mean differences otherwise",
    "multipleComparisons": "Holm's step-down adjustment over every comparison of the "
    "report (pValueHolm); pValue is unadjusted",
    "variance": "method of moments: within = pooled variance of repetitions around "
    "their task's mean; between = variance of the task means less within times the "
    "mean of 1/repetitions (at least 0)",
    "power": f"normal approximation: a difference is detectable at {POWER:.0%} power and "
    f"two-sided alpha {ALPHA:g} when it is (z(1-alpha/2) + z(power)) times the standard "
    "error sqrt((between + within / repetitions) / tasks)",
    "lossWarning": "whenever two compared arms lose different shares of their "
    "started cells; Fisher exact p reported",
}


# -- summary.json ---------------------------------------------------------------------


def _number(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _interval(interval: Interval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {
        "estimate": _number(interval.estimate),
        "low": _number(interval.low),
        "high": _number(interval.high),
        "n": interval.n,
        "tasks": interval.tasks,
    }


def _variance_json(split: VarianceSplit | None) -> dict[str, Any] | None:
    if split is None:
        return None
    more_reps = split.standard_error(split.tasks, 2 * split.repetitions)
    more_tasks = split.standard_error(2 * split.tasks, split.repetitions)
    return {
        "tasks": split.tasks,
        "observations": split.observations,
        "repetitionsPerTask": _number(split.repetitions, 3),
        "between": _number(split.between),
        "within": _number(split.within),
        "withinShare": _number(split.within_share, 4),
        "clusteredStandardError": _number(split.clustered_se),
        "naiveStandardError": _number(split.naive_se),
        "designEffect": _number(split.design_effect, 4),
        "standardErrorWith": {
            "twiceTheRepetitions": _number(more_reps) if split.within is not None else None,
            "twiceTheTasks": _number(more_tasks),
            "endlessRepetitions": _number(split.standard_error(split.tasks, math.inf))
            if split.within is not None
            else None,
        },
    }


def _arm_json(arm: ArmSummary) -> dict[str, Any]:
    return {
        "arm": arm.arm,
        "run": arm.run or None,
        "subject": arm.subject_id,
        "cells": arm.cells,
        "results": arm.results,
        "completed": arm.completed,
        "subjectFailed": arm.subject_failed,
        "meanScore": _interval(arm.score),
        "binaryScores": arm.binary,
        "passAtK": [
            {
                "k": p.k,
                "value": _number(p.value),
                "tasks": p.tasks,
                "interval": _interval(p.interval),
            }
            for p in arm.pass_at_k
        ],
        "variance": _variance_json(arm.variance),
        "tokens": {
            "resultsReporting": arm.tokens.reported,
            "resultsNotReporting": arm.tokens.unreported,
            # null, not 0, when no result reported usage: unknown is not nothing.
            **{
                _camel(f.kind): (
                    {"total": f.total, "mean": _number(f.mean, 2)} if arm.tokens.reported else None
                )
                for f in arm.tokens.figures
            },
            "total": (
                {"total": arm.tokens.total, "mean": _number(arm.tokens.mean_total, 2)}
                if arm.tokens.reported
                else None
            ),
            "reasoning": None,
            "reasoningNote": REASONING_NOTE,
        },
        "cost": {
            "totalUsd": _number(arm.cost.total_usd, 8),
            "meanUsd": _number(arm.cost.mean_usd, 8),
            "resultsWithCost": arm.cost.known,
            "resultsWithUnknownCost": arm.cost.unknown,
            "totalIsLowerBound": arm.cost.lower_bound,
            "allAttemptsUsd": _number(arm.cost.all_attempts_usd, 8),
            "allAttemptsWithUnknownCost": arm.cost.all_attempts_unknown,
        },
        "durationSec": (
            None
            if arm.duration is None
            else {
                "n": arm.duration.n,
                "median": _number(arm.duration.median, 3),
                "p90": _number(arm.duration.p90, 3),
                "max": _number(arm.duration.max, 3),
                "mean": _number(arm.duration.mean, 3),
            }
        ),
    }


def _camel(kind: str) -> str:
    head, *rest = kind.split()
    return head + "".join(w.title() for w in rest)


def _pair_json(pair: PairComparison) -> dict[str, Any]:
    test = pair.test
    return {
        "first": pair.first,
        "second": pair.second,
        "design": "across runs (not paired)" if pair.across_runs else "paired (same task group)",
        "pairs": pair.pairs,
        "discardedUnmatched": {
            pair.first: pair.first_unmatched,
            pair.second: pair.second_unmatched,
        },
        "firstMean": _number(pair.first_mean),
        "secondMean": _number(pair.second_mean),
        "difference": _interval(pair.difference),
        "test": None
        if test is None
        else {
            "name": test.name,
            "firstHigher": test.positive,
            "secondHigher": test.negative,
            "ties": test.ties,
            "counts": test.unit,
            "pValue": test.p_value,
            "pValueHolm": pair.p_holm,
        },
        "variance": _variance_json(pair.variance),
        "power": _power_json(pair),
    }


def _power_json(pair: PairComparison) -> dict[str, Any] | None:
    split = pair.variance
    if split is None or pair.components is None:
        return None
    tasks, reps = split.tasks, split.repetitions
    return {
        "power": POWER,
        "alpha": ALPHA,
        "detectableDifference": _number(pair.detectable(tasks, reps)),
        "withTwiceTheRepetitions": _number(pair.detectable(tasks, 2 * reps))
        if split.within is not None
        else None,
        "withTwiceTheTasks": _number(pair.detectable(2 * tasks, reps)),
    }


def _loss_json(loss: ArmLoss) -> dict[str, Any]:
    return {
        "arm": loss.arm,
        "cells": loss.cells,
        "started": loss.started,
        "withResult": loss.with_result,
        "withoutResult": loss.without_result,
        "exhausted": loss.exhausted,
        "notStarted": loss.not_started,
        "attempts": loss.attempts,
        "infraFailed": loss.infra_failed,
        "cancelled": loss.cancelled,
        "interrupted": loss.interrupted,
        "retriedToResult": loss.retried_to_result,
    }


def _run_json(run: RunInfo) -> dict[str, Any]:
    return {
        "label": run.label or None,
        "location": run.location,
        "runId": run.run_id,
        "experiment": run.experiment_id,
        "state": run.state.value,
        "partial": run.partial,
        "detail": run.detail,
        "cells": run.cells,
        "withResult": run.with_result,
        "pending": run.pending,
        "exhausted": run.exhausted,
        "damagedRecords": run.damaged,
        "integrity": _integrity_json(run),
        "startedAt": run.started_at.isoformat() if run.started_at else None,
        "makaEvalVersions": list(run.versions),
        "benchmark": run.document.get("benchmark"),
    }


def report_json(report: Report) -> dict[str, Any]:
    """summary.json: every figure of the report, and how it was computed."""
    return {
        "format": SUMMARY_FORMAT,
        "generatedAt": report.generated_at.isoformat(),
        "makaEvalVersion": __version__,
        "partial": report.partial,
        "runs": [_run_json(run) for run in report.runs],
        "runDifferences": list(report.run_differences),
        "warnings": report.warnings(),
        "method": {**METHOD, "resamples": report.resamples, "seed": report.seed},
        "arms": [_arm_json(arm) for arm in report.arms],
        "pairs": [_pair_json(pair) for pair in report.pairs],
        "losses": [_loss_json(loss) for loss in report.losses],
    }
