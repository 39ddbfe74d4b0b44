"""`maka-eval report`: the full analysis of a run (or two), in the terminal and on disk.

`results` and `status` keep their quick tables; this command pairs the arms, puts
intervals and exact tests on the comparisons, counts the losses, and writes
report.html (self-contained), cells.csv and summary.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from maka_eval.cli.console import out

if TYPE_CHECKING:
    from maka_eval.analysis.comparison import PairComparison
    from maka_eval.analysis.report import Report
    from maka_eval.analysis.source import AttemptSource
    from maka_eval.analysis.summary import RunSummary
    from maka_eval.analysis.variance import VarianceSplit


def _sources(
    run_dirs: list[Path], cluster: str | None, kubeconfig: Path | None
) -> list[tuple[AttemptSource, str]]:
    """The runs to report on (A first), each with why its damaged records are left out."""
    from maka_eval.analysis.source import RunDirectorySource
    from maka_eval.cli.integrity import CLUSTER_DAMAGE, DIRECTORY_DAMAGE

    if cluster is None and kubeconfig is not None:
        raise typer.BadParameter(
            "only applies with --cluster NAMESPACE/NAME", param_hint="--kubeconfig"
        )
    total = len(run_dirs) + (cluster is not None)
    if total == 0:
        raise typer.BadParameter(
            "name a run directory, or an experiment on a cluster with --cluster NAMESPACE/NAME",
            param_hint="RUN_DIR / --cluster",
        )
    if total > 2:
        raise typer.BadParameter(
            "a report compares at most two runs: RUN_DIR and RUN_DIR_B, or one RUN_DIR and "
            "--cluster NAMESPACE/NAME",
            param_hint="RUN_DIR / RUN_DIR_B / --cluster",
        )
    sources: list[tuple[AttemptSource, str]] = [
        (RunDirectorySource(path), DIRECTORY_DAMAGE) for path in run_dirs
    ]
    if cluster is not None:
        # Imported here: only --cluster needs the kubernetes client.
        from maka_eval.analysis.cluster import ClusterSource, connect, parse_target

        try:
            namespace, name = parse_target(cluster)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--cluster") from None
        sources.append((ClusterSource(connect(kubeconfig), namespace, name), CLUSTER_DAMAGE))
    return sources


def _default_out(run_dirs: list[Path], cluster: str | None) -> Path:
    if not run_dirs:
        assert cluster is not None
        return Path("report-" + cluster.replace("/", "-"))
    if len(run_dirs) == 1 and cluster is None:
        return run_dirs[0] / "report"
    other = run_dirs[1].name if len(run_dirs) == 2 else (cluster or "").replace("/", "-")
    return run_dirs[0] / f"report-vs-{other or 'b'}"


def report_command(
    run_dir: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN_DIR",
            help="Run directory (or name an experiment with --cluster).",
            show_default=False,
        ),
    ] = None,
    run_dir_b: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN_DIR_B",
            help="A second run of the same benchmark: arms are paired across the two runs "
            "by task id and repetition (a warning names what differs between them).",
            show_default=False,
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            metavar="NAMESPACE/NAME",
            help="Read the Experiment NAME in NAMESPACE from a Kubernetes cluster instead of "
            "a run directory (with a RUN_DIR: compare the two).",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            metavar="PATH",
            help="With --cluster: the kubeconfig to use (default: $KUBECONFIG, "
            "~/.kube/config, else the Pod's service account).",
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR",
            help="Where report.html, cells.csv and summary.json go (default: RUN_DIR/report).",
        ),
    ] = None,
    resamples: Annotated[
        int,
        typer.Option("--bootstrap", metavar="N", min=100, help="Bootstrap resamples per interval."),
    ] = 10_000,
    seed: Annotated[
        int, typer.Option("--seed", metavar="S", min=0, help="Seed of the bootstrap.")
    ] = 0,
) -> None:
    """The full analysis: per-arm intervals, paired comparisons with exact tests, losses;
    writes report.html, cells.csv and summary.json (records that fail verification are
    left out, listed in the report and on stderr, and exit 3)."""
    from maka_eval.analysis.report_files import build_and_write_report
    from maka_eval.cli.integrity import exit_if_failed, summarize

    run_dirs = [p for p in (run_dir, run_dir_b) if p is not None]
    # A large run takes seconds to read: say what is going on (on a terminal only). The
    # spinner's thread is gone before the report forks its writers.
    with out.status("reading the attempt records ...") as status:
        sources = _sources(run_dirs, cluster, kubeconfig)
        status.update("summarizing the cells ...")
        summaries: list[RunSummary] = [summarize(source, why) for source, why in sources]
    target = out_dir if out_dir is not None else _default_out(run_dirs, cluster)
    if out.is_terminal:
        out.print("analysing and writing the report ...", style="dim", highlight=False)
    report, written = build_and_write_report(
        [source for source, _ in sources],
        target,
        resamples=resamples,
        seed=seed,
        summaries=summaries,
    )
    out.print(report_view(report))
    out.print(
        f"wrote {written.html}, {written.csv.name} and {written.json.name}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    exit_if_failed(*summaries)


# -- the terminal view ------------------------------------------------------------------


def _ci(estimate: float, low: float, high: float) -> Text:
    text = Text(f"{estimate:.3f} ")
    text.append(f"[{low:.3f}, {high:.3f}]", style="dim")
    return text


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def _p(value: float) -> Text:
    text = f"{value:.3g}" if value >= 0.001 else "<0.001"
    return Text(text, style="bold red" if value < 0.05 else "")


def report_view(report: Report) -> RenderableType:
    """What `report` prints: runs, arms, tokens, pairs, losses and warnings."""
    parts: list[RenderableType] = [_runs(report)]
    if report.partial:
        parts.append(
            Text(
                "PARTIAL RESULTS: the run is not complete; every figure covers the results "
                "recorded so far.",
                style="bold yellow",
            )
        )
    parts += [_arms(report), _tokens(report), _pairs(report)]
    variance = _variance(report)
    if variance is not None:
        parts.append(variance)
    parts += [_losses(report), Text(method_line(report), style="dim")]
    warnings = report.warnings()
    if warnings:
        parts.append(Text("warnings:", style="bold yellow"))
        parts += [Text(f"  - {w}", style="yellow") for w in warnings]
    return Group(*parts)


def _runs(report: Report) -> Table:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for run in report.runs:
        style = "green" if not run.partial else "yellow"
        name = f"run {run.label}" if run.label else "run"
        line = Text(f"{run.location}  ({run.run_id}, experiment {run.experiment_id})  ")
        line.append(run.state.value, style=style)
        if run.partial:
            line.append(f": {run.detail}", style=style)
        head.add_row(name, line)
    return head


def _arms(report: Report) -> Table:
    ks = sorted({p.k for arm in report.arms for p in arm.pass_at_k})
    shown_ks = [k for k in ks if k in (1, max(ks))] if ks else []
    table = Table(
        title="Arms (each over its own results; compare arms with the paired table)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption="≥: some results have no known cost, the total is a lower bound"
        if any(arm.cost.lower_bound for arm in report.arms)
        else None,
        caption_justify="left",
    )
    table.add_column("arm", style="bold", no_wrap=True)
    table.add_column("results", justify="right", no_wrap=True)
    table.add_column("tasks", justify="right", no_wrap=True)
    table.add_column("mean score [95% CI]", justify="right", no_wrap=True)
    for k in shown_ks:
        table.add_column(f"pass@{k}", justify="right", no_wrap=True)
    for name in ("cost", "mean cost", "time p50/p90/max"):
        table.add_column(name, justify="right", no_wrap=True)
    for arm in report.arms:
        passes = {p.k: p.value for p in arm.pass_at_k}
        score: RenderableType = (
            _ci(arm.score.estimate, arm.score.low, arm.score.high) if arm.score else "-"
        )
        d = arm.duration
        lower = "≥ " if arm.cost.lower_bound else ""
        table.add_row(
            arm.arm,
            f"{arm.results}/{arm.cells}",
            str(arm.score.tasks) if arm.score else "-",
            score,
            *[f"{passes[k]:.3f}" if passes.get(k) is not None else "-" for k in shown_ks],
            lower + _usd(arm.cost.total_usd),
            _usd(arm.cost.mean_usd),
            "-" if d is None else f"{d.median:.1f}s/{d.p90:.1f}s/{d.max:.1f}s",
        )
    return table


def _tokens(report: Report) -> Table:
    table = Table(
        title="Tokens per result (mean; normalized the same way for every arm)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("arm", style="bold", no_wrap=True)
    table.add_column("reporting", justify="right", no_wrap=True)
    kinds = [f.kind for f in report.arms[0].tokens.figures] if report.arms else []
    for kind in (*kinds, "total", "reasoning"):
        table.add_column(kind, justify="right", no_wrap=True)
    for arm in report.arms:
        t = arm.tokens
        if t.reported:
            figures = [f"{f.mean:,.0f}" for f in t.figures] + [f"{t.mean_total or 0:,.0f}"]
        else:
            figures = ["not reported"] * (len(kinds) + 1)
        table.add_row(
            arm.arm, f"{t.reported}/{t.reported + t.unreported}", *figures, "not reported"
        )
    return table


def _pairs(report: Report) -> RenderableType:
    if not report.pairs:
        return Text("paired comparisons: one arm, nothing to compare", style="dim")
    table = Table(
        title="Paired comparisons (by task id and repetition; unmatched results discarded)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    several = sum(pair.test is not None for pair in report.pairs) > 1
    table.add_column("first \u2212 second", style="bold", no_wrap=True)
    names = ["pairs", "tasks", "discarded", "difference [95% CI]", "test", "+/\u2212/=", "p"]
    for name in names + (["p (Holm)"] if several else []):
        table.add_column(name, justify="right", no_wrap=True)
    for pair in report.pairs:
        d = pair.difference
        test = pair.test
        label = f"{pair.first} \u2212 {pair.second}"
        if pair.across_runs:
            label += " (across runs)"
        holm = [_p(pair.p_holm) if pair.p_holm is not None else "-"] if several else []
        table.add_row(
            label,
            str(pair.pairs),
            str(d.tasks) if d else "-",
            f"{pair.first_unmatched}/{pair.second_unmatched}",
            _ci(d.estimate, d.low, d.high) if d else "-",
            test.name if test else "-",
            f"{test.positive}/{test.negative}/{test.ties} {test.unit}" if test else "-",
            _p(test.p_value) if test else "-",
            *holm,
        )
    return table


def method_line(report: Report) -> str:
    """How the figures were computed, in one sentence (the unit first)."""
    tested = sum(pair.test is not None for pair in report.pairs)
    holm = (
        f"; p (Holm): adjusted over the {tested} comparisons (Holm's step-down)"
        if tested > 1
        else ""
    )
    return (
        "unit: the task (repetitions averaged within it); 95% intervals: percentile "
        f"bootstrap over tasks, {report.resamples:,} resamples, seed {report.seed}; "
        "test: McNemar exact / sign test over pairs with one repetition, sign test over "
        f"tasks otherwise{holm}"
    )


def _se(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _variance(report: Report) -> Table | None:
    """Where the variance lies (arms and pairs), and what more repetitions or more tasks
    would buy; None when no arm has repetitions."""
    rows: list[tuple[str, VarianceSplit, PairComparison | None]] = [
        (arm.arm, arm.variance, None) for arm in report.arms if arm.variance is not None
    ]
    rows += [
        (f"{pair.first} \u2212 {pair.second}", pair.variance, pair)
        for pair in report.pairs
        if pair.variance is not None and pair.variance.within is not None
    ]
    if not rows:
        return None
    table = Table(
        title="Variance by task (standard error now / with twice the repetitions / with "
        "twice the tasks; for pairs, the smallest difference detectable at 80% power)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("arm or pair", style="bold", no_wrap=True)
    for name in ("tasks", "reps", "between", "within", "within share", "design effect"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("SE now / 2x reps / 2x tasks", "detectable now / 2x reps / 2x tasks"):
        table.add_column(name, justify="right", no_wrap=True)
    for name, v, pair in rows:
        more_reps = v.standard_error(v.tasks, 2 * v.repetitions) if v.within is not None else None
        ses = f"{_se(v.clustered_se)} / {_se(more_reps)} / " + _se(
            v.standard_error(2 * v.tasks, v.repetitions)
        )
        detectable = "-"
        if pair is not None and pair.components is not None:
            detectable = " / ".join(
                _se(pair.detectable(tasks, reps))
                for tasks, reps in (
                    (v.tasks, v.repetitions),
                    (v.tasks, 2 * v.repetitions),
                    (2 * v.tasks, v.repetitions),
                )
            )
        share = v.within_share
        table.add_row(
            name,
            str(v.tasks),
            f"{v.repetitions:.2g}",
            f"{v.between:.4f}",
            _se(v.within),
            "-" if share is None else f"{share:.0%}",
            "-" if v.design_effect is None else f"{v.design_effect:.2f}",
            ses,
            detectable,
        )
    return table


def _losses(report: Report) -> Table:
    table = Table(
        title="Infrastructure losses", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("arm", style="bold", no_wrap=True)
    for name in (
        "started",
        "without result",
        "out of retries",
        "not started",
        "attempts",
        "infra failed",
        "cancelled",
        "interrupted",
    ):
        table.add_column(name, justify="right", no_wrap=True)
    for loss in report.losses:
        table.add_row(
            loss.arm,
            str(loss.started),
            Text(str(loss.without_result), style="yellow" if loss.without_result else ""),
            str(loss.exhausted),
            str(loss.not_started),
            str(loss.attempts),
            str(loss.infra_failed),
            str(loss.cancelled),
            str(loss.interrupted),
        )
    return table
