"""Provision an isolated virtual environment holding a pinned Inspect AI.

The peer workloads under ``bench/peers`` run Inspect AI in its own venv so
that its dependency tree never mixes with maka-eval's.  This module is
stdlib-only so it can be imported from the benchmark driver before any
third-party package is available.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

DEFAULT_VERSION = "0.3.285"
_DISTRIBUTION = "inspect-ai"
_VERSION_PROBE = (
    f"import importlib.metadata as m, sys; sys.stdout.write(m.version({_DISTRIBUTION!r}))"
)


def _venv_python(venv_dir: Path) -> Path:
    """Return the interpreter path inside ``venv_dir`` for this platform."""
    if sys.platform == "win32":
        return venv_dir / "Scripts" / "python.exe"
    return venv_dir / "bin" / "python"


def _installed_version(python: Path) -> str | None:
    """Return the inspect-ai version installed for ``python``, or None."""
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", _VERSION_PROBE],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_inspect_python(venv_dir: Path, version: str = DEFAULT_VERSION) -> Path:
    """Make sure ``venv_dir`` holds ``inspect-ai==version`` and return its python.

    The venv is created when missing.  The installed version is read with
    ``importlib.metadata`` inside the venv, so a venv that already holds the
    requested version costs a single interpreter start-up and nothing else.
    A different or absent version is (re)installed with the venv's own pip.

    Raises:
        RuntimeError: if the venv cannot be created or pip fails; the
            message carries pip's output.
    """
    venv_dir = Path(venv_dir)
    python = _venv_python(venv_dir)
    if _installed_version(python) == version:
        return python

    if not python.exists():
        try:
            venv.EnvBuilder(with_pip=True).create(venv_dir)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise RuntimeError(f"could not create venv at {venv_dir}: {exc}") from exc

    pip = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"{_DISTRIBUTION}=={version}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if pip.returncode != 0:
        raise RuntimeError(
            f"pip could not install {_DISTRIBUTION}=={version} into {venv_dir} "
            f"(exit {pip.returncode}):\n{pip.stderr.strip() or pip.stdout.strip()}"
        )

    installed = _installed_version(python)
    if installed != version:
        raise RuntimeError(
            f"{_DISTRIBUTION} in {venv_dir} reports version {installed!r} "
            f"after installing {version!r}"
        )
    return python
