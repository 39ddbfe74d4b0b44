#!/usr/bin/env bash
# The hello example on the kind cluster of hack/kind-up.sh, end to end, checked.
#
#   hack/e2e.sh              (runs hack/kind-up.sh first when the cluster or the
#                            operator is not there yet)
#
# In a fresh namespace it
#   1. checks that the cluster enforces NetworkPolicy: a Pod under a deny-all-egress
#      policy must not reach a server Pod that a Pod without one reaches;
#   2. applies examples/hello/experiment.k8s.yaml and waits for the Experiment's
#      status.phase to be Complete, printing progress;
#   3. checks: cellsDone == cellsTotal == tasks x subjects x repetitions, no failed cell;
#      the oracle subject's meanScore is 1 over all its cells; every Attempt has
#      status.result; every attempt Pod has automountServiceAccountToken: false and a
#      deny-all NetworkPolicy of its own name; `maka-eval results --cluster` reads it
#      (when a maka-eval command is at hand).
# Exits 0 when all hold, else 1 with the reason, the namespace's state and the
# operator's log. A passing run deletes its namespace; a failing one keeps it.
#
# Settings (environment):
#   MAKA_EVAL_KIND_CLUSTER   cluster name (default maka-eval; kubectl context kind-<name>)
#   MAKA_EVAL_E2E_NAMESPACE  namespace to use; must not exist (default maka-eval-e2e-<time>)
#   MAKA_EVAL_E2E_TIMEOUT    seconds to wait for the Experiment (default 900)
#   MAKA_EVAL_E2E_KEEP       set to 1 to keep the namespace after a passing run too
#   MAKA_EVAL_CLI            the maka-eval command (default: .venv/bin/maka-eval, else
#                            maka-eval on PATH, else the results check is skipped)
# See docs/kubernetes.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CLUSTER="${MAKA_EVAL_KIND_CLUSTER:-maka-eval}"
CONTEXT="kind-$CLUSTER"
NS="${MAKA_EVAL_E2E_NAMESPACE:-maka-eval-e2e-$(date +%Y%m%d-%H%M%S)}"
TIMEOUT="${MAKA_EVAL_E2E_TIMEOUT:-900}"
EXPERIMENT_FILE="$REPO/examples/hello/experiment.k8s.yaml"
EXPERIMENT=hello
ORACLE=oracle
TASK_IMAGE=localhost/maka-eval/debian-python:bookworm # has python3; the probe uses it
SYSTEM_NAMESPACE=maka-eval-system
DEPLOYMENT=maka-eval-operator
MANAGED=app.kubernetes.io/managed-by=maka-eval

log() { printf '[e2e] %s\n' "$*" >&2; }
fail() { printf '[e2e] FAIL: %s\n' "$*" >&2; exit 1; }
kc() { kubectl --context "$CONTEXT" "$@"; }
kn() { kubectl --context "$CONTEXT" -n "$NS" "$@"; }

TMP="$(mktemp -d)"
NS_CREATED=""

diagnostics() {
  log "---- state of namespace $NS"
  kn get experiments,cells,attempts,pods,networkpolicies -o wide >&2 || true
  kn get experiment "$EXPERIMENT" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
  kn get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 20 >&2 || true
  log "---- operator log (last 60 lines)"
  kc -n "$SYSTEM_NAMESPACE" logs "deployment/$DEPLOYMENT" --tail=60 >&2 || true
}

finish() {
  local rc=$?
  rm -rf "$TMP"
  if ((rc != 0)); then
    if [[ -n "$NS_CREATED" ]]; then
      diagnostics
      log "kept namespace $NS for a look; delete it with: kubectl --context $CONTEXT delete namespace $NS"
    fi
    log "end to end: FAILED"
  elif [[ -n "$NS_CREATED" && "${MAKA_EVAL_E2E_KEEP:-}" != 1 ]]; then
    kc delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    log "deleted namespace $NS (everything in it goes with it)"
  fi
  exit "$rc"
}
trap finish EXIT

# ---------------------------------------------------------------------------- cluster

ensure_cluster() {
  local tool
  for tool in docker kind kubectl; do
    command -v "$tool" >/dev/null 2>&1 \
      || fail "$tool is not on PATH; hack/kind-up.sh names what to install"
  done
  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER" \
      && kc -n "$SYSTEM_NAMESPACE" get "deployment/$DEPLOYMENT" >/dev/null 2>&1; then
    log "using kind cluster $CLUSTER (context $CONTEXT)"
  else
    log "kind cluster $CLUSTER or its operator is missing: running hack/kind-up.sh"
    "$HERE/kind-up.sh"
  fi
  kc -n "$SYSTEM_NAMESPACE" rollout status "deployment/$DEPLOYMENT" --timeout=180s >&2 \
    || fail "the operator (deployment $DEPLOYMENT in $SYSTEM_NAMESPACE) is not ready"
}

