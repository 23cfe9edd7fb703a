"""The admin client against a real kube-apiserver + etcd (envtest) with the
ziptrail CRDs, and the session client against the operator's real session
gateway, reconcilers and trigger engine, run in process by the Go helper
tests/testenv (which also plays Knative: every Knative Service becomes
Ready at the URL of a Python function server this module runs)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

import ziptrail
from conftest import REPO, free_port, port_open, stop, wait_for

admin_mod = pytest.importorskip("ziptrail.admin", reason="needs the kubernetes package")
from ziptrail.admin import Admin, Event, Sessions  # noqa: E402


BIG = bytes(range(256)) * (12 << 10)  # 3 MiB


def handler(inv: ziptrail.Invocation) -> bytes:
    """The workflows' functions: "<wf>-upper" upper-cases its input into
    the output bucket; "<wf>-crash" fails; "<wf>-big" returns 3 MiB."""
    if inv.function.endswith("-crash"):
        raise RuntimeError("crashed on purpose")
    if inv.function.endswith("-big"):
        return BIG
    data = inv.objects[0].bytes()
    ziptrail.send_object("output", "result", data.upper())
    return b""


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(kubeconfig, gateway URL) of a running control plane and operator."""
    if not os.environ.get("KUBEBUILDER_ASSETS"):
        pytest.fail('KUBEBUILDER_ASSETS is not set: eval "$(hack/install-deps.sh --env)"')
    tmp = tmp_path_factory.mktemp("testenv")
    fn = ziptrail.make_server(handler, port=0, host="127.0.0.1")
    threading.Thread(target=fn.serve_forever, daemon=True).start()
    binary = tmp / "testenv"
    subprocess.run(["go", "build", "-o", str(binary), "./sdk/python/tests/testenv"], cwd=REPO, check=True)
    gw_port = free_port()
    proc = subprocess.Popen([str(binary), "--dir", str(tmp), "--gateway", f"127.0.0.1:{gw_port}",
                             "--function-url", f"http://127.0.0.1:{fn.server_address[1]}/"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("READY "):
            raise RuntimeError(f"testenv did not start (exit {proc.wait()})")
        wait_for("gateway", lambda: port_open(gw_port), proc)
        yield line.split(" ", 1)[1].strip(), f"http://127.0.0.1:{gw_port}"
    finally:
        if proc.stdin:
            proc.stdin.close()  # the helper stops the control plane
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            stop(proc)
        fn.shutdown()
        fn.server_close()


@pytest.fixture
def admin(control_plane) -> Iterator[Admin]:
    with Admin("default", kubeconfig=control_plane[0]) as a:
        yield a


def test_bucket_crud(admin: Admin):
    """Create, read, list, update, apply, delete a Bucket; clear errors for
    duplicates and missing ones."""
    created = admin.create_bucket("events", {"objectTTL": "5m"})
    assert created["metadata"]["name"] == "events" and created["spec"]["objectTTL"] == "5m"
    with pytest.raises(ziptrail.ConflictError, match="already exists"):
        admin.create_bucket("events", {})
    assert admin.get("Bucket", "events")["spec"]["objectTTL"] == "5m"
    assert "events" in [b["metadata"]["name"] for b in admin.list("Bucket")]
    assert admin.update("Bucket", "events", {"objectTTL": "10m"})["spec"]["objectTTL"] == "10m"
    assert admin.apply_bucket("events", {"objectTTL": "1m"})["spec"]["objectTTL"] == "1m"
    admin.delete("Bucket", "events", wait=30)
    with pytest.raises(ziptrail.NotFoundError, match="Bucket events"):
        admin.get("Bucket", "events")
    with pytest.raises(ziptrail.NotFoundError):
        admin.delete("Bucket", "events")
    admin.delete("Bucket", "events", missing_ok=True)


def test_trigger_validation_and_crud(admin: Admin):
    """The API server's CRD validation message reaches the caller as an
    InvalidError; a valid Trigger is created, updated and deleted."""
    with pytest.raises(ziptrail.InvalidError, match="rejected by the API server") as e:
        admin.create_trigger("bad", {"bucket": "events", "primitive": "Sometimes", "targets": ["f"]})
    assert "primitive" in str(e.value)
    admin.create_trigger("each", {"bucket": "events", "primitive": "Immediate", "targets": ["filter"]})
    t = admin.update("Trigger", "each", {"bucket": "events", "primitive": "Immediate", "targets": ["filter", "log"]})
    assert t["spec"]["targets"] == ["filter", "log"]
    admin.delete("Trigger", "each", wait=30)
    with pytest.raises(ziptrail.InvalidError, match="unknown kind"):
        admin.get("Function", "x")


def workflow(fn: str) -> dict:
    return {"entry": fn, "outputBucket": "output", "functions": [{"name": fn, "image": "example.com/fn:1"}],
            "buckets": [{"name": "output"}]}


def test_workflow_session_runs_through_the_gateway(admin: Admin, control_plane):
    """A Workflow created with the admin client becomes Ready (reconciler +
    Knative stand-in); a session started through the real gateway invokes
    the function, streams its progress and returns its result."""
    admin.apply_workflow("shout", workflow("upper"))
    admin.wait_ready("Workflow", "shout", timeout=60)
    sessions = Sessions(control_plane[1], namespace="default", kubeconfig=control_plane[0])
    events: list[Event] = []
    result = sessions.run("shout", b"hello pheromone", timeout=60, on_event=events.append)
    assert result == b"HELLO PHEROMONE"
    kinds = [e.kind for e in events]
    assert kinds[0] == "Started" and "Invoked" in kinds and kinds[-1] == "Completed", kinds
    done = [s for s in sessions.list("shout") if s.state == "Completed"]
    assert len(done) == 1 and done[0].invocations == 1
    assert sessions.get(done[0].id).result["key"] == "result"


def test_session_errors(admin: Admin, control_plane):
    """A failing function fails its session (FunctionFailedError with the
    cause); unknown workflows and sessions are NotFoundErrors; an
    unreachable gateway is UnavailableError."""
    admin.apply_workflow("broken", workflow("crash"))
    admin.wait_ready("Workflow", "broken", timeout=60)
    sessions = Sessions(control_plane[1], namespace="default", kubeconfig=control_plane[0])
    with pytest.raises(ziptrail.FunctionFailedError, match="crashed on purpose"):
        sessions.run("broken", b"x", timeout=60)
    with pytest.raises(ziptrail.NotFoundError, match="workflow not found"):
        sessions.start("nope")
    with pytest.raises(ziptrail.NotFoundError):
        sessions.result("no-such-session", timeout=1)
    with pytest.raises(ziptrail.UnavailableError):
        Sessions(f"http://127.0.0.1:{free_port()}", retry_for=0).start("x")
    admin.delete("Workflow", "broken", wait=60)


def test_session_credentials_and_large_results(admin: Admin, control_plane, tmp_path: Path):
    """The gateway checks Kubernetes credentials: no token is refused
    (401), a ServiceAccount without the ziptrail-session-runner role too
    (403, naming the role); the kubeconfig's token or one given works. A
    3 MiB result streams into a file with result_to."""
    from kubernetes import client

    admin.apply_workflow("large", {"entry": "big", "functions": [{"name": "big", "image": "example.com/fn:1"}]})
    admin.wait_ready("Workflow", "large", timeout=60)
    with pytest.raises(ziptrail.ZiptrailError, match="not authenticated.*bearer token"):
        Sessions(control_plane[1], token="").start("large")
    with pytest.raises(ziptrail.ZiptrailError, match="not authenticated"):
        Sessions(control_plane[1], token="forged").start("large")

    core = client.CoreV1Api(admin.api_client)
    core.create_namespaced_service_account("default", {"metadata": {"name": "guest"}})
    token = core.create_namespaced_service_account_token("guest", "default", {"spec": {}}).status.token
    with pytest.raises(ziptrail.ZiptrailError, match="not allowed.*system:serviceaccount:default:guest.*ziptrail-session-runner"):
        Sessions(control_plane[1], token=token).start("large")
    client.RbacAuthorizationV1Api(admin.api_client).create_namespaced_role_binding("default", {
        "metadata": {"name": "guest-sessions"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ziptrail-session-runner"},
        "subjects": [{"kind": "ServiceAccount", "name": "guest", "namespace": "default"}]})

    guest = Sessions(control_plane[1], token=token)
    started = []

    def allowed() -> bool:
        try:
            started.append(guest.start("large"))
            return True
        except ziptrail.ZiptrailError:
            return False  # the gateway keeps a denial for 2s
    wait_for("the role binding to count", allowed)

    s = started[0]
    out = tmp_path / "result.bin"
    with open(out, "wb") as f:
        assert guest.result_to(s.id, f, timeout=60) == len(BIG)
    assert out.read_bytes() == BIG
    s = guest.start("large")
    assert guest.result(s.id, timeout=60) == BIG
    admin.delete("Workflow", "large", wait=60)


def test_plan_with_and_without_calibration(admin: Admin, control_plane):
    """Sessions.plan asks the real gateway's shuffle planner: the built-in
    defaults (calibrated False) until the operator's namespace holds the
    calibration ConfigMap, then its parameters; the planner's refusals are
    InvalidErrors with the reason; strangers are refused."""
    from kubernetes import client

    sessions = Sessions(control_plane[1], namespace="default", kubeconfig=control_plane[0])
    plan = sessions.plan(4 << 30, fast_capacity=1 << 30, max_worker_memory=2 << 30, budget=0.5)
    assert not plan.calibrated and plan.warning == ""
    assert plan.method in ("s3", "redis", "podmemory", "hybrid"), plan
    assert plan.parallelism >= 1 and plan.worker_memory >= 128 << 20 and plan.seconds > 0 and plan.dollars <= 0.5
    assert [o.method for o in plan.alternatives] == ["s3", "redis", "podmemory", "hybrid"]
    chosen = next(o for o in plan.alternatives if o.method == plan.method)
    assert (chosen.seconds, chosen.dollars, chosen.parallelism, chosen.meets_constraint) == (plan.seconds, plan.dollars, plan.parallelism, True)
    # The fast tier holds a quarter of the data: Redis alone cannot run it.
    redis = next(o for o in plan.alternatives if o.method == "redis")
    assert not redis.feasible and redis.reason
    assert plan.document["result"]["input"]["budget"] == 0.5

    cheap = sessions.plan(4 << 30, fast_capacity=1 << 30, deadline=3600, methods=["s3", "hybrid"],
                          prices={"slowPerPut": 0.0})
    assert [o.method for o in cheap.alternatives] == ["s3", "hybrid"]
    assert cheap.document["result"]["input"]["objective"] == "cheapest" and cheap.document["prices"]["slowPerPut"] == 0

    for kwargs, message in (({"size": -1}, "data size must be positive"),
                            ({"size": 1 << 30, "methods": ["tape"]}, 'unknown method "tape"'),
                            ({"size": 1 << 30, "budget": 1, "deadline": 60}, "not both"),
                            ({"size": 1 << 30, "prices": {"gold": 1}}, "unknown field")):
        with pytest.raises(ziptrail.InvalidError, match=message):
            sessions.plan(**kwargs)
    with pytest.raises(ziptrail.ZiptrailError, match="not authenticated"):
        Sessions(control_plane[1], token="").plan(1 << 30)

    # The calibration `ziptrail calibrate --configmap` writes.
    doc = dict(plan.document["calibration"])
    doc["time"] = "2026-11-03T10:00:00Z"
    doc["measuredOn"] = {"kind": "cluster", "name": "pytest-cluster"}
    doc["params"] = dict(doc["params"], workerStartup=doc["params"]["workerStartup"] * 3)
    core = client.CoreV1Api(admin.api_client)
    core.create_namespace({"metadata": {"name": "ziptrail-system"}})
    core.create_namespaced_config_map("ziptrail-system", {"metadata": {"name": "ziptrail-shuffle-calibration"},
                                                          "data": {"calibration.json": json.dumps(doc)}})
    try:
        calibrated = sessions.plan(4 << 30, fast_capacity=1 << 30, max_worker_memory=2 << 30, budget=0.5)
        assert calibrated.calibrated and calibrated.warning == ""
        assert calibrated.document["calibration"]["measuredOn"]["name"] == "pytest-cluster"
        assert calibrated.seconds != plan.seconds  # three times the start-up time
    finally:
        core.delete_namespaced_config_map("ziptrail-shuffle-calibration", "ziptrail-system")


def test_result_asks_again_while_the_engine_moves():
    """A gateway answers as while the session's workflow's engine moves
    between operator replicas: 503 (ErrEngineMoving), then 202 at once (the
    wait on the old owner ended with the move), then the result. The client
    asks again each time, in a moment, and returns the result; another 503
    is the caller's once retries are over (at once without retries)."""
    calls: list[str] = []
    moving = ("the workflow's engine is moving to another operator replica: "
              "workflow default/w (engine bucket b): no owner yet")

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            calls.append(self.path)
            n = len(calls)
            sid = self.path.split("/")[5]
            if sid == "other-1":
                code, body = 503, json.dumps({"error": "the gateway is shutting down"}).encode()
            elif n <= 2:
                code, body = 503, json.dumps({"error": moving}).encode()
            elif n == 3:
                code, body = 202, json.dumps({"id": sid, "state": "Running"}).encode()
            else:
                code, body = 200, b"done"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        s = Sessions(f"http://127.0.0.1:{srv.server_address[1]}", token="t")
        assert s.result("w-1", timeout=60) == b"done"
        assert len(calls) == 4 and all("/sessions/w-1/result?wait=" in c for c in calls)
        with pytest.raises(ziptrail.UnavailableError, match="shutting down"):
            Sessions(f"http://127.0.0.1:{srv.server_address[1]}", token="t", retry_for=0).result("other-1", timeout=60)
    finally:
        srv.shutdown()
