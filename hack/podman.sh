#!/usr/bin/env bash
# A real Docker-API container engine for the container sandbox's tests: rootful Podman,
# with registry-free base images built from Debian packages. Idempotent and cached.
#
#   hack/podman.sh setup            install podman & co. (apt), write containers.conf,
#                                   check that `podman run --network none` works
#   hack/podman.sh images           build the base images without a registry (cached):
#                                   maka-eval/debian:bookworm-minbase, tagged as
#                                   debian:bookworm-slim, debian:bookworm, debian:12
#                                   (no Python in it: the relay bundle's tests run there;
#                                   images/Dockerfile builds FROM it);
#                                   then maka-eval/debian-python:bookworm (podman build)
#   hack/podman.sh service start    start `podman system service` on the socket, wait for
#                                   /_ping, print `export DOCKER_HOST=...` as the last line
#   hack/podman.sh service stop     stop what `service start` began (by recorded pid)
#   hack/podman.sh service socket   print the DOCKER_HOST url
#   hack/podman.sh service status   exit 0 when the service answers, 3 when not
#   hack/podman.sh up               setup + images + service start
#
#   eval "$(hack/podman.sh up)"; docker ps; hack/podman.sh service stop
#
# Progress goes to stderr; only the export line goes to stdout.
#
# Settings (environment):
#   MAKA_EVAL_CACHE          cache root (default ~/.cache/maka-eval); rootfs tarballs go
#                            to $MAKA_EVAL_CACHE/images/
#   MAKA_EVAL_PODMAN_DIR     service state: socket, pid, log (default /run/maka-eval)
#   MAKA_EVAL_APT_MIRROR     Debian mirror for the base image (default: the URIs: line of
#                            /etc/apt/sources.list.d/*.sources, else /etc/apt/sources.list,
#                            else http://deb.debian.org/debian)
#   MAKA_EVAL_DEBIAN_SUITE   default bookworm
# See docs/containers.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATES="$HERE/podman"

CACHE_DIR="${MAKA_EVAL_CACHE:-${HOME:-/root}/.cache/maka-eval}/images"
STATE_DIR="${MAKA_EVAL_PODMAN_DIR:-/run/maka-eval}"
SOCKET="$STATE_DIR/podman.sock"
PID_FILE="$STATE_DIR/podman-service.pid"
LOG_FILE="$STATE_DIR/podman-service.log"
SUITE="${MAKA_EVAL_DEBIAN_SUITE:-bookworm}"
VARIANT="minbase"
COMPONENTS="main"

# Installed without Recommends (those pull in buildah, dbus-user-session and systemd);
# the ones podman needs are listed: conmon, netavark (the network stack, with iptables for
# bridges) and aardvark-dns, catatonit (--init).
# The last four make the verifier's toolbox (static programs bind-mounted read-only into
# every container: maka_eval/sandbox/toolbox.py builds it on first use, into the cache).
PACKAGES=(podman crun runc fuse-overlayfs slirp4netns uidmap mmdebstrap
          conmon netavark aardvark-dns catatonit iptables curl iproute2 ca-certificates
          busybox-static bash-static gcc libc6-dev)
CONF=/etc/containers/containers.conf
CONF_BACKUP=/etc/containers/containers.conf.maka-eval.bak

BASE_IMAGE="localhost/maka-eval/debian:$SUITE-$VARIANT"
BASE_TAGS=()
if [[ "$SUITE" == bookworm ]]; then
  BASE_TAGS=(docker.io/library/debian:bookworm-slim docker.io/library/debian:bookworm
             docker.io/library/debian:12)
fi
PYTHON_IMAGE="localhost/maka-eval/debian-python:$SUITE"
SMOKE_IMAGE="localhost/maka-eval/smoke:latest"

log() { printf '[podman.sh] %s\n' "$*" >&2; }
die() { printf '[podman.sh] ERROR: %s\n' "$*" >&2; exit 1; }