make_namespace() {
  if kc get namespace "$NS" >/dev/null 2>&1; then
    fail "namespace $NS exists; the end-to-end run needs a fresh one (MAKA_EVAL_E2E_NAMESPACE)"
  fi
  kc create namespace "$NS" >/dev/null
  NS_CREATED=1
  log "namespace $NS"
}

# ---------------------------------------------------------------------------- probe

# A client Pod that tries a TCP connection to $2:8080 and says "open" or "blocked".
probe_client() {
  local name="$1" ip="$2"
  kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: e2e-probe-$name
  labels: {e2e-probe: $name}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  enableServiceLinks: false
  containers:
    - name: probe
      image: $TASK_IMAGE
      command:
        - python3
        - -c
        - |
          import socket, time
          time.sleep(3)  # let the node's policy agent see this Pod
          try:
              socket.create_connection(("$ip", 8080), timeout=5).close()
              print("open")
          except OSError as exc:
              print("blocked", exc)
EOF
}

check_network_policy_enforced() {
  local t0=$SECONDS ip open denied
  log "NetworkPolicy probe: a deny-all-egress Pod must not reach a server another Pod reaches"
  kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: e2e-probe-server
  labels: {e2e-probe: server}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  containers:
    - name: server
      image: $TASK_IMAGE
      command: [python3, -m, http.server, "8080"]
      ports: [{containerPort: 8080}]
      readinessProbe:
        tcpSocket: {port: 8080}
        periodSeconds: 1
---
# The same shape as an attempt's policy: egress (and ingress) listed, no rule.
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: e2e-probe-deny
spec:
  podSelector:
    matchLabels: {e2e-probe: denied}
  policyTypes: [Ingress, Egress]
  ingress: []
  egress: []
EOF
  kn wait --for=condition=Ready pod/e2e-probe-server --timeout=120s >/dev/null \
    || fail "the probe's server Pod did not become ready"
  ip="$(kn get pod e2e-probe-server -o jsonpath='{.status.podIP}')"
  probe_client open "$ip"
  probe_client denied "$ip"
  kn wait --for=jsonpath='{.status.phase}'=Succeeded pod/e2e-probe-open pod/e2e-probe-denied \
    --timeout=120s >/dev/null || fail "the probe's client Pods did not finish"
  open="$(kn logs e2e-probe-open)"
  denied="$(kn logs e2e-probe-denied)"
  [[ "$open" == open* ]] \
    || fail "the probe is inconclusive: a Pod without any NetworkPolicy could not reach $ip:8080 ($open)"
  [[ "$denied" == blocked* ]] \
    || fail "NetworkPolicy is not enforced: a Pod under a deny-all-egress policy reached $ip:8080. Attempt Pods would have the network. kind v0.24.0+ with its default CNI (kindnet) enforces NetworkPolicy; a cluster made with disableDefaultCNI needs a CNI that does (Calico, Cilium)."
  kn delete pod e2e-probe-server e2e-probe-open e2e-probe-denied --wait=false >/dev/null
  log "NetworkPolicy enforced ($(( SECONDS - t0 )) s): without a policy '$open', under deny-all '$denied'"
}

# ---------------------------------------------------------------------------- experiment

# "phase|cellsDone|cellsTotal|cellsFailed|cellsRunning|attempts" of the Experiment.
experiment_status() {
  kn get experiment "$EXPERIMENT" -o \
    jsonpath='{.status.phase}|{.status.cellsDone}|{.status.cellsTotal}|{.status.cellsFailed}|{.status.cellsRunning}|{.status.attempts}' \
    2>/dev/null || echo "|||||"
}

run_experiment() {
  local t0=$SECONDS shown=-1000 phase done_ total failed running attempts
  kn apply -f "$EXPERIMENT_FILE" >&2
  log "waiting up to $TIMEOUT s for Experiment $EXPERIMENT to be Complete"
  while :; do
    IFS='|' read -r phase done_ total failed running attempts <<<"$(experiment_status)"
    log "$(( SECONDS - t0 )) s: phase ${phase:-<none>}, cells done ${done_:-0}/${total:-?}, running ${running:-0}, failed ${failed:-0}, attempts ${attempts:-0}"
    if (( SECONDS - shown >= 30 )); then
      kn get experiments,cells,attempts >&2 || true
      shown=$SECONDS
    fi
    case "$phase" in
      Complete) break ;;
      Failed | BudgetExhausted) fail "Experiment $EXPERIMENT ended in phase $phase" ;;
    esac
    (( SECONDS - t0 < TIMEOUT )) || fail "Experiment $EXPERIMENT was not Complete after $TIMEOUT s (phase ${phase:-<none>})"
    sleep 5
  done
  kn get experiments,cells,attempts >&2
  log "Experiment $EXPERIMENT Complete in $(( SECONDS - t0 )) s"
}

# ---------------------------------------------------------------------------- checks

is_one() { awk -v v="$1" 'BEGIN { exit !(v != "" && v + 0 == 1) }'; }

