"""The operator at scale: a 10,000-cell experiment against a real API server.

The control plane is hack/envtest.sh's (real etcd, kube-apiserver, controller-manager and
scheduler). ``maka-eval operator --namespace NS --metrics-port PORT`` runs as its own
process, exactly as deployed. The benchmark plays the kubelet of a fake Node of its own
(``maka-eval-bench-node``: Ready, huge capacity, tainted ``eval.maka.dev/bench:NoSchedule``
so that no other Pod lands on it): it watches the Pods the real scheduler binds to that
node and marks each one Succeeded at once, with a valid result kernel as the subject
container's termination message, from several threads.

The experiment is examples/hello/experiment.k8s.yaml with 50 task ids (no folders: the
operator never reads them, the relay in the Pod would), two subjects (oracle, noop) and
as many repetitions as make ``--cells``; its Pods select the bench node and tolerate its
taint; ``execution.maxConcurrentTaskGroups`` is ``--concurrency``.

Figures (the bench's clock is time.monotonic() in this process):

* time until all Cells exist: from the POST of the Experiment to this process seeing the
  last Cell's ADDED watch event;
* operator API writes per attempt lifecycle, by verb: the operator's own counter
  ``maka_eval_api_writes_total{verb}`` over the run, minus one POST per Cell, the
  Experiment status PATCHes (counted from the Experiment's watch: one MODIFIED event per
  write) and the operator's Events (listed at the end), divided by the attempts
  finished. Those three are reported separately. The API server's own
  ``apiserver_request_total`` gives the same writes by kind (cluster-wide);
* periodic polling: the operator's LIST requests from the end of its start-up (its own
  LIST of each kind, then kopf's LIST and WATCH of each) to the end of the idle window
  after completion, as the API server counts them. The operator runs as a ServiceAccount
  of its own, and FlowSchemas that match only it (one per kind of verb, at the `exempt`
  priority level: nothing is queued or limited) make the API server count its requests
  apart from every other client's (apiserver_flowcontrol_dispatched_requests_total). The
  per-resource, every-client view of apiserver_request_total is printed for comparison
  (the bench's own watches are cluster-scoped, so their LISTs are not in it);
* operator peak RSS: VmHWM of the operator process (/proc/PID/status);
* Pod termination -> Cell status: from this process's status PATCH of the Pod returning
  to this process seeing the Cell's status.selectedAttempt appear (watch), p50/p95.

The exit status is 0 whatever the verdicts: a benchmark, not a test.

    .venv/bin/python bench/operator_scale.py                  # 10,000 cells
    .venv/bin/python bench/operator_scale.py --cells 400      # a quick one
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.k8s import names
from maka_eval.k8s.render import SUBJECT_CONTAINER

REPO = Path(__file__).resolve().parents[1]
ENVTEST = REPO / "hack" / "envtest.sh"
EXAMPLE = REPO / "examples" / "hello" / "experiment.k8s.yaml"
NODE_TEMPLATE = REPO / "hack" / "envtest" / "node.json"
MAKA_EVAL = Path(sys.executable).parent / "maka-eval"
GROUP = "eval.maka.dev"
VERSION = "v1alpha1"
BENCH_TAINT = f"{GROUP}/bench"
MERGE_PATCH = "application/merge-patch+json"

TARGET_CELLS_SEC = 60.0
TARGET_WRITES = 8.0
FLOOR_WRITES = 6.0
TARGET_RSS_MB = 300.0
OPERATOR_KINDS = ("experiments", "cells", "attempts", "pods")
"""What the operator watches (one LIST each at start-up by itself, one by kopf)."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# ---------------------------------------------------------------------------- the API


class Api:
    """JSON over the kubernetes client's connection pool (thread-safe)."""

    def __init__(self, kubeconfig: Path) -> None:
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 64
        self.client = k8s_client.ApiClient(configuration)
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        timeout: Any = 60,
    ) -> Any:
        verb, url, headers, payload, _ = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.client.call_api(
            verb, url, header_params=headers, body=payload, _request_timeout=timeout
        )

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
        what: str = "",
    ) -> Any:
        """The decoded answer; None for a status in `ok`; retries 429/5xx/dropped."""
        delay = 0.1
        for attempt in range(10):
            try:
                response = self._send(method, path, body, query, content_type)
                data = response.read()
                status = response.status
            except ApiException as exc:
                status, data = exc.status or 0, (exc.body or "")
            except (HTTPError, OSError):
                if attempt == 9:
                    raise
                status, data = 0, ""
            with self._lock:
                self.requests[what or method] += 1
            if status and status < 400:
                return json.loads(data) if data else {}
            if status in ok:
                return None
            if status and status != 429 and status < 500:
                text = data.decode() if isinstance(data, bytes) else str(data)
                raise RuntimeError(f"{method} {path}: {status}: {text[:500]}")
            time.sleep(delay)
            delay = min(delay * 2, 3.0)
        raise RuntimeError(f"{method} {path}: the API server kept failing")

    def text(self, path: str) -> str:
        response = self._send("GET", path, timeout=60)
        data = response.read()
        return data.decode() if isinstance(data, bytes) else str(data)

    def stream(self, path: str, query: list[tuple[str, str]], timeout: float) -> Iterator[Any]:
        """The events of one WATCH request, decoded, until the server ends it."""
        response = self._send("GET", path, query=query, timeout=(10, timeout + 30))
        if response.status == 410:
            raise Expired(path)
        if response.status >= 400:
            raise RuntimeError(f"WATCH {path}: {response.status}: {response.read()[:300]!r}")
        raw = response.response
        buffer = b""
        try:
            for segment in raw.stream(amt=None, decode_content=False):
                buffer += segment
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            raw.release_conn()


