"""Experiment -> Cells -> Attempts -> Pods and NetworkPolicies, as plain data.

Pure functions: the operator writes what they return, and tests/k8s/test_render.py
checks them as data (and the real API server accepts them, by server-side dry-run).

The attempt Pod:
- restartPolicy Never: an infrastructure failure becomes a new Attempt, not a restart;
- init containers copy the relay bundle (relay image, /opt/maka-eval) and the experiment
  folder (benchmark image, /benchmark) into emptyDirs, Tekton-style; the relay bundle's
  copy is checked against its manifest and any pinned digest first (k8s/relay_bundle.py);
- the subject container runs the task image with the relay as its entrypoint; the relay
  reads the task's own settings inside the Pod (`AttemptPlan.task_dir`), runs the
  subject and the verifier, and writes the result kernel to the termination message;
- no ServiceAccount token, NET_RAW and NET_ADMIN dropped, no service links;
- each declared credential comes from its Secret, into this subject's Pod only;
- arms of a task group that start together carry a scheduling gate until all exist.

With `executor.config.egress.mode: proxy` the Pod also gets
- the egress proxy as a native sidecar (an init container with restartPolicy Always,
  the egress image): the lean mitmproxy with the egress addons on 127.0.0.1, chained to the
  egress gateway with the attempt's credential, read from the attempt's Secret
  (`egress_secret_object`) that only the sidecar mounts; its exec startupProbe holds
  the subject back until the proxy listens and its CA certificate is published;
- the CA certificate in an emptyDir the subject mounts read-only (the CA key and the
  audit log stay in an emptyDir only the sidecar mounts);
- hostAliases pinning the proxy's name to 127.0.0.1 and the gateway's name to its
  address: the Pod needs no DNS;
- the relay told (`AttemptPlan.egress`) to keep the subject in the Pod's network,
  with the proxy variables and the CA, after its gate has checked the subject holds
  neither NET_RAW nor NET_ADMIN;
- metering (`AttemptPlan.metering`): the sidecar writes the signed provider-usage
  checkpoint into an emptyDir the subject's container mounts read-only, keyed by the
  attempt's result token (in the attempt's Secret); the relay reads the token from a
  volume holding that key alone (hidden from the subject by its sandbox), settles the
  sidecar over HTTP once the subject has ended, and records the metered usage and cost
  (priced with `spec.metering.prices`) in the result kernel.

The NetworkPolicy selects the attempt's Pod and allows no ingress. Its egress: nothing
at all, or with the proxy only the gateway's Pods on the gateway's port -- no DNS,
nothing else. A NetworkPolicy cannot tell the sidecar from the subject; the gateway
can, by the credential (see maka_eval.egress.gateway).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maka_eval import layout
from maka_eval.egress import sidecar
from maka_eval.egress.policy import EgressPolicy
from maka_eval.engine.expand import Cell
from maka_eval.engine.launch import SOLUTION_DIR_NAME
from maka_eval.engine.modes import Isolation
from maka_eval.engine.status import Trigger
from maka_eval.executors.plan import plan_attempt
from maka_eval.k8s import names, relay_bundle
from maka_eval.k8s.crds import VERSION
from maka_eval.k8s.egress import GatewayAccess, GatewayRoute
from maka_eval.relay.environment import egress_environment
from maka_eval.relay.plan import OWN_NETWORK, AttemptPlan, EgressPlan, MeteringPlan
from maka_eval.spec.egress import policy_of
from maka_eval.spec.experiment import API_GROUP, Experiment, KubernetesExecutorConfig
from maka_eval.spec.metering import prices_of
from maka_eval.spec.subjects import ExternalSubject, MakaSubject, subject_launch

API_VERSION = f"{API_GROUP}/{VERSION}"
SUBJECT_CONTAINER = "subject"

EGRESS_CONTAINER = "egress-proxy"
EGRESS_PROXY_NAME = "maka-eval-proxy"
"""The proxy's name in HTTP(S)_PROXY, pinned to 127.0.0.1 by the Pod's hostAliases."""
EGRESS_PROXY_PORT = sidecar.DEFAULT_PORT
EGRESS_CA_CERT = f"{layout.POD_EGRESS_CA_DIR}/{sidecar.CA_CERT_NAME}"
EGRESS_CREDENTIAL_KEY = "upstream-auth"
EGRESS_POLICY_KEY = "policy.json"
EGRESS_RESULT_TOKEN_KEY = "result-token"
EGRESS_CHECKPOINT = f"{layout.POD_EGRESS_METER_DIR}/provider-usage.json"
"""The subject's container (the relay) mounts the meter folder read-only."""
RESULT_TOKEN_FILE = f"{layout.POD_RESULT_TOKEN_DIR}/token"
"""The result token alone (the relay's; its sandbox hides the folder from the subject)."""
EGRESS_SIDECAR_USER = 65532
EGRESS_SIDECAR_RESOURCES = {
    "requests": {"cpu": "50m", "memory": "96Mi"},
    "limits": {"memory": "512Mi"},
}
EGRESS_STARTUP_PERIOD_SEC = 1
EGRESS_STARTUP_FAILURES = 120
"""The proxy has two minutes to listen and publish its CA (it takes about a second)."""


