#!/usr/bin/env bash
# A real Kubernetes control plane for tests, built from Go modules the way
# controller-runtime's envtest uses one: etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler as local processes on loopback, plus a fake Node object. There is
# no kubelet: tests play the kubelet and write pod status themselves.
#
#   hack/envtest.sh build    build the binaries once into the cache (skipped when cached)
#   hack/envtest.sh start    build if needed, start everything, print `export KUBECONFIG=...`
#                            as the last line of stdout (progress goes to stderr)
#   hack/envtest.sh stop     stop what `start` began (by recorded pids)
#   hack/envtest.sh status   say whether it is up (exit 0) or not (exit 3)
#
#   eval "$(hack/envtest.sh start)"; kubectl get nodes; hack/envtest.sh stop
#
# Settings (environment):
#   MAKA_EVAL_CACHE            cache root (default ~/.cache/maka-eval); the binaries go to
#                              $MAKA_EVAL_CACHE/envtest/<k8s version>/
#   MAKA_EVAL_ENVTEST_DIR      state folder: pki, etcd data, logs, pids, kubeconfig
#                              (default /tmp/maka-eval-envtest)
#   MAKA_EVAL_K8S_VERSION      k8s.io/kubernetes version (default v1.37.2)
#   MAKA_EVAL_ETCD_VERSION     go.etcd.io/etcd/server/v3 version (default v3.6.16)
#   MAKA_EVAL_ENVTEST_CONTROLLERS  kube-controller-manager --controllers list
#   GO                         the go command (default: go on PATH, else /usr/local/go/bin/go)
#   GOTOOLCHAIN                passed through; set it (e.g. go1.27.3) if a module asks for
#                              a newer Go than the installed one
# See docs/envtest.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

K8S_VERSION="${MAKA_EVAL_K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${MAKA_EVAL_ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${MAKA_EVAL_CACHE:-${HOME:-/root}/.cache/maka-eval}/envtest"
BIN_DIR="$CACHE_ROOT/$K8S_VERSION"
SRC_DIR="$CACHE_ROOT/src"
STATE_DIR="${MAKA_EVAL_ENVTEST_DIR:-/tmp/maka-eval-envtest}"
CONTROLLERS="${MAKA_EVAL_ENVTEST_CONTROLLERS:-garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller,job-controller,ttl-after-finished-controller}"
NODE_NAME="maka-eval-node"
SERVICE_CIDR="10.96.0.0/24"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)

log() { printf '[envtest] %s\n' "$*" >&2; }
die() { printf '[envtest] ERROR: %s\n' "$*" >&2; exit 1; }

go_cmd() {
  if [[ -n "${GO:-}" ]]; then echo "$GO"
  elif command -v go >/dev/null 2>&1; then command -v go
  elif [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go
  else die "no go command found (set GO=/path/to/go)"
  fi
}

# ---------------------------------------------------------------------------- build

# The version line each cached binary must print for the cache to count as valid.
expected_version() {
  case "$1" in
    etcd) echo "etcd Version: ${ETCD_VERSION#v}" ;;
    *) echo "Kubernetes $K8S_VERSION" ;;
  esac
}

binaries_ok() {
  local c out
  for c in "${COMPONENTS[@]}"; do
    [[ -x "$BIN_DIR/$c" ]] || return 1
    out="$("$BIN_DIR/$c" --version 2>/dev/null)" || return 1
    grep -qF "$(expected_version "$c")" <<<"$out" || return 1
  done
}

