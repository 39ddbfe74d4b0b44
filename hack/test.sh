#!/usr/bin/env bash
# The test command (README, second line; .ci/run runs it): a fresh virtualenv with the
# package and its test tools, the machine tools the sandbox tests need, then lint,
# type-check and the whole test suite. The container engine (hack/podman.sh) and the
# Kubernetes control plane (hack/envtest.sh) are installed, built and started by the
# test sessions that need them, and cached outside the repository.
#
# `bash hack/test.sh --fast [pytest args]`: the fast tier only (tests/conftest.py: the pure
# and unit tests, no sandbox, container engine, control plane, Harbor or browser), for the
# edit-test loop. It installs no machine tools, reinstalls the package only when
# pyproject.toml changed, runs ruff (under a second) but not mypy (half a minute without its
# cache; CI runs it). CI runs everything: .ci/run calls this script without --fast.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --fast ]; then
    shift
    stamp=.venv/.maka-eval-installed
    if [ ! -x .venv/bin/python ] || ! sha256sum -c --status "$stamp" 2>/dev/null; then
        python3 -m venv .venv
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
        sha256sum pyproject.toml >"$stamp"
    fi
    .venv/bin/ruff check .
    exec .venv/bin/python -m pytest --fast "$@"
fi
if [ "$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then
    # The process sandbox makes each attempt's namespaces with bubblewrap.
    apt-get install -y -q bubblewrap >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }
fi
if [ "$(id -u)" = 0 ] && ! command -v nft >/dev/null; then
    # Each local cell's network namespace gets an nftables policy (egress enforcement).
    apt-get install -y -q nftables >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q nftables >/dev/null; }
fi
missing_debs() {
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' \
            || printf '%s ' "$p"
    done
}
toolbox_debs=$(missing_debs busybox-static bash-static gcc libc6-dev)
if [ "$(id -u)" = 0 ] && [ -n "$toolbox_debs" ]; then
    # The container sandbox's verifier runs static tools of this machine (a busybox, a bash,
    # and maka-setpriv compiled with gcc -static): maka_eval/sandbox/toolbox.py.
    apt-get install -y -q $toolbox_debs >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q $toolbox_debs >/dev/null; }
fi
if [ "$(id -u)" = 0 ] && ! command -v shellcheck >/dev/null; then
    # The container sandbox's shell programs are linted (tests/sandbox/test_shell_programs.py).
    apt-get install -y -q shellcheck >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q shellcheck >/dev/null; }
fi
if [ "$(id -u)" = 0 ] && ! command -v chromium >/dev/null; then
    # The report's plots are checked in a real browser (headless Chromium).
    apt-get install -y -q chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
sha256sum pyproject.toml >.venv/.maka-eval-installed
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
