"""Experiment -> Cells -> Attempts -> Pods and NetworkPolicies, as plain data.

Pure functions: the operator writes what they return, and tests/k8s/test_render.py
checks them as data (and the real API server accepts them, by server-side dry-run).

The attempt Pod:
- restartPolicy Never: an infrastructure failure becomes a new Attempt, not a restart;
- init containers copy the relay bundle (relay image, /opt/maka-eval) and the experiment
  folder (benchmark image, /benchmark) into emptyDirs, Tekton-style;
- the subject container runs the task image with the relay as its entrypoint; the relay
  reads the task's own settings inside the Pod (`AttemptPlan.task_dir`), runs the
  subject and the verifier, and writes the result kernel to the termination message;
- no ServiceAccount token, NET_RAW and NET_ADMIN dropped, no service links;
- each declared credential comes from its Secret, into this subject's Pod only;
- arms of a task group that start together carry a scheduling gate until all exist.

The NetworkPolicy selects the attempt's Pod and allows no egress at all: the egress
gateway (a later addition) will be the only destination it opens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maka_eval.engine.expand import Cell
from maka_eval.engine.launch import SOLUTION_DIR_NAME, subject_launch
from maka_eval.engine.status import Trigger
from maka_eval.k8s import names
from maka_eval.k8s.crds import VERSION
from maka_eval.relay.plan import AttemptPlan
from maka_eval.spec.experiment import API_GROUP, Experiment, KubernetesExecutorConfig
from maka_eval.spec.subjects import ExternalSubject, MakaSubject

API_VERSION = f"{API_GROUP}/{VERSION}"
MOUNT_ROOT = "/maka"
RELAY_DIR = f"{MOUNT_ROOT}/relay"
BENCHMARK_DIR = f"{MOUNT_ROOT}/benchmark"
WORK_DIR = f"{MOUNT_ROOT}/work"
ARTIFACTS_DIR = f"{MOUNT_ROOT}/artifacts"
RELAY_BUNDLE_IN_IMAGE = "/opt/maka-eval"
"""Where the relay image holds the bundle (bin/maka-relay and what it needs)."""
BENCHMARK_IN_IMAGE = "/benchmark"
RELAY_PROGRAM = f"{RELAY_DIR}/bin/maka-relay"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
SUBJECT_CONTAINER = "subject"


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


def attempt_id(experiment_uid: str, cell_id: str, number: int) -> str:
    """Unique across clusters and runs: the Experiment's uid names the run."""
    return f"{experiment_uid}/{cell_id}/{number}"


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
        "attemptId": attempt_id(ref.uid, cell.id, number),
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
    benchmark = experiment.spec.benchmark.config.path.strip("/") or "."
    task = experiment.task(task_id)
    return f"{BENCHMARK_DIR}/{benchmark}/{task.directory_name}".replace("/./", "/")


def _program(command: str) -> str:
    """A relative command path names a file of the experiment folder (the benchmark
    image's /benchmark); a bare name is looked up on the task image's PATH."""
    if "/" in command and not command.startswith("/"):
        return f"{BENCHMARK_DIR}/{command.removeprefix('./')}"
    return command


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
    root = f"{WORK_DIR}/attempt"
    launch = subject_launch(
        subject,
        program=program,
        runtime_host_args=host.args if host is not None else (),
        solution_dir=f"{task_dir}/solution",
        solution_script=f"{root}/{SOLUTION_DIR_NAME}/solve.sh",
        solution_env={},
    )
    defaults = spec.execution.default_timeouts
    return AttemptPlan(
        attempt_id=attempt_uid_id,
        run_id=experiment.id,
        cell_id=cell.id,
        task_id=cell.task_id,
        repetition=cell.repetition,
        subject_id=cell.subject_id,
        root=root,
        artifacts_dir=ARTIFACTS_DIR,
        instruction_file=f"{task_dir}/instruction.md",
        tests_dir=f"{task_dir}/tests",
        environment_dir=None,
        subject=launch,
        agent_timeout_sec=defaults.agent_sec,
        verifier_timeout_sec=defaults.verifier_sec,
        score_key=spec.verifier.config.score_key,
        redact=tuple(dict.fromkeys(c for s in spec.subjects for c in s.credentials)),
        output_limit_bytes=spec.execution.max_output_bytes,
        isolation="auto",
        hidden=(BENCHMARK_DIR,),
        visible=(launch.argv[0].rsplit("/", 1)[0],)
        if launch.argv[0].startswith(BENCHMARK_DIR)
        else (),
        task_dir=task_dir,
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
) -> dict[str, Any]:
    """The Pod of one Attempt (`attempt` is the Attempt object as created)."""
    config = executor_config(experiment)
    meta = attempt["metadata"]
    plan = attempt_plan(experiment, cell, attempt["spec"]["attemptId"], config)
    image = config.task_images.get(cell.task_id, config.task_image)
    volumes = [
        {"name": "relay", "emptyDir": {}},
        {"name": "benchmark", "emptyDir": {}},
        {"name": "work", "emptyDir": {}},
        {"name": "artifacts", "emptyDir": {}},
    ]
    init = [
        {
            "name": "relay-bundle",
            "image": config.relay_image,
            "command": ["cp", "-a", f"{RELAY_BUNDLE_IN_IMAGE}/.", f"{RELAY_DIR}/"],
            "volumeMounts": [{"name": "relay", "mountPath": RELAY_DIR}],
            "securityContext": _security_context(),
        },
        {
            "name": "benchmark",
            "image": config.benchmark_image,
            "command": ["cp", "-a", f"{BENCHMARK_IN_IMAGE}/.", f"{BENCHMARK_DIR}/"],
            "volumeMounts": [{"name": "benchmark", "mountPath": BENCHMARK_DIR}],
            "securityContext": _security_context(),
        },
    ]
    resources = {
        k: amounts
        for k, v in (("requests", config.resources.requests), ("limits", config.resources.limits))
        if (amounts := v.model_dump(mode="json", by_alias=True, exclude_none=True))
    }
    subject_container = _without_none(
        {
            "name": SUBJECT_CONTAINER,
            "image": image,
            "command": [RELAY_PROGRAM],
            "args": ["--plan-json", plan.to_json(), "--result", TERMINATION_MESSAGE_PATH],
            "workingDir": WORK_DIR,
            "env": _credential_env(experiment, cell.subject_id, config) or None,
            "resources": resources or None,
            "terminationMessagePath": TERMINATION_MESSAGE_PATH,
            "terminationMessagePolicy": "File",
            "securityContext": _security_context(),
            "volumeMounts": [
                {"name": "relay", "mountPath": RELAY_DIR, "readOnly": True},
                {"name": "benchmark", "mountPath": BENCHMARK_DIR},
                {"name": "work", "mountPath": WORK_DIR},
                {"name": "artifacts", "mountPath": ARTIFACTS_DIR},
            ],
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


def network_policy_object(ref: ExperimentRef, attempt: Mapping[str, Any]) -> dict[str, Any]:
    """Deny all egress of the attempt's Pod (ingress too: nothing talks to a subject)."""
    meta = attempt["metadata"]
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
            "egress": [],
        },
    }