build_kubernetes() {
  local go="$1" mod_dir="$SRC_DIR/kubernetes-$K8S_VERSION" gomod_file replaces
  rm -rf "$mod_dir" && mkdir -p "$mod_dir"
  log "downloading k8s.io/kubernetes@$K8S_VERSION (go.mod)"
  gomod_file="$(cd "$mod_dir" && "$go" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$gomod_file" ]] || die "could not download the go.mod of k8s.io/kubernetes@$K8S_VERSION"
  # k8s.io/kubernetes replaces its staging modules with ./staging/src/k8s.io/X. Generate
  # `k8s.io/X => k8s.io/X v0.<minor>.<patch>` for each of them that its go.mod requires
  # (the sample-* staging modules are not required and not all published).
  local staging_version="v0.${K8S_VERSION#v1.}"
  replaces="$(awk -v sv="$staging_version" '
    /^require[[:space:]]*\(/ { inreq = 1; next }
    inreq && /^\)/ { inreq = 0; next }
    inreq && $1 ~ /^k8s\.io\// { required[$1] = 1 }
    /^replace[[:space:]]*\(/ { inrep = 1; next }
    inrep && /^\)/ { inrep = 0; next }
    inrep && $2 == "=>" && $3 ~ /^\.\/staging\// { staging[++n] = $1 }
    END { for (i = 1; i <= n; i++) if (staging[i] in required) printf "\t%s => %s %s\n", staging[i], staging[i], sv }
  ' "$gomod_file")"
  [[ -n "$replaces" ]] || die "no staging replace lines found in $gomod_file"
  local go_line
  go_line="$(awk '$1 == "go" { print $2; exit }' "$gomod_file")"
  {
    sed "s/@GO_VERSION@/$go_line/" "$HERE/envtest/go.mod.tmpl"
    grep -E '^godebug ' "$gomod_file" || true
    printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n%s\n)\n' "$K8S_VERSION" "$replaces"
  } >"$mod_dir/go.mod"
  log "scratch module $mod_dir/go.mod: $(grep -c '=>' "$mod_dir/go.mod") replace lines"
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
              k8s.io/kubernetes/cmd/kube-scheduler)
  log "go get ${pkgs[*]} @$K8S_VERSION"
  (cd "$mod_dir" && "$go" get "${pkgs[@]/%/@$K8S_VERSION}")
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local commit_date ldflags="" pkg
  commit_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$commit_date"
  done
  log "go build -trimpath kube-apiserver kube-controller-manager kube-scheduler (slow: many minutes)"
  (cd "$mod_dir" && CGO_ENABLED=0 nice -n 10 "$go" build -trimpath -ldflags "-s -w$ldflags" \
    -o "$BIN_DIR/.tmp/" "${pkgs[@]}")
}

build_etcd() {
  local go="$1" mod_dir="$SRC_DIR/etcd-$ETCD_VERSION"
  rm -rf "$mod_dir" && mkdir -p "$mod_dir"
  # etcd gets its own scratch module: its dependency versions (grpc, otel, ...) are not
  # the ones Kubernetes pins.
  local go_line
  go_line="$("$go" env GOVERSION)"; go_line="${go_line#go}"
  sed "s/@GO_VERSION@/$go_line/" "$HERE/envtest/go.mod.tmpl" >"$mod_dir/go.mod"
  log "go get go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  (cd "$mod_dir" && "$go" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
  log "go build -trimpath etcd"
  (cd "$mod_dir" && CGO_ENABLED=0 nice -n 10 "$go" build -trimpath -ldflags "-s -w" \
    -o "$BIN_DIR/.tmp/etcd" go.etcd.io/etcd/server/v3)
}

cmd_build() {
  mkdir -p "$BIN_DIR"
  # One build at a time per cache (parallel pytest sessions, CI jobs).
  exec 9>"$CACHE_ROOT/.build.lock"
  flock 9
  if binaries_ok; then
    log "binaries already built in $BIN_DIR ($(expected_version kube-apiserver), $(expected_version etcd))"
    return 0
  fi
  local go start elapsed
  go="$(go_cmd)"
  "$go" version >/dev/null 2>&1 || die "the go command '$go' does not run (set GO=/path/to/go)"
  log "building into $BIN_DIR with $("$go" version) (GOTOOLCHAIN=${GOTOOLCHAIN:-$("$go" env GOTOOLCHAIN)})"
  start=$(date +%s)
  rm -rf "$BIN_DIR/.tmp" && mkdir -p "$BIN_DIR/.tmp"
  build_etcd "$go"
  build_kubernetes "$go"
  local c
  for c in "${COMPONENTS[@]}"; do mv -f "$BIN_DIR/.tmp/$c" "$BIN_DIR/$c"; done
  rmdir "$BIN_DIR/.tmp"
  elapsed=$(( $(date +%s) - start ))
  binaries_ok || die "built binaries do not report the expected versions"
  {
    echo "kubernetes=$K8S_VERSION"
    echo "etcd=$ETCD_VERSION"
    echo "go=$("$go" version)"
    echo "build_seconds=$elapsed"
    echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$BIN_DIR/BUILD_INFO"
  log "build took ${elapsed}s ($(( elapsed / 60 ))m$(( elapsed % 60 ))s); binaries in $BIN_DIR"
}

# ---------------------------------------------------------------------------- start / stop

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Running: the process exists and is not a zombie. A zombie answers `kill -0` until its
# parent reaps it; when the parent is a program that adopted the component (a test
# session that is a child subreaper) that may be never.
running() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "${stat%% *}" != Z ]]
}

pid_alive() {
  # The pid is alive AND still runs the binary we started (pids get reused).
  local name="$1" pid
  [[ -f "$STATE_DIR/$name.pid" ]] || return 1
  pid="$(cat "$STATE_DIR/$name.pid")"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$BIN_DIR/$name " 2>/dev/null
}

