#!/usr/bin/env bash
# maka-eval's operator on a local kind cluster, ready for hack/e2e.sh.
#
#   hack/kind-up.sh          create the kind cluster (or reuse it), build the images and
#                            load them into it, install the CRDs, (re)start the operator
#                            and the egress gateway
#   hack/kind-up.sh down     delete the cluster
#
#   hack/kind-up.sh && hack/e2e.sh
#
# Needs Docker (a running daemon), kind v0.24.0 or newer and kubectl. The first run
# pulls the base images (kindest/node, debian:bookworm-slim, busybox) and PyPI packages, so it needs the network; later runs reuse the cluster and
# Docker's build cache. kubectl commands name the context kind-<cluster> explicitly:
# whatever context is current, nothing else is touched. `kind create cluster` also makes
# that context the current one, as kind always does.
#
# Images (tags as examples/hello/experiment.k8s.yaml names them):
#   localhost/maka-eval/operator:0.1.0           images/Dockerfile --target operator
#   localhost/maka-eval/relay:0.1.0              images/Dockerfile --target relay
#   localhost/maka-eval/hello:1.0                images/hello-benchmark/Dockerfile
#   localhost/maka-eval/debian-python:bookworm   images/task-debian-python/Dockerfile
#   localhost/maka-eval/egress:0.1.0             images/Dockerfile --target egress (attempt Pods'
#                                                egress sidecar and the egress gateway)
#
# Settings (environment):
#   MAKA_EVAL_KIND_CLUSTER   cluster name (default maka-eval; kubectl context kind-<name>)
#   MAKA_EVAL_KIND_IMAGE     node image for `kind create cluster --image` (default: kind's)
# See docs/kubernetes.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CLUSTER="${MAKA_EVAL_KIND_CLUSTER:-maka-eval}"
CONTEXT="kind-$CLUSTER"
SYSTEM_NAMESPACE=maka-eval-system
DEPLOYMENT=maka-eval-operator
KIND_MIN_MINOR=24 # kind v0.24.0: kindnet enforces NetworkPolicy (kube-network-policies)

OPERATOR_IMAGE=localhost/maka-eval/operator:0.1.0
RELAY_IMAGE=localhost/maka-eval/relay:0.1.0
BENCHMARK_IMAGE=localhost/maka-eval/hello:1.0
TASK_IMAGE=localhost/maka-eval/debian-python:bookworm
EGRESS_IMAGE=localhost/maka-eval/egress:0.1.0
GATEWAY=maka-eval-egress-gateway

log() { printf '[kind-up] %s\n' "$*" >&2; }
die() { printf '[kind-up] ERROR: %s\n' "$*" >&2; exit 1; }
kc() { kubectl --context "$CONTEXT" "$@"; }

# Seconds since $1 (a value of $SECONDS).
since() { echo "$((SECONDS - $1))"; }

