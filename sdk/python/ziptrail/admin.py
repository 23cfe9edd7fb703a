"""The admin client: Buckets, Triggers and Workflows through the Kubernetes
API (the ``kubernetes`` package: ``pip install 'ziptrail[admin]'``), and
workflow sessions through the operator's session gateway (HTTP, stdlib only).

    from ziptrail.admin import Admin, Sessions

    admin = Admin(namespace="demo")                   # kubeconfig or in-cluster
    admin.apply_workflow("wordcount", {...spec...})   # create or update
    run = Sessions("http://ziptrail-gateway:8088", namespace="demo")
    result = run.run("wordcount", b"input text", timeout=300,
                     on_event=lambda e: print(e.kind, e.message))
    with open("out.bin", "wb") as f:                  # a result of any size
        run.result_to(session_id, f)
    plan = run.plan(4 << 30, fast_capacity=1 << 30, deadline=600)  # shuffle dry run
    print(plan.method, plan.parallelism, plan.seconds, plan.dollars, plan.calibrated)

The gateway authenticates every request with Kubernetes credentials (a
bearer token: the kubeconfig's, the pod's ServiceAccount token, or
``token=``) and authorizes it with RBAC: bind the user to the ClusterRole
``ziptrail-session-runner`` in the namespace.

Session calls are retried while the gateway cannot be reached (connection
refused or reset, closed before an answer) or answers 503 (an operator
rollout, its engine moving between replicas), with exponential back-off and
jitter and the gateway's Retry-After (at most 30 s), for ``retry_for``
seconds (2 minutes by default). A start carries an ``Idempotency-Key``, so
retrying one whose answer was lost answers the session it started. A result
stays readable until acknowledged: one whose transfer breaks is read again
from where it broke, and a result read whole is acknowledged.

Every failure is a :class:`ziptrail.ZiptrailError`: NotFoundError,
ConflictError, InvalidError (with the API server's validation message),
UnavailableError, ZiptrailTimeoutError, FunctionFailedError (a failed
session), ExpiredError (an expired session).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

from .errors import ConflictError, InvalidError, NotFoundError, UnavailableError, ZiptrailError, ZiptrailTimeoutError
from ._sessions import (CHUNK, ENV_GATEWAY, ENV_TOKEN, IDEMPOTENCY_KEY, RETRY_FOR, SA_TOKEN_FILE, Event, Plan,  # noqa: F401
                        PlanOption, Session, Sessions)

GROUP = "ziptrail.dev"
VERSION = "v1alpha1"
#: kind -> plural (config/crd/bases)
PLURALS = {"Bucket": "buckets", "Trigger": "triggers", "Workflow": "workflows"}



def _api_error(op: str, kind: str, name: str, e: Any) -> ZiptrailError:
    """Translates a kubernetes ApiException (or a connection error)."""
    status = getattr(e, "status", None)
    message = ""
    body = getattr(e, "body", None)
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)
    message = message or getattr(e, "reason", "") or str(e)
    what = f"{kind} {name}".strip()
    if status == 404:
        return NotFoundError(op, f"{what}: {message}")
    if status == 409:
        return ConflictError(op, f"{what}: {message}")
    if status in (400, 422):
        return InvalidError(op, f"{what} rejected by the API server: {message}")
    if status in (401, 403):
        return ZiptrailError(op, f"{what}: not allowed ({status}): {message}")
    if status is None or status == 0:
        return UnavailableError(op, f"{what}: cannot reach the Kubernetes API server: {message}")
    return ZiptrailError(op, f"{what}: API server answered {status}: {message}")


class Admin:
    """Creates, updates, reads and deletes ziptrail resources in a namespace.

    ``kubeconfig``/``context`` select a kubeconfig (default: in-cluster
    config when running in a pod, else ``$KUBECONFIG`` / ``~/.kube/config``);
    ``api_client`` passes a ready ``kubernetes.client.ApiClient`` instead.
    Resources are plain dicts (as ``kubectl get -o json`` shows them).
    """

    def __init__(self, namespace: str = "default", *, kubeconfig: str | None = None, context: str | None = None,
                 api_client: Any = None) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise ZiptrailError("admin", "the admin client needs the kubernetes package: pip install 'ziptrail[admin]'") from None
        self.namespace = namespace
        if api_client is None:
            try:
                if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                    config.load_incluster_config()
                    api_client = client.ApiClient()
                else:
                    api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
            except (config.ConfigException, OSError) as e:
                raise UnavailableError("admin", f"no usable Kubernetes configuration: {e}") from None
        self.api_client = api_client
        self._api = client.CustomObjectsApi(api_client)
        self._exc = (client.ApiException, OSError, _urllib3_errors())

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- generic ------------------------------------------------------------

    def _plural(self, kind: str) -> str:
        try:
            return PLURALS[kind]
        except KeyError:
            raise InvalidError("admin", f"unknown kind {kind!r}: one of {', '.join(PLURALS)}") from None

    def _do(self, op: str, kind: str, name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._exc as e:
            raise _api_error(op, kind, name, e) from None

    def create(self, kind: str, name: str, spec: dict[str, Any], *, namespace: str | None = None,
               labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Creates a resource; ConflictError when it exists."""
        ns = namespace or self.namespace
        metadata: dict[str, Any] = {"name": name, "namespace": ns}
        if labels:
            metadata["labels"] = dict(labels)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": metadata, "spec": spec}
        return self._do("create", kind, name, lambda: self._api.create_namespaced_custom_object(
            GROUP, VERSION, ns, self._plural(kind), body))

    def get(self, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """Reads a resource (with its status); NotFoundError when absent."""
        ns = namespace or self.namespace
        return self._do("get", kind, name, lambda: self._api.get_namespaced_custom_object(
            GROUP, VERSION, ns, self._plural(kind), name))

    def list(self, kind: str, *, namespace: str | None = None) -> list[dict[str, Any]]:
        ns = namespace or self.namespace
        out = self._do("list", kind, "", lambda: self._api.list_namespaced_custom_object(GROUP, VERSION, ns, self._plural(kind)))
        return list(out.get("items", []))

    def update(self, kind: str, name: str, spec: dict[str, Any], *, namespace: str | None = None,
               retries: int = 5) -> dict[str, Any]:
        """Replaces a resource's spec (read, modify, write; retried when
        another writer changed it in between)."""
        ns = namespace or self.namespace
        for attempt in range(retries):
            current = self.get(kind, name, namespace=ns)
            current["spec"] = spec
            try:
                return self._do("update", kind, name, lambda: self._api.replace_namespaced_custom_object(
                    GROUP, VERSION, ns, self._plural(kind), name, current))
            except ConflictError:
                if attempt == retries - 1:
                    raise
        raise AssertionError("unreachable")

    def apply(self, kind: str, name: str, spec: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        """Creates the resource, or updates its spec when it exists."""
        try:
            return self.create(kind, name, spec, namespace=namespace)
        except ConflictError:
            return self.update(kind, name, spec, namespace=namespace)

    def delete(self, kind: str, name: str, *, namespace: str | None = None, missing_ok: bool = False,
               wait: float | None = None) -> None:
        """Deletes a resource; with ``wait`` (seconds), until it is gone
        (finalizers done). NotFoundError when absent unless ``missing_ok``."""
        ns = namespace or self.namespace
        try:
            self._do("delete", kind, name, lambda: self._api.delete_namespaced_custom_object(
                GROUP, VERSION, ns, self._plural(kind), name))
        except NotFoundError:
            if missing_ok:
                return
            raise
        if wait is not None:
            deadline = time.monotonic() + wait
            while True:
                try:
                    self.get(kind, name, namespace=ns)
                except NotFoundError:
                    return
                if time.monotonic() > deadline:
                    raise ZiptrailTimeoutError("delete", f"{kind} {name} still exists after {wait}s (finalizers pending?)")
                time.sleep(0.1)

    # --- per kind -----------------------------------------------------------

    def create_bucket(self, name: str, spec: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return self.create("Bucket", name, spec or {}, **kw)

    def create_trigger(self, name: str, spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.create("Trigger", name, spec, **kw)

    def create_workflow(self, name: str, spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.create("Workflow", name, spec, **kw)

    def apply_bucket(self, name: str, spec: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return self.apply("Bucket", name, spec or {}, **kw)

    def apply_trigger(self, name: str, spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.apply("Trigger", name, spec, **kw)

    def apply_workflow(self, name: str, spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return self.apply("Workflow", name, spec, **kw)

    def wait_ready(self, kind: str, name: str, timeout: float = 60, *, namespace: str | None = None) -> dict[str, Any]:
        """Waits until the resource's Ready condition is True; the timeout
        error carries its last Ready message."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.get(kind, name, namespace=namespace)
            ready = next((c for c in obj.get("status", {}).get("conditions", []) if c.get("type") == "Ready"), None)
            if ready and ready.get("status") == "True":
                return obj
            if time.monotonic() > deadline:
                why = f"{ready.get('reason')}: {ready.get('message')}" if ready else "no Ready condition yet"
                raise ZiptrailTimeoutError("wait_ready", f"{kind} {name} not ready after {timeout}s ({why})")
            time.sleep(0.1)


def _urllib3_errors() -> type[BaseException]:
    try:
        import urllib3

        return urllib3.exceptions.HTTPError
    except ImportError:  # pragma: no cover - kubernetes depends on urllib3
        return OSError
