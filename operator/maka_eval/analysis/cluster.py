"""The cluster AttemptSource: an experiment's results read from the Kubernetes API.

Three requests make the snapshot: one GET of the Experiment (its spec is the frozen
experiment document), one LIST of its Attempts and one LIST of its Cells (both selected
by the `eval.maka.dev/experiment` label). Attempts are listed before Cells: a Cell is
created before its Attempts, so every Attempt seen has its Cell in the later list.

Each Attempt with a `status.result` becomes an AttemptRecord through the same parser
the file store uses (`AttemptRecord.from_dict`, whose `result` is the kernel's camelCase
wire form exactly as the Attempt stores it): identity from the Attempt's spec and its
Cell's spec, the kernel from its status. An Attempt without a result is still running
and is not a record. One whose spec or result does not parse, whose Cell is missing or
disagrees, or that belongs to an earlier Experiment of the same name is damaged: named
in `damaged()` and left out, like a damaged record file.

`kubernetes` is imported only by `connect` and the error translation, so commands that
never talk to a cluster (`maka-eval run`) do not load it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from maka_eval import strict_json
from maka_eval.analysis.source import WriterView
from maka_eval.contract.fields import ContractError
from maka_eval.contract.record import RECORD_FORMAT, AttemptRecord
from maka_eval.errors import MakaEvalError, Problem
from maka_eval.k8s.names import LABEL_EXPERIMENT
from maka_eval.k8s.resources import AttemptSpec, CellSpec
from maka_eval.spec.experiment import API_GROUP, API_VERSION
from maka_eval.store.integrity import Integrity

VERSION = API_VERSION.split("/", 1)[1]
REQUEST_TIMEOUT_SEC = 30.0
_CRDS_HINT = "install the CRDs with `kubectl apply -f crds/`"


class ClusterError(MakaEvalError):
    """The cluster cannot be read as asked (no kubeconfig, not found, forbidden)."""


class CustomObjects(Protocol):
    """What ClusterSource uses of `kubernetes.client.CustomObjectsApi`."""

    def get_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        *,
        _request_timeout: float,
    ) -> object: ...

    def list_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        *,
        label_selector: str,
        _request_timeout: float,
    ) -> object: ...


def parse_target(value: str) -> tuple[str, str]:
    """`NAMESPACE/NAME` -> (namespace, name); ValueError saying what is expected."""
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(
            f"expected NAMESPACE/NAME (the Experiment's namespace and name, "
            f"e.g. default/hello), got {value!r}"
        )
    return namespace, name


class ClusterSource:
    """An AttemptSource over an Experiment and its Cells and Attempts on a cluster."""

    def __init__(self, api: CustomObjects, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self._records: dict[str, list[AttemptRecord]] = {}
        self._damaged: list[Problem] = []
        experiment = self._get_experiment()
        attempts = self._list("attempts")
        cells = self._list("cells")
        metadata = _mapping(experiment.get("metadata"))
        self._uid = str(metadata.get("uid") or "")
        spec = experiment.get("spec")
        self._document: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "Experiment",
            "metadata": {"name": str(metadata.get("name") or name), "namespace": namespace},
            "spec": spec if isinstance(spec, Mapping) else {},
        }
        self._read(cells, attempts)

    # -- the AttemptSource interface -------------------------------------------------
    @property
    def location(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def run_id(self) -> str:
        """The Experiment's uid: a re-created Experiment of the same name is a new run."""
        return self._uid or self.location

    @property
    def experiment_origin(self) -> str:
        return f"Experiment {self.namespace}/{self.name}"

    def experiment_document(self) -> Mapping[str, Any]:
        return self._document

    def records(self) -> Mapping[str, Sequence[AttemptRecord]]:
        return self._records

    def interrupted(self) -> Mapping[str, Sequence[int]]:
        # An Attempt without a result is running as far as its object tells; the operator
        # writes a result (infra_failed) for one whose Pod is gone.
        return {}

    def damaged(self) -> Sequence[Problem]:
        return self._damaged

    def writer(self) -> WriterView | None:
        return None  # the operator is the writer; there is no lock to show

    def integrity(self) -> Integrity | None:
        return None  # only the operator may write results (status RBAC, CEL write-once)

    # -- reading ---------------------------------------------------------------------
    def _request(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:
            raise _cluster_error(exc, self.api, self.namespace, self.name, what) from None

    def _get_experiment(self) -> Mapping[str, Any]:
        obj = self._request(
            "get",
            lambda: self.api.get_namespaced_custom_object(
                API_GROUP,
                VERSION,
                self.namespace,
                "experiments",
                self.name,
                _request_timeout=REQUEST_TIMEOUT_SEC,
            ),
        )
        if not isinstance(obj, Mapping):
            raise ClusterError(
                f"the API server returned no Experiment object for {self.location} "
                f"(got {type(obj).__name__}); check the kubeconfig's server"
            )
        return obj

    def _list(self, plural: str) -> list[Mapping[str, Any]]:
        listing = self._request(
            "list",
            lambda: self.api.list_namespaced_custom_object(
                API_GROUP,
                VERSION,
                self.namespace,
                plural,
                label_selector=f"{LABEL_EXPERIMENT}={self.name}",
                _request_timeout=REQUEST_TIMEOUT_SEC,
            ),
        )
        items = listing.get("items") if isinstance(listing, Mapping) else None
        if not isinstance(items, list):
            raise ClusterError(
                f"the API server returned no list of {plural} for {self.location}; "
                "check the kubeconfig's server"
            )
        return [item for item in items if isinstance(item, Mapping)]

    def _read(self, cells: list[Mapping[str, Any]], attempts: list[Mapping[str, Any]]) -> None:
        by_name = {str(_mapping(c.get("metadata")).get("name")): c for c in cells}
        seen: dict[tuple[str, int], str] = {}
        for obj in sorted(attempts, key=_creation_order):
            where = f"attempt {self.namespace}/{_mapping(obj.get('metadata')).get('name')}"
            status = _mapping(obj.get("status"))
            if status.get("result") is None:
                continue  # still running: not a record yet
            try:
                record = self._record(obj, by_name)
            except _Damaged as exc:
                self._damaged.append(Problem(where, str(exc)))
                continue
            key = (record.cell_id, record.attempt)
            if key in seen:
                self._damaged.append(
                    Problem(
                        where,
                        f"claims to be attempt {record.attempt} of {record.cell_id}, which "
                        f"{seen[key]} already is; attempts are never renumbered",
                    )
                )
                continue
            seen[key] = where
            self._records.setdefault(record.cell_id, []).append(record)
        for records in self._records.values():
            records.sort(key=lambda r: r.attempt)

    def _record(
        self, obj: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]]
    ) -> AttemptRecord:
        metadata = _mapping(obj.get("metadata"))
        status = _mapping(obj.get("status"))
        spec = _validated(AttemptSpec, obj.get("spec"), "not a valid Attempt spec")
        cell_obj = cells.get(spec.cell_name)
        if cell_obj is None:
            raise _Damaged(f"its Cell {spec.cell_name} is missing, so its cell cannot be confirmed")
        cell = _validated(CellSpec, cell_obj.get("spec"), f"its Cell {spec.cell_name} is not valid")
        if cell.experiment_ref.name != self.name:
            raise _Damaged(
                f"its Cell {spec.cell_name} belongs to experiment {cell.experiment_ref.name}"
            )
        if cell.cell_id != spec.cell_id:
            raise _Damaged(
                f"claims cell {spec.cell_id} but its Cell {spec.cell_name} is {cell.cell_id}; "
                "it was tampered with"
            )
        cell_meta = _mapping(cell_obj.get("metadata"))
        if _owner_uid(cell_meta, "Experiment") not in (None, self._uid) or _owner_uid(
            metadata, "Cell"
        ) not in (None, cell_meta.get("uid")):
            raise _Damaged("belongs to an earlier Experiment of the same name (a different run)")
        started = status.get("startedAt") or metadata.get("creationTimestamp")
        finished = status.get("finishedAt") or started
        wire: dict[str, Any] = {
            "format": RECORD_FORMAT,
            "runId": self.run_id,
            "experimentId": self.name,
            "cellId": spec.cell_id,
            "taskId": cell.task_id,
            "repetition": cell.repetition,
            "subjectId": cell.subject_id,
            "attempt": spec.number,
            "attemptId": spec.attempt_id,
            "trigger": spec.trigger.value,
            "request": spec.request,
            "startedAt": started,
            "subjectStartedAt": None,
            "finishedAt": finished,
            "result": status.get("result"),  # the kernel's wire form, camelCase as stored
            "timings": {},
            "host": str(status.get("podName") or ""),
            "makaEvalVersion": "",
        }
        try:
            return AttemptRecord.from_dict(wire)
        except ContractError as exc:
            raise _Damaged(f"not a valid attempt: {str(exc)[:200]}") from None