check_counts() {
  local tasks subjects reps expected phase done_ total failed running attempts
  tasks="$(kn get experiment "$EXPERIMENT" -o jsonpath='{.spec.tasks[*].id}' | wc -w)"
  subjects="$(kn get experiment "$EXPERIMENT" -o jsonpath='{.spec.subjects[*].id}' | wc -w)"
  reps="$(kn get experiment "$EXPERIMENT" -o jsonpath='{.spec.repetitions}')"
  expected=$(( tasks * subjects * reps ))
  IFS='|' read -r phase done_ total failed running attempts <<<"$(experiment_status)"
  [[ "$total" == "$expected" ]] \
    || fail "status.cellsTotal is '$total', expected $expected ($tasks tasks x $subjects subjects x $reps repetitions)"
  [[ "$done_" == "$total" ]] || fail "status.cellsDone ($done_) != status.cellsTotal ($total)"
  [[ "${failed:-0}" == 0 ]] || fail "status.cellsFailed is $failed"
  (( ${attempts:-0} >= total )) || fail "status.attempts ($attempts) < cells ($total)"
  log "ok: $done_/$total cells done, none failed, $attempts attempts (phase $phase)"

  local mean n
  mean="$(kn get experiment "$EXPERIMENT" -o jsonpath="{.status.subjects[?(@.subjectId==\"$ORACLE\")].meanScore}")"
  n="$(kn get experiment "$EXPERIMENT" -o jsonpath="{.status.subjects[?(@.subjectId==\"$ORACLE\")].n}")"
  is_one "$mean" || fail "subject $ORACLE: meanScore is '${mean:-<none>}', expected 1 (its solutions solve every task)"
  [[ "$n" == $(( tasks * reps )) ]] || fail "subject $ORACLE: n is '$n', expected $(( tasks * reps ))"
  log "ok: subject $ORACLE has meanScore $mean over $n cells"
}

check_attempts_and_pods() {
  local attempts pods policies line name result automount types egress missing_pods=0 count=0
  attempts="$(kn get attempts -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.status.result.status}{"\n"}{end}')"
  pods="$(kn get pods -l "$MANAGED" -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.spec.automountServiceAccountToken}{"\n"}{end}')"
  policies="$(kn get networkpolicies -l "$MANAGED" -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.spec.policyTypes}{"|"}{.spec.egress}{"\n"}{end}')"
  [[ -n "$attempts" ]] || fail "no Attempt objects in $NS"

  while IFS='|' read -r name result; do
    [[ -n "$name" ]] || continue
    count=$((count + 1))
    [[ -n "$result" ]] || fail "Attempt $name has no status.result"
    grep -q "^$name|" <<<"$pods" || missing_pods=$((missing_pods + 1))
  done <<<"$attempts"
  log "ok: all $count Attempts have status.result"
  # The operator deletes an attempt's Pod only when it was stuck pulling its image (an
  # infrastructure failure that a new Attempt replaced); here every image is loaded.
  ((missing_pods == 0)) || fail "$missing_pods Attempt(s) have no Pod"

  count=0
  while IFS='|' read -r name automount; do
    [[ -n "$name" ]] || continue
    count=$((count + 1))
    [[ "$automount" == false ]] \
      || fail "Pod $name: automountServiceAccountToken is '${automount:-<unset>}', expected false"
    line="$(grep "^$name|" <<<"$policies" || true)"
    [[ -n "$line" ]] || fail "Pod $name has no NetworkPolicy named $name"
    IFS='|' read -r _ types egress <<<"$line"
    [[ "$types" == *Egress* ]] || fail "NetworkPolicy $name: policyTypes $types lacks Egress"
    [[ -z "$egress" || "$egress" == "[]" ]] || fail "NetworkPolicy $name allows egress: $egress"
  done <<<"$pods"
  ((count > 0)) || fail "no attempt Pods (label $MANAGED) in $NS"
  log "ok: all $count attempt Pods have automountServiceAccountToken false and a deny-all-egress NetworkPolicy of their name"
}

maka_eval_cli() {
  if [[ -n "${MAKA_EVAL_CLI:-}" ]]; then
    echo "$MAKA_EVAL_CLI"
  elif [[ -x "$REPO/.venv/bin/maka-eval" ]]; then
    echo "$REPO/.venv/bin/maka-eval"
  else
    command -v maka-eval || true
  fi
}

check_results_command() {
  local cli
  cli="$(maka_eval_cli)"
  if [[ -z "$cli" ]]; then
    log "skipped: maka-eval results --cluster (no maka-eval command; set MAKA_EVAL_CLI)"
    return
  fi
  kind get kubeconfig --name "$CLUSTER" >"$TMP/kubeconfig"
  "$cli" results --cluster "$NS/$EXPERIMENT" --kubeconfig "$TMP/kubeconfig" >&2 \
    || fail "maka-eval results --cluster $NS/$EXPERIMENT failed"
  log "ok: maka-eval results --cluster $NS/$EXPERIMENT"
}

# ---------------------------------------------------------------------------- main

T0=$SECONDS
ensure_cluster
make_namespace
check_network_policy_enforced
run_experiment
check_counts
check_attempts_and_pods
check_results_command
log "end to end: PASSED in $(( SECONDS - T0 )) s"
