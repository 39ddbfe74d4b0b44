#!/usr/bin/env bash
# Builds the relay bundle: the relay frozen by PyInstaller (its own interpreter and
# standard library: in a Pod the relay imports nothing else, tests/relay/
# test_relay_stdlib.py), relocatable to any folder, plus checksums.sha256.
#
#   relay-image/build-bundle.sh OUT_DIR
#
#   OUT_DIR/bin/maka-relay          the relay (`python -m maka_eval.relay` frozen)
#   OUT_DIR/bin/_internal/...       what it runs with (libpython, the standard library)
#   OUT_DIR/checksums.sha256        `<sha256>  ./<path>` for every other file, sorted
#
# Prints the bundle digest (sha256: + the sha256 of checksums.sha256) as its last line.
# Run it where the bundle's glibc floor should be: PyInstaller links against the build
# machine's glibc, so build on the oldest distribution the task images may have (the
# images/Dockerfile relay target builds on Debian 12, glibc 2.36).
#
# Settings (environment):
#   PYTHON      interpreter with PyInstaller and maka_eval importable
#               (default: python3)
#   WORK_DIR    PyInstaller's scratch folder (default: a temporary one)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="${1:?usage: relay-image/build-bundle.sh OUT_DIR}"

log() { printf '[build-bundle] %s\n' "$*" >&2; }
die() { printf '[build-bundle] ERROR: %s\n' "$*" >&2; exit 1; }

work="${WORK_DIR:-}"
if [[ -z "$work" ]]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
[[ ! -e "$OUT" || -z "$(ls -A "$OUT" 2>/dev/null)" ]] || die "$OUT is not empty"

# --collect-submodules: the relay's lazy imports (the task settings reader, the process
# sandbox) are found by PyInstaller's bytecode scan; collecting the relay's own packages
# as a whole also keeps modules reached only through a dynamic import.
# --exclude-module: the scan also follows imports the relay never runs in a Pod (type-only
# ones, the spec models behind engine.launch.subject_launch, the container sandbox's
# Docker SDK), which would carry pydantic and PyYAML along; the relay in a Pod runs on the
# standard library alone (tests/relay/test_relay_stdlib.py), so they stay out.
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
  --onedir --name maka-relay --contents-directory _internal \
  --collect-submodules maka_eval.relay --collect-submodules maka_eval.sandbox \
  --collect-submodules maka_eval.processes \
  --exclude-module tkinter \
  --exclude-module pydantic --exclude-module pydantic_core --exclude-module yaml \
  --distpath "$work/dist" --workpath "$work/build" --specpath "$work" \
  "$HERE/maka-relay.py" >&2 || die "PyInstaller failed"

mkdir -p "$OUT/bin"
cp -a "$work/dist/maka-relay/." "$OUT/bin/"

# The bundle is plain files and folders only: the Pod's check refuses anything else.
odd="$(find "$OUT" ! -type f ! -type d | head -n 3)"
[[ -z "$odd" ]] || die "the bundle holds entries that are not plain files: $odd"
bad="$(cd "$OUT" && find . -type f -name '*[[:space:]\\]*' | head -n 3)"
[[ -z "$bad" ]] || die "file names with blanks or backslashes cannot go in checksums.sha256: $bad"

# Fail the build, not an attempt: the frozen relay must start and parse a plan.
"$OUT/bin/maka-relay" --help >/dev/null || die "$OUT/bin/maka-relay --help failed"

# Written outside the bundle first: the listing must not see the manifest being written.
(cd "$OUT" && find . -type f ! -path ./checksums.sha256 -print0 | LC_ALL=C sort -z \
  | xargs -0 sha256sum) >"$work/checksums.sha256"
mv -f "$work/checksums.sha256" "$OUT/checksums.sha256"
log "$(grep -c . "$OUT/checksums.sha256") files, $(du -sh "$OUT" | cut -f1)"
echo "sha256:$(sha256sum <"$OUT/checksums.sha256" | cut -c1-64)"
