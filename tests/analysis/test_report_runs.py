"""`maka-eval report` on real runs of examples/hello made by the local executor: a
complete run, the same run made partial (an interrupted writer, a live writer), two runs
of the benchmark compared, a run on a (fake) cluster, and the HTML page rendered by
headless Chromium and looked at as pixels."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from maka_eval.cli import main as cli_main
from maka_eval.store.lock import WriterLock
from tests.analysis.test_cluster_source import NAME, NS, UID, fake_cluster  # noqa: F401
from tests.store.sealing import reseal_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello"
CHROMIUM_INSTALL = "apt-get update && apt-get install -y chromium"

pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "maka_eval.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def report(*args: str) -> Result:
    """`maka-eval report ARGS` in this process (the run itself is a real subprocess)."""
    result = CliRunner().invoke(
        cli_main.app, ["report", *args], env={"COLUMNS": "160"}, color=False
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def run_hello(root: Path, name: str, **changes: object) -> Path:
    """Run a copy of examples/hello (with top-level fields changed) into root/name."""
    source = root / f"{name}-experiment"
    shutil.copytree(EXAMPLE, source)
    if changes:
        path = source / "experiment.yaml"
        doc = yaml.safe_load(path.read_text())
        doc.update(changes)
        path.write_text(yaml.safe_dump(doc))
    result = cli("run", str(source / "experiment.yaml"), "--out", str(root / name))
    assert result.returncode == 0, result.stderr + result.stdout
    return root / name


@pytest.fixture(scope="module")
def hello(tmp_path_factory) -> Path:
    """One complete run of the hello example (4 tasks x 3 subjects x 2 repetitions)."""
    return run_hello(tmp_path_factory.mktemp("hello"), "run")


@pytest.fixture
def partial(hello, tmp_path) -> Path:
    """The hello run as a writer killed mid-run leaves it: the scripted arm's second
    repetition has attempt folders but no records (interrupted), and noop's sort-names
    repetition 2 never started."""
    run = tmp_path / "partial"
    shutil.copytree(hello, run, ignore=shutil.ignore_patterns("report*"))
    # A run of its own (a copy would share the original's ledger head), whose writer
    # never committed those records.
    noop = run / "cells" / "sort-names" / "2" / "noop"
    reseal_run(run, drop=lambda path: "/2/scripted/" in str(path) or path.is_relative_to(noop))
    shutil.rmtree(noop)
    return run


def summary_of(out_dir: Path) -> dict:
    return json.loads((out_dir / "summary.json").read_text())


def test_report_on_a_complete_run(hello, tmp_path):
    out = tmp_path / "out"
    result = report(str(hello), "--out", str(out), "--bootstrap", "2000", "--seed", "3")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "complete" in text and "PARTIAL" not in text
    for heading in ("Arms", "Tokens per result", "Paired comparisons", "Infrastructure losses"):
        assert heading in text
    assert "sign test over tasks" in text and "not reported" in text
    data = summary_of(out)
    arms = {a["arm"]: a for a in data["arms"]}
    assert arms["oracle"]["meanScore"]["estimate"] == 1.0
    assert arms["noop"]["meanScore"]["estimate"] == 0.0
    assert arms["scripted"]["meanScore"]["estimate"] == 0.5
    low, high = arms["scripted"]["meanScore"]["low"], arms["scripted"]["meanScore"]["high"]
    # Two of four tasks solved, in both repetitions: resampling tasks draws no solved
    # task (or only solved ones) one time in 16, so the honest interval spans [0, 1].
    assert (low, high) == (0.0, 1.0)
    # The scripted agent solves fix-greeting and sum-numbers in both repetitions.
    assert [(p["k"], p["value"]) for p in arms["scripted"]["passAtK"]] == [(1, 0.5), (2, 0.5)]
    assert arms["scripted"]["cost"]["resultsWithCost"] == 8
    assert arms["scripted"]["cost"]["totalUsd"] > 0
    assert arms["scripted"]["tokens"]["input"]["total"] > 0
    # The exit-code contract reports no usage or cost: unknown, never zero.
    assert arms["oracle"]["cost"]["totalUsd"] is None
    assert arms["oracle"]["tokens"]["resultsReporting"] == 0
    assert arms["oracle"]["tokens"]["input"] is None and arms["oracle"]["tokens"]["total"] is None
    assert arms["oracle"]["durationSec"]["max"] >= arms["oracle"]["durationSec"]["median"]
    pairs = {(p["first"], p["second"]): p for p in data["pairs"]}
    oracle_noop = pairs["oracle", "noop"]
    assert oracle_noop["pairs"] == 8 and oracle_noop["difference"]["estimate"] == 1.0
    assert oracle_noop["difference"]["tasks"] == 4
    # Two repetitions of four tasks: the task is the unit, so the test counts 4 tasks
    # where the oracle is higher (p = 2/2^4), not 8 independent pairs (2/2^8).
    assert oracle_noop["test"]["name"] == "sign test over tasks"
    assert oracle_noop["test"]["counts"] == "tasks" and oracle_noop["test"]["firstHigher"] == 4
    assert oracle_noop["test"]["pValue"] == pytest.approx(2 / 2**4)
    assert pairs["oracle", "scripted"]["test"]["pValue"] == pytest.approx(2 / 2**2)
    # Three comparisons: Holm's adjustment is given next to each p-value.
    assert oracle_noop["test"]["pValueHolm"] == pytest.approx(3 * 2 / 2**4)
    assert data["method"]["unit"].startswith("task")
    assert data["partial"] is False and data["warnings"] == []
    assert all(loss["withoutResult"] == 0 for loss in data["losses"])
    rows = list(csv.DictReader(io.StringIO((out / "cells.csv").read_text())))
    assert len(rows) == 24 and {r["arm"] for r in rows} == {"oracle", "noop", "scripted"}


def test_report_defaults_to_the_run_directory(hello):
    result = report(str(hello), "--bootstrap", "500")
    assert result.exit_code == 0, result.output
    assert {p.name for p in (hello / "report").iterdir()} == {
        "report.html",
        "cells.csv",
        "summary.json",
    }
    # The report folder is not part of the run: status still reads it the same way.
    status = cli("status", str(hello))
    assert status.returncode == 0 and "24 total, 24 with a result" in status.stdout


def test_report_on_an_interrupted_run(partial, tmp_path):
    out = tmp_path / "out"
    result = report(str(partial), "--out", str(out), "--bootstrap", "500")
    assert result.exit_code == 0, result.output
    assert "PARTIAL RESULTS" in result.stdout and "interrupted" in result.stdout
    data = summary_of(out)
    assert data["partial"] is True
    (run,) = data["runs"]
    assert run["state"] == "interrupted" and run["withResult"] == 19 and run["pending"] == 5
    losses = {loss["arm"]: loss for loss in data["losses"]}
    assert losses["scripted"]["interrupted"] == 4 and losses["scripted"]["withoutResult"] == 4
    assert losses["noop"]["notStarted"] == 1 and losses["noop"]["withoutResult"] == 0
    pairs = {(p["first"], p["second"]): p for p in data["pairs"]}
    assert pairs["oracle", "scripted"]["pairs"] == 4
    assert pairs["oracle", "scripted"]["discardedUnmatched"] == {"oracle": 4, "scripted": 0}
    assert pairs["noop", "scripted"]["discardedUnmatched"] == {"noop": 3, "scripted": 0}
    warnings = " ".join(data["warnings"])
    assert "is interrupted" in warnings and "19 of 24 cells" in warnings
    assert "oracle and scripted lost different shares of their started cells" in warnings
    page = (out / "report.html").read_text()
    assert "Partial results." in page and "badge partial" in page


def test_report_while_a_writer_is_running(partial, tmp_path):
    lock = WriterLock(partial)
    lock.acquire()  # this test process is the live writer the report sees
    try:
        result = cli("report", str(partial), "--out", str(tmp_path / "out"), "--bootstrap", "200")
    finally:
        lock.release()
    assert result.returncode == 0, result.stderr
    assert "in progress" in result.stdout and "a writer is running" in result.stdout
    assert summary_of(tmp_path / "out")["runs"][0]["state"] == "in progress"


def test_two_runs_of_the_benchmark(hello, tmp_path):
    other = run_hello(
        tmp_path,
        "run-b",
        benchmark={
            "id": "hello",
            "version": "1.1",
            "kind": "directory",
            "config": {"path": "tasks"},
        },
        execution={"maxConcurrentTaskGroups": 4, "maxInfraRetries": 3},
    )
    result = report(str(hello), str(other), "--bootstrap", "500")
    assert result.exit_code == 0, result.output
    out = hello / "report-vs-run-b"
    data = summary_of(out)
    assert len(data["pairs"]) == 9 and all(
        p["design"] == "across runs (not paired)" for p in data["pairs"]
    )
    same = next(p for p in data["pairs"] if p["first"] == "A:oracle" and p["second"] == "B:oracle")
    assert same["pairs"] == 8 and same["difference"]["estimate"] == 0.0
    assert 'benchmark.version: "1.0" -> "1.1"' in data["runDifferences"]
    assert "execution.maxInfraRetries: 2 -> 3" in data["runDifferences"]
    assert "not a paired design" in result.stdout and "benchmark.version" in result.stdout
    assert "A:scripted" in (out / "cells.csv").read_text()


def test_report_reads_a_cluster(fake_cluster, tmp_path):  # noqa: F811
    result = report("--cluster", f"{NS}/{NAME}", "--out", str(tmp_path / "c"), "--bootstrap", "200")
    assert result.exit_code == 3, result.output  # written, and one Attempt left out
    assert "1 attempt record(s) in evals/exp FAILED VERIFICATION" in result.stderr
    data = summary_of(tmp_path / "c")
    (run,) = data["runs"]
    assert run["runId"] == UID and run["state"] == "in progress" and run["damagedRecords"] == 1
    pairs = data["pairs"]
    assert pairs[0]["pairs"] == 1 and pairs[0]["difference"]["estimate"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "name a run directory"),
        (("a", "b", "--cluster", "ns/x"), "at most two runs"),
        (("a", "--kubeconfig", "k"), "only applies with --cluster"),
        (("/nonexistent/run",), "not a maka-eval run directory"),
        (("--cluster", "nonamespace"), "expected NAMESPACE/NAME"),
    ],
)
def test_mistakes_are_messages(args, message):
    result = cli("report", *args)
    assert result.returncode == 2
    assert message in result.stderr


# -- the page in a browser --------------------------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"headless Chromium is needed to check report.html: {CHROMIUM_INSTALL}")


def screenshot(page: Path, png: Path, height: int = 2000) -> None:
    result = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={png}",
            f"--window-size=1280,{height}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert png.is_file(), result.stderr


def test_the_page_is_self_contained_with_tables_and_plots(partial, tmp_path):
    assert report(str(partial), "--out", str(tmp_path / "out"), "--bootstrap", "200").exit_code == 0
    page = (tmp_path / "out" / "report.html").read_text()
    for section in ("arms", "pairs", "losses", "tokens", "cost", "runs", "missing", "plots"):
        assert f"id='{section}'" in page
    assert page.count("<table>") >= 7 and page.count("<svg") == 4
    for title in ("Score per arm", "Paired differences", "Cost vs score", "Duration per arm"):
        assert title in page
    # No network: nothing is loaded from anywhere (the SVG namespace is a name, not a fetch).
    assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?(https?:)?//""", page)
    assert "<script" not in page and "<link" not in page and "<img" not in page