@dataclass(frozen=True)
class ExperimentRef:
    """What an owned object needs of its Experiment object."""

    name: str
    namespace: str
    uid: str


def owner_reference(
    kind: str, name: str, uid: str, api_version: str = API_VERSION
) -> dict[str, Any]:
    """A controller ownerReference: the garbage collector deletes the child with it."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def cell_labels(ref: ExperimentRef, cell: Cell) -> dict[str, str]:
    """Labels of a cell and of everything it owns."""
    experiment = ref.name
    return {
        names.LABEL_EXPERIMENT: experiment,
        names.LABEL_EXPERIMENT_UID: ref.uid,
        names.LABEL_TASK: cell.task_id,
        names.LABEL_REPETITION: str(cell.repetition),
        names.LABEL_SUBJECT: cell.subject_id,
        names.LABEL_GROUP: names.group_label(experiment, cell.group_id),
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
    }


def cell_object(ref: ExperimentRef, cell: Cell) -> dict[str, Any]:
    """The Cell object of one task x repetition x subject."""
    name = names.cell_name(ref.name, ref.uid, cell.task_id, cell.repetition, cell.subject_id)
    return {
        "apiVersion": API_VERSION,
        "kind": "Cell",
        "metadata": {
            "name": name,
            "namespace": ref.namespace,
            "labels": cell_labels(ref, cell),
            "ownerReferences": [owner_reference("Experiment", ref.name, ref.uid)],
        },
        "spec": {
            "experimentRef": {"name": ref.name},
            "taskId": cell.task_id,
            "repetition": cell.repetition,
            "subjectId": cell.subject_id,
            "groupId": cell.group_id,
            "cellId": cell.id,
        },
    }


def attempt_object(
    ref: ExperimentRef,
    cell: Cell,
    cell_uid: str,
    number: int,
    trigger: Trigger,
    request: str | None,
) -> dict[str, Any]:
    """The Attempt object: which cell, its number and why it runs (frozen)."""
    cell_name = names.cell_name(ref.name, ref.uid, cell.task_id, cell.repetition, cell.subject_id)
    name = names.attempt_name(cell_name, number)
    spec: dict[str, Any] = {
        "cellName": cell_name,
        "cellId": cell.id,
        "number": number,
        "trigger": trigger.value,
        "attemptId": layout.attempt_id(ref.uid, cell.id, number),
    }
    if request is not None:
        spec["request"] = request
    return {
        "apiVersion": API_VERSION,
        "kind": "Attempt",
        "metadata": {
            "name": name,
            "namespace": ref.namespace,
            "labels": {**cell_labels(ref, cell), names.LABEL_CELL: cell_name},
            "ownerReferences": [owner_reference("Cell", cell_name, cell_uid)],
        },
        "spec": spec,
    }


def _task_dir(experiment: Experiment, task_id: str) -> str:
    benchmark = (experiment.spec.benchmark.config.path or ".").strip("/") or "."
    task = experiment.task(task_id)
    return f"{layout.POD_BENCHMARK_DIR}/{benchmark}/{task.directory_name}".replace("/./", "/")


def _program(command: str) -> str:
    """A relative command path names a file of the experiment folder (the benchmark
    image's /benchmark); a bare name is looked up on the task image's PATH."""
    if "/" in command and not command.startswith("/"):
        return f"{layout.POD_BENCHMARK_DIR}/{command.removeprefix('./')}"
    return command


def egress_policy(experiment: Experiment) -> EgressPolicy | None:
    """The policy the attempt Pods' egress sidecars enforce; None when the experiment's
    attempts get no network (no egress config, or mode none)."""
    return policy_of(executor_config(experiment).egress)


def attempt_plan(
    experiment: Experiment, cell: Cell, attempt_uid_id: str, config: KubernetesExecutorConfig
) -> AttemptPlan:
    """The relay plan of one attempt, with the Pod's paths; the task's own settings are
    read by the relay inside the Pod (task_dir)."""
    spec = experiment.spec
    subject = experiment.subject(cell.subject_id)
    task_dir = _task_dir(experiment, cell.task_id)
    host = config.runtime_host
    program: str | None = None
    if isinstance(subject, ExternalSubject):
        program = _program(subject.config.command)
    elif isinstance(subject, MakaSubject):
        assert host is not None, "validation requires a Runtime Host for maka subjects"
        program = _program(host.command)
    root = f"{layout.POD_WORK_DIR}/attempt"
    launch = subject_launch(
        subject,
        program=program,
        runtime_host_args=host.args if host is not None else (),
        solution_dir=f"{task_dir}/solution",
        solution_script=f"{root}/{SOLUTION_DIR_NAME}/solve.sh",
        solution_env={},
    )
    policy = policy_of(config.egress)
    egress = (
        EgressPlan(
            namespace=OWN_NETWORK,
            namespace_identity="",  # the relay reads it in the Pod
            proxy_name=EGRESS_PROXY_NAME,
            proxy_address="127.0.0.1",
            proxy_port=EGRESS_PROXY_PORT,
            ca_cert=EGRESS_CA_CERT,
            policy_digest=policy.digest,
        )
        if policy is not None
        else None
    )
    prices = prices_of(spec.metering)
    metering = (
        MeteringPlan(
            checkpoint=EGRESS_CHECKPOINT,
            prices=prices.to_dict() if prices is not None else {},
            token_file=RESULT_TOKEN_FILE,
            settle_proxy=f"http://127.0.0.1:{EGRESS_PROXY_PORT}",
        )
        if policy is not None
        else None
    )
    return plan_attempt(
        experiment,
        cell,
        run_id=experiment.id,
        attempt_id=attempt_uid_id,
        root=root,
        artifacts_dir=layout.POD_ARTIFACTS_DIR,
        subject=launch,
        isolation=Isolation.AUTO,
        # The operator cannot see the task: the relay applies its settings in the Pod.
        task=None,
        task_dir=task_dir,
        hidden=(layout.POD_BENCHMARK_DIR, layout.POD_RESULT_TOKEN_DIR)
        if policy is not None
        else (layout.POD_BENCHMARK_DIR,),
        visible=(launch.argv[0].rsplit("/", 1)[0],)
        if launch.argv[0].startswith(layout.POD_BENCHMARK_DIR)
        else (),
        in_task_image=True,
        egress=egress,
        metering=metering,
    )


def _credential_env(
    experiment: Experiment, subject_id: str, config: KubernetesExecutorConfig
) -> list[dict[str, Any]]:
    subject = experiment.subject(subject_id)
    env = []
    for name in subject.credentials:
        source = config.credential(name)
        env.append(
            {
                "name": name,
                "valueFrom": {"secretKeyRef": {"name": source.name, "key": source.key}},
            }
        )
    return env


def credential_sources(experiment: Experiment) -> list[tuple[str, str, str, str]]:
    """(subject id, credential, Secret name, key) of every declared credential."""
    config = executor_config(experiment)
    out = []
    for subject in experiment.spec.subjects:
        for name in subject.credentials:
            source = config.credential(name)
            out.append((subject.id, name, source.name, source.key))
    return out


def executor_config(experiment: Experiment) -> KubernetesExecutorConfig:
    """The Kubernetes executor's settings (ValueError for another executor)."""
    config = experiment.spec.executor.config
    if not isinstance(config, KubernetesExecutorConfig):
        raise ValueError(f"executor.kind is '{experiment.spec.executor.kind}', not 'kubernetes'")
    return config


def _without_none(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def pod_object(
    ref: ExperimentRef,
    experiment: Experiment,
    cell: Cell,
    attempt: Mapping[str, Any],
    *,
    gated: bool,
    gateway: GatewayRoute | None = None,
    relay_digest: str | None = None,
) -> dict[str, Any]:
    """The Pod of one Attempt (`attempt` is the Attempt object as created); `gateway`
    is required when the experiment's egress goes through the proxy; `relay_digest` is
    the operator's pinned relay bundle digest (k8s/relay_bundle.py)."""
    config = executor_config(experiment)
    meta = attempt["metadata"]
    plan = attempt_plan(experiment, cell, attempt["spec"]["attemptId"], config)
    image = config.task_images.get(cell.task_id, config.task_image)
    proxied = plan.egress is not None
    if proxied and gateway is None:
        raise ValueError("an attempt whose egress goes through the proxy needs the gateway")
    volumes = [
        {"name": "relay", "emptyDir": {}},
        {"name": "benchmark", "emptyDir": {}},
        {"name": "work", "emptyDir": {}},
        {"name": "artifacts", "emptyDir": {}},
    ]
    init = [
        # Copies the bundle and checks the copy against its manifest and the pins.
        relay_bundle.init_container(
            config.relay_image,
            layout.RELAY_BUNDLE_IN_IMAGE,
            layout.POD_RELAY_DIR,
            relay_bundle.pins(relay_digest, config.relay_bundle_digest),
            _security_context(),
        ),
        {
            "name": "benchmark",
            "image": config.benchmark_image,
            "command": [
                "cp",
                "-a",
                f"{layout.BENCHMARK_IN_IMAGE}/.",
                f"{layout.POD_BENCHMARK_DIR}/",
            ],
            "volumeMounts": [{"name": "benchmark", "mountPath": layout.POD_BENCHMARK_DIR}],
            "securityContext": _security_context(),
        },
    ]
    subject_mounts = [
        {"name": "relay", "mountPath": layout.POD_RELAY_DIR, "readOnly": True},
        {"name": "benchmark", "mountPath": layout.POD_BENCHMARK_DIR},
        {"name": "work", "mountPath": layout.POD_WORK_DIR},
        {"name": "artifacts", "mountPath": layout.POD_ARTIFACTS_DIR},
    ]
    env = _credential_env(experiment, cell.subject_id, config)
    host_aliases = None
    if gateway is not None and proxied:
        volumes += _egress_volumes(meta["name"])
        init.append(_egress_sidecar(config.egress_image, gateway))
        subject_mounts += [
            {"name": "egress-ca", "mountPath": layout.POD_EGRESS_CA_DIR, "readOnly": True},
            {"name": "egress-meter", "mountPath": layout.POD_EGRESS_METER_DIR, "readOnly": True},
            {"name": "result-token", "mountPath": layout.POD_RESULT_TOKEN_DIR, "readOnly": True},
        ]
        proxy_url = f"http://{EGRESS_PROXY_NAME}:{EGRESS_PROXY_PORT}"
        # The relay gives the subject the same variables (plan.egress); here they serve
        # whatever else runs in the container (kubectl exec).
        env += [
            {"name": k, "value": v}
            for k, v in egress_environment(proxy_url, EGRESS_CA_CERT).items()
        ]
        host_aliases = [{"ip": "127.0.0.1", "hostnames": [EGRESS_PROXY_NAME]}]
        if gateway.pinned:
            host_aliases.append({"ip": gateway.address, "hostnames": [gateway.host]})
    resources = {
        k: amounts
        for k, v in (("requests", config.resources.requests), ("limits", config.resources.limits))
        if (amounts := v.model_dump(mode="json", by_alias=True, exclude_none=True))
    }
    subject_container = _without_none(
        {
            "name": SUBJECT_CONTAINER,
            "image": image,
            "command": [layout.POD_RELAY_PROGRAM],
            "args": ["--plan-json", plan.to_json(), "--result", layout.TERMINATION_MESSAGE_PATH],
            "workingDir": layout.POD_WORK_DIR,
            "env": env or None,
            "resources": resources or None,
            "terminationMessagePath": layout.TERMINATION_MESSAGE_PATH,
            "terminationMessagePolicy": "File",
            "securityContext": _security_context(),
            "volumeMounts": subject_mounts,
        }
    )
    spec: dict[str, Any] = _without_none(
        {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "serviceAccountName": config.service_account_name,
            "runtimeClassName": config.runtime_class_name,
            "nodeSelector": dict(config.node_selector) or None,
            "tolerations": [
                t.model_dump(mode="json", by_alias=True, exclude_none=True)
                for t in config.tolerations
            ]
            or None,
            "schedulingGates": [{"name": names.GROUP_GATE}] if gated else None,
            "hostAliases": host_aliases,
            "initContainers": init,
            "containers": [subject_container],
            "volumes": volumes,
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"],
            "namespace": ref.namespace,
            "labels": {**meta["labels"], names.LABEL_ATTEMPT: meta["name"]},
            "ownerReferences": [owner_reference("Attempt", meta["name"], meta["uid"])],
        },
        "spec": spec,
    }


def _security_context() -> dict[str, Any]:
    return {"capabilities": {"drop": ["NET_RAW", "NET_ADMIN"]}}


def _egress_volumes(attempt_name: str) -> list[dict[str, Any]]:
    return [
        # Certificate only; the subject mounts it read-only.
        {"name": "egress-ca", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        # The sidecar's alone: CA key, audit log.
        {"name": "egress-state", "emptyDir": {}},
        # The checkpoint: written by the sidecar, read-only to the subject's container.
        {"name": "egress-meter", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {
            # The result token alone (never the gateway credential), for the relay.
            "name": "result-token",
            "secret": {
                "secretName": names.egress_secret_name(attempt_name),
                "items": [{"key": EGRESS_RESULT_TOKEN_KEY, "path": "token"}],
                "defaultMode": 0o444,
            },
        },
        {
            "name": "egress-secret",
            "secret": {
                "secretName": names.egress_secret_name(attempt_name),
                # Readable by the sidecar's non-root user; no other container mounts it.
                "defaultMode": 0o444,
            },
        },
    ]


def _egress_sidecar(image: str, gateway: GatewayRoute) -> dict[str, Any]:
    """The egress proxy as a native sidecar: it starts before the subject, which waits
    for its startupProbe, and is stopped after the subject has ended."""
    python = ["python3", "-m", "maka_eval.egress.sidecar"]
    where = ["--port", str(EGRESS_PROXY_PORT), "--publish-dir", layout.POD_EGRESS_CA_DIR]
    return {
        "name": EGRESS_CONTAINER,
        "image": image,
        "restartPolicy": "Always",
        "command": python,
        "args": [
            *where,
            "--upstream",
            gateway.url,
            "--credential-file",
            f"{layout.POD_EGRESS_SECRET_DIR}/{EGRESS_CREDENTIAL_KEY}",
            "--policy-file",
            f"{layout.POD_EGRESS_SECRET_DIR}/{EGRESS_POLICY_KEY}",
            "--state-dir",
            layout.POD_EGRESS_STATE_DIR,
            "--checkpoint",
            EGRESS_CHECKPOINT,
            "--result-token-file",
            f"{layout.POD_EGRESS_SECRET_DIR}/{EGRESS_RESULT_TOKEN_KEY}",
        ],
        "env": [
            {"name": "HOME", "value": layout.POD_EGRESS_STATE_DIR},
            {"name": "TMPDIR", "value": layout.POD_EGRESS_STATE_DIR},
        ],
        "startupProbe": {
            "exec": {"command": [*python, "--probe", *where]},
            "periodSeconds": EGRESS_STARTUP_PERIOD_SEC,
            "timeoutSeconds": 5,
            "failureThreshold": EGRESS_STARTUP_FAILURES,
        },
        "resources": EGRESS_SIDECAR_RESOURCES,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": EGRESS_SIDECAR_USER,
            "runAsGroup": EGRESS_SIDECAR_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "egress-secret", "mountPath": layout.POD_EGRESS_SECRET_DIR, "readOnly": True},
            {"name": "egress-state", "mountPath": layout.POD_EGRESS_STATE_DIR},
            {"name": "egress-ca", "mountPath": layout.POD_EGRESS_CA_DIR},
            {"name": "egress-meter", "mountPath": layout.POD_EGRESS_METER_DIR},
        ],
    }


def egress_secret_object(
    ref: ExperimentRef,
    attempt: Mapping[str, Any],
    access: GatewayAccess,
    policy: EgressPolicy,
) -> dict[str, Any]:
    """The attempt's egress Secret: its gateway credential and the policy, for the
    sidecar alone, and the result token (sidecar and relay). Owned by the Attempt, so it
    is deleted with it."""
    meta = attempt["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.egress_secret_name(meta["name"]),
            "namespace": ref.namespace,
            "labels": {**meta["labels"], names.LABEL_ATTEMPT: meta["name"]},
            "ownerReferences": [owner_reference("Attempt", meta["name"], meta["uid"])],
        },
        "type": "Opaque",
        "immutable": True,
        "stringData": {
            EGRESS_CREDENTIAL_KEY: access.credential(ref.namespace, meta["name"]),
            EGRESS_POLICY_KEY: policy.to_json(),
            EGRESS_RESULT_TOKEN_KEY: access.result_token(ref.namespace, meta["name"], meta["uid"]),
        },
    }


def attempt_objects(
    ref: ExperimentRef,
    experiment: Experiment,
    cell: Cell,
    attempt: Mapping[str, Any],
    *,
    gated: bool,
    gateway: GatewayAccess | None = None,
    relay_digest: str | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(kind, object) of what an Attempt runs with, in creation order: its
    NetworkPolicy, its egress Secret (with the proxy), its Pod."""
    policy = egress_policy(experiment)
    route = gateway.route if gateway is not None and policy is not None else None
    objects = [("NetworkPolicy", network_policy_object(ref, attempt, route))]
    if policy is not None:
        if gateway is None:
            raise ValueError("an attempt whose egress goes through the proxy needs the gateway")
        objects.append(("Secret", egress_secret_object(ref, attempt, gateway, policy)))
    pod = pod_object(
        ref, experiment, cell, attempt, gated=gated, gateway=route, relay_digest=relay_digest
    )
    objects.append(("Pod", pod))
    return objects


def network_policy_object(
    ref: ExperimentRef, attempt: Mapping[str, Any], gateway: GatewayRoute | None = None
) -> dict[str, Any]:
    """No ingress to the attempt's Pod (nothing talks to a subject) and no egress but,
    with `gateway`, to the egress gateway's Pods on its port: no DNS, nothing else."""
    meta = attempt["metadata"]
    egress: list[dict[str, Any]] = []
    if gateway is not None:
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": gateway.namespace}
                        },
                        "podSelector": {"matchLabels": dict(gateway.pod_labels)},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": gateway.port}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": meta["name"],
            "namespace": ref.namespace,
            "labels": dict(meta["labels"]),
            "ownerReferences": [owner_reference("Attempt", meta["name"], meta["uid"])],
        },
        "spec": {
            "podSelector": {"matchLabels": {names.LABEL_ATTEMPT: meta["name"]}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }
