"""The relay bundle's integrity check, run by every attempt Pod's first init container.

The relay image holds the bundle at /opt/maka-eval (relay-image/build-bundle.sh): the
frozen relay (`bin/maka-relay` and its `bin/_internal/`: its own interpreter, standard
library and dependencies) and `checksums.sha256`, one `<sha256>  ./<path>` line per file
in `sha256sum` format. The bundle's digest is `sha256:` + the sha256 of that manifest, so
one value pins every byte of the bundle.

The init container copies the bundle into the Pod's emptyDir and then checks the copy --
the bytes the subject container will run -- with this script, which the operator puts in
the Pod (the image supplies only `sh` and coreutils). It recomputes the manifest's digest
and compares it with each pinned digest (the operator's `--relay-bundle-digest`, the
experiment's `executor.config.relayBundleDigest`), checks every file the manifest names,
and refuses files it does not name and anything that is not a plain file or folder. Any
doubt fails closed: the copy is deleted, the reason -- naming the expected and the actual
digest -- goes to the termination message, and the init container exits 1, so the Pod
never starts the subject and the operator records an infrastructure failure with that
reason (maka_eval.k8s.results).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from maka_eval import layout

MANIFEST = "checksums.sha256"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
_DIGEST = re.compile(DIGEST_PATTERN)
REJECTED = "relay bundle rejected"
"""How every failure message of the check begins."""
OPERATOR_PIN = "operator --relay-bundle-digest"
SPEC_PIN = "executor.config.relayBundleDigest"

# POSIX sh (dash, busybox ash) with GNU coreutils' sha256sum (--strict, --quiet).
# Arguments: source folder, destination folder, image, then one `DIGEST=ORIGIN` per pin.
VERIFY_SCRIPT = r"""set -u
src=$1 dst=$2 image=$3
shift 3
fail() {
  msg="relay bundle rejected: $* (image $image)"
  printf '%s\n' "$msg" >&2
  printf '%s' "$msg" >@TERMINATION_MESSAGE_PATH@ 2>/dev/null || :
  find "$dst" -mindepth 1 -delete 2>/dev/null || :
  exit 1
}
[ -s "$src/checksums.sha256" ] \
  || fail "the image has no $src/checksums.sha256; build it with images/Dockerfile (target relay)"
# Entry by entry: a non-root copy may not set the times of the volume's own folder.
err=$(cd "$src" && find . -mindepth 1 -maxdepth 1 -exec cp -a {} "$dst/" \; 2>&1) \
  && [ -z "$err" ] || fail "copying $src to $dst failed: $err"
cd "$dst" || fail "cannot enter $dst"
actual=sha256:$(sha256sum <checksums.sha256 | cut -c1-64)
for pin in "$@"; do
  want=${pin%%=*}
  [ "$actual" = "$want" ] || fail "digest mismatch: expected $want (${pin#*=}), actual $actual"
done
bad=$(grep -v '^[0-9a-f]\{64\}  \./[^ \\]*$' checksums.sha256 | head -n 1)
[ -z "$bad" ] || fail "checksums.sha256 (digest $actual) has a malformed line: $bad"
grep -q '^[0-9a-f]\{64\}  \./bin/maka-relay$' checksums.sha256 \
  || fail "checksums.sha256 (digest $actual) does not name ./bin/maka-relay"
odd=$(find . ! -type f ! -type d | head -n 3 | tr '\n' ' ')
[ -z "$odd" ] || fail "the bundle (digest $actual) holds entries that are not plain files: $odd"
names() { sed 's/^[0-9a-f]\{64\}  //' checksums.sha256; }
# Named twice plus once if present: a name seen once is a file the manifest does not name.
extra=$({ names; names; find . -type f ! -path ./checksums.sha256; } \
  | LC_ALL=C sort | uniq -u | head -n 3 | tr '\n' ' ')
[ -z "$extra" ] || fail "files not named in checksums.sha256 (digest $actual): $extra"
if ! out=$(sha256sum --check --strict --quiet checksums.sha256 2>&1); then
  first=$(printf '%s\n' "$out" | sed -n 's/: FAILED$//p' | head -n 1)
  if [ -n "$first" ] && [ -f "$first" ]; then
    want=$(awk -v p="$first" '$2 == p { print $1; exit }' checksums.sha256)
    got=$(sha256sum <"$first" | cut -c1-64)
    fail "$first does not match checksums.sha256: expected sha256:$want, actual sha256:$got"
  fi
  fail "files do not match checksums.sha256 (digest $actual):" \
    "$(printf '%s' "$out" | head -n 3 | tr '\n' ' ')"
fi
echo "relay bundle $actual verified: $(grep -c . checksums.sha256) files"
""".replace("@TERMINATION_MESSAGE_PATH@", layout.TERMINATION_MESSAGE_PATH)


class BadDigest(ValueError):
    """A pinned digest that is not `sha256:` and 64 lowercase hex digits."""


def check_digest(value: str, origin: str) -> str:
    """`value` if it is a bundle digest, else BadDigest naming `origin` and the fix."""
    if not _DIGEST.match(value):
        raise BadDigest(
            f"{origin}: '{value}' is not a relay bundle digest; expected 'sha256:' and 64 "
            "lowercase hex digits (hack/build-images.sh prints it)"
        )
    return value


def pins(operator_digest: str | None, spec_digest: str | None) -> list[tuple[str, str]]:
    """(digest, where it was pinned) for each pin that is set: the bundle must match all."""
    out = []
    if operator_digest:
        out.append((check_digest(operator_digest, OPERATOR_PIN), OPERATOR_PIN))
    if spec_digest:
        out.append((check_digest(spec_digest, SPEC_PIN), SPEC_PIN))
    return out


def init_command(
    source: str, destination: str, image: str, pinned: Sequence[tuple[str, str]]
) -> list[str]:
    """The init container's command: copy `source` to `destination`, then check it."""
    return [
        "sh",
        "-c",
        VERIFY_SCRIPT,
        "relay-bundle",
        source,
        destination,
        image,
        *(f"{digest}={origin}" for digest, origin in pinned),
    ]


def init_container(
    image: str,
    source: str,
    destination: str,
    pinned: Sequence[tuple[str, str]],
    security_context: dict[str, Any],
) -> dict[str, Any]:
    """The attempt Pod's `relay-bundle` init container."""
    return {
        "name": "relay-bundle",
        "image": image,
        "command": init_command(source, destination, image, pinned),
        "volumeMounts": [{"name": "relay", "mountPath": destination}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security_context,
    }


__all__ = [
    "DIGEST_PATTERN",
    "MANIFEST",
    "OPERATOR_PIN",
    "REJECTED",
    "SPEC_PIN",
    "VERIFY_SCRIPT",
    "BadDigest",
    "check_digest",
    "init_command",
    "init_container",
    "pins",
]