apiserver_ready() {
  [[ -f "$STATE_DIR/ports.env" ]] || return 1
  # shellcheck disable=SC1091
  source "$STATE_DIR/ports.env"
  [[ "$(curl -sS --max-time 3 --cacert "$STATE_DIR/pki/ca.crt" --cert "$STATE_DIR/pki/admin.crt" \
        --key "$STATE_DIR/pki/admin.key" "https://127.0.0.1:$APISERVER_PORT/readyz" 2>/dev/null)" == ok ]]
}

is_up() {
  local c
  for c in "${COMPONENTS[@]}"; do pid_alive "$c" || return 1; done
  apiserver_ready && [[ -f "$STATE_DIR/kubeconfig" ]]
}

launch() {
  # launch NAME ARGS...: start a component in its own session, logs to NAME.log.
  local name="$1"; shift
  # fds 8 and 9 hold this script's locks: the component must not inherit them.
  setsid "$BIN_DIR/$name" "$@" >"$STATE_DIR/$name.log" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$STATE_DIR/$name.pid"
  log "started $name (pid $!, log $STATE_DIR/$name.log)"
}

wait_for() {
  # wait_for NAME SECONDS COMMAND...: poll COMMAND until it succeeds; fail if NAME dies.
  local name="$1" timeout="$2"; shift 2
  local deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    if ! pid_alive "$name"; then
      tail -n 30 "$STATE_DIR/$name.log" >&2 || true
      die "$name exited during startup (log: $STATE_DIR/$name.log)"
    fi
    if (( $(date +%s) > deadline )); then
      tail -n 30 "$STATE_DIR/$name.log" >&2 || true
      die "$name not ready after ${timeout}s (log: $STATE_DIR/$name.log)"
    fi
    sleep 0.3
  done
}

make_pki() {
  local pki="$STATE_DIR/pki"
  if [[ -f "$pki/ca.crt" && -f "$pki/admin.crt" && -f "$pki/serving.crt" && -f "$pki/sa.key" ]] &&
     openssl x509 -checkend 86400 -noout -in "$pki/serving.crt" >/dev/null 2>&1; then
    return 0
  fi
  log "generating certificates in $pki"
  rm -rf "$pki" && mkdir -p "$pki" && chmod 700 "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt \
      -subj "/CN=maka-eval-envtest-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # Serving certificate: loopback plus the in-cluster names of the API server.
    cat >serving.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:${SERVICE_CIDR%.*}.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    openssl req -new -newkey rsa:2048 -nodes -keyout serving.key -out serving.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
      -extfile serving.ext -out serving.crt 2>/dev/null
    # Client certificate for the admin user: group system:masters.
    cat >client.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
    openssl req -new -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr \
      -subj "/O=system:masters/CN=maka-eval-admin" 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
      -extfile client.ext -out admin.crt 2>/dev/null
    # Service-account token signing key pair.
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext ./*.srl
    chmod 600 ./*.key
  )
}

write_kubeconfig() {
  local target="$1" server="$2"
  b64() { base64 -w0 <"$1"; }
  cat >"$target.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: envtest
  cluster:
    server: $server
    certificate-authority-data: $(b64 "$STATE_DIR/pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(b64 "$STATE_DIR/pki/admin.crt")
    client-key-data: $(b64 "$STATE_DIR/pki/admin.key")
contexts:
- name: envtest
  context:
    cluster: envtest
    user: admin
    namespace: default
current-context: envtest
EOF
  chmod 600 "$target.tmp" && mv -f "$target.tmp" "$target"
}

create_node() {
  # The fake Node: Ready, with capacity, no taints. Nothing updates it afterwards (no
  # kubelet, and no node-lifecycle controller to mark it NotReady or taint it).
  local kubeconfig="$1" now
  now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  sed -e "s/@NODE_NAME@/$NODE_NAME/g" -e "s/@NOW@/$now/g" -e "s/@K8S_VERSION@/$K8S_VERSION/g" "$HERE/envtest/node.json" >"$STATE_DIR/node.json"
  kubectl --kubeconfig "$kubeconfig" apply -f "$STATE_DIR/node.json" >&2
  # Status is a subresource: set it explicitly whatever the create kept.
  kubectl --kubeconfig "$kubeconfig" patch node "$NODE_NAME" --subresource=status --type=merge \
    -p "$(python3 -c 'import json, sys; print(json.dumps({"status": json.load(open(sys.argv[1]))["status"]}))' "$STATE_DIR/node.json")" >&2
  # The TaintNodesByCondition admission plugin taints every new node with
  # node.kubernetes.io/not-ready:NoSchedule; the node-lifecycle controller would lift it
  # once the node is Ready. It does not run here, so lift it ourselves.
  kubectl --kubeconfig "$kubeconfig" patch node "$NODE_NAME" --type=merge \
    -p '{"spec": {"taints": null}}' >&2
}

cmd_start() {
  command -v kubectl >/dev/null 2>&1 || die "kubectl is needed (it applies the fake Node)"
  command -v openssl >/dev/null 2>&1 || die "openssl is needed (certificates)"
  mkdir -p "$STATE_DIR"
  exec 8>"$STATE_DIR/.lock"
  flock 8
  if is_up; then
    log "already running (state $STATE_DIR)"
    echo "export KUBECONFIG=$STATE_DIR/kubeconfig"
    return 0
  fi
  cmd_build
  stop_components
  # A failed start leaves nothing running (the logs stay for the error report).
  trap 'if [[ -z "${ENVTEST_STARTED:-}" ]]; then log "start failed; stopping what it began"; stop_components; fi' EXIT
  make_pki
  local etcd_port etcd_peer_port api_port kcm_port sched_port pki="$STATE_DIR/pki"
  etcd_port=$(free_port); etcd_peer_port=$(free_port); api_port=$(free_port)
  kcm_port=$(free_port); sched_port=$(free_port)
  cat >"$STATE_DIR/ports.env" <<EOF
ETCD_PORT=$etcd_port
APISERVER_PORT=$api_port
CONTROLLER_MANAGER_PORT=$kcm_port
SCHEDULER_PORT=$sched_port
EOF
  rm -rf "$STATE_DIR/etcd-data" "$STATE_DIR/kubeconfig"

  launch etcd --name envtest --data-dir "$STATE_DIR/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "envtest=http://127.0.0.1:$etcd_peer_port" \
    --unsafe-no-fsync --log-level warn
  wait_for etcd 30 curl -fsS --max-time 2 "http://127.0.0.1:$etcd_port/health"

  launch kube-apiserver \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --tls-cert-file="$pki/serving.crt" --tls-private-key-file="$pki/serving.key" \
    --client-ca-file="$pki/ca.crt" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --authorization-mode=Node,RBAC \
    --allow-privileged=true \
    --endpoint-reconciler-type=none
  wait_for kube-apiserver 90 apiserver_ready
  log "kube-apiserver ready on https://127.0.0.1:$api_port"

  write_kubeconfig "$STATE_DIR/kubeconfig" "https://127.0.0.1:$api_port"
  local kc="$STATE_DIR/kubeconfig"

  launch kube-controller-manager \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" \
    --leader-elect=false --use-service-account-credentials=false \
    --controllers="$CONTROLLERS" \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --service-cluster-ip-range="$SERVICE_CIDR"
  launch kube-scheduler \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" --leader-elect=false
  wait_for kube-controller-manager 60 curl -fsSk --max-time 2 "https://127.0.0.1:$kcm_port/healthz"
  wait_for kube-scheduler 60 curl -fsSk --max-time 2 "https://127.0.0.1:$sched_port/healthz"

  create_node "$kc"
  ENVTEST_STARTED=1
  log "control plane up: kubeconfig $kc, logs and pids in $STATE_DIR"
  echo "export KUBECONFIG=$kc"
}

stop_components() {
  local c pid pids=() i
  for (( i = ${#COMPONENTS[@]} - 1; i >= 0; i-- )); do
    c="${COMPONENTS[$i]}"
    if pid_alive "$c"; then
      pid="$(cat "$STATE_DIR/$c.pid")"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$c:$pid")
    fi
  done
  local deadline=$(( $(date +%s) + 15 )) entry
  for entry in "${pids[@]}"; do
    c="${entry%%:*}"; pid="${entry#*:}"
    while running "$pid"; do
      if (( $(date +%s) > deadline + 15 )); then
        log "$c (pid $pid) is still there after SIGKILL; giving up on it"
        break
      fi
      if (( $(date +%s) > deadline )); then
        log "$c (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
      fi
      sleep 0.1
    done
    log "stopped $c (pid $pid)"
  done
  for c in "${COMPONENTS[@]}"; do rm -f "$STATE_DIR/$c.pid"; done
}

cmd_stop() {
  [[ -d "$STATE_DIR" ]] || { log "not running (no $STATE_DIR)"; return 0; }
  exec 8>"$STATE_DIR/.lock"
  flock 8
  stop_components
  rm -f "$STATE_DIR/kubeconfig"
  log "stopped (logs kept in $STATE_DIR)"
}

cmd_status() {
  local c pid
  for c in "${COMPONENTS[@]}"; do
    if pid_alive "$c"; then pid="$(cat "$STATE_DIR/$c.pid")"; echo "$c: running (pid $pid)"
    else echo "$c: not running"; fi
  done
  if is_up; then
    echo "up: export KUBECONFIG=$STATE_DIR/kubeconfig"
    return 0
  fi
  echo "down"
  return 3
}

case "${1:-}" in
  build) cmd_build ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 build|start|stop|status" >&2; exit 2 ;;
esac