check_tools() {
  local missing=()
  command -v docker >/dev/null 2>&1 \
    || missing+=("docker: install Docker Engine (https://docs.docker.com/engine/install/) or Docker Desktop")
  command -v kind >/dev/null 2>&1 \
    || missing+=("kind: v0.24.0 or newer, https://kind.sigs.k8s.io/docs/user/quick-start/#installation (or: go install sigs.k8s.io/kind@latest)")
  command -v kubectl >/dev/null 2>&1 \
    || missing+=("kubectl: https://kubernetes.io/docs/tasks/tools/")
  if ((${#missing[@]})); then
    printf '[kind-up] ERROR: not on PATH:\n' >&2
    printf '[kind-up]   %s\n' "${missing[@]}" >&2
    exit 1
  fi
  local out
  if ! out="$(docker info 2>&1 >/dev/null)"; then
    die "the Docker daemon does not answer (\`docker info\` failed): start it, or point DOCKER_HOST at one.
$out"
  fi
  local version minor
  version="$(kind version 2>/dev/null || true)"
  if [[ "$version" =~ v0\.([0-9]+)\. ]]; then
    minor="${BASH_REMATCH[1]}"
    if ((minor < KIND_MIN_MINOR)); then
      die "$version: kind before v0.24.0 does not enforce NetworkPolicy, and attempt Pods rely on theirs; install kind v0.24.0 or newer"
    fi
  elif [[ ! "$version" =~ v[1-9][0-9]*\. ]]; then
    log "could not read the kind version from '$version'; carrying on (v0.24.0 or newer is needed for NetworkPolicy)"
  fi
}

cluster_exists() {
  kind get clusters 2>/dev/null | grep -qx "$CLUSTER"
}

create_cluster() {
  if cluster_exists; then
    log "cluster $CLUSTER exists; reusing it (hack/kind-up.sh down deletes it)"
    return
  fi
  local t0=$SECONDS args=(--name "$CLUSTER" --wait 180s --config -)
  [[ -n "${MAKA_EVAL_KIND_IMAGE:-}" ]] && args+=(--image "$MAKA_EVAL_KIND_IMAGE")
  log "kind create cluster --name $CLUSTER"
  # kindnet, kind's default CNI, enforces NetworkPolicy since kind v0.24.0 (it bundles
  # sigs.k8s.io/kube-network-policies), so the default networking is kept on purpose:
  # do not set disableDefaultCNI here without installing a policy-enforcing CNI.
  kind create cluster "${args[@]}" <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
EOF
  log "cluster $CLUSTER created in $(since "$t0") s"
}

build() {
  local image="$1"
  shift
  log "docker build $image"
  docker build -t "$image" "$@" >&2 || die "docker build of $image failed (its output is above)"
}

build_images() {
  local t0=$SECONDS
  build "$OPERATOR_IMAGE" -f "$REPO/images/Dockerfile" --target operator "$REPO"
  build "$RELAY_IMAGE" -f "$REPO/images/Dockerfile" --target relay "$REPO"
  build "$BENCHMARK_IMAGE" -f "$REPO/images/hello-benchmark/Dockerfile" "$REPO"
  build "$TASK_IMAGE" "$REPO/images/task-debian-python"
  build "$EGRESS_IMAGE" -f "$REPO/images/Dockerfile" --target egress "$REPO"
  log "images built in $(since "$t0") s"
}

# `kind load docker-image`, and when that fails (Docker's containerd image store with a
# multi-platform image: "content digest ... not found") the single-platform archive way.
# Returns 1 when both ways fail.
load_image() {
  local image="$1" arch tmp
  if kind load docker-image --name "$CLUSTER" "$image" >/dev/null 2>&1; then
    return 0
  fi
  arch="$(docker version -f '{{.Server.Arch}}' 2>/dev/null || echo amd64)"
  tmp="$(mktemp -d)"
  log "kind load docker-image $image failed; trying docker image save --platform linux/$arch"
  if docker image save --platform "linux/$arch" -o "$tmp/image.tar" "$image" \
      && kind load image-archive --name "$CLUSTER" "$tmp/image.tar"; then
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$tmp"
  return 1
}

load_images() {
  local t0=$SECONDS image
  for image in "$OPERATOR_IMAGE" "$RELAY_IMAGE" "$BENCHMARK_IMAGE" "$TASK_IMAGE" "$EGRESS_IMAGE"; do
    load_image "$image" \
      || die "could not load $image into kind cluster $CLUSTER (try: kind load docker-image --name $CLUSTER $image)"
  done
  log "images loaded into $CLUSTER in $(since "$t0") s"
}

install_crds() {
  kc apply -f "$REPO/crds/" >&2
  kc wait --for=condition=Established --timeout=60s \
    crd/experiments.eval.maka.dev crd/cells.eval.maka.dev crd/attempts.eval.maka.dev >&2
}

operator_diagnostics() {
  kc -n "$SYSTEM_NAMESPACE" get pods -o wide >&2 || true
  kc -n "$SYSTEM_NAMESPACE" describe pods -l "app.kubernetes.io/name=$DEPLOYMENT" 2>&1 \
    | tail -n 40 >&2 || true
  kc -n "$SYSTEM_NAMESPACE" logs "deployment/$DEPLOYMENT" --tail=60 >&2 || true
}

deploy_operator() {
  local t0=$SECONDS
  kc apply -f "$HERE/kind/operator.yaml" >&2
  # The image tag stays the same when the code changes: a restart picks up what was
  # just loaded (imagePullPolicy: Never).
  kc -n "$SYSTEM_NAMESPACE" rollout restart "deployment/$DEPLOYMENT" >&2
  if ! kc -n "$SYSTEM_NAMESPACE" rollout status "deployment/$DEPLOYMENT" --timeout=180s >&2; then
    operator_diagnostics
    die "the operator did not become ready in 180 s (its state and log are above)"
  fi
  log "operator ready in $(since "$t0") s"
}

# The egress gateway (hack/kind/egress-gateway.yaml) with a random key made once per
# cluster: attempt credentials are HMACs under it, so it is never in a file.
deploy_egress_gateway() {
  local t0=$SECONDS key
  if ! kc -n "$SYSTEM_NAMESPACE" get secret "$GATEWAY" >/dev/null 2>&1; then
    key="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
    kc -n "$SYSTEM_NAMESPACE" create secret generic "$GATEWAY" --from-literal=key="$key" >&2
  fi
  kc apply -f "$HERE/kind/egress-gateway.yaml" >&2
  kc -n "$SYSTEM_NAMESPACE" rollout restart "deployment/$GATEWAY" >&2
  if ! kc -n "$SYSTEM_NAMESPACE" rollout status "deployment/$GATEWAY" --timeout=180s >&2; then
    kc -n "$SYSTEM_NAMESPACE" describe pods -l "app.kubernetes.io/name=$GATEWAY" 2>&1 \
      | tail -n 40 >&2 || true
    die "the egress gateway did not become ready in 180 s (its state is above)"
  fi
  log "egress gateway ready in $(since "$t0") s"
}

cmd_up() {
  local t0=$SECONDS
  check_tools
  create_cluster
  build_images
  load_images
  install_crds
  deploy_operator
  deploy_egress_gateway
  log "up in $(since "$t0") s: kubectl --context $CONTEXT get experiments,cells,attempts -A"
  log "next: hack/e2e.sh"
}

cmd_down() {
  command -v kind >/dev/null 2>&1 || die "kind is not on PATH"
  if cluster_exists; then
    kind delete cluster --name "$CLUSTER"
  else
    log "no kind cluster named $CLUSTER"
  fi
}

case "${1:-up}" in
  up) cmd_up ;;
  down) cmd_down ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2 ;;
esac
