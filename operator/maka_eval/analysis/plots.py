"""The report's plots, drawn with matplotlib (Agg, no display) as inline SVG text.

Each function returns one `<svg>` element ready to paste into the page: text stays text
(fonts come from the page), ids are salted deterministically so the same report gives
the same bytes, and nothing refers to a file or the network.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # never a display: reports are written on servers and in CI

from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from maka_eval.analysis.arms import ArmSummary
from maka_eval.analysis.comparison import PairComparison

PALETTE = (
    "#2563eb",
    "#ea580c",
    "#16a34a",
    "#9333ea",
    "#dc2626",
    "#0891b2",
    "#ca8a04",
    "#db2777",
    "#4b5563",
    "#65a30d",
)
INK = "#1f2937"
GRID = "#e5e7eb"
MUTED = "#6b7280"
_STYLE: dict[Any, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "maka-eval-report",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial"],
    "font.size": 10,
    "axes.edgecolor": "#9ca3af",
    "axes.labelcolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
WIDTH_IN = 5.6


def arm_colors(arms: Sequence[str]) -> dict[str, str]:
    """One color per arm, the same in every plot."""
    return {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(arms)}


def _figure(rows: int) -> tuple[Figure, Axes]:
    height = max(2.4, 1.1 + 0.42 * rows)
    figure = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    axes = figure.add_subplot()
    axes.grid(axis="x", color=GRID, linewidth=0.8)
    axes.set_axisbelow(True)
    return figure, axes


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    with matplotlib.rc_context(_STYLE):
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :].strip()


def score_plot(arms: Sequence[ArmSummary], colors: Mapping[str, str]) -> str:
    """Mean score per arm with its bootstrap 95% interval."""
    with matplotlib.rc_context(_STYLE):
        figure, axes = _figure(len(arms))
        shown = [a for a in arms if a.score is not None]
        for y, arm in enumerate(reversed(shown)):
            assert arm.score is not None
            s = arm.score
            axes.errorbar(
                s.estimate,
                y,
                xerr=[[s.estimate - s.low], [s.high - s.estimate]],
                fmt="o",
                color=colors[arm.arm],
                ecolor=colors[arm.arm],
                elinewidth=2.2,
                capsize=4,
                markersize=7,
            )
        axes.set_yticks(range(len(shown)), [f"{a.arm}  (n={a.results})" for a in reversed(shown)])
        axes.set_ylim(-0.6, max(len(shown), 1) - 0.4)
        low = min([a.score.low for a in shown if a.score] + [0.0])
        high = max([a.score.high for a in shown if a.score] + [1.0])
        margin = 0.05 * (high - low)
        axes.set_xlim(low - margin, high + margin)
        axes.set_xlabel("mean score, 95% bootstrap interval")
        if not shown:
            _empty(axes, "no results yet")
        return _svg(figure)


def difference_plot(pairs: Sequence[PairComparison]) -> str:
    """Mean paired difference per pair of arms with its bootstrap 95% interval."""
    with matplotlib.rc_context(_STYLE):
        figure, axes = _figure(len(pairs))
        shown = [p for p in pairs if p.difference is not None]
        axes.axvline(0, color=MUTED, linewidth=1, linestyle="--")
        for y, pair in enumerate(reversed(shown)):
            d = pair.difference
            assert d is not None
            color = "#b45309" if pair.across_runs else INK
            axes.errorbar(
                d.estimate,
                y,
                xerr=[[d.estimate - d.low], [d.high - d.estimate]],
                fmt="s",
                color=color,
                ecolor=color,
                elinewidth=2.2,
                capsize=4,
                markersize=6,
                markerfacecolor="white" if pair.across_runs else color,
            )
        axes.set_yticks(
            range(len(shown)),
            [f"{p.first} \u2212 {p.second}  (n={p.pairs})" for p in reversed(shown)],
        )
        axes.set_ylim(-0.6, max(len(shown), 1) - 0.4)
        extent = max([abs(p.difference.low) for p in shown if p.difference] + [0.0])
        extent = max([abs(p.difference.high) for p in shown if p.difference] + [extent, 0.1])
        axes.set_xlim(-extent * 1.15, extent * 1.15)
        axes.set_xlabel("mean paired difference, 95% bootstrap interval")
        if not shown:
            _empty(axes, "nothing to compare: fewer than two arms with paired results")
        elif any(p.across_runs for p in shown):
            axes.set_title(
                "hollow: across two runs (not a paired design)", fontsize=8.5, color=MUTED
            )
        return _svg(figure)


def cost_score_plot(arms: Sequence[ArmSummary], colors: Mapping[str, str]) -> str:
    """Mean cost per result against mean score, per arm ('≥': cost is a lower bound)."""
    with matplotlib.rc_context(_STYLE):
        figure = Figure(figsize=(WIDTH_IN, 3.4), layout="constrained")
        axes = figure.add_subplot()
        axes.grid(color=GRID, linewidth=0.8)
        axes.set_axisbelow(True)
        shown = [a for a in arms if a.cost.mean_usd is not None and a.score is not None]
        taken: dict[tuple[str, str], int] = {}  # labels at one spot are stacked, not overlaid
        for arm in shown:
            assert arm.score is not None and arm.cost.mean_usd is not None
            s = arm.score
            axes.errorbar(
                arm.cost.mean_usd,
                s.estimate,
                yerr=[[s.estimate - s.low], [s.high - s.estimate]],
                fmt=">" if arm.cost.lower_bound else "o",
                color=colors[arm.arm],
                elinewidth=2,
                capsize=3,
                markersize=8,
            )
            prefix = "≥ " if arm.cost.lower_bound else ""
            spot = (f"{arm.cost.mean_usd:.3g}", f"{s.estimate:.2f}")
            stacked = taken.get(spot, 0)
            taken[spot] = stacked + 1
            axes.annotate(
                f"{arm.arm}  {prefix}${arm.cost.mean_usd:.4g}",
                (arm.cost.mean_usd, s.estimate),
                xytext=(8, 6 - 12 * stacked),
                textcoords="offset points",
                fontsize=8.5,
                color=INK,
            )
        axes.set_xlabel("mean cost per result (USD)")
        axes.set_ylabel("mean score")
        axes.xaxis.set_major_locator(ticker.MaxNLocator(5))
        if shown:
            top = max(a.cost.mean_usd or 0.0 for a in shown)
            axes.set_xlim(0, top * 1.6 if top > 0 else 1)
            decimals = max(2, 1 - math.floor(math.log10(top * 1.6))) if top > 0 else 2
            axes.xaxis.set_major_formatter(ticker.StrMethodFormatter(f"${{x:,.{decimals}f}}"))
            scores = [v for a in shown if a.score for v in (a.score.low, a.score.high)]
            if min(scores) >= 0 and max(scores) <= 1:
                axes.set_ylim(-0.03, 1.03)
        missing = [a.arm for a in arms if a.cost.mean_usd is None]
        if not shown:
            _empty(axes, "no arm reported a cost")
        elif missing:
            axes.set_title(f"no cost reported: {', '.join(missing)}", fontsize=8.5, color=MUTED)
        return _svg(figure)


def duration_plot(
    arms: Sequence[ArmSummary],
    durations: Mapping[str, Sequence[float]],
    colors: Mapping[str, str],
) -> str:
    """Duration per arm: box = quartiles, whiskers = 5th-95th percentile, diamond = p90,
    cross = max."""
    with matplotlib.rc_context(_STYLE):
        figure, axes = _figure(len(arms))
        shown = [a for a in reversed(arms) if durations.get(a.arm)]
        if shown:
            boxes = axes.boxplot(
                [durations[a.arm] for a in shown],
                orientation="horizontal",
                whis=(5, 95),
                showfliers=False,
                patch_artist=True,
                widths=0.55,
                medianprops={"color": INK, "linewidth": 1.6},
            )
            for patch, arm in zip(boxes["boxes"], shown, strict=True):
                patch.set_facecolor(colors[arm.arm])
                patch.set_alpha(0.35)
                patch.set_edgecolor(colors[arm.arm])
            for y, arm in enumerate(shown, start=1):
                if arm.duration is None:
                    continue
                axes.plot(arm.duration.p90, y, "D", color=colors[arm.arm], markersize=5)
                axes.plot(arm.duration.max, y, "x", color=INK, markersize=6)
            axes.set_yticks(range(1, len(shown) + 1), [a.arm for a in shown])
            low = min(min(durations[a.arm]) for a in shown)
            high = max(a.duration.max for a in shown if a.duration)
            if low > 0 and high / low > 50:
                axes.set_xscale("log")
                axes.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            _empty(axes, "no results yet")
        axes.set_xlabel("seconds per result")
        return _svg(figure)


def _empty(axes: Axes, message: str) -> None:
    axes.set_yticks([])
    axes.text(0.5, 0.5, message, transform=axes.transAxes, ha="center", va="center", color=MUTED)
