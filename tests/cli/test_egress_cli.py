"""`maka-eval egress check`: the verdict table and its exit codes (0, 3, 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from maka_eval.egress.policy import TERMINAL_BENCH, EgressPolicy
from tests.helpers import make_task, spec, write_experiment


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "maka_eval.cli.main", "egress", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_allowed_urls_exit_0_and_show_their_normal_form():
    result = cli("https://PyPI.org:443/simple/%72equests/", "example.com")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "https://pypi.org/simple/requests/" in result.stdout
    assert "http://example.com/" in result.stdout
    assert result.stdout.count("ALLOWED") == 2
    assert "preset terminal-bench (v1)" in result.stdout
    assert "2 allowed, 0 blocked" in result.stdout


def test_any_blocked_url_exits_3_and_names_the_rule():
    wrapped = "https://web.archive.org/web/2024/https://github.com/harbor-framework/harbor"
    result = cli("https://example.org/", "https://tbench.ai/leaderboard", wrapped)
    assert result.returncode == 3, result.stderr + result.stdout
    assert result.stdout.count("BLOCKED") == 2 and "ALLOWED" in result.stdout
    assert "tbench.ai" in result.stdout and "github.com/harbor-framework" in result.stdout
    assert "wrapped URL https://github.com/harbor-framework/harbor" in result.stdout
    assert "1 allowed, 2 blocked" in result.stdout
    # With preset none the same benchmark site passes.
    assert cli("--preset", "none", "https://tbench.ai/").returncode == 0


def test_a_spec_adds_its_entries(tmp_path: Path):
    egress = {"mode": "proxy", "preset": "none", "block": ["answers.example.com"]}
    path = write_experiment(
        tmp_path, spec(executor={"kind": "local", "config": {"egress": egress}})
    )
    result = cli("--spec", str(path), "https://answers.example.com/q", "https://tbench.ai/")
    assert result.returncode == 3, result.stderr + result.stdout
    assert "preset none (v1), 1 entries (0 preset + 1 spec)" in result.stdout
    assert "1 allowed, 1 blocked" in result.stdout


def test_a_bad_spec_exits_2_with_the_path_and_no_traceback(tmp_path: Path):
    egress = {"mode": "proxy", "block": ["https://answers.example.com"]}
    path = write_experiment(
        tmp_path, spec(executor={"kind": "local", "config": {"egress": egress}})
    )
    result = cli("--spec", str(path), "https://example.org/")
    assert result.returncode == 2
    assert "executor.config.egress.block[0]: 'https://answers.example.com' has a scheme" in (
        result.stderr
    )
    assert result.stdout == ""
    # An experiment without egress configuration says how to add one.
    bare = write_experiment(tmp_path / "bare", spec())
    result = cli("--spec", str(bare), "https://example.org/")
    assert result.returncode == 2
    assert "executor.config.egress: is not set; add egress: {mode: proxy}" in result.stderr
    json.loads(bare.read_text())  # untouched


def test_validate_reports_the_egress_policy(tmp_path: Path):
    make_task(tmp_path / "tasks", "t1")
    executor = {
        "kind": "kubernetes",
        "config": {
            "relayImage": "relay:1",
            "egressImage": "egress:1",
            "benchmarkImage": "bench:1",
            "taskImage": "task:1",
            "egress": {"mode": "proxy", "block": ["answers.example.com"]},
        },
    }
    path = write_experiment(tmp_path, spec(executor=executor))
    result = subprocess.run(
        [sys.executable, "-m", "maka_eval.cli.main", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    digest = EgressPolicy("terminal-bench", ["answers.example.com"]).digest
    line = next(x for x in result.stdout.splitlines() if x.startswith("egress"))
    assert (
        f"mode proxy, preset terminal-bench (v1), {len(TERMINAL_BENCH.entries) + 1} entries" in line
    )
    assert f"digest {digest[:16]}" in line