def test_the_page_renders_in_headless_chromium(hello, partial, tmp_path):
    from PIL import Image

    for name, run in (("complete", hello), ("partial", partial)):
        out = tmp_path / name
        result = report(str(run), "--out", str(out), "--bootstrap", "500")
        assert result.exit_code == 0, result.output
        png = tmp_path / f"{name}.png"
        screenshot(out / "report.html", png)
        image = Image.open(png).convert("RGB")
        assert image.size == (1280, 2000)
        colors = image.getcolors(maxcolors=1 << 20)
        assert colors is not None
        # A blank page is one color; the report has text, tables, and plots in color.
        assert len(colors) > 500, len(colors)
        background = max(colors)[0] / (1280 * 2000)
        assert background < 0.9, background
        # The plots' arm colors are on screen (blue, orange, green markers and boxes).
        palette = {rgb for _, rgb in colors}
        for rgb in ((0x25, 0x63, 0xEB), (0xEA, 0x58, 0x0C), (0x16, 0xA3, 0x4A)):
            assert rgb in palette, rgb
        if name == "partial":
            # The amber partial banner near the top of the page.
            top = image.crop((0, 0, 1280, 400))
            assert (0xFF, 0xFB, 0xEB) in {rgb for _, rgb in top.getcolors(1 << 20) or []}
