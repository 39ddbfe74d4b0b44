"""The operator's few API calls, as plain JSON over the kubernetes client.

Every call the operator makes goes through `Cluster`, so retries live in one place:
429 (with Retry-After), 5xx and dropped connections are retried with backoff; 409
AlreadyExists on a create is `AlreadyExists` (deterministic names make a second create
harmless); 404 on a read is None.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from maka_eval import strict_json
from maka_eval.k8s.crds import VERSION
from maka_eval.spec.experiment import API_GROUP

log = logging.getLogger("maka_eval.operator")

PATHS = {
    "Experiment": f"/apis/{API_GROUP}/{VERSION}/namespaces/{{ns}}/experiments",
    "Cell": f"/apis/{API_GROUP}/{VERSION}/namespaces/{{ns}}/cells",
    "Attempt": f"/apis/{API_GROUP}/{VERSION}/namespaces/{{ns}}/attempts",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "Event": "/api/v1/namespaces/{ns}/events",
}
CLUSTER_PATHS = {
    "Experiment": f"/apis/{API_GROUP}/{VERSION}/experiments",
    "Cell": f"/apis/{API_GROUP}/{VERSION}/cells",
    "Attempt": f"/apis/{API_GROUP}/{VERSION}/attempts",
    "Pod": "/api/v1/pods",
}
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRIES = 8


class AlreadyExists(Exception):
    """A create found the name taken (409 AlreadyExists)."""


class Rejected(Exception):
    """The API server refused the request for good (4xx other than 404/409/429)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _message(text: str) -> str:
    """The Status object's message, or the body itself."""
    try:
        body = strict_json.loads(text or "{}")
    except (TypeError, ValueError):
        return text[:500]
    return str(body.get("message") or text)[:2000] if isinstance(body, dict) else text[:500]


class Cluster:
    """JSON in, JSON out; counts writes by verb (bench/operator_scale.py reads them)."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self.api = api_client
        self.writes: Counter[str] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        """Error answers by (verb, HTTP status or "connection"), retried ones included."""
        self._lock = threading.Lock()

    def counts(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """Copies of `writes` and `errors` (the metrics endpoint reads them)."""
        with self._lock:
            return dict(self.writes), dict(self.errors)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        delay = 0.05
        for attempt in range(RETRIES):
            wait = delay
            try:
                verb, url, headers, payload, _ = self.api.param_serialize(
                    method=method,
                    resource_path=path,
                    query_params=query or [],
                    header_params={"Content-Type": content_type, "Accept": "application/json"},
                    body=body,
                    auth_settings=["BearerToken"],
                )
                response = self.api.call_api(
                    verb, url, header_params=headers, body=payload, _request_timeout=30
                )
                data = response.read()  # type: ignore[no-untyped-call]
                status = response.status
                if status < 400:
                    result: dict[str, Any] = strict_json.loads(data) if data else {}
                    if method != "GET":
                        with self._lock:
                            self.writes[method] += 1
                    return result
                text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
                headers_in = response.headers or {}
            except ApiException as exc:
                status = exc.status or 0
                text = exc.body or ""
                headers_in = exc.headers or {}
            except (HTTPError, OSError) as exc:
                if attempt == RETRIES - 1:
                    raise
                log.info("%s %s: %s, retrying in %.2fs", method, path, exc, wait)
                status = 0
                text = ""
                headers_in = {}
            with self._lock:
                self.errors[(method, str(status) if status else "connection")] += 1
            if status == 429 or status >= 500:
                retry_after = str(headers_in.get("Retry-After") or "")
                wait = float(retry_after) if retry_after.isdigit() else delay
                log.info("%s %s: %s, retrying in %.2fs", method, path, status, wait)
            elif status == 409 and method == "POST":
                raise AlreadyExists(_message(text))
            elif status:
                raise Rejected(status, _message(text))
            time.sleep(min(wait, 5.0) * (1 + random.random() / 4))
            delay = min(delay * 2, 5.0)
        raise Rejected(503, f"{method} {path}: the API server kept failing")

    # -- verbs -------------------------------------------------------------------------
    def create(
        self, kind: str, namespace: str, body: Mapping[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        query = [("dryRun", "All")] if dry_run else None
        return self._call("POST", PATHS[kind].format(ns=namespace), dict(body), query=query)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", f"{PATHS[kind].format(ns=namespace)}/{name}")
        except Rejected as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, kind: str, namespace: str | None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """One LIST (start-up only): the objects, each with kind set."""
        path = PATHS[kind].format(ns=namespace) if namespace else CLUSTER_PATHS[kind]
        query = [("labelSelector", label_selector)] if label_selector else []
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self._call(
                "GET",
                path,
                query=[*query, ("limit", "1000"), *([("continue", token)] if token else [])],
            )
            for item in page.get("items") or ():
                item.setdefault("kind", kind)
                items.append(item)
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        patch: Any,
        *,
        status: bool = False,
        content_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        path = f"{PATHS[kind].format(ns=namespace)}/{name}" + ("/status" if status else "")
        return self._call("PATCH", path, patch, content_type=content_type)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            self._call("DELETE", f"{PATHS[kind].format(ns=namespace)}/{name}")
        except Rejected as exc:
            if exc.status != 404:
                raise
