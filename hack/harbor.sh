#!/usr/bin/env bash
# Harbor's own Python environment, for `executor.kind: harbor` tests and benchmarks.
# Idempotent and cached; the product never runs this (it only reads
# MAKA_EVAL_HARBOR_PYTHON, see docs/harbor.md).
#
#   hack/harbor.sh          make (or reuse) the environment; print its interpreter path
#                           as the only line on stdout
#   hack/harbor.sh path     print the interpreter path; exit 3 when it is not built yet
#
# The environment: a Python 3.12 virtualenv with harbor==$HARBOR_VERSION and
# podman-compose (Podman 4.x has no `podman compose`; Harbor falls back to it).
# The interpreter comes from pyenv's 3.12, else `uv python find 3.12`, else python3.12
# on PATH (Debian: apt-get install python3.12 python3.12-venv, where available).
#
# Settings (environment):
#   MAKA_EVAL_CACHE           cache root (default ~/.cache/maka-eval); the environment
#                             goes to $MAKA_EVAL_CACHE/harbor/<harbor version>-py<x.y>
#   MAKA_EVAL_HARBOR_VERSION  default 0.26 (any 0.26.x release)
#   MAKA_EVAL_PYTHON312       an interpreter to use instead of looking for one
set -euo pipefail

HARBOR_VERSION="${MAKA_EVAL_HARBOR_VERSION:-0.26}"
PODMAN_COMPOSE_SPEC="podman-compose>=1.6,<1.7"
CACHE_ROOT="${MAKA_EVAL_CACHE:-${HOME:-/root}/.cache/maka-eval}/harbor"

log() { printf '[harbor.sh] %s\n' "$*" >&2; }
die() { printf '[harbor.sh] ERROR: %s\n' "$*" >&2; exit 1; }

# A Python 3.12 (or newer 3.x) interpreter, or nothing.
find_python() {
  local candidate
  if [[ -n "${MAKA_EVAL_PYTHON312:-}" ]]; then echo "$MAKA_EVAL_PYTHON312"; return; fi
  if command -v pyenv >/dev/null 2>&1; then
    candidate="$(pyenv root)/versions/$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -n1)/bin/python3.12"
    [[ -x "$candidate" ]] && { echo "$candidate"; return; }
  fi
  for candidate in "${HOME:-/root}"/.pyenv/versions/3.12*/bin/python3.12; do
    [[ -x "$candidate" ]] && { echo "$candidate"; return; }
  done
  if command -v uv >/dev/null 2>&1; then
    candidate="$(uv python find 3.12 2>/dev/null || true)"
    if [[ -z "$candidate" ]]; then
      uv python install 3.12 >&2 2>/dev/null && candidate="$(uv python find 3.12 2>/dev/null || true)"
    fi
    [[ -n "$candidate" && -x "$candidate" ]] && { echo "$candidate"; return; }
  fi
  if command -v python3.12 >/dev/null 2>&1; then command -v python3.12; return; fi
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1 \
      && apt-cache show python3.12-venv >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.12 python3.12-venv >&2 \
      && command -v python3.12 && return
  fi
}

interpreter_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# The harbor version installed in an environment, or nothing.
installed_harbor() {
  "$1" -c 'import importlib.metadata as m; print(m.version("harbor"))' 2>/dev/null || true
}

env_dir_for() { echo "$CACHE_ROOT/$HARBOR_VERSION-py$1"; }

cmd_path() {
  local dir
  for dir in "$CACHE_ROOT/$HARBOR_VERSION"-py3.*; do
    if [[ -f "$dir/.complete" && -x "$dir/bin/python" ]]; then echo "$dir/bin/python"; return; fi
  done
  log "not built yet: run hack/harbor.sh"
  exit 3
}

cmd_build() {
  local python version dir found t0
  python="$(find_python || true)"
  [[ -n "$python" ]] || die "no Python 3.12 found (Harbor $HARBOR_VERSION needs >= 3.12). \
Install one with pyenv (pyenv install 3.12), uv (uv python install 3.12) or apt \
(python3.12 python3.12-venv), or point MAKA_EVAL_PYTHON312 at one."
  version="$(interpreter_version "$python")" || die "$python does not run"
  [[ "$(printf '%s\n' 3.12 "$version" | sort -V | head -n1)" == 3.12 ]] \
    || die "$python is Python $version; Harbor $HARBOR_VERSION needs >= 3.12"
  dir="$(env_dir_for "$version")"
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  flock -w 1800 9 || die "timed out waiting for $CACHE_ROOT/.lock"
  if [[ -f "$dir/.complete" ]]; then
    found="$(installed_harbor "$dir/bin/python")"
    if [[ "$found" == "$HARBOR_VERSION" || "$found" == "$HARBOR_VERSION".* ]]; then
      log "harbor $found ready in $dir"
      echo "$dir/bin/python"
      return
    fi
    log "$dir holds harbor '${found:-none}', not $HARBOR_VERSION: rebuilding"
  fi
  rm -rf "$dir"
  t0="$(date +%s)"
  log "creating $dir from $python (Python $version)"
  "$python" -m venv "$dir" || die "$python -m venv failed (Debian: apt-get install python3.12-venv)"
  log "installing harbor==$HARBOR_VERSION.* and $PODMAN_COMPOSE_SPEC (a few minutes the first time)"
  nice "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
    "harbor==$HARBOR_VERSION.*" "$PODMAN_COMPOSE_SPEC" >&2 \
    || { rm -rf "$dir"; die "pip install harbor==$HARBOR_VERSION.* failed"; }
  found="$(installed_harbor "$dir/bin/python")"
  [[ -n "$found" ]] || { rm -rf "$dir"; die "harbor is not importable after the install"; }
  "$dir/bin/harbor" --help >/dev/null 2>&1 || { rm -rf "$dir"; die "$dir/bin/harbor does not run"; }
  touch "$dir/.complete"
  log "harbor $found installed in $(( $(date +%s) - t0 )) s: $dir"
  echo "$dir/bin/python"
}

case "${1:-build}" in
  build) cmd_build ;;
  path) cmd_path ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