class Expired(Exception):
    """A watch's resourceVersion is too old (410 Gone): LIST again."""


class Watcher(threading.Thread):
    """One LIST, then WATCH from its resourceVersion for good (LIST again only on 410).

    `on_event(type, object)` runs in this thread; `lists` counts this watcher's LISTs.
    """

    def __init__(
        self,
        api: Api,
        path: str,
        query: list[tuple[str, str]],
        on_event: Callable[[str, dict[str, Any]], None],
        name: str,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.api = api
        self.path = path
        self.query = query
        self.on_event = on_event
        self.lists = 0
        self.watches = 0
        self.listed = threading.Event()
        self.stopping = threading.Event()

    def _list(self) -> str:
        token = ""
        while True:
            page = self.api.call(
                "GET",
                self.path,
                query=[*self.query, ("limit", "500"), *([("continue", token)] if token else [])],
                what="bench LIST",
            )
            self.lists += 1
            for item in page.get("items") or ():
                self.on_event("ADDED", item)
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                self.listed.set()
                return str(page["metadata"]["resourceVersion"])

    def run(self) -> None:
        version = self._list()
        while not self.stopping.is_set():
            query = [
                *self.query,
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("resourceVersion", version),
                ("timeoutSeconds", "120"),
            ]
            self.watches += 1
            try:
                for event in self.api.stream(self.path, query, 120):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Expired(self.path)
                        break
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind != "BOOKMARK":
                        self.on_event(str(kind), obj)
            except Expired:
                log(f"{self.name}: watch expired (410): LIST again")
                version = self._list()
            except Exception as exc:  # keep watching, from the last version seen
                if not self.stopping.is_set():
                    log(f"{self.name}: watch failed ({exc}); watching again")
                    time.sleep(0.5)


# ---------------------------------------------------------------------------- metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, metric: str) -> Iterator[tuple[dict[str, str], float]]:
    for line in text.splitlines():
        if not line.startswith(metric):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != metric:
            continue
        yield dict(_LABEL.findall(match.group(2) or "")), float(match.group(3))


RequestKey = tuple[str, str, str, str, str]
"""(verb, group, resource, subresource, scope)."""


def apiserver_requests(text: str) -> Counter[RequestKey]:
    """apiserver_request_total of a /metrics text, by (verb, group, resource, ...)."""
    counts: Counter[RequestKey] = Counter()
    for labels, value in samples(text, "apiserver_request_total"):
        key = (
            labels.get("verb", ""),
            labels.get("group", ""),
            labels.get("resource", ""),
            labels.get("subresource", ""),
            labels.get("scope", ""),
        )
        counts[key] += value
    return counts


def flow_schema_counts(text: str, schemas: dict[str, str]) -> dict[str, float]:
    """apiserver_flowcontrol_dispatched_requests_total of each flow schema, by our label."""
    by_name = {
        labels.get("flow_schema", ""): value
        for labels, value in samples(text, "apiserver_flowcontrol_dispatched_requests_total")
    }
    return {label: by_name.get(name, 0.0) for label, name in schemas.items()}


def operator_metrics(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    writes = {
        labels["verb"]: value for labels, value in samples(text, "maka_eval_api_writes_total")
    }
    passes = sum(v for _, v in samples(text, "maka_eval_reconcile_passes_total"))
    errors = sum(v for _, v in samples(text, "maka_eval_reconcile_errors_total"))
    seconds = sum(v for _, v in samples(text, "maka_eval_reconcile_seconds_sum"))
    return {"writes": writes, "passes": passes, "errors": errors, "pass_seconds": seconds}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its reaped children, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def control_plane_pids() -> dict[str, int]:
    """The envtest components' pids (hack/envtest.sh records them), by name."""
    state = Path(os.environ.get("MAKA_EVAL_ENVTEST_DIR") or "/tmp/maka-eval-envtest")
    out = {}
    for name in ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager"):
        with contextlib.suppress(OSError, ValueError):
            out[name] = int((state / f"{name}.pid").read_text().strip())
    return out


def proc_status(pid: int, field: str) -> float:
    """A kB field of /proc/PID/status, in MB."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------------------- the bench


def kubeconfig_path(given: str | None) -> Path:
    if given:
        return Path(given)
    env = os.environ.get("KUBECONFIG")
    status = subprocess.run([str(ENVTEST), "status"], capture_output=True, text=True)
    if env and status.returncode == 0:
        return Path(env)
    log("starting hack/envtest.sh (or finding it running)")
    started = subprocess.run([str(ENVTEST), "start"], capture_output=True, text=True)
    last = (started.stdout.strip().splitlines() or [""])[-1]
    if started.returncode != 0 or not last.startswith("export KUBECONFIG="):
        sys.exit(f"hack/envtest.sh start failed:\n{started.stderr[-3000:]}")
    return Path(last.removeprefix("export KUBECONFIG="))


def shape(cells: int) -> tuple[int, int]:
    """(tasks, repetitions) for `cells` cells of two subjects: up to 50 tasks."""
    if cells < 2 or cells % 2:
        sys.exit("--cells must be an even number (two subjects per task group)")
    groups = cells // 2
    tasks = max(t for t in range(1, min(50, groups) + 1) if groups % t == 0)
    return tasks, groups // tasks


def experiment_document(
    name: str, namespace: str, node: str, cells: int, concurrency: int
) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    spec = doc["spec"]
    tasks, repetitions = shape(cells)
    # Task ids without a path: the folder is the id; the operator never reads it.
    spec["tasks"] = [{"id": f"t{i:03d}"} for i in range(tasks)]
    spec["subjects"] = [s for s in spec["subjects"] if s["id"] in ("oracle", "noop")]
    spec["repetitions"] = repetitions
    spec["execution"]["maxConcurrentTaskGroups"] = concurrency
    config = spec["executor"]["config"]
    config["nodeSelector"] = {"kubernetes.io/hostname": node}
    config["tolerations"] = [{"key": BENCH_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    return doc


def result_kernel() -> str:
    return ResultKernel(
        status=AttemptStatus.COMPLETED,
        score=1.0,
        usage=None,
        cost_usd=None,
        duration_sec=0.01,
        artifacts=(),
        status_source=StatusSource.FRAME,
        reason="the subject reported success (bench/operator_scale.py)",
        isolation="container",
    ).to_json()


def ensure_crds(api: Api, kubeconfig: Path) -> None:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/experiments.{GROUP}"
    if api.call("GET", path, ok=(404,)) is not None:
        return
    log("installing the CRDs (kubectl apply -f crds/)")
    subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", "apply", "-f", str(REPO / "crds")], check=True
    )
    subprocess.run(
        [
            "kubectl",
            f"--kubeconfig={kubeconfig}",
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
        check=True,
        capture_output=True,
    )


def ensure_node(api: Api, node: str) -> None:
    """The bench's own fake Node (hack/envtest.sh create_node's shape), tainted."""
    text = (
        NODE_TEMPLATE.read_text()
        .replace("@NODE_NAME@", node)
        .replace("@NOW@", stamp())
        .replace("@K8S_VERSION@", os.environ.get("MAKA_EVAL_K8S_VERSION", "v1.37.2"))
    )
    body = json.loads(text)
    body["metadata"]["labels"]["eval.maka.dev/bench"] = "true"
    body["metadata"]["labels"].pop("maka-eval.dev/envtest", None)
    big = {"cpu": "1000", "memory": "4Ti", "pods": "100000", "ephemeral-storage": "100Ti"}
    body["status"]["capacity"] = dict(big)
    body["status"]["allocatable"] = dict(big)
    for condition in body["status"]["conditions"]:
        condition["message"] = "fake node of bench/operator_scale.py, which plays its kubelet"
    api.call("POST", "/api/v1/nodes", body, ok=(409,))
    api.call(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": body["status"]},
        content_type=MERGE_PATCH,
    )
    # Replaces the not-ready taint of the TaintNodesByCondition admission plugin (nothing
    # lifts it here) with the bench's own: only the bench's Pods tolerate it.
    taint = {"key": BENCH_TAINT, "value": "true", "effect": "NoSchedule"}
    api.call(
        "PATCH", f"/api/v1/nodes/{node}", {"spec": {"taints": [taint]}}, content_type=MERGE_PATCH
    )


class OperatorIdentity:
    """The operator's own ServiceAccount, and FlowSchemas that count its requests.

    The operator runs with a kubeconfig holding a token of ServiceAccount
    `maka-eval-operator` in the bench's namespace (bound to cluster-admin), so that API
    Priority and Fairness can tell its requests from everyone else's: one FlowSchema per
    kind of verb matches that ServiceAccount only and sends it to the `exempt` priority
    level (like the admin user's requests: nothing is queued or limited), and the API
    server counts every request it dispatches per FlowSchema
    (apiserver_flowcontrol_dispatched_requests_total). A count that no other client adds
    to, whatever else runs against the API server.
    """

    VERBS = {
        "list": ["list"],
        "watch": ["watch"],
        "get": ["get"],
        "write": ["create", "update", "patch", "delete", "deletecollection"],
    }
    ACCOUNT = "maka-eval-operator"

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.binding = f"maka-eval-bench-{namespace}"
        self.schemas = {verb: f"maka-eval-bench-{namespace}-{verb}" for verb in self.VERBS}

    def create(self, admin_kubeconfig: Path, target: Path) -> Path:
        """Create the ServiceAccount, its binding and the FlowSchemas; write its kubeconfig."""
        ns = self.namespace
        account = {"metadata": {"name": self.ACCOUNT, "namespace": ns}}
        self.api.call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", account, ok=(409,))
        rbac = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
        binding = {
            "metadata": {"name": self.binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": self.ACCOUNT, "namespace": ns}],
        }
        self.api.call("POST", rbac, binding, ok=(409,))
        for verb, name in self.schemas.items():
            schema = {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": name},
                "spec": {
                    "priorityLevelConfiguration": {"name": "exempt"},
                    "matchingPrecedence": 50,
                    "rules": [
                        {
                            "subjects": [
                                {
                                    "kind": "ServiceAccount",
                                    "serviceAccount": {"name": self.ACCOUNT, "namespace": ns},
                                }
                            ],
                            "resourceRules": [
                                {
                                    "verbs": self.VERBS[verb],
                                    "apiGroups": ["*"],
                                    "resources": ["*"],
                                    "clusterScope": True,
                                    "namespaces": ["*"],
                                }
                            ],
                        }
                    ],
                },
            }
            self.api.call(
                "POST", "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", schema, ok=(409,)
            )
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 24 * 3600},
        }
        token = self.api.call(
            "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{self.ACCOUNT}/token", request
        )["status"]["token"]
        config = yaml.safe_load(admin_kubeconfig.read_text())
        context = (
            next(c for c in config["contexts"] if c["name"] == config.get("current-context"))
            if config.get("current-context")
            else config["contexts"][0]
        )
        cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
        target.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [cluster],
                    "users": [{"name": self.ACCOUNT, "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "operator",
                            "context": {
                                "cluster": cluster["name"],
                                "user": self.ACCOUNT,
                                "namespace": ns,
                            },
                        }
                    ],
                    "current-context": "operator",
                }
            )
        )
        target.chmod(0o600)
        return target

    def delete(self) -> None:
        for name in self.schemas.values():
            self.api.call(
                "DELETE", f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{name}", ok=(404,)
            )
        self.api.call(
            "DELETE",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{self.binding}",
            ok=(404,),
        )


class Kubelet:
    """Marks every Pod bound to `node` Succeeded, with `kernel` as its termination message."""

    def __init__(self, api: Api, node: str, kernel: str, threads: int, delay: float) -> None:
        self.api = api
        self.node = node
        self.kernel = kernel
        self.delay = delay
        self.work: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: set[str] = set()
        self.terminated: dict[str, float] = {}  # "ns/name" -> monotonic time of the PATCH
        self._lock = threading.Lock()
        self.watcher = Watcher(
            api,
            "/api/v1/pods",
            [("fieldSelector", f"spec.nodeName={node}")],
            self.on_event,
            "bench-kubelet",
        )
        self.threads = [
            threading.Thread(target=self.worker, name=f"kubelet-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> Kubelet:
        for thread in self.threads:
            thread.start()
        self.watcher.start()
        return self

    def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}/{meta['uid']}"
        if kind == "DELETED":
            return
        if meta.get("deletionTimestamp"):
            self.work.put(pod)  # a kubelet confirms the deletion once its containers stop
            return
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        with self._lock:
            if key in self.seen:
                return
            self.seen.add(key)
        self.work.put(pod)

    def worker(self) -> None:
        while True:
            pod = self.work.get()
            meta = pod["metadata"]
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            try:
                if meta.get("deletionTimestamp"):
                    self.api.call(
                        "DELETE",
                        path,
                        {"gracePeriodSeconds": 0},
                        ok=(404, 409),
                        what="bench DELETE pod",
                    )
                    continue
                if self.delay:
                    time.sleep(self.delay)
                self.api.call(
                    "PATCH",
                    f"{path}/status",
                    self.status(pod),
                    content_type=MERGE_PATCH,
                    ok=(404,),
                    what="bench PATCH pod/status",
                )
                with self._lock:
                    self.terminated[f"{meta['namespace']}/{meta['name']}"] = time.monotonic()
            except Exception as exc:
                log(f"kubelet: {meta['name']}: {exc}")

    def status(self, pod: dict[str, Any]) -> dict[str, Any]:
        now = stamp()
        subject = next(c for c in pod["spec"]["containers"] if c["name"] == SUBJECT_CONTAINER)
        return {
            "status": {
                "phase": "Succeeded",
                "startTime": now,
                "containerStatuses": [
                    {
                        "name": SUBJECT_CONTAINER,
                        "image": subject["image"],
                        "imageID": "",
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "startedAt": now,
                                "finishedAt": now,
                                "message": self.kernel,
                            }
                        },
                    }
                ],
            }
        }


class Observer:
    """Watches the experiment's Cells and the Experiment (cluster-scoped requests)."""

    def __init__(self, api: Api, namespace: str, experiment: str, cells: int) -> None:
        self.total = cells
        self.namespace = namespace
        self.cell_seen: dict[str, float] = {}
        self.cell_selected: dict[str, tuple[float, int]] = {}
        self.all_cells_at: float | None = None
        self.all_selected_at: float | None = None
        self.experiment: dict[str, Any] = {}
        self.experiment_writes = 0  # MODIFIED events of the Experiment
        self.finished_at: float | None = None
        self.finished = threading.Event()
        self._versions: set[str] = set()
        selector = f"{names.LABEL_EXPERIMENT}={experiment}"
        self.cells = Watcher(
            api,
            f"/apis/{GROUP}/{VERSION}/cells",
            [("labelSelector", selector), ("fieldSelector", f"metadata.namespace={namespace}")],
            self.on_cell,
            "bench-cells",
        )
        self.experiments = Watcher(
            api,
            f"/apis/{GROUP}/{VERSION}/experiments",
            [("fieldSelector", f"metadata.namespace={namespace},metadata.name={experiment}")],
            self.on_experiment,
            "bench-experiment",
        )

    def start(self) -> Observer:
        self.cells.start()
        self.experiments.start()
        self.cells.listed.wait(30)
        self.experiments.listed.wait(30)
        return self

    def on_cell(self, kind: str, cell: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        now = time.monotonic()
        name = cell["metadata"]["name"]
        if name not in self.cell_seen:
            self.cell_seen[name] = now
            if len(self.cell_seen) == self.total:
                self.all_cells_at = now
        selected = (cell.get("status") or {}).get("selectedAttempt")
        if selected and name not in self.cell_selected:
            self.cell_selected[name] = (now, int(selected))
            if len(self.cell_selected) == self.total:
                self.all_selected_at = now
                self._check()

    def on_experiment(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        version = obj["metadata"]["resourceVersion"]
        if kind == "MODIFIED" and version not in self._versions:
            self.experiment_writes += 1
        self._versions.add(version)
        self.experiment = obj
        self._check()

    def _check(self) -> None:
        phase = (self.experiment.get("status") or {}).get("phase")
        if phase in ("Failed", "BudgetExhausted") or (
            phase == "Complete" and self.all_selected_at is not None
        ):
            if self.finished_at is None:
                self.finished_at = time.monotonic()
            self.finished.set()


class OperatorProcess:
    def __init__(self, kubeconfig: Path, namespace: str, port: int, log_path: Path) -> None:
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.log_path = log_path
        with log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [str(MAKA_EVAL), "operator", "--namespace", namespace, "--metrics-port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.pid = self.process.pid
        self.port = port

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return True
        time.sleep(interval)
    return False


def profile_summary(path: Path, top: int = 25) -> str:
    """The hottest maka_eval/kopf frames of py-spy's raw (collapsed) output."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    lines = [f"py-spy: {total} samples; inclusive share of the hottest project frames:"]
    shown = 0
    for frame, count in inclusive.most_common():
        if "maka_eval" in frame or "kopf" in frame:
            lines.append(f"  {100 * count / total:5.1f}%  {frame}")
            shown += 1
            if shown == top:
                break
    lines.append("own (leaf) time:")
    for frame, count in own.most_common(12):
        lines.append(f"  {100 * count / total:5.1f}%  {frame}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    kubeconfig = kubeconfig_path(args.kubeconfig)
    api = Api(kubeconfig)
    namespace = args.namespace or f"maka-eval-bench-{uuid.uuid4().hex[:6]}"
    experiment_name = "scale"
    tasks, repetitions = shape(args.cells)
    work_dir = Path(tempfile.mkdtemp(prefix="maka-eval-operator-scale-"))
    log(
        f"{args.cells} cells = {tasks} tasks x {repetitions} repetitions x 2 subjects; "
        f"maxConcurrentTaskGroups {args.concurrency}; namespace {namespace}; "
        f"node {args.node}; logs in {work_dir}"
    )
    ensure_crds(api, kubeconfig)
    ensure_node(api, args.node)
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}, ok=(409,))

    identity = OperatorIdentity(api, namespace)
    operator: OperatorProcess | None = None
    kubelet = Kubelet(api, args.node, result_kernel(), args.kubelet_threads, args.kubelet_delay)
    profiler: subprocess.Popen[bytes] | None = None
    try:
        kubelet.start()
        observer = Observer(api, namespace, experiment_name, args.cells).start()
        kubelet.watcher.listed.wait(30)

        # -- the operator, and the end of its start-up --------------------------------
        operator_kubeconfig = identity.create(kubeconfig, work_dir / "operator.kubeconfig")
        port = args.metrics_port or free_port()
        operator = OperatorProcess(operator_kubeconfig, namespace, port, work_dir / "operator.log")
        log(f"operator pid {operator.pid}, metrics on :{port}")
        startup: dict[str, float] = {}

        def started() -> bool:
            # Start-up: one LIST of each watched kind by the operator itself, then kopf's
            # LIST and WATCH of each.
            assert operator is not None
            if not operator.alive():
                raise SystemExit(f"the operator exited:\n{operator.tail()}")
            operator_metrics(port)
            startup.update(flow_schema_counts(api.text("/metrics"), identity.schemas))
            kinds = len(OPERATOR_KINDS)
            return startup["list"] >= 2 * kinds and startup["watch"] >= kinds

        if not wait_until(started, 90, 1.0):
            log(f"WARNING: the operator's start-up not seen in 90 s: requests {startup}")
        time.sleep(2)
        if args.profile:
            profiler = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(operator.pid),
                    "--rate",
                    "50",
                    "--format",
                    "raw",
                    "--nonblocking",
                    "-o",
                    str(args.profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        base_text = api.text("/metrics")
        base_requests = apiserver_requests(base_text)
        base_flows = flow_schema_counts(base_text, identity.schemas)
        base_operator = operator_metrics(port)
        bench_lists_before = (
            kubelet.watcher.lists + observer.cells.lists + observer.experiments.lists
        )

        # -- the run ----------------------------------------------------------------
        doc = experiment_document(
            experiment_name, namespace, args.node, args.cells, args.concurrency
        )
        pids = {"operator": operator.pid, "bench": os.getpid(), **control_plane_pids()}

        def cpu() -> dict[str, float]:
            return {name: cpu_seconds(pid) for name, pid in pids.items()}

        cpu_marks: list[tuple[str, float, dict[str, float]]] = []
        t0 = time.monotonic()
        cpu_marks.append(("start", t0, cpu()))
        api.call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/experiments", doc)
        rss: list[tuple[float, float]] = []
        next_report = t0 + 10
        while not observer.finished.wait(1.0):
            now = time.monotonic()
            rss.append((now - t0, proc_status(operator.pid, "VmRSS")))
            if observer.all_cells_at is not None and len(cpu_marks) == 1:
                cpu_marks.append(("all Cells exist", now, cpu()))
            if not operator.alive():
                raise SystemExit(f"the operator exited:\n{operator.tail()}")
            if now - t0 > args.timeout:
                log("timed out")
                break
            if now >= next_report:
                next_report = now + 10
                status = observer.experiment.get("status") or {}
                log(
                    f"{now - t0:6.0f}s  cells {len(observer.cell_seen)}/{args.cells}  "
                    f"pods ended {len(kubelet.terminated)}  "
                    f"cells with a result {len(observer.cell_selected)}  "
                    f"phase {status.get('phase')}  running {status.get('attemptsRunning')}  "
                    f"operator RSS {rss[-1][1]:.0f} MB"
                )
        finished_at = observer.finished_at or time.monotonic()
        cpu_marks.append(("complete", time.monotonic(), cpu()))
        # The operator counts a pass's writes when the pass returns, just after its last
        # write (the one this process saw): wait for its counters to stand still.
        run_operator = operator_metrics(port)
        for _ in range(60):
            time.sleep(0.5)
            again = operator_metrics(port)
            if again == run_operator:
                break
            run_operator = again
        log(f"finished after {finished_at - t0:.1f}s; idle for {args.idle:g}s")
        time.sleep(args.idle)
        end_operator = operator_metrics(port)
        end_text = api.text("/metrics")
        end_requests = apiserver_requests(end_text)
        end_flows = flow_schema_counts(end_text, identity.schemas)
        peak_rss = proc_status(operator.pid, "VmHWM")
        bench_lists = (
            kubelet.watcher.lists + observer.cells.lists + observer.experiments.lists
        ) - bench_lists_before
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(timeout=60)
        events = api.call(
            "GET", f"/api/v1/namespaces/{namespace}/events", what="bench LIST (after)"
        )
        operator_events = sum(
            1
            for e in events.get("items") or ()
            if (e.get("source") or {}).get("component") == "maka-eval-operator"
        )
        report(
            args=args,
            t0=t0,
            finished_at=finished_at,
            observer=observer,
            kubelet=kubelet,
            base_operator=base_operator,
            run_operator=run_operator,
            end_operator=end_operator,
            base_requests=base_requests,
            end_requests=end_requests,
            startup_flows=base_flows,
            flows={k: end_flows[k] - base_flows[k] for k in end_flows},
            bench_lists=bench_lists,
            peak_rss=peak_rss,
            rss=rss,
            operator_events=operator_events,
            namespace=namespace,
            cpu_marks=cpu_marks,
        )
        if args.profile:
            print()
            print(profile_summary(Path(args.profile)))
    finally:
        if profiler is not None and profiler.poll() is None:
            profiler.kill()
        if operator is not None:
            operator.stop()
        identity.delete()
        (work_dir / "operator.kubeconfig").unlink(missing_ok=True)
        if args.keep:
            log(f"kept namespace {namespace} and node {args.node} (--keep)")
        else:
            cleanup(api, namespace, args.node)


TEARDOWN = (
    "/api/v1/namespaces/{ns}/pods",
    "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/attempts",
    f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/cells",
    f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/experiments",
)
"""What the experiment made, dependents before their owners."""


def delete_collection(api: Api, path: str) -> None:
    """DELETE a collection until nothing is left (one request may time out on 10,000)."""
    options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    for _ in range(60):
        with contextlib.suppress(RuntimeError):
            api.call("DELETE", path, options)
        if not api.call("GET", path, query=[("limit", "1")]).get("items"):
            return
        time.sleep(1.0)


def cleanup(api: Api, namespace: str, node: str) -> None:
    """Delete what the experiment made, then the namespace, then the node.

    Dependents go before their owners (Pods and NetworkPolicies, Attempts, Cells, the
    Experiment). Deleting the namespace alone removes owners first, and the garbage
    collector of the shared control plane then checks every orphaned dependent, one
    request each: tens of thousands after a 10,000-cell run, a backlog of many minutes
    in which the test suite's own owned objects would wait to be collected.
    """
    log(f"deleting the experiment's objects, dependents first, and namespace {namespace}")
    for path in TEARDOWN:
        delete_collection(api, path.format(ns=namespace))
    api.call("DELETE", f"/api/v1/namespaces/{namespace}", ok=(404,))
    gone = wait_until(
        lambda: api.call("GET", f"/api/v1/namespaces/{namespace}", ok=(404,)) is None, 900, 2.0
    )
    if not gone:
        log(f"namespace {namespace} is still terminating; node {node} kept for its Pods")
        return
    left = api.call("GET", "/api/v1/pods", query=[("fieldSelector", f"spec.nodeName={node}")])
    if left.get("items"):
        log(f"node {node} kept: {len(left['items'])} other Pod(s) on it")
        return
    api.call("DELETE", f"/api/v1/nodes/{node}", ok=(404,))
    log(f"deleted namespace {namespace} and node {node}")


def report(
    *,
    args: argparse.Namespace,
    t0: float,
    finished_at: float,
    observer: Observer,
    kubelet: Kubelet,
    base_operator: dict[str, Any],
    run_operator: dict[str, Any],
    end_operator: dict[str, Any],
    base_requests: Counter[RequestKey],
    end_requests: Counter[RequestKey],
    startup_flows: dict[str, float],
    flows: dict[str, float],
    bench_lists: int,
    peak_rss: float,
    rss: list[tuple[float, float]],
    operator_events: int,
    namespace: str,
    cpu_marks: list[tuple[str, float, dict[str, float]]],
) -> None:
    status = observer.experiment.get("status") or {}
    attempts = int(status.get("attempts") or 0)
    done = int(status.get("cellsDone") or 0)
    wall = finished_at - t0

    # writes
    writes = {
        verb: run_operator["writes"].get(verb, 0) - base_operator["writes"].get(verb, 0)
        for verb in sorted(set(run_operator["writes"]) | set(base_operator["writes"]))
    }
    cells_created = len(observer.cell_seen)
    per_attempt = dict(writes)
    per_attempt["POST"] = per_attempt.get("POST", 0) - cells_created - operator_events
    per_attempt["PATCH"] = per_attempt.get("PATCH", 0) - observer.experiment_writes
    per_attempt = {v: n / attempts for v, n in per_attempt.items() if attempts}
    per_attempt_total = sum(per_attempt.values())
    idle_writes = sum(end_operator["writes"].values()) - sum(run_operator["writes"].values())
    idle_passes = end_operator["passes"] - run_operator["passes"]
    passes = run_operator["passes"] - base_operator["passes"]
    pass_seconds = run_operator["pass_seconds"] - base_operator["pass_seconds"]

    # API server view
    delta = Counter({k: end_requests[k] - base_requests.get(k, 0) for k in end_requests})
    ns_lists = {k: v for k, v in delta.items() if k[0] == "LIST" and k[4] == "namespace" and v}
    operator_lists = flows["list"]
    by_kind = {
        k: v
        for k, v in delta.items()
        if v
        and k[0] in ("POST", "PATCH", "PUT", "DELETE", "APPLY")
        and k[2] in ("cells", "attempts", "experiments", "pods", "networkpolicies", "events")
    }

    # latency
    latencies = []
    for cell, (seen_at, number) in observer.cell_selected.items():
        ended = kubelet.terminated.get(f"{namespace}/{names.attempt_name(cell, number)}")
        if ended is not None:
            latencies.append(seen_at - ended)
    cells_time = observer.all_cells_at - t0 if observer.all_cells_at is not None else float("nan")

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    rows = [
        (
            f"time until all {args.cells} Cells exist",
            f"{cells_time:.1f} s",
            f"< {TARGET_CELLS_SEC:g} s",
            verdict(cells_time < TARGET_CELLS_SEC),
        ),
        (
            "operator writes per attempt lifecycle",
            f"{per_attempt_total:.2f} ("
            + ", ".join(f"{v} {n:.2f}" for v, n in sorted(per_attempt.items()))
            + ")",
            f"<= {TARGET_WRITES:g} (floor ~{FLOOR_WRITES:g})",
            verdict(attempts > 0 and per_attempt_total <= TARGET_WRITES),
        ),
        (
            "operator LIST requests after start-up",
            f"{operator_lists:.0f}",
            "0",
            verdict(operator_lists == 0),
        ),
        (
            "operator peak RSS (VmHWM)",
            f"{peak_rss:.0f} MB",
            f"< {TARGET_RSS_MB:g} MB",
            verdict(peak_rss < TARGET_RSS_MB),
        ),
        (
            "Pod terminated -> Cell status, p50 / p95",
            f"{pct(latencies, 0.5):.2f} / {pct(latencies, 0.95):.2f} s",
            "-",
            "-",
        ),
    ]
    print()
    print(
        f"operator_scale: {args.cells} cells, maxConcurrentTaskGroups {args.concurrency}, "
        f"{attempts} attempts, {done} cells done, phase {status.get('phase')}, "
        f"{wall:.1f} s to complete ({attempts / wall if wall else 0:.1f} attempts/s)"
    )
    widths = [
        max(len(str(r[i])) for r in [("figure", "value", "target", ""), *rows]) for i in range(4)
    ]
    header = ("figure", "value", "target", "verdict")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    print("details:")
    print(
        "  operator writes over the run (maka_eval_api_writes_total): "
        + ", ".join(f"{v} {n:.0f}" for v, n in writes.items())
        + f"; less {cells_created} Cell POSTs (1 per cell), {operator_events} Event POSTs, "
        f"{observer.experiment_writes} Experiment status PATCHes "
        f"({observer.experiment_writes / attempts if attempts else 0:.3f} per attempt, "
        f"amortized over {passes:.0f} reconcile passes)"
    )
    print(
        "  API server writes by kind over the run (apiserver_request_total, cluster-wide; "
        "pods/status are the bench kubelet's, pods/binding the scheduler's):"
    )
    for (verb, group, resource, sub, _scope), n in sorted(by_kind.items()):
        per = f" ({n / attempts:.2f}/attempt)" if attempts else ""
        kind = f"{group + '/' if group else ''}{resource}{'/' + sub if sub else ''}"
        print(f"    {verb:6} {kind}: {n:.0f}{per}")

    listing = ", ".join(f"{k[2]} {v:.0f}" for k, v in sorted(ns_lists.items())) or "none"
    print(
        "  polling: the operator runs as its own ServiceAccount, and FlowSchemas matching it "
        "alone make the API server count its requests (apiserver_flowcontrol_dispatched_"
        f"requests_total). Start-up: {startup_flows['list']:.0f} LIST, "
        f"{startup_flows['watch']:.0f} WATCH, {startup_flows['get']:.0f} GET, "
        f"{startup_flows['write']:.0f} write requests. From then to the end of the idle "
        f"window: {flows['list']:.0f} LIST, {flows['watch']:.0f} WATCH (re)opened, "
        f"{flows['get']:.0f} GET, {flows['write']:.0f} write requests (the operator's own "
        f"counter: {sum(writes.values()) + idle_writes:.0f} successful writes)."
    )
    print(
        "  for comparison, namespace-scoped LISTs by every client (apiserver_request_total, "
        f"per resource, not per client; the bench's own {bench_lists} are cluster-scoped): "
        f"{listing}"
    )
    print(
        f"  idle {args.idle:g}s after completion: {idle_passes:.0f} reconcile passes, "
        f"{idle_writes:.0f} writes"
    )
    if passes:
        print(
            f"  reconcile passes: {passes:.0f} (mean {1000 * pass_seconds / passes:.0f} ms, "
            f"{pass_seconds:.1f} s in passes = {100 * pass_seconds / wall:.0f}% of the run); "
            f"errors {run_operator['errors'] - base_operator['errors']:.0f}"
        )
    if latencies:
        print(
            f"  Pod terminated -> Cell status over {len(latencies)} cells: "
            f"p50 {pct(latencies, 0.5):.2f} s, p95 {pct(latencies, 0.95):.2f} s, "
            f"max {max(latencies):.2f} s, mean {statistics.fmean(latencies):.2f} s"
        )
    for (_, start, before), (label, end, after) in itertools.pairwise(cpu_marks):
        span = end - start
        print(
            f"  CPU until {label} ({span:.0f} s wall, {os.cpu_count()} CPUs; % of one CPU): "
            + ", ".join(
                f"{name} {after[name] - before[name]:.0f} s "
                f"({100 * (after[name] - before[name]) / span:.0f}%)"
                for name in after
            )
        )
    if rss:
        marks = [rss[min(len(rss) - 1, int(len(rss) * f))] for f in (0.1, 0.25, 0.5, 0.75, 1.0)]
        print(
            "  operator RSS during the run: " + ", ".join(f"{t:.0f}s {m:.0f} MB" for t, m in marks)
        )
    if args.json:
        print(
            json.dumps(
                {
                    "cells": args.cells,
                    "concurrency": args.concurrency,
                    "wallSec": wall,
                    "attempts": attempts,
                    "allCellsSec": cells_time,
                    "writesPerAttempt": per_attempt,
                    "writesPerAttemptTotal": per_attempt_total,
                    "experimentStatusPatches": observer.experiment_writes,
                    "cellPosts": cells_created,
                    "eventPosts": operator_events,
                    "listsAfterStartup": operator_lists,
                    "peakRssMb": peak_rss,
                    "latencyP50Sec": pct(latencies, 0.5),
                    "latencyP95Sec": pct(latencies, 0.95),
                    "passes": passes,
                    "passSeconds": pass_seconds,
                }
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=10000, help="cells (even; default 10000)")
    parser.add_argument(
        "--concurrency", type=int, default=200, help="execution.maxConcurrentTaskGroups"
    )
    parser.add_argument("--namespace", help="namespace to create (default: a fresh name)")
    parser.add_argument("--node", default="maka-eval-bench-node", help="the bench's fake Node")
    parser.add_argument("--keep", action="store_true", help="keep the namespace and the node")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, else hack/envtest.sh start")
    parser.add_argument("--metrics-port", type=int, help="the operator's (default: a free port)")
    parser.add_argument("--kubelet-threads", type=int, default=8)
    parser.add_argument(
        "--kubelet-delay", type=float, default=0.0, help="seconds before a Pod is ended"
    )
    parser.add_argument("--idle", type=float, default=10.0, help="seconds watched after the end")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this long")
    parser.add_argument("--profile", help="py-spy raw profile of the operator to this file")
    parser.add_argument("--json", action="store_true", help="also print a JSON summary line")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
