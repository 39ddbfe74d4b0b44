"""report.html: one self-contained page (inline CSS and SVG, no script, no network).

It shows what the terminal shows and more: the state of each run (partial runs are
marked at the top), the warnings, per-arm figures, the paired comparisons, the losses,
the plots and how every figure was computed.

Every text goes through `escape`: HTML escaped, and the characters a terminal would act
on (controls, bidi overrides that show a name reversed) written visibly as in the CLI.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence

from maka_eval import __version__
from maka_eval.analysis.arms import REASONING_NOTE, ArmSummary
from maka_eval.analysis.plots import (
    arm_colors,
    cost_score_plot,
    difference_plot,
    duration_plot,
    score_plot,
)
from maka_eval.analysis.power import ALPHA, POWER
from maka_eval.analysis.provenance import RunInfo
from maka_eval.analysis.report import Report, failures_json
from maka_eval.analysis.statistics import CONFIDENCE, Interval
from maka_eval.analysis.variance import VarianceSplit
from maka_eval.printable import visible
from maka_eval.store.attempts import collector_paused
from maka_eval.store.integrity import SealState

MAX_LISTED_CELLS = 60
MAX_LISTED_FAILURES = 200


def escape(text: str) -> str:
    """`text` for the page: control and bidi characters made visible (`\\u202e`), then
    HTML-escaped, quotes included."""
    return html.escape(visible(text))


_CSS = """
:root { --ink:#1f2937; --muted:#6b7280; --line:#e5e7eb; --panel:#ffffff; --bg:#f3f4f6;
        --ok:#15803d; --warn:#b45309; --warnbg:#fffbeb; --bad:#b91c1c; --accent:#2563eb; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1220px; margin: 0 auto; padding: 24px 28px 48px; }
header h1 { font-size: 22px; margin: 0 0 4px; }
header .sub { color: var(--muted); }
.badge { display:inline-block; padding:2px 10px; border-radius:999px; font-weight:600;
         font-size:12px; letter-spacing:.03em; text-transform:uppercase; vertical-align:middle;
         margin-left:8px; }
.badge.complete { background:#dcfce7; color:var(--ok); }
.badge.partial { background:#fef3c7; color:var(--warn); }
.banner { margin:16px 0; padding:12px 16px; border-radius:8px; border:1px solid #fcd34d;
          background:var(--warnbg); }
.banner strong { color: var(--warn); }
.warnings { margin: 16px 0; padding: 12px 16px 12px 18px; border-left: 4px solid var(--warn);
            background: var(--panel); border-radius: 6px; }
.warnings h2 { margin-top: 0; }
.warnings li { margin: 4px 0; }
.failed { border-left: 4px solid var(--bad); }
.failed h2 { color: var(--bad); }
.failed td { white-space: normal; }
.badge.failed { background:#fee2e2; color:var(--bad); }
section { background: var(--panel); border-radius: 10px; padding: 16px 20px; margin: 16px 0;
          box-shadow: 0 1px 2px rgba(0,0,0,.06); }
h2 { font-size: 16px; margin: 0 0 10px; }
p.note { color: var(--muted); margin: 8px 0 0; font-size: 12.5px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 6px 10px; border-bottom: 1px solid var(--line); text-align: right;
         white-space: nowrap; }
th { font-size: 12px; color: var(--muted); font-weight: 600; background: #f9fafb;
     white-space: normal; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
td.text, th.text { text-align: left; }
.scroll { overflow-x: auto; }
tbody tr:hover { background: #f9fafb; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:6px; }
.ci { color: var(--muted); }
.lb { color: var(--warn); font-weight: 600; }
.sig { color: var(--bad); font-weight: 600; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.plots figure { margin: 0; background: var(--panel); border-radius: 10px; padding: 12px;
                box-shadow: 0 1px 2px rgba(0,0,0,.06); }
.plots figcaption { font-weight: 600; margin-bottom: 6px; }
.plots svg { width: 100%; height: auto; }
ul.diff { margin: 6px 0 0; padding-left: 20px; }
code { background:#f3f4f6; padding: 1px 4px; border-radius: 4px; font-size: 12.5px; }
footer { color: var(--muted); font-size: 12px; margin-top: 24px; }
"""


def _fmt(value: float | None, digits: int = 3) -> str:
    return "&ndash;" if value is None else f"{value:.{digits}f}"


def _int(value: int | None) -> str:
    return "&ndash;" if value is None else f"{value:,}"


def _usd(value: float | None) -> str:
    return "&ndash;" if value is None else f"${value:,.4f}"


def _interval(interval: Interval | None, digits: int = 3) -> str:
    if interval is None:
        return "&ndash;"
    return (
        f"{interval.estimate:.{digits}f} <span class='ci'>[{interval.low:.{digits}f}, "
        f"{interval.high:.{digits}f}]</span>"
    )


def _p(value: float) -> str:
    text = f"{value:.3g}" if value >= 0.001 else "&lt; 0.001"
    return f"<span class='sig'>{text}</span>" if value < 0.05 else text


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], text_columns: int = 1) -> str:
    """An HTML table; cells are already escaped HTML."""
    cls = ["text" if i < text_columns else "" for i in range(len(head))]
    header = "".join(f"<th class='{c}'>{h}</th>" for c, h in zip(cls, head, strict=True))
    body = "".join(
        "<tr>"
        + "".join(f"<td class='{c}'>{v}</td>" for c, v in zip(cls, row, strict=True))
        + "</tr>"
        for row in rows
    )
    return (
        f"<div class='scroll'><table><thead><tr>{header}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def _arm_cell(arm: str, colors: dict[str, str]) -> str:
    return f"<span class='swatch' style='background:{colors[arm]}'></span>{escape(arm)}"


def _header(report: Report) -> str:
    experiments = sorted({run.experiment_id for run in report.runs})
    badge = (
        "<span class='badge partial'>partial</span>"
        if report.partial
        else "<span class='badge complete'>complete</span>"
    )
    if any(run.problems for run in report.runs):
        badge += "<span class='badge failed'>records failed verification</span>"
    elif any(
        run.integrity is not None and run.integrity.state is not SealState.VERIFIED
        for run in report.runs
    ):
        badge += "<span class='badge partial'>unverified</span>"
    runs = " · ".join(
        escape(f"{run.label + ': ' if run.label else ''}{run.location} ({run.run_id})")
        for run in report.runs
    )
    benchmark = report.runs[0].document.get("benchmark") or {}
    bench = escape(f"{benchmark.get('id', '?')} {benchmark.get('version', '')}".strip())
    return (
        f"<header><h1>maka-eval report: {escape(', '.join(experiments))}{badge}</h1>"
        f"<div class='sub'>benchmark {bench} · {runs}</div></header>"
    )


def _banner(report: Report) -> str:
    if not report.partial:
        return ""
    lines = "".join(
        f"<div><strong>{escape(run.label + ': ' if run.label else '')}"
        f"{escape(run.state.value)}</strong> — {escape(run.detail)}. "
        f"{run.with_result:,} of {run.cells:,} cells have a result so far.</div>"
        for run in report.runs
        if run.partial
    )
    return (
        "<div class='banner' id='partial'><strong>Partial results.</strong> "
        f"Every figure below covers the results recorded so far.{lines}</div>"
    )


def _warnings(report: Report) -> str:
    found = report.warnings()
    if not found:
        return ""
    items = "".join(f"<li>{escape(w)}</li>" for w in found)
    return f"<div class='warnings'><h2>Warnings</h2><ul>{items}</ul></div>"


def _failed_section(report: Report) -> str:
    """Every record that failed verification: which file, and how it failed."""
    rows = []
    for run in report.runs:
        label = f"{run.label}: " if run.label else ""
        rows += [
            [
                escape(label + failure["kind"]),
                f"<code>{escape(failure['where'])}</code>",
                escape(failure["detail"]),
            ]
            for failure in failures_json(run)
        ]
    if not rows:
        return ""
    more = (
        f"<p class='note'>… and {len(rows) - MAX_LISTED_FAILURES:,} more (summary.json "
        "lists every one).</p>"
        if len(rows) > MAX_LISTED_FAILURES
        else ""
    )
    return (
        f"<section class='failed' id='failed'><h2>Failed verification ({len(rows):,})</h2>"
        "<p class='note'>These records' seals or ledger lines do not hold: they were "
        "edited, forged, moved, copied from another run or removed after they were "
        "written. What they hold is left out of every figure on this page.</p>"
        f"{_table(['how', 'file', 'what was seen'], rows[:MAX_LISTED_FAILURES], 3)}{more}"
        "</section>"
    )


def _records_cell(run: RunInfo) -> str:
    integrity = run.integrity
    if integrity is None:
        return "not sealed (cluster)"
    if integrity.state is SealState.VERIFIED:
        return escape(f"verified: {integrity.verified:,} (key {integrity.key_id})")
    if integrity.state is SealState.FAILED:
        return (
            f"<span class='sig'>{len(run.problems):,} failed</span> · "
            f"{integrity.verified:,} verified"
        )
    return f"<span class='lb'>{escape(integrity.state.value)}</span>"


def _pass_header(arms: Sequence[ArmSummary]) -> list[int]:
    ks: set[int] = set()
    for arm in arms:
        ks |= {p.k for p in arm.pass_at_k}
    return sorted(ks)


def _arms_section(report: Report, colors: dict[str, str]) -> str:
    ks = _pass_header(report.arms)
    head = [
        "arm",
        "results / cells",
        "tasks",
        "completed / failed",
        f"mean score [{CONFIDENCE:.0%} CI]",
        *[f"pass@{k}" for k in ks],
        "mean tokens",
        "total cost",
        "mean cost",
        "duration median / p90 / max",
    ]
    rows = []
    for arm in report.arms:
        passes = {p.k: p for p in arm.pass_at_k}
        lower = "<span class='lb'>≥ </span>" if arm.cost.lower_bound else ""
        d = arm.duration
        rows.append(
            [
                _arm_cell(arm.arm, colors),
                f"{arm.results:,} / {arm.cells:,}",
                _int(arm.score.tasks if arm.score else None),
                f"{arm.completed:,} / {arm.subject_failed:,}",
                _interval(arm.score),
                *[_interval(passes[k].interval) if k in passes else "&ndash;" for k in ks],
                _int(None if arm.tokens.mean_total is None else round(arm.tokens.mean_total)),
                lower + _usd(arm.cost.total_usd),
                _usd(arm.cost.mean_usd),
                "&ndash;" if d is None else f"{d.median:.1f}s / {d.p90:.1f}s / {d.max:.1f}s",
            ]
        )
    note = (
        "Per arm, over its own cells with a result (each cell's earliest valid attempt). "
        "The task is the unit: the mean score is the mean over tasks of each task's mean "
        "over its repetitions, and its interval resamples whole tasks. "
        "Loss is not random, so compare arms with the paired table below, not with these "
        "means. pass@k: Chen et al.'s unbiased estimator per task, averaged over tasks "
        "with at least k results (interval: resampling tasks); a result passes at full "
        "marks. ≥: some results have no known cost, so the total is a lower bound."
    )
    return (
        f"<section id='arms'><h2>Arms</h2>{_table(head, rows)}"
        f"<p class='note'>{escape(note)}</p></section>"
    )


def _pairs_section(report: Report) -> str:
    if not report.pairs:
        return (
            "<section id='pairs'><h2>Paired comparisons</h2>"
            "<p class='note'>One arm: nothing to compare.</p></section>"
        )
    tested = sum(pair.test is not None for pair in report.pairs)
    head = [
        "first &minus; second",
        "design",
        "pairs",
        "tasks",
        "discarded (first / second)",
        "mean first",
        "mean second",
        f"difference [{CONFIDENCE:.0%} CI]",
        "test",
        "first higher / second higher / tied",
        "p",
        *(["p (Holm)"] if tested > 1 else []),
    ]
    rows = []
    for pair in report.pairs:
        test = pair.test
        holm = [_p(pair.p_holm) if pair.p_holm is not None else "&ndash;"] if tested > 1 else []
        rows.append(
            [
                f"{escape(pair.first)} &minus; {escape(pair.second)}",
                "across runs" if pair.across_runs else "paired",
                f"{pair.pairs:,}",
                _int(pair.difference.tasks if pair.difference else None),
                f"{pair.first_unmatched:,} / {pair.second_unmatched:,}",
                _fmt(pair.first_mean),
                _fmt(pair.second_mean),
                _interval(pair.difference),
                escape(test.name) if test else "&ndash;",
                f"{test.positive:,} / {test.negative:,} / {test.ties:,} {test.unit}"
                if test
                else "&ndash;",
                _p(test.p_value) if test else "&ndash;",
                *holm,
            ]
        )
    holm_note = (
        f" p (Holm): each p-value adjusted by Holm's step-down method over the {tested} "
        "comparisons of this report, so that the chance of any false 'significant' stays "
        "at 0.05; p: unadjusted."
        if tested > 1
        else ""
    )
    note = (
        "Paired by task id and repetition; a result whose partner has none is discarded "
        "and counted. The task is the unit: repetitions of one task are not independent "
        "pairs (a task neither arm solves fails together every time), so each task's "
        "differences are averaged. Difference: mean over tasks of (first &minus; second), "
        f"percentile bootstrap over tasks ({report.resamples:,} resamples, seed "
        f"{report.seed}). Test: with one pair per task, McNemar's exact test (two-sided "
        "binomial on the discordant pairs) when every score is 0 or 1, else the two-sided "
        "sign test on the nonzero differences; with repetitions, the sign test on the "
        f"tasks' mean differences (it counts tasks).{holm_note}"
    )
    return (
        f"<section id='pairs'><h2>Paired comparisons</h2>{_table(head, rows, 2)}"
        f"<p class='note'>{note}</p></section>"
    )


def _se(value: float | None) -> str:
    return _fmt(value, 4)


def _variance_row(name: str, v: VarianceSplit, detectable: Sequence[float | None]) -> list[str]:
    more_reps = v.standard_error(v.tasks, 2 * v.repetitions) if v.within is not None else None
    share = v.within_share
    return [
        name,
        f"{v.tasks:,}",
        f"{v.repetitions:.3g}",
        _se(v.between),
        _se(v.within),
        "&ndash;" if share is None else f"{share:.0%}",
        _fmt(v.design_effect, 2),
        f"{_se(v.clustered_se)} / {_se(more_reps)} / "
        f"{_se(v.standard_error(2 * v.tasks, v.repetitions))}",
        " / ".join(_se(d) for d in detectable) if detectable else "&ndash;",
    ]


def _variance_section(report: Report, colors: dict[str, str]) -> str:
    """Where the variance lies, what more repetitions or tasks would buy, and power."""
    rows = [
        _variance_row(_arm_cell(arm.arm, colors), arm.variance, ())
        for arm in report.arms
        if arm.variance is not None
    ]
    for pair in report.pairs:
        v = pair.variance
        if v is None or v.tasks < 2:
            continue
        designs = [(v.tasks, v.repetitions)]
        if v.within is not None:
            designs.append((v.tasks, 2 * v.repetitions))
        designs.append((2 * v.tasks, v.repetitions))
        rows.append(
            _variance_row(
                f"{escape(pair.first)} &minus; {escape(pair.second)}",
                v,
                [pair.detectable(tasks, reps) for tasks, reps in designs],
            )
        )
    if not rows:
        return ""
    head = [
        "arm, or pair (difference)",
        "tasks",
        "repetitions",
        "between tasks",
        "within a task",
        "within share",
        "design effect",
        "standard error: now / 2&times; repetitions / 2&times; tasks",
        f"detectable difference ({POWER:.0%} power, &alpha; {ALPHA:g}): now / "
        "2&times; repetitions / 2&times; tasks",
    ]
    note = (
        "A score varies because tasks differ (between) and because one task's attempts "
        "differ (within, the variance of one repetition around its task's mean; pooled "
        "over tasks). The mean over tasks has the variance (between + within / "
        "repetitions) / tasks: repetitions shrink only the within part, more tasks shrink "
        "both. Design effect: the honest variance over the one that treats every "
        "repetition as independent. Detectable difference: the smallest true difference "
        f"found at {POWER:.0%} power by a two-sided test at {ALPHA:g}, (z<sub>0.975</sub> + "
        "z<sub>0.8</sub>) times the standard error, at this run's measured variance. "
        "Plan a run with <code>maka-eval plan</code>. With one repetition the within part "
        "cannot be told apart (it is counted in between)."
    )
    return (
        f"<section id='variance'><h2>Variance and power</h2>{_table(head, rows)}"
        f"<p class='note'>{note}</p></section>"
    )


def _losses_section(report: Report, colors: dict[str, str]) -> str:
    head = [
        "arm",
        "cells",
        "started",
        "with result",
        "without result",
        "out of retries",
        "not started",
        "attempts",
        "infra failed",
        "cancelled",
        "interrupted",
        "retried to a result",
    ]
    rows = [
        [
            _arm_cell(loss.arm, colors),
            *(
                f"{v:,}"
                for v in (
                    loss.cells,
                    loss.started,
                    loss.with_result,
                    loss.without_result,
                    loss.exhausted,
                    loss.not_started,
                    loss.attempts,
                    loss.infra_failed,
                    loss.cancelled,
                    loss.interrupted,
                    loss.retried_to_result,
                )
            ),
        ]
        for loss in report.losses
    ]
    note = (
        "Loss is not random (long, chatty attempts die more), so a warning is shown whenever "
        "two compared arms lose different shares of their started cells, with Fisher's "
        "exact p-value; 'significantly' below 0.05."
    )
    return (
        f"<section id='losses'><h2>Infrastructure losses</h2>{_table(head, rows)}"
        f"<p class='note'>{note}</p></section>"
    )


def _tokens_section(report: Report, colors: dict[str, str]) -> str:
    kinds = [f.kind for f in report.arms[0].tokens.figures] if report.arms else []
    head = [
        "arm",
        "results reporting",
        *[f"{k} (total / mean)" for k in kinds],
        "total (total / mean)",
        "reasoning",
    ]
    rows = []
    for arm in report.arms:
        t = arm.tokens
        if t.reported:
            figures = [f"{f.total:,} / {f.mean:,.0f}" for f in t.figures]
            total = f"{t.total:,} / {t.mean_total or 0:,.0f}"
        else:
            figures = ["not reported"] * len(kinds)
            total = "not reported"
        rows.append(
            [
                _arm_cell(arm.arm, colors),
                f"{t.reported:,} of {t.reported + t.unreported:,}",
                *figures,
                total,
                "not reported",
            ]
        )
    note = (
        "Normalized usage of each result: input excludes cached input, so the four kinds add "
        f"up to the total, the same way for every arm. Reasoning tokens: {REASONING_NOTE}."
    )
    return (
        f"<section id='tokens'><h2>Tokens</h2>{_table(head, rows)}"
        f"<p class='note'>{escape(note)}</p></section>"
    )


def _cost_section(report: Report, colors: dict[str, str]) -> str:
    head = [
        "arm",
        "results with cost",
        "results with unknown cost",
        "total (results)",
        "mean per result",
        "every attempt (incl. lost)",
        "attempts with unknown cost",
    ]
    rows = []
    for arm in report.arms:
        c = arm.cost
        lower = "<span class='lb'>≥ </span>" if c.lower_bound else ""
        every_lower = (
            "<span class='lb'>≥ </span>"
            if c.all_attempts_unknown and c.all_attempts_usd is not None
            else ""
        )
        rows.append(
            [
                _arm_cell(arm.arm, colors),
                f"{c.known:,}",
                f"{c.unknown:,}",
                lower + _usd(c.total_usd),
                _usd(c.mean_usd),
                every_lower + _usd(c.all_attempts_usd),
                f"{c.all_attempts_unknown:,}",
            ]
        )
    note = (
        "Cost is attributable cost as recorded in each attempt's result; unknown cost "
        "(the exit-code contract, or a partial metering figure) is never counted as zero: "
        "the totals are then lower bounds (≥)."
    )
    return (
        f"<section id='cost'><h2>Cost</h2>{_table(head, rows)}"
        f"<p class='note'>{escape(note)}</p></section>"
    )


PLOT_TITLES = ("Score per arm", "Paired differences", "Cost vs score", "Duration per arm")
"""The page's plots, in page order (`render_plots` names them by these)."""


def render_plots(report: Report, titles: Sequence[str]) -> dict[str, str]:
    """The inline SVG of each plot named (titles from PLOT_TITLES): a large report's
    writer renders some in a forked child while it renders the others."""
    colors = arm_colors([arm.arm for arm in report.arms])
    with collector_paused():
        return {title: _plot(report, title, colors) for title in titles}


def _plot(report: Report, title: str, colors: dict[str, str]) -> str:
    if title == "Score per arm":
        return score_plot(report.arms, colors)
    if title == "Paired differences":
        return difference_plot(report.pairs)
    if title == "Cost vs score":
        return cost_score_plot(report.arms, colors)
    if title == "Duration per arm":
        durations: dict[str, list[float]] = {arm.arm: [] for arm in report.arms}
        for cell in report.cells:
            if cell.duration_sec is not None:
                durations[cell.arm].append(cell.duration_sec)
        return duration_plot(report.arms, durations, colors)
    raise ValueError(f"no plot is titled {title!r}")


def _plots_section(report: Report, colors: dict[str, str], rendered: Mapping[str, str]) -> str:
    figures = [
        (title, rendered[title] if title in rendered else _plot(report, title, colors))
        for title in PLOT_TITLES
    ]
    legends = {
        "Score per arm": "Each arm over its own results; compare arms on the pairs.",
        "Paired differences": "First minus second over matched task repetitions.",
        "Cost vs score": "Mean cost per result against mean score; &gt; marks a lower-bound cost.",
        "Duration per arm": "Box: quartiles; whiskers: 5th to 95th percentile; &#9670; p90; "
        "&times; max.",
    }
    body = "".join(
        f"<figure><figcaption>{escape(title)}</figcaption>{svg}"
        f"<p class='note'>{legends[title]}</p></figure>"
        for title, svg in figures
    )
    return f"<div class='plots' id='plots'>{body}</div>"


def _runs_section(report: Report) -> str:
    head = ["run", "location", "state", "cells with a result", "records", "started", "maka-eval"]
    rows = [
        [
            escape(run.label) or "&ndash;",
            escape(f"{run.location} ({run.run_id})"),
            escape(run.state.value),
            f"{run.with_result:,} / {run.cells:,}",
            _records_cell(run),
            run.started_at.strftime("%Y-%m-%d %H:%M UTC") if run.started_at else "&ndash;",
            escape(", ".join(run.versions) or "unknown"),
        ]
        for run in report.runs
    ]
    differences = ""
    if report.two_runs:
        items = "".join(f"<li><code>{escape(d)}</code></li>" for d in report.run_differences)
        differences = (
            "<p class='note'>Separate runs are not a paired design. What differs (A → B):</p>"
            + (
                f"<ul class='diff'>{items}</ul>"
                if items
                else "<p class='note'>nothing recorded "
                "in the frozen experiments, versions or start dates</p>"
            )
        )
    return f"<section id='runs'><h2>Runs</h2>{_table(head, rows, 3)}{differences}</section>"


def _missing_section(report: Report) -> str:
    missing = [c for c in report.cells if c.score is None]  # `not c.has_result`, inlined
    if not missing:
        return ""
    rows = [
        [
            escape(c.cell_id) + (f" <span class='ci'>({escape(c.run)})</span>" if c.run else ""),
            escape(c.state.value),
            f"{c.attempts:,}",
            f"{c.infra_failed:,}",
            f"{c.cancelled:,}",
            f"{c.interrupted:,}",
        ]
        for c in missing[:MAX_LISTED_CELLS]
    ]
    more = (
        f"<p class='note'>… and {len(missing) - MAX_LISTED_CELLS:,} more (cells.csv lists "
        "every cell).</p>"
        if len(missing) > MAX_LISTED_CELLS
        else ""
    )
    head = ["cell", "state", "attempts", "infra failed", "cancelled", "interrupted"]
    return (
        f"<section id='missing'><h2>Cells without a result ({len(missing):,})</h2>"
        f"{_table(head, rows, 2)}{more}</section>"
    )


def render_page(report: Report, plots: Mapping[str, str] | None = None) -> str:
    """The whole page as one string; `plots`: SVGs already rendered (`render_plots`), by
    title (the others are rendered here)."""
    with collector_paused():  # matplotlib allocates much; the report's rows are many
        return _page(report, plots or {})


def _page(report: Report, plots: Mapping[str, str]) -> str:
    colors = arm_colors([arm.arm for arm in report.arms])
    title = "maka-eval report: " + ", ".join(sorted({r.experiment_id for r in report.runs}))
    parts = [
        _header(report),
        _banner(report),
        _warnings(report),
        _failed_section(report),
        _arms_section(report, colors),
        _plots_section(report, colors, plots),
        _pairs_section(report),
        _variance_section(report, colors),
        _losses_section(report, colors),
        _tokens_section(report, colors),
        _cost_section(report, colors),
        _runs_section(report),
        _missing_section(report),
        (
            f"<footer>Generated {report.generated_at.strftime('%Y-%m-%d %H:%M UTC')} by "
            f"maka-eval {escape(__version__)} · unit: the task · bootstrap over tasks, "
            f"{report.resamples:,} resamples, seed {report.seed} · cells.csv and "
            "summary.json are next to this page.</footer>"
        ),
    ]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{''.join(parts)}</main></body></html>\n"
    )
