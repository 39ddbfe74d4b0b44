"""The maka-eval command: validate, run, status, results, operator, unlock.

User mistakes (bad specs, missing prerequisites, locked or mismatched run directories)
are printed as messages naming the field and the fix, never as tracebacks.

Exit codes: 0 done; 2 a user mistake (nothing done); 3 `run`, `status`, `results` or
`report` printed everything else, but attempt records failed verification (edited,
forged, moved, copied from another run or removed: each is named on stderr, and left
out); 130 interrupted. A run whose records cannot be verified on this machine (its key
is not here, or it was written before records were sealed) is marked UNVERIFIED on
stderr and in `status`, and exits 0.
"""

from __future__ import annotations

import enum
import errno
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from maka_eval import __version__
from maka_eval.analysis.source import RunDirectorySource
from maka_eval.analysis.summary import RunSummary
from maka_eval.cli import egress as egress_cli
from maka_eval.cli import plan as plan_cli
from maka_eval.cli import render
from maka_eval.cli import report as report_cli
from maka_eval.cli.console import err, out
from maka_eval.cli.integrity import CLUSTER_DAMAGE, DIRECTORY_DAMAGE, exit_if_failed, summarize
from maka_eval.cli.integrity import VERIFICATION_FAILED as VERIFICATION_FAILED  # exit code 3
from maka_eval.cli.progress import RunProgress
from maka_eval.engine.expand import expand
from maka_eval.errors import MakaEvalError, PrerequisiteError
from maka_eval.executors.attempts import (
    check_plugin_prerequisites,
    plugin_of,
    readiness_problems,
)
from maka_eval.executors.load import load_experiment_file
from maka_eval.local.executor import LocalRun, RunOptions, RunReport
from maka_eval.local.prerequisites import check_prerequisites, work_root_path
from maka_eval.processes.table import ProcessEntry
from maka_eval.spec.load import LoadedExperiment
from maka_eval.spec.task_directory import TaskDefinition, load_tasks
from maka_eval.store.lock import unlock
from maka_eval.store.run_store import read_run

app = typer.Typer(
    name="maka-eval",
    help="Run AI-agent benchmark experiments reproducibly, fairly and safely.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help: typer's rich panels label every option with a Python type, flags too.
    rich_markup_mode=None,
)