need_root() {
  [[ "$(id -u)" == 0 ]] || die "$1 needs root (rootful Podman); run it as root"
}

# Seconds since $1 (an epoch from `date +%s.%N`), with one decimal.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------------------- setup

missing_packages() {
  local p status
  for p in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
    [[ "$status" == "install ok installed" ]] || echo "$p"
  done
}

install_packages() {
  local missing
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]} == 0)); then
    log "packages already installed: ${PACKAGES[*]}"
    return
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Update the lists only when something is missing (a fresh machine has none).
  nice apt-get update -qq >&2 || die "apt-get update failed"
  nice apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
}

write_config() {
  local nofile rendered
  nofile="$(ulimit -Hn)"
  [[ "$nofile" == unlimited ]] && nofile=1048576
  rendered="$(sed "s/@NOFILE@/$nofile/g" "$TEMPLATES/containers.conf.tmpl")"
  mkdir -p /etc/containers
  if [[ -f "$CONF" ]] && [[ "$(cat "$CONF")" == "$rendered" ]]; then
    log "$CONF is up to date (nofile=$nofile)"
    return
  fi
  if [[ -f "$CONF" && ! -e "$CONF_BACKUP" ]] && ! grep -q 'Written by maka-eval' "$CONF"; then
    cp -p "$CONF" "$CONF_BACKUP"
    log "kept the previous $CONF as $CONF_BACKUP"
  fi
  printf '%s\n' "$rendered" >"$CONF.tmp" && mv -f "$CONF.tmp" "$CONF"
  log "wrote $CONF (nofile=$nofile, cgroupfs, runc, file events)"
}

# A tiny image made from the host's own `true` and its libraries: checks the runtime,
# the storage driver and the network-less run without any registry or mmdebstrap.
ensure_smoke_image() {
  podman image exists "$SMOKE_IMAGE" && return
  local tmp bin lib
  tmp="$(mktemp -d)"
  bin="$(readlink -f "$(type -P true)")"
  mkdir -p "$tmp/root/bin"
  cp "$bin" "$tmp/root/bin/true"
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
    mkdir -p "$tmp/root$(dirname "$lib")"
    cp -L "$lib" "$tmp/root$lib"
  done
  tar -C "$tmp/root" -cf "$tmp/smoke.tar" .
  podman import --quiet --change 'CMD ["/bin/true"]' "$tmp/smoke.tar" "$SMOKE_IMAGE" >/dev/null \
    || die "podman import of the smoke image failed (storage? see podman info)"
  rm -rf "$tmp"
}

