"""The operator on a real cluster: hack/kind-up.sh, then hack/e2e.sh (the hello example).

A kind cluster needs Docker (a daemon that answers), kind and kubectl. Where one of them
is missing the test skips and says which; where they are all there it builds the images,
creates or reuses the kind cluster and runs the experiment (minutes the first time).
A cluster this test created is deleted afterwards unless MAKA_EVAL_KIND_KEEP=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KIND_UP = REPO / "hack" / "kind-up.sh"
E2E = REPO / "hack" / "e2e.sh"
CLUSTER = os.environ.get("MAKA_EVAL_KIND_CLUSTER", "maka-eval")
KIND_UP_TIMEOUT_SEC = 45 * 60  # image builds and the node image pull, on a cold machine
E2E_TIMEOUT_SEC = 30 * 60  # hack/e2e.sh gives the Experiment 15 minutes itself


def _tail(text: str, lines: int = 80) -> str:
    return "\n".join(text.splitlines()[-lines:])


def what_is_missing() -> list[str]:
    """Why a kind cluster cannot run here; empty when it can."""
    missing = [
        f"{tool} is not on PATH" for tool in ("docker", "kind", "kubectl") if not shutil.which(tool)
    ]
    if shutil.which("docker"):
        try:
            info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            missing.append("`docker info` did not answer in 60 s")
        else:
            if info.returncode != 0:
                lines = [line for line in info.stderr.splitlines() if line.strip()]
                reason = lines[-1].strip() if lines else f"exit {info.returncode}"
                missing.append(f"`docker info` failed: {reason}")
    return missing


def cluster_exists() -> bool:
    out = subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True, timeout=60)
    return CLUSTER in out.stdout.split()


def run(script: Path, timeout: int) -> None:
    env = dict(os.environ)
    cli = Path(sys.executable).parent / "maka-eval"
    if cli.exists():
        env.setdefault("MAKA_EVAL_CLI", str(cli))  # for `maka-eval results --cluster`
    try:
        proc = subprocess.run(
            ["bash", str(script)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(
            f"{script.relative_to(REPO)} did not finish in {timeout} s:\n{_tail(err or '')}",
            pytrace=False,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{script.relative_to(REPO)} failed (exit {proc.returncode}):\n"
            f"{_tail(proc.stderr)}\n{_tail(proc.stdout, 20)}",
            pytrace=False,
        )


def test_hello_runs_end_to_end_on_a_kind_cluster():
    missing = what_is_missing()
    if missing:
        pytest.skip(
            "kind end-to-end needs Docker, kind and kubectl: "
            + "; ".join(missing)
            + "; run hack/kind-up.sh && hack/e2e.sh where they exist"
        )
    existed = cluster_exists()
    try:
        run(KIND_UP, KIND_UP_TIMEOUT_SEC)
        run(E2E, E2E_TIMEOUT_SEC)
    finally:
        if not existed and os.environ.get("MAKA_EVAL_KIND_KEEP") != "1":
            subprocess.run(
                ["bash", str(KIND_UP), "down"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