def _wide() -> bool:
    """Whether the terminal has room for score bars next to the numbers."""
    return out.width >= 100


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _version(value: bool) -> None:
    if value:
        out.print(f"maka-eval {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """maka-eval: experiments -> cells (task x repetition x subject) -> append-only attempts."""


def _load(experiment: Path) -> tuple[LoadedExperiment, dict[str, TaskDefinition]]:
    loaded = load_experiment_file(experiment)
    prefix = "spec." if loaded.form == "kubernetes" else ""
    tasks = load_tasks(loaded.experiment, loaded.base_dir, prefix)
    for task in tasks.values():
        for warning in task.warnings:
            err.print(
                f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True
            )
    return loaded, tasks


@app.command()
def validate(
    experiment: Annotated[
        Path,
        typer.Argument(metavar="EXPERIMENT", help="Experiment file (YAML or JSON, either form)."),
    ],
    cells: Annotated[bool, typer.Option("--cells", help="Also list every cell id.")] = False,
) -> None:
    """Check an experiment strictly and show what it expands into."""
    loaded, tasks = _load(experiment)
    expansion = expand(loaded.experiment)
    out.print(f"[green]✓[/green] {experiment} is a valid experiment")
    out.print(render.expansion_view(loaded, expansion))
    if cells:
        for group in expansion.groups:
            out.print(f"  task group {group.id}", highlight=False)
            for member in group.cells:
                out.print(f"    {member.id}", highlight=False)
    execution = plugin_of(loaded.experiment)
    if execution is not None:
        prefix = "spec." if loaded.form == "kubernetes" else ""
        found = check_plugin_prerequisites(execution, loaded.experiment, os.environ, prefix)
        out.print(
            f"[green]✓[/green] prerequisites for executor '{execution.plugin.kind}' are present"
        )
        for item in found:
            name = item.name if prefix else item.name.removeprefix("spec.")
            out.print(f"  {name}: {item.detail or 'found'}", highlight=False, markup=False)
        return
    unready = readiness_problems(loaded.experiment, "spec." if loaded.form == "kubernetes" else "")
    if unready:
        raise PrerequisiteError("this experiment cannot run yet:", unready)
    if loaded.experiment.spec.executor.kind != "local":
        out.print(
            "prerequisites (images, the Secrets of declared credentials) are checked by the "
            "operator on the cluster; apply it with kubectl apply -f"
        )
        return
    commands = check_prerequisites(loaded, tasks, os.environ)
    out.print("[green]✓[/green] prerequisites for the local executor are present")
    out.print(f"  container engine: {commands.engine_search}", highlight=False, markup=False)
    if commands.containers:
        out.print(
            f"  {len(commands.containers)} of {len(tasks)} task(s) run in their container "
            "image: " + ", ".join(sorted(commands.containers)),
            highlight=False,
            markup=False,
        )


@app.command()
def run(
    experiment: Annotated[
        Path,
        typer.Argument(metavar="EXPERIMENT", help="Experiment file (YAML or JSON, either form)."),
    ],
    out_dir: Annotated[
        Path,
        typer.Option("--out", "-o", metavar="DIR", help="Run directory (created or resumed)."),
    ],
    cell: Annotated[
        list[str] | None,
        typer.Option(
            "--cell",
            metavar="CELL_ID",
            help="Append one attempt to just this cell (<task>::<rep>::<subject>); repeatable.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="With --cell: also re-run cells that have a result.")
    ] = False,
    keep_workspaces: Annotated[
        bool,
        typer.Option(
            "--keep-workspaces",
            help="Keep each attempt's workspace for debugging (the folder is printed).",
        ),
    ] = False,
) -> None:
    """Run every cell locally (or resume), with live progress; print the results."""
    loaded, tasks = _load(experiment)
    options = RunOptions(cells=tuple(cell or ()), force=force, keep_workspaces=keep_workspaces)
    with RunProgress(out) as progress:
        report = LocalRun(loaded, tasks, out_dir, options=options, events=progress).run()
    summary = _summary(out_dir)
    out.print(render.subjects_table(summary.subjects, title=f"Results: {out_dir}", bar=_wide()))
    if report.held_by_budget:
        out.print(
            f"[yellow]budget reached ({report.budget.describe() if report.budget else ''}): "
            f"{report.held_by_budget} task group(s) were not started[/yellow]"
        )
    if keep_workspaces:
        _say_where_workspaces_are(report)
    if report.cancelled:
        # On stdout like the progress it ends, so the story cannot interleave out of order.
        out.print(
            f"[magenta]cancelled[/magenta]: running attempts were recorded as cancelled. "
            f"Re-run the same command to resume: maka-eval run {experiment} --out {out_dir}"
        )
        raise typer.Exit(130)
    missing = len(summary.cells) - len(summary.results)
    if missing and not report.held_by_budget:
        out.print(
            f"[yellow]{missing} cell(s) have no result[/yellow]: see `maka-eval status {out_dir}`"
        )
    out.print(f"[dim]details: maka-eval results {out_dir}[/dim]")
    exit_if_failed(summary)


def _summary(run_dir: Path) -> RunSummary:
    """Summarize a run directory; what fails verification is warned about (stderr)."""
    return summarize(RunDirectorySource(run_dir), DIRECTORY_DAMAGE)


RunDirArgument = Annotated[
    Path | None,
    typer.Argument(metavar="RUN_DIR", help="Run directory (or name an experiment with --cluster)."),
]
ClusterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        metavar="NAMESPACE/NAME",
        help="Read the Experiment NAME in NAMESPACE from a Kubernetes cluster instead of a "
        "run directory.",
    ),
]
KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        metavar="PATH",
        help="With --cluster: the kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, "
        "else the Pod's service account).",
    ),
]


def _read_summary(run_dir: Path | None, cluster: str | None, kubeconfig: Path | None) -> RunSummary:
    """The summary of a run directory or, with --cluster, of an Experiment on a cluster."""
    if run_dir is not None and cluster is not None:
        raise typer.BadParameter(
            f"name either a run directory ({run_dir}) or --cluster {cluster}, not both",
            param_hint="RUN_DIR / --cluster",
        )
    if cluster is None:
        if kubeconfig is not None:
            raise typer.BadParameter(
                "only applies with --cluster NAMESPACE/NAME", param_hint="--kubeconfig"
            )
        if run_dir is None:
            raise typer.BadParameter(
                "name a run directory, or an experiment on a cluster with --cluster NAMESPACE/NAME",
                param_hint="RUN_DIR / --cluster",
            )
        return _summary(run_dir)
    # Imported here: only --cluster needs the kubernetes client.
    from maka_eval.analysis.cluster import ClusterSource, connect, parse_target

    try:
        namespace, name = parse_target(cluster)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cluster") from None
    source = ClusterSource(connect(kubeconfig), namespace, name)
    return summarize(source, CLUSTER_DAMAGE)


def _say_where_workspaces_are(report: RunReport) -> None:
    if report.work_dir is None:
        return
    out.print(
        f"workspaces kept in {report.work_dir} "
        "(one folder per attempt: <task>__<rep>__<subject>__<n>)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


@app.command()
def status(
    run_dir: RunDirArgument = None,
    cluster: ClusterOption = None,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Show a run's cells (selected result per cell), subjects, budget, writer, and what
    verifying its records found (exit 3 when records failed verification)."""
    summary = _read_summary(run_dir, cluster, kubeconfig)
    out.print(render.status_view(summary, bar=_wide()))
    exit_if_failed(summary)


@app.command()
def results(
    run_dir: RunDirArgument = None,
    fmt: Annotated[
        OutputFormat,
        typer.Option("--format", "-f", metavar="table|json|csv", help="Output format."),
    ] = OutputFormat.table,
    cluster: ClusterOption = None,
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Print the result map: each cell's earliest valid attempt, and per-subject summaries
    (records that fail verification are left out, named on stderr, and exit 3)."""
    summary = _read_summary(run_dir, cluster, kubeconfig)
    if fmt is OutputFormat.json:
        sys.stdout.write(render.results_json(summary) + "\n")
    elif fmt is OutputFormat.csv:
        sys.stdout.write(render.results_csv(summary))
    else:
        out.print(render.results_table(summary, bar=_wide()))
    exit_if_failed(summary)


# `report`: the full analysis.
app.command(name="report")(report_cli.report_command)

# `plan`: power before running (the smallest detectable difference, tasks x repetitions).
app.command(name="plan")(plan_cli.plan_command)

# `egress check`: the contamination blocklist, as the proxy applies it.
app.add_typer(egress_cli.app, name="egress")


class LogFormat(enum.StrEnum):
    plain = "plain"
    json = "json"


@app.command(name="operator")
def operator_command(
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Watch this namespace (repeat for more). Default: every namespace.",
        ),
    ] = None,
    peering: Annotated[
        str | None,
        typer.Option(
            help="Run as one of several replicas: kopf peering object NAME elects the one "
            "that acts (needs kopf's peering CRDs). Default: standalone, one replica.",
        ),
    ] = None,
    log_format: Annotated[
        LogFormat, typer.Option("--log-format", help="plain, or json (one object a line).")
    ] = LogFormat.plain,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve Prometheus metrics on this port (/metrics)."),
    ] = None,
    kubeconfig: KubeconfigOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log more.")] = False,
    egress_gateway: Annotated[
        str | None,
        typer.Option(
            "--egress-gateway",
            envvar="MAKA_EVAL_EGRESS_GATEWAY",
            help="HOST:PORT of the egress gateway that attempt Pods' proxies chain to; the "
            "operator resolves HOST (attempt Pods get the address, they have no DNS). "
            "Default: maka-eval-egress-gateway.<gateway namespace>.svc:3128.",
        ),
    ] = None,
    egress_gateway_namespace: Annotated[
        str | None,
        typer.Option(
            "--egress-gateway-namespace",
            envvar="MAKA_EVAL_EGRESS_GATEWAY_NAMESPACE",
            help="Namespace of the gateway's Pods and key Secret. Default: the operator's "
            "own ($POD_NAMESPACE, else its ServiceAccount's, else maka-eval-system).",
        ),
    ] = None,
    egress_key_secret: Annotated[
        str | None,
        typer.Option(
            "--egress-key-secret",
            envvar="MAKA_EVAL_EGRESS_KEY_SECRET",
            help="Secret (key 'key') holding the key attempt credentials are derived "
            "from; the gateway mounts the same. Default: maka-eval-egress-gateway.",
        ),
    ] = None,
    relay_bundle_digest: Annotated[
        str | None,
        typer.Option(
            "--relay-bundle-digest",
            envvar="MAKA_EVAL_RELAY_BUNDLE_DIGEST",
            help="sha256:<64 hex> of the relay bundle (printed by hack/build-images.sh): "
            "every attempt Pod checks its copy before the subject starts, and a bundle "
            "with another digest fails the attempt as infrastructure. Default: no pin "
            "(the bundle is still checked against its own manifest).",
        ),
    ] = None,
) -> None:
    """Run the Kubernetes operator: Experiments applied with kubectl run as Pods."""
    from maka_eval.k8s.egress import GatewaySettings
    from maka_eval.k8s.operator import run as run_operator

    try:
        egress = GatewaySettings.make(
            egress_gateway, namespace=egress_gateway_namespace, key_secret=egress_key_secret
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--egress-gateway") from None
    if relay_bundle_digest:
        from maka_eval.k8s.relay_bundle import OPERATOR_PIN, BadDigest, check_digest

        try:
            check_digest(relay_bundle_digest, OPERATOR_PIN)
        except BadDigest as exc:
            raise typer.BadParameter(str(exc), param_hint="--relay-bundle-digest") from None

    run_operator(
        namespaces=tuple(namespace or ()),
        peering=peering,
        log_format=log_format.value,
        metrics_port=metrics_port,
        kubeconfig=str(kubeconfig) if kubeconfig else None,
        verbose=verbose,
        egress=egress,
        relay_digest=relay_bundle_digest or None,
    )


@app.command(name="unlock")
def unlock_command(
    run_dir: Annotated[Path, typer.Argument(help="Run directory with a stale .writer.lock.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Remove the lock even so. For a lock from another host: you checked there "
            "that no writer and no process of the run remain. On this host: kill the run's "
            "leftover processes (SIGKILL, frozen ones too) after asking, then remove it.",
        ),
    ] = False,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="With --force, kill without asking (for scripts)."),
    ] = False,
) -> None:
    """Remove a stale writer lock, after checking that no writer and no process of the run remain.

    The run's processes are its subjects, verifiers and their children: found by their
    environment markers, by descent, and by working inside the run's work folder.
    """
    if yes and not force:
        raise typer.BadParameter("--yes only applies with --force", param_hint="--yes")
    contents = read_run(run_dir)
    work_dir = work_root_path(os.environ) / contents.run_id

    def confirm(entries: Sequence[ProcessEntry]) -> bool:
        out.print(f"processes of run {contents.run_id} are still running:", markup=False)
        for entry in entries:
            state = "frozen" if entry.frozen else f"state {entry.state}"
            out.print(f"  pid {entry.pid} ({state}): {entry.why}", markup=False)
        return yes or typer.confirm(
            f"Kill these {len(entries)} processes (SIGKILL) and remove the lock?", default=False
        )

    done = unlock(run_dir, contents.run_id, work_dir=work_dir, force=force, confirm=confirm)
    if done.killed:
        pids = " ".join(map(str, done.killed))
        out.print(f"killed {len(done.killed)} leftover processes of the run: {pids}")
    out.print(f"removed the stale lock of {done.info.describe()}; run again to resume")


def _plain(reason: str) -> str:
    """'[Errno 28] No space left on device: 'x'' -> 'no space left on device'."""
    text = reason.split("] ", 1)[1] if reason.startswith("[Errno") else reason
    text = text.split(": '", 1)[0].split(': "', 1)[0]
    return text[:1].lower() + text[1:]


def describe_os_error(exc: OSError) -> str:
    """One plain sentence naming the path, for an OSError or a shutil.Error (whose args
    hold a list of (source, destination, reason) from a failed tree copy)."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list):
        failures = [f for f in exc.args[0] if isinstance(f, tuple) and len(f) == 3]
        if failures:
            src, dst, why = (str(part) for part in failures[0])
            more = len(failures) - 1
            tail = f" (and {more} more file{'s' if more > 1 else ''})" if more else ""
            if "[Errno 28]" in why or "No space left on device" in why:
                return f"no space left on device while writing {dst}{tail}"
            return f"could not copy {src} to {dst}: {_plain(why)}{tail}"
    path = exc.filename
    if exc.errno == errno.ENOSPC:
        return "no space left on device" + (f" while writing {path}" if path else "")
    reason = _plain(exc.strerror or str(exc))
    if path is None:
        return reason
    where = f"{path} -> {exc.filename2}" if exc.filename2 else str(path)
    return f"{reason}: {where}"


def main() -> None:
    """Console-script entry point: user mistakes become messages, never tracebacks."""
    try:
        app()  # standalone: typer prints usage errors itself and exits 2
    except MakaEvalError as exc:
        err.print(f"[red]error:[/red] {escape(exc.summary)}", highlight=False)
        for problem in exc.problems:
            err.print(f"  - {problem}", highlight=False, markup=False)
        sys.exit(exc.exit_code)
    except OSError as exc:  # the machine refused something: a path, a permission, disk space
        err.print(f"[red]error:[/red] {escape(describe_os_error(exc))}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:  # before or after a run; during one, Ctrl-C cancels cleanly
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