verify_run() {
  local image="$1" out
  if ! out="$(podman run --rm --network none "$image" true 2>&1)"; then
    die "podman run --rm --network none $image true failed:
$out
(see docs/containers.md, \"Pitfalls\")"
  fi
}

cmd_setup() {
  need_root setup
  local t0
  t0="$(date +%s.%N)"
  install_packages
  write_config
  ensure_smoke_image
  verify_run "$SMOKE_IMAGE"
  if podman image exists "$BASE_IMAGE"; then verify_run "$BASE_IMAGE"; fi
  log "setup ok: $(podman --version), runtime $(podman info --format '{{.Host.OCIRuntime.Name}}'), \
cgroups $(podman info --format '{{.Host.CgroupsVersion}}'), \
storage $(podman info --format '{{.Store.GraphDriverName}}') ($(since "$t0") s)"
}

# ---------------------------------------------------------------------------- images

# The first URI of the apt sources that serve $SUITE itself (not -security/-updates).
apt_mirror() {
  if [[ -n "${MAKA_EVAL_APT_MIRROR:-}" ]]; then echo "$MAKA_EVAL_APT_MIRROR"; return; fi
  local f uri=""
  shopt -s nullglob
  for f in /etc/apt/sources.list.d/*.sources; do
    uri="$(awk -v suite="$SUITE" '
      function flush() { if (!done && uris != "" && (" " suites " ") ~ (" " suite " ")) { print uris; done = 1; exit } uris = ""; suites = "" }
      /^[[:space:]]*$/ { flush(); next }
      /^#/ { next }
      tolower($1) == "uris:" { uris = $2 }
      tolower($1) == "suites:" { $1 = ""; suites = $0 }
      END { flush() }' "$f")"
    [[ -n "$uri" ]] && break
  done
  shopt -u nullglob
  if [[ -z "$uri" && -f /etc/apt/sources.list ]]; then
    uri="$(awk -v suite="$SUITE" '$1 == "deb" {
        for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i !~ /=/) break
        if ($(i + 1) == suite) { print $i; exit } }' /etc/apt/sources.list)"
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# The cached rootfs tarball for a mirror/suite/variant (the key holds no date).
rootfs_path() {
  local key
  key="$(printf '%s\n' "$1" "$SUITE" "$VARIANT" "$COMPONENTS" | sha256sum | cut -c1-12)"
  echo "$CACHE_DIR/debian-$SUITE-$VARIANT-$key.tar"
}

build_rootfs() {
  local mirror="$1" tar="$2" t0
  mkdir -p "$CACHE_DIR"
  t0="$(date +%s.%N)"
  log "mmdebstrap --variant=$VARIANT $SUITE (mirror $mirror) -> $tar"
  rm -f "$tar.tmp"
  if ! nice mmdebstrap --quiet --variant="$VARIANT" --format=tar "$SUITE" "$tar.tmp" \
      "deb $mirror $SUITE $COMPONENTS" >&2; then
    rm -f "$tar.tmp"
    die "mmdebstrap failed (mirror $mirror)"
  fi
  mv -f "$tar.tmp" "$tar"
  printf 'mirror=%s\nsuite=%s\nvariant=%s\ncomponents=%s\nbuilt=%s\n' "$mirror" "$SUITE" \
    "$VARIANT" "$COMPONENTS" "$(date -u +%FT%TZ)" >"$tar.meta"
  log "rootfs built in $(since "$t0") s ($(du -h "$tar" | cut -f1))"
}

cmd_images() {
  need_root images
  command -v podman >/dev/null 2>&1 || die "podman is not installed; run: hack/podman.sh setup"
  local mirror tar t0 tag
  if podman image exists "$BASE_IMAGE"; then
    log "$BASE_IMAGE exists"
  else
    mirror="$(apt_mirror)"
    tar="$(rootfs_path "$mirror")"
    if [[ -s "$tar" ]]; then log "using cached $tar"; else build_rootfs "$mirror" "$tar"; fi
    t0="$(date +%s.%N)"
    podman import --quiet \
      --change 'CMD ["/bin/bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$tar" "$BASE_IMAGE" >/dev/null || { rm -f "$tar"; die "podman import $tar failed (removed it from the cache)"; }
    log "imported $BASE_IMAGE in $(since "$t0") s"
  fi
  for tag in "${BASE_TAGS[@]}"; do
    podman tag "$BASE_IMAGE" "$tag"
  done
  ((${#BASE_TAGS[@]})) && log "tagged as ${BASE_TAGS[*]}"
  verify_run "$BASE_IMAGE"

  if podman image exists "$PYTHON_IMAGE"; then
    log "$PYTHON_IMAGE exists"
  else
    t0="$(date +%s.%N)"
    log "podman build $PYTHON_IMAGE (FROM debian:bookworm-slim, apt-get install python3)"
    # For bookworm: FROM debian:bookworm-slim, checking that the tags resolve locally.
    local base="$BASE_IMAGE"
    ((${#BASE_TAGS[@]})) && base="debian:bookworm-slim"
    nice podman build --pull=never --quiet --build-arg "BASE=$base" -t "$PYTHON_IMAGE" \
      -f "$TEMPLATES/debian-python.Dockerfile" "$TEMPLATES" >/dev/null \
      || die "podman build of $PYTHON_IMAGE failed"
    log "built $PYTHON_IMAGE in $(since "$t0") s"
  fi
  podman run --rm --network none "$PYTHON_IMAGE" python3 -c 'import sys; print(sys.version)' \
    >/dev/null || die "$PYTHON_IMAGE does not run python3"
  log "images ok"
}

# ---------------------------------------------------------------------------- service

ping_ok() {
  [[ -S "$SOCKET" ]] && [[ "$(curl -fsS --max-time 5 --unix-socket "$SOCKET" http://d/_ping \
    2>/dev/null)" == OK ]]
}

recorded_pid() {
  local pid
  [[ -f "$PID_FILE" ]] || return 1
  pid="$(cat "$PID_FILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  # Only a live podman system service counts (the pid may have been reused).
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'podman system service' || return 1
  echo "$pid"
}

service_start() {
  need_root "service start"
  command -v podman >/dev/null 2>&1 || die "podman is not installed; run: hack/podman.sh setup"
  mkdir -p "$STATE_DIR"
  local t0 pid i
  if recorded_pid >/dev/null && ping_ok; then
    log "service already running (pid $(recorded_pid)) on $SOCKET"
  else
    if pid="$(recorded_pid)"; then kill "$pid" 2>/dev/null || true; fi
    rm -f "$SOCKET" "$PID_FILE"
    t0="$(date +%s.%N)"
    # Detached from our stdin/stdout/stderr, so a caller reading our output does not
    # wait for the service to exit; setsid keeps it out of the caller's process group.
    # From its own folder: conmon drops files (an `oom` marker) in its working directory.
    (cd "$(dirname "$PID_FILE")" && exec setsid podman system service --time=0 "unix://$SOCKET" \
      </dev/null >>"$LOG_FILE" 2>&1 9>&-) &
    echo $! >"$PID_FILE"
    for ((i = 0; i < 300; i++)); do
      ping_ok && break
      kill -0 "$(cat "$PID_FILE")" 2>/dev/null || die "podman system service exited; see $LOG_FILE:
$(tail -n 20 "$LOG_FILE")"
      sleep 0.1
    done
    ping_ok || die "the service did not answer /_ping on $SOCKET in 30 s; see $LOG_FILE"
    log "service started (pid $(cat "$PID_FILE")) in $(since "$t0") s; log: $LOG_FILE"
  fi
  echo "export DOCKER_HOST=unix://$SOCKET"
}

service_stop() {
  local pid i
  if ! pid="$(recorded_pid)"; then
    log "service not running"
    rm -f "$PID_FILE"
    return
  fi
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "service pid $pid ignored SIGTERM for 10 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$PID_FILE" "$SOCKET"
  log "service stopped (pid $pid)"
}

cmd_service() {
  case "${1:-start}" in
    start) service_start ;;
    stop) service_stop ;;
    socket) echo "unix://$SOCKET" ;;
    status)
      if recorded_pid >/dev/null && ping_ok; then
        log "running (pid $(recorded_pid)) on $SOCKET"
      else
        log "not running"; exit 3
      fi ;;
    *) die "usage: hack/podman.sh service [start|stop|socket|status]" ;;
  esac
}

# ---------------------------------------------------------------------------- main

# One at a time for the steps that change things (apt, images, the service); two test
# sessions starting together wait for each other. The service itself does not inherit
# the lock (9>&- above).
lock() {
  [[ "$(id -u)" == 0 ]] || return 0
  exec 9>/run/lock/maka-eval-podman.lock
  flock -w 1800 9 || die "timed out waiting for /run/lock/maka-eval-podman.lock"
}

case "${1:-}" in
  setup) lock; cmd_setup ;;
  images) lock; cmd_images ;;
  service) shift; [[ "${1:-start}" == start ]] && lock; cmd_service "$@" ;;
  up) lock; cmd_setup; cmd_images; service_start ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2 ;;
esac
