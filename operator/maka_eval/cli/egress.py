"""`maka-eval egress`: the egress policy from the command line.

`egress check URL...` tells whether the contamination blocklist lets each URL through,
with the same code the per-cell proxy and the cluster sidecar run. Exit 0 when every
URL is allowed, 3 when any is blocked, 2 when the experiment named by --spec is invalid.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from maka_eval.cli.console import out
from maka_eval.egress.policy import EgressPolicy, Verdict, normalize_url
from maka_eval.errors import Problem, SpecError
from maka_eval.spec.egress import EgressConfig, policy_of

BLOCKED_EXIT_CODE = 3
"""`egress check` exits with this when any URL is blocked (2 is a usage or spec error)."""

app = typer.Typer(
    name="egress",
    help="The subjects' egress policy: check URLs against the contamination blocklist.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
)


class PresetChoice(enum.StrEnum):
    terminal_bench = "terminal-bench"
    none = "none"


def egress_summary(config: EgressConfig | None) -> str | None:
    """One line describing an experiment's egress configuration (None when it has none)."""
    if config is None:
        return None
    policy = policy_of(config)
    if policy is None:
        return "mode none: subjects get no network"
    return f"mode {config.mode}, {describe_policy(policy)}"


def describe_policy(policy: EgressPolicy) -> str:
    """Preset, entry counts and digest of a policy, on one line."""
    preset = policy.preset
    return (
        f"preset {preset.name} (v{preset.version}), {len(policy.rules)} entries "
        f"({len(preset.entries)} preset + {len(policy.block)} spec), "
        f"digest {policy.digest[:16]}"
    )


def _spec_policy(spec: Path) -> tuple[EgressPolicy | None, str]:
    """The policy of the experiment file `spec` (None: mode 'none'), and its description."""
    from maka_eval.executors.load import load_experiment_file

    loaded = load_experiment_file(spec)
    prefix = "spec." if loaded.form == "kubernetes" else ""
    config = loaded.experiment.spec.executor_egress
    if config is None:
        raise SpecError(
            f"{spec} configures no egress policy",
            [
                Problem(
                    f"{prefix}executor.config.egress",
                    "is not set; add egress: {mode: proxy} (preset terminal-bench), or check "
                    "against a preset alone with --preset",
                )
            ],
        )
    policy = policy_of(config)
    summary = egress_summary(config) or ""
    return policy, f"{spec}: {summary}"


NO_NETWORK = Verdict(
    True, "mode: none", "executor.config.egress.mode is 'none': subjects get no network"
)


def _table(urls: list[str], verdicts: list[Verdict]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, expand=False)
    table.add_column("URL (normalized)", overflow="fold")
    table.add_column("verdict", no_wrap=True)
    table.add_column("rule", overflow="fold")
    table.add_column("reason", overflow="fold")
    for url, verdict in zip(urls, verdicts, strict=True):
        verdict_text = (
            Text("BLOCKED", style="bold red") if verdict.blocked else Text("ALLOWED", "green")
        )
        table.add_row(
            Text(normalize_url(url).text),
            verdict_text,
            Text(verdict.rule or "-"),
            Text(verdict.reason),
        )
    return table


@app.command("check")
def check(
    urls: Annotated[
        list[str],
        typer.Argument(metavar="URL", help="URLs to check (a missing scheme means http)."),
    ],
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            metavar="EXPERIMENT",
            help="Check against this experiment's executor.config.egress.",
        ),
    ] = None,
    preset: Annotated[
        PresetChoice | None,
        typer.Option(
            "--preset",
            metavar="terminal-bench|none",
            help="Check against a built-in preset alone (default: terminal-bench).",
        ),
    ] = None,
) -> None:
    """Tell whether the egress policy blocks each URL (exit 3 if any is blocked)."""
    if spec is not None and preset is not None:
        raise typer.BadParameter(
            "name either an experiment (--spec) or a preset (--preset), not both",
            param_hint="--spec / --preset",
        )
    if spec is not None:
        policy, title = _spec_policy(spec)
    else:
        policy = EgressPolicy((preset or PresetChoice.terminal_bench).value)
        title = describe_policy(policy)
    verdicts = [policy.check_url(url) if policy else NO_NETWORK for url in urls]
    out.print(f"egress policy: {title}", highlight=False, markup=False, soft_wrap=True)
    out.print(_table(urls, verdicts))
    blocked = sum(v.blocked for v in verdicts)
    out.print(f"{len(urls) - blocked} allowed, {blocked} blocked", highlight=False)
    if blocked:
        raise typer.Exit(BLOCKED_EXIT_CODE)
