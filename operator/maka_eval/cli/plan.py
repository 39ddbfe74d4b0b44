"""`maka-eval plan`: before running, what an experiment's tasks x repetitions can detect,
and what a target difference needs.

The variance figures are assumed (each option has a stated default) or measured on a
finished run with --from (a pilot run of the same benchmark). The arithmetic lives in
`analysis.power` and `analysis.planning`; this module reads the options and prints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from maka_eval.cli.console import out

if TYPE_CHECKING:
    from maka_eval.analysis.planning import Design, Source

DEFAULT_SCORE_VARIANCE = 0.25
"""A 0/1 score's largest variance (a 50% pass rate)."""
DEFAULT_WITHIN_SHARE = 0.5
DEFAULT_CORRELATION = 0.0
"""No help from pairing: the conservative assumption."""


def _check_range(value: float, low: float, high: float, hint: str, what: str) -> None:
    if not (math.isfinite(value) and low < value < high):
        raise typer.BadParameter(
            f"{what}, between {low:g} and {high:g} (got {value:g})", param_hint=hint
        )


def plan_command(
    experiment: Annotated[
        Path,
        typer.Argument(metavar="EXPERIMENT", help="Experiment file (YAML or JSON, either form)."),
    ],
    difference: Annotated[
        float | None,
        typer.Option(
            "--difference",
            metavar="D",
            help="A difference in mean score to detect: also print the tasks x repetitions "
            "it needs.",
        ),
    ] = None,
    alpha: Annotated[
        float, typer.Option("--alpha", metavar="A", help="Two-sided significance level.")
    ] = 0.05,
    power: Annotated[
        float, typer.Option("--power", metavar="P", help="Probability of detecting it.")
    ] = 0.8,
    score_variance: Annotated[
        float | None,
        typer.Option(
            "--score-variance",
            metavar="V",
            help="Assumed variance of one score of an arm (default 0.25: 0/1 scores at a "
            "50% pass rate, their largest).",
            show_default=False,
        ),
    ] = None,
    within_share: Annotated[
        float | None,
        typer.Option(
            "--within-share",
            metavar="S",
            help="Assumed share of that variance within a task, across its repetitions "
            "(default 0.5; 0: a task's repetitions always agree).",
            show_default=False,
        ),
    ] = None,
    correlation: Annotated[
        float | None,
        typer.Option(
            "--correlation",
            metavar="R",
            help="Assumed correlation across tasks of two arms' task means: what pairing "
            "removes (default 0).",
            show_default=False,
        ),
    ] = None,
    from_run: Annotated[
        Path | None,
        typer.Option(
            "--from",
            metavar="RUN_DIR",
            help="Measure the variance on this finished run (a pilot of the same "
            "benchmark) instead of assuming it.",
        ),
    ] = None,
) -> None:
    """Power before running: the smallest difference the experiment's tasks x repetitions
    detect (80% power, two-sided alpha 0.05), and with --difference the tasks x
    repetitions that difference needs."""
    from maka_eval.analysis.planning import Source, design_of, measured_sources
    from maka_eval.analysis.power import assumed_components
    from maka_eval.analysis.source import RunDirectorySource
    from maka_eval.cli.integrity import DIRECTORY_DAMAGE, summarize
    from maka_eval.engine.expand import expand
    from maka_eval.executors.load import load_experiment_file

    _check_range(alpha, 0, 1, "--alpha", "the significance level is a probability")
    _check_range(power, 0, 1, "--power", "the power is a probability")
    if difference is not None and not (math.isfinite(difference) and difference > 0):
        raise typer.BadParameter(
            f"the difference to detect is a positive number (got {difference:g})",
            param_hint="--difference",
        )
    assumed = {
        "--score-variance": score_variance,
        "--within-share": within_share,
        "--correlation": correlation,
    }
    if from_run is not None:
        given = [name for name, value in assumed.items() if value is not None]
        if given:
            raise typer.BadParameter(
                "measured figures replace assumed ones: give --from RUN_DIR or "
                f"{', '.join(given)}, not both",
                param_hint=given[0],
            )
    variance = DEFAULT_SCORE_VARIANCE if score_variance is None else score_variance
    share = DEFAULT_WITHIN_SHARE if within_share is None else within_share
    rho = DEFAULT_CORRELATION if correlation is None else correlation
    if not (math.isfinite(variance) and variance > 0):
        raise typer.BadParameter(
            f"a variance is a positive number (got {variance:g})", param_hint="--score-variance"
        )
    if not (math.isfinite(share) and 0 <= share <= 1):
        raise typer.BadParameter(
            f"a share is between 0 and 1 (got {share:g})", param_hint="--within-share"
        )
    if not (math.isfinite(rho) and -1 <= rho <= 1):
        raise typer.BadParameter(
            f"a correlation is between -1 and 1 (got {rho:g})", param_hint="--correlation"
        )

    loaded = load_experiment_file(experiment)
    design = design_of(loaded.experiment.id, expand(loaded.experiment))
    if len(design.subjects) < 2:
        raise typer.BadParameter(
            f"{experiment} has one subject: a plan is for comparing two or more",
            param_hint="EXPERIMENT",
        )
    notes: list[str] = []
    if from_run is None:
        if rho == 1 and share == 0:
            raise typer.BadParameter(
                "with --correlation 1 and --within-share 0 two arms never differ by chance: "
                "there is nothing to plan",
                param_hint="--correlation",
            )
        sources = [Source("every pair", assumed_components(variance, share, rho))]
        where = (
            f"assumed: score variance {variance:g}, within-task share {share:g}, "
            f"correlation {rho:g} (--score-variance, --within-share, --correlation; or "
            "measure them with --from RUN_DIR)"
        )
    else:
        summary = summarize(RunDirectorySource(from_run), DIRECTORY_DAMAGE)
        sources, constant = measured_sources(summary)
        notes += [
            f"{name}: every task gave the same difference on that run (no variance to "
            "measure), so it is left out"
            for name in constant
        ]
        if not sources:
            raise typer.BadParameter(
                f"{from_run} has no two arms with results on two or more common tasks to "
                "measure a variance from",
                param_hint="--from",
            )
        where = (
            f"measured on {from_run} ({len(summary.expansion.task_ids)} tasks x "
            f"{summary.expansion.repetitions} repetitions)"
        )
        if summary.expansion.repetitions < 2:
            notes.append(
                "that run has one repetition, so the variance within a task cannot be told "
                "apart: it is counted between tasks, and more repetitions are assumed to "
                "buy nothing"
            )
    out.print(
        plan_view(design, sources, where, notes, difference=difference, alpha=alpha, power=power)
    )


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def plan_view(
    design: Design,
    sources: list[Source],
    where: str,
    notes: list[str],
    *,
    difference: float | None,
    alpha: float,
    power: float,
) -> RenderableType:
    """What `plan` prints."""
    from maka_eval.analysis.planning import detectable, hardest, repetitions_for, tasks_table
    from maka_eval.analysis.power import Components, tasks_needed

    m = design.comparisons
    adjusted = f"alpha/{m} = {alpha / m:.3g}"
    parts: list[RenderableType] = [
        Text(
            f"experiment {design.experiment_id}: {design.tasks} tasks x "
            f"{design.repetitions} repetitions x {len(design.subjects)} subjects "
            f"({m} comparison{'s' if m > 1 else ''})"
        ),
        Text(f"variance {where}", style="dim"),
    ]
    parts += [Text(f"note: {note}", style="yellow") for note in notes]
    table = Table(
        title=f"Smallest detectable difference ({power:.0%} power, two-sided alpha {alpha:g})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption=(
            f"with {m} comparisons the report adjusts p-values by Holm, whose strictest "
            f"step tests at {adjusted}"
            if m > 1
            else None
        ),
        caption_justify="left",
    )
    table.add_column("comparison", style="bold", no_wrap=True)
    for name in ("between tasks", "within a task", "standard error", f"at alpha {alpha:g}"):
        table.add_column(name, justify="right", no_wrap=True)
    if m > 1:
        table.add_column(f"at {adjusted}", justify="right", no_wrap=True)
    for row in detectable(design, sources, alpha=alpha, power=power):
        c = row.source.components
        table.add_row(
            row.source.name,
            f"{c.between:.4f}",
            f"{c.within:.4f}",
            f"{row.standard_error:.4f}",
            f"{row.difference:.4f}",
            *([_figure(row.difference_adjusted)] if m > 1 else []),
        )
    parts.append(table)
    if difference is None:
        return Group(*parts)
    source = hardest(design, sources)
    needed = Table(
        title=f"Tasks needed to detect a difference of {difference:g} ({power:.0%} power)"
        + (f", for {source.name} (the comparison that varies most)" if len(sources) > 1 else ""),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    needed.add_column("repetitions", justify="right", no_wrap=True)
    needed.add_column(f"tasks at alpha {alpha:g}", justify="right", no_wrap=True)
    if m > 1:
        needed.add_column(f"tasks at {adjusted}", justify="right", no_wrap=True)
    for need in tasks_table(design, source, difference, alpha=alpha, power=power):
        mark = " (this design)" if need.repetitions == design.repetitions else ""
        needed.add_row(
            f"{need.repetitions}{mark}",
            f"{need.tasks:,}",
            *([f"{need.tasks_adjusted:,}"] if need.tasks_adjusted is not None else []),
        )
    parts.append(needed)
    at_alpha, at_adjusted = repetitions_for(design, source, difference, alpha=alpha, power=power)
    floor_components = source.components
    for label, reps, level in (
        (f"alpha {alpha:g}", at_alpha, alpha),
        (adjusted, at_adjusted, alpha / m),
    ):
        if label == adjusted and m < 2:
            continue
        if reps is not None:
            parts.append(
                Text(
                    f"with this experiment's {design.tasks} tasks, at {label}: "
                    f"{reps} repetition{'s' if reps > 1 else ''} per task"
                )
            )
            continue
        floor = (
            tasks_needed(
                Components(floor_components.between, 0.0), difference, 1, alpha=level, power=power
            )
            if floor_components.between > 0
            else None
        )
        parts.append(
            Text(
                f"with this experiment's {design.tasks} tasks, at {label}: no number of "
                "repetitions is enough; the variance between tasks alone needs "
                + (f"at least {floor:,} tasks" if floor is not None else "more tasks"),
                style="yellow",
            )
        )
    return Group(*parts)