class _Damaged(Exception):
    """An Attempt that cannot be trusted; the message says why."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _creation_order(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = _mapping(obj.get("metadata"))
    return str(metadata.get("creationTimestamp") or ""), str(metadata.get("name") or "")


def _owner_uid(metadata: Mapping[str, Any], kind: str) -> str | None:
    """The uid of the owner of `kind`, when the object names one."""
    owners = metadata.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, Mapping) and owner.get("kind") == kind:
            return str(owner.get("uid") or "")
    return None


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], data: Any, what: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        from maka_eval.spec.problems import problems_from

        problems = problems_from(exc, model, ["spec"])
        first = str(problems[0]) if problems else str(exc).splitlines()[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise _Damaged(f"{what}: {first[:200]}{more}") from None


# -- connecting and errors ---------------------------------------------------------------


def connect(kubeconfig: Path | None = None) -> CustomObjects:
    """A CustomObjectsApi from `kubeconfig`, else $KUBECONFIG or ~/.kube/config, else the
    in-cluster service account; ClusterError naming the fix when none works."""
    try:
        from kubernetes import client, config
    except ImportError:  # pragma: no cover - a dependency of maka-eval
        raise ClusterError(
            "the kubernetes Python package is missing: pip install 'kubernetes>=31,<38'"
        ) from None
    configuration = client.Configuration()
    configuration.retries = 0  # fail at once with one message, not retry warnings
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise ClusterError(f"--kubeconfig {kubeconfig}: no such file; name a kubeconfig file")
        paths = str(kubeconfig)
    elif os.environ.get("KUBECONFIG"):  # as kubectl: when set, only the files it names
        paths = os.environ["KUBECONFIG"]
        if not any(p and Path(p).expanduser().is_file() for p in paths.split(os.pathsep)):
            raise ClusterError(
                f"KUBECONFIG={paths} names no existing file; fix it or pass --kubeconfig PATH"
            )
    else:
        default = Path("~/.kube/config").expanduser()
        paths = str(default) if default.is_file() else ""
    if not paths and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ClusterError(
            "no Kubernetes configuration found: pass --kubeconfig PATH or set KUBECONFIG "
            "(~/.kube/config is used when it exists; in a Pod, the service account)"
        )
    loaders: Any = config  # its loaders are untyped
    try:
        if paths:
            loaders.load_kube_config(
                config_file=paths, client_configuration=configuration, persist_config=False
            )
        else:
            loaders.load_incluster_config(client_configuration=configuration)
    except Exception as exc:  # the loaders raise ConfigException, YAML and type errors
        where = f"the kubeconfig {paths}" if paths else "the in-cluster configuration"
        reason = str(exc) if isinstance(exc, config.ConfigException) else repr(exc)
        raise ClusterError(
            f"{where} cannot be used: {_one_line(reason)}; "
            "fix it or pass another with --kubeconfig PATH"
        ) from None
    api: CustomObjects = client.CustomObjectsApi(client.ApiClient(configuration))
    return api


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _server(api: Any) -> str:
    host = getattr(getattr(getattr(api, "api_client", None), "configuration", None), "host", None)
    return f" at {host}" if isinstance(host, str) and host else ""


def _cluster_error(exc: Exception, api: Any, namespace: str, name: str, what: str) -> Exception:
    """`exc` from a request as a ClusterError naming the fix (other exceptions as they are)."""
    if isinstance(exc, MakaEvalError):
        return exc
    try:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config import ConfigException
        from urllib3.exceptions import HTTPError
    except ImportError:  # pragma: no cover - a dependency of maka-eval
        return exc
    target = f"{namespace}/{name}"
    if isinstance(exc, ConfigException):
        return ClusterError(
            f"the kubeconfig's credentials cannot be used: {_one_line(str(exc))}; "
            "log in to the cluster again or pass another with --kubeconfig PATH"
        )
    if isinstance(exc, HTTPError | OSError):
        reason = getattr(exc, "reason", None) or exc
        return ClusterError(
            f"cannot reach the Kubernetes API server{_server(api)}: {_one_line(str(reason), 200)}"
            "; check that the cluster is up and the kubeconfig's current context "
            "(or pass --kubeconfig PATH)"
        )
    if not isinstance(exc, ApiException):
        return exc
    code = exc.status
    message = _status_message(exc.body)
    if code == 401:
        return ClusterError(
            f"the API server{_server(api)} refused the kubeconfig's credentials (401 "
            "Unauthorized); log in to the cluster again or pass --kubeconfig PATH"
        )
    if code == 403:
        return ClusterError(
            f"forbidden: {message or 'the API server refused the request'}; grant get and "
            f"list on experiments, cells and attempts ({API_GROUP}) in namespace {namespace}"
        )
    if code == 404:
        details = _status_details(exc.body)
        if what == "get" and details.get("name") == name:
            return ClusterError(
                f"experiment {target} not found: check the namespace and name "
                f"(`kubectl get experiments -n {namespace}` lists them)"
            )
        return ClusterError(
            f"the API server{_server(api)} does not serve {API_GROUP} {VERSION} "
            f"(404 for {target}); {_CRDS_HINT}"
        )
    return ClusterError(
        f"the API server answered {code} {exc.reason or ''} for {target}"
        + (f": {message}" if message else "")
    )


def _status_body(body: Any) -> Mapping[str, Any]:
    try:
        data = strict_json.loads(body) if isinstance(body, str | bytes) else body
    except ValueError:
        return {}
    return data if isinstance(data, Mapping) else {}


def _status_message(body: Any) -> str:
    return _one_line(str(_status_body(body).get("message") or ""))


def _status_details(body: Any) -> Mapping[str, Any]:
    return _mapping(_status_body(body).get("details"))
