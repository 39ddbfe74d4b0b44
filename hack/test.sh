#!/usr/bin/env bash
# The test command (README, second line; .ci/run runs it): a fresh virtualenv with the
# package and its test tools, then lint, type-check and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
