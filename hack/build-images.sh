#!/usr/bin/env bash
# Builds maka-eval's images from images/Dockerfile, with Docker or Podman. Idempotent:
# the layer cache and a pip cache mount make a second run take seconds.
#
#   hack/build-images.sh                    operator, egress and relay
#   hack/build-images.sh relay [egress...]  only those
#
# stdout: one line per image built (its name), then `relay-bundle-digest=sha256:...`
# when the relay image was built: the value for the operator's --relay-bundle-digest
# (chart value relayBundleDigest) or an experiment's executor.config.relayBundleDigest.
# Progress goes to stderr.
#
# Settings (environment):
#   MAKA_EVAL_BUILDER        docker or podman (default: docker when its daemon answers,
#                            else podman)
#   MAKA_EVAL_IMAGE_PREFIX   image names' prefix (default localhost/maka-eval)
#   MAKA_EVAL_IMAGE_TAG      image tag (default: the version in pyproject.toml)
#   MAKA_EVAL_DEBIAN_IMAGE   base image of every stage (default
#                            docker.io/library/debian:bookworm-slim). Pin it by digest
#                            for images you ship: ...debian:bookworm-slim@sha256:<digest>
#   MAKA_EVAL_BUILD_CA       a CA bundle pip should trust during the build (a network
#                            with a TLS-intercepting proxy), passed as the build secret
#                            `build-ca`; default: this machine's
#                            /etc/ssl/certs/ca-certificates.crt when it exists; `none`
#                            passes nothing
#   MAKA_EVAL_BUILD_ARGS     more arguments for every build (e.g. --no-cache)
# Without a registry (this repository's tests), hack/podman.sh images first makes the
# Debian base image from Debian packages under the default DEBIAN_IMAGE name.
# See docs/images.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
DOCKERFILE="$REPO/images/Dockerfile"
PREFIX="${MAKA_EVAL_IMAGE_PREFIX:-localhost/maka-eval}"
DEBIAN_IMAGE="${MAKA_EVAL_DEBIAN_IMAGE:-docker.io/library/debian:bookworm-slim}"
ALL=(operator egress relay)

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { printf '[build-images] ERROR: %s\n' "$*" >&2; exit 1; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

builder() {
  if [[ -n "${MAKA_EVAL_BUILDER:-}" ]]; then
    [[ "$MAKA_EVAL_BUILDER" == docker || "$MAKA_EVAL_BUILDER" == podman ]] \
      || die "MAKA_EVAL_BUILDER is '$MAKA_EVAL_BUILDER'; use docker or podman"
    command -v "$MAKA_EVAL_BUILDER" >/dev/null 2>&1 || die "$MAKA_EVAL_BUILDER is not on PATH"
    echo "$MAKA_EVAL_BUILDER"
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1; then
    echo podman
  else
    die "neither a Docker daemon nor podman is available (hack/podman.sh setup installs Podman)"
  fi
}

tag() {
  if [[ -n "${MAKA_EVAL_IMAGE_TAG:-}" ]]; then echo "$MAKA_EVAL_IMAGE_TAG"; return; fi
  sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$REPO/pyproject.toml" | head -n 1
}

main() {
  local targets=("$@") b t tag_ ca args=() t0 image digest
  ((${#targets[@]})) || targets=("${ALL[@]}")
  for t in "${targets[@]}"; do
    [[ " ${ALL[*]} " == *" $t "* ]] || die "unknown image '$t'; choose from: ${ALL[*]}"
  done
  b="$(builder)"
  tag_="$(tag)"
  [[ -n "$tag_" ]] || die "no version in pyproject.toml; set MAKA_EVAL_IMAGE_TAG"
  ca="${MAKA_EVAL_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
  if [[ "$ca" != none && -s "$ca" ]]; then
    args+=(--secret "id=build-ca,src=$ca")
  elif [[ "$ca" != none && -n "${MAKA_EVAL_BUILD_CA:-}" ]]; then
    die "MAKA_EVAL_BUILD_CA=$ca is not a readable file"
  fi
  # Only what the images are built from: no virtualenvs, no __pycache__ (which would
  # also change the COPY layers on every test run).
  if [[ "$b" == podman ]]; then
    args+=(--ignorefile "$REPO/images/Dockerfile.dockerignore")
  else
    export DOCKER_BUILDKIT=1  # secrets and cache mounts; Dockerfile.dockerignore
  fi
  # shellcheck disable=SC2206
  args+=(--build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" ${MAKA_EVAL_BUILD_ARGS:-})
  for t in "${targets[@]}"; do
    image="$PREFIX/$t:$tag_"
    t0="$(date +%s.%N)"
    log "$b build --target $t -t $image (FROM $DEBIAN_IMAGE)"
    nice "$b" build "${args[@]}" -f "$DOCKERFILE" --target "$t" -t "$image" "$REPO" >&2 \
      || die "$b build of $image failed (its output is above)"
    log "built $image in $(since "$t0") s"
    echo "$image"
    if [[ "$t" == relay ]]; then
      digest="$("$b" run --rm --network none "$image" sha256sum /opt/maka-eval/checksums.sha256 \
        | cut -c1-64)" || die "could not read $image's /opt/maka-eval/checksums.sha256"
      [[ "$digest" =~ ^[0-9a-f]{64}$ ]] || die "$image: no relay bundle manifest"
      echo "relay-bundle-digest=sha256:$digest"
    fi
  done
}

main "$@"
