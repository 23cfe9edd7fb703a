"""Workflow sessions through the operator's session gateway (HTTP, stdlib
only): :class:`Sessions`, re-exported by :mod:`ziptrail.admin`, whose
docstring describes the client; :class:`ziptrail.admin.Admin` is the
Kubernetes half.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator

from .errors import (ExpiredError, FunctionFailedError, InvalidError, NotFoundError, UnavailableError,
                     ZiptrailError, ZiptrailTimeoutError)

ENV_GATEWAY = "ZIPTRAIL_GATEWAY"
ENV_TOKEN = "ZIPTRAIL_TOKEN"
SA_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
#: bytes per read when a result streams
CHUNK = 256 << 10
#: how long session calls are retried by default (seconds), the first and
#: the longest pause of the back-off, and the longest Retry-After honoured
RETRY_FOR = 120.0
_RETRY_FIRST, _RETRY_MAX, _RETRY_AFTER_MAX = 0.2, 5.0, 30.0
IDEMPOTENCY_KEY = "Idempotency-Key"


log = logging.getLogger("ziptrail.admin")


# --- sessions through the gateway ------------------------------------------

@dataclass(frozen=True)
class Event:
    """One line of a session's progress (Started, Invoked, ObjectReady,
    Rerun, InvokeFailed, Completed, Failed, Expired)."""

    kind: str
    message: str
    time: str = ""


@dataclass(frozen=True)
class Session:
    id: str
    namespace: str
    workflow: str
    state: str  # Running, Completed, Failed, Expired
    invocations: int = 0
    objects: int = 0
    error: str = ""
    result: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return self.state != "Running"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Session:
        return cls(id=d["id"], namespace=d.get("namespace", ""), workflow=d.get("workflow", ""), state=d.get("state", ""),
                   invocations=d.get("invocations", 0), objects=d.get("objects", 0), error=d.get("error", ""),
                   result=d.get("result"),
                   events=[Event(e.get("kind", ""), e.get("message", ""), e.get("time", "")) for e in d.get("events") or []])


@dataclass(frozen=True)
class PlanOption:
    """One shuffle method's best plan: its workers (``parallelism`` of
    ``worker_memory`` bytes), the hybrid's rounds, the predicted time in
    seconds and cost in dollars. ``feasible`` is False when the method
    cannot run the shuffle at all (``reason`` says why);
    ``meets_constraint`` says whether it is within the budget or deadline."""

    method: str
    parallelism: int = 0
    worker_memory: int = 0
    rounds: int = 0
    round_bytes: int = 0
    seconds: float = 0.0
    dollars: float = 0.0
    feasible: bool = False
    meets_constraint: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """The shuffle planner's answer (:meth:`Sessions.plan`): the chosen
    method (None when no plan meets the constraint; ``reason`` says why)
    with its parallelism, worker memory, rounds and predictions, every
    method's best in ``alternatives`` (the chosen one included), whether
    the cluster's calibration was used (``warning``: why a calibration that
    exists was not), and the whole answer in ``document`` (the JSON of
    ``ziptrail explain -o json``: phases, costs, calibration, prices)."""

    method: str | None
    parallelism: int
    worker_memory: int
    rounds: int
    round_bytes: int
    seconds: float
    dollars: float
    reason: str
    alternatives: list[PlanOption]
    calibrated: bool
    warning: str = ""
    document: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        result = d.get("result") or {}
        chosen = result.get("chosen")
        alternatives = []
        for o in result.get("options") or []:
            best = o.get("best")
            fields: dict[str, Any] = {"method": o.get("method", "")}
            if best:
                fields.update(_prediction(best), feasible=True)
            alternatives.append(PlanOption(meets_constraint=bool(o.get("meetsConstraint")), reason=o.get("reason", ""), **fields))
        c = _prediction(chosen) if chosen else {}
        return cls(method=c.get("method"), parallelism=c.get("parallelism", 0), worker_memory=c.get("worker_memory", 0),
                   rounds=c.get("rounds", 0), round_bytes=c.get("round_bytes", 0), seconds=c.get("seconds", 0.0),
                   dollars=c.get("dollars", 0.0), reason=result.get("reason", ""), alternatives=alternatives,
                   calibrated=bool(d.get("calibrated")), warning=d.get("warning", ""), document=d)


def _prediction(p: dict[str, Any]) -> dict[str, Any]:
    cfg = p.get("config") or {}
    return {"method": cfg.get("method", ""), "parallelism": int(cfg.get("parallelism", 0)),
            "worker_memory": int(cfg.get("workerMemory", 0)), "rounds": int(p.get("rounds", 0)),
            "round_bytes": int(p.get("roundBytes", 0)), "seconds": float(p.get("seconds", 0)),
            "dollars": float(p.get("cost", 0))}


class _Credentials:
    """The bearer token sent to the gateway: ``token`` (``""``: none),
    else ``$ZIPTRAIL_TOKEN``, else the kubeconfig's (``kubeconfig``/``context``,
    default ``$KUBECONFIG`` or ``~/.kube/config``; needs the kubernetes
    package; exec plugins are refreshed as the kubernetes client refreshes
    them), else the pod's ServiceAccount token. None found: requests go
    without, and the gateway's 401 says what it needs."""

    def __init__(self, token: str | None, kubeconfig: str | None, context: str | None) -> None:
        if token is None:
            token = os.environ.get(ENV_TOKEN) or None
        self._token = token  # "": send none
        self._kubeconfig, self._context = kubeconfig, context
        self._config: Any = None
        self._loaded = False

    def header(self) -> str | None:
        if self._token is not None:
            return f"Bearer {self._token}" if self._token else None
        if not self._loaded:
            self._loaded = True
            self._config = self._load_kubeconfig()
        if self._config is not None:
            hook = getattr(self._config, "refresh_api_key_hook", None)
            if hook is not None:
                hook(self._config)
            auth = (self._config.api_key or {}).get("authorization") or (self._config.api_key or {}).get("BearerToken")
            if auth:
                return auth if auth.lower().startswith("bearer ") else f"Bearer {auth}"
        if self._kubeconfig is None and os.path.exists(SA_TOKEN_FILE):
            with open(SA_TOKEN_FILE, encoding="utf-8") as f:  # re-read: the kubelet rotates it
                return f"Bearer {f.read().strip()}"
        return None

    def _load_kubeconfig(self) -> Any:
        try:
            from kubernetes import client, config
        except ImportError:
            return None
        cfg = client.Configuration()
        try:
            config.load_kube_config(config_file=self._kubeconfig, context=self._context, client_configuration=cfg)
        except (config.ConfigException, OSError, TypeError):
            if self._kubeconfig is not None:
                raise InvalidError("sessions", f"cannot load the kubeconfig {self._kubeconfig}") from None
            return None
        return cfg


class Sessions:
    """Runs workflow sessions through the operator's session gateway
    (``url`` defaults to ``$ZIPTRAIL_GATEWAY``). Every request carries a
    Kubernetes bearer token (see :class:`_Credentials`: ``token=``,
    ``$ZIPTRAIL_TOKEN``, the kubeconfig's, the pod's ServiceAccount's)."""

    def __init__(self, url: str | None = None, namespace: str = "default", *, timeout: float = 30,
                 token: str | None = None, kubeconfig: str | None = None, context: str | None = None,
                 retry_for: float = RETRY_FOR, on_retry: Callable[[str, str, float], None] | None = None) -> None:
        url = url or os.environ.get(ENV_GATEWAY, "")
        if not url:
            raise InvalidError("sessions", f"no gateway URL: pass one or set {ENV_GATEWAY}")
        self.url = url.rstrip("/")
        self.namespace = namespace
        self.timeout = timeout  # per HTTP request, besides waits
        #: seconds a call is retried while the gateway is unreachable or
        #: answers 503 (0: no retries); on_retry(op, why, pause) is told of
        #: each retry (default: logged on the "ziptrail.admin" logger)
        self.retry_for = retry_for
        self.on_retry = on_retry or (lambda op, why, pause: log.warning("%s: gateway %s, retrying in %.1fs", op, why, pause))
        self._creds = _Credentials(token, kubeconfig, context)

    def _path(self, *parts: str) -> str:
        return f"{self.url}/v1/namespaces/{urllib.parse.quote(self.namespace)}/" + "/".join(urllib.parse.quote(p) for p in parts)

    def _open(self, op: str, method: str, url: str, body: bytes | None = None, timeout: float | None = None,
              headers: dict[str, str] | None = None) -> Any:
        """Sends a request and returns the open response (2xx), or raises;
        sends it again while the gateway is unreachable or answers 503,
        within retry_for."""
        backoff = _Backoff(self.retry_for)
        while True:
            try:
                return self._open_once(op, method, url, body, timeout, headers)
            except _Retryable as e:
                pause = backoff.next(e.retry_after)
                if pause is None:
                    raise e.error from None
                self.on_retry(op, e.why, pause)
                time.sleep(pause)

    def _open_once(self, op: str, method: str, url: str, body: bytes | None, timeout: float | None,
                   headers: dict[str, str] | None) -> Any:
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        if body is not None and not req.has_header("Content-type"):
            req.add_header("Content-Type", "application/octet-stream")
        auth = self._creds.header()
        if auth:
            req.add_header("Authorization", auth)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            data = e.read()
            try:
                message = json.loads(data).get("error", "") or data.decode()
            except (ValueError, AttributeError):
                message = data.decode("utf-8", "replace")
            if e.code == 503:
                raise _Retryable("unavailable (503)", _retry_after(e.headers.get("Retry-After")),
                                 _gateway_error(op, e.code, message)) from None
            raise _gateway_error(op, e.code, message) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            if isinstance(e, TimeoutError) or "timed out" in str(e):
                raise ZiptrailTimeoutError(op, f"the gateway at {self.url} did not answer in time: {e}") from None
            err = UnavailableError(op, f"cannot reach the gateway at {self.url}: {e}")
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            if isinstance(reason, (ConnectionError, http.client.HTTPException)):
                raise _Retryable(f"unreachable ({reason})", 0.0, err) from None
            raise err from None

    def _request(self, op: str, method: str, url: str, body: bytes | None = None, timeout: float | None = None) -> tuple[int, dict[str, str], bytes]:
        with self._open(op, method, url, body, timeout or self.timeout) as r:
            return r.status, dict(r.headers), r.read()

    def start(self, workflow: str, input: bytes | str = b"") -> Session:
        """Starts a session of a workflow with an input. The start carries
        an idempotency key, so its retries answer the same session."""
        data = input.encode() if isinstance(input, str) else bytes(input)
        with self._open("start", "POST", self._path("workflows", workflow, "sessions"), data, self.timeout,
                        headers={IDEMPOTENCY_KEY: os.urandom(16).hex()}) as r:
            return Session.from_json(json.loads(r.read()))

    def ack(self, session_id: str) -> None:
        """Acknowledges a completed session's result: the gateway frees it
        now, rather than minutes after its first full read. result() and
        result_to() acknowledge by themselves."""
        self._request("ack", "DELETE", self._path("sessions", session_id, "result"))

    def _ack_soon(self, session_id: str) -> None:
        """Acknowledges once, without retrying: unacknowledged, the gateway
        frees the result after its grace anyway."""
        try:
            with self._open_once("ack", "DELETE", self._path("sessions", session_id, "result"), None, self.timeout, None) as r:
                r.read()
        except (ZiptrailError, _Retryable):
            pass

    def get(self, session_id: str) -> Session:
        _, _, body = self._request("session", "GET", self._path("sessions", session_id))
        return Session.from_json(json.loads(body))

    def list(self, workflow: str = "") -> list[Session]:
        url = self._path("sessions") + (f"?workflow={urllib.parse.quote(workflow)}" if workflow else "")
        _, _, body = self._request("sessions", "GET", url)
        return [Session.from_json(s) for s in json.loads(body) or []]

    def events(self, session_id: str) -> Iterator[Event]:
        """Streams the session's progress (server-sent events) until it ends."""
        resp = self._open("events", "GET", self._path("sessions", session_id, "events"), headers={"Accept": "text/event-stream"})
        with resp:
            kind, data = "", ""
            for raw in resp:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif line == "" and (kind or data):
                    d = json.loads(data) if data else {}
                    yield Event(d.get("kind", kind), d.get("message", ""), d.get("time", ""))
                    kind, data = "", ""

    def result(self, session_id: str, timeout: float | None = None) -> bytes:
        """Waits for the session's result (``timeout`` seconds, None: as long
        as it runs) and returns it. Raises FunctionFailedError when the
        session failed, ExpiredError when it expired, ZiptrailTimeoutError
        when still running. For large results, result_to streams instead."""
        out = io.BytesIO()
        self.result_to(session_id, out, timeout)
        return out.getvalue()

    def result_to(self, session_id: str, out: BinaryIO, timeout: float | None = None) -> int:
        """Waits for the session's result like :meth:`result` and writes it
        to ``out`` (a binary file) as it arrives, in chunks: a result of any
        size passes without being held in memory. A transfer that breaks is
        read again and written on from where it broke (within retry_for).
        Returns its size; the result, read whole, is acknowledged."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _MOVING_PAUSE
        written = 0  # bytes of the result written to out
        cuts = _Backoff(self.retry_for)
        while True:
            wait = 60.0 if deadline is None else max(0.0, deadline - time.monotonic())
            url = self._path("sessions", session_id, "result") + f"?wait={wait:.3f}s"
            asked = time.monotonic()
            try:
                with self._open("result", "GET", url, timeout=wait + self.timeout) as r:
                    if r.status == 200:
                        size = int(r.headers.get("Content-Length", "-1"))
                        try:
                            written = _copy(r, out, size, session_id, written)
                        except _Cut as cut:
                            written = cut.written
                            again = cuts.next(0.0)
                            if again is None:
                                raise cut.error from None
                            self.on_retry("result", f"cut off the result after {written} bytes", again)
                            time.sleep(again)
                            continue
                        self._ack_soon(session_id)
                        return written
                    r.read()
                early = time.monotonic() - asked < wait / 2
            except UnavailableError as e:
                if _ENGINE_MOVING not in e.message:
                    raise
                early = True
            if deadline is not None and time.monotonic() >= deadline:
                raise ZiptrailTimeoutError("result", f"session {session_id} still running after {timeout}s")
            if early:
                # The workflow's engine is moving to another operator replica
                # (docs/sharding.md), or moved while the gateway waited: ask
                # again in a moment, when the gateway routes to its new owner.
                time.sleep(pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(2 * pause, 1.0)
            else:
                pause = _MOVING_PAUSE

    def plan(self, size: int, fast_capacity: int = 0, *, pod_memory: int = 0, min_worker_memory: int = 0,
             max_worker_memory: int = 0, max_parallelism: int = 0, objective: str = "", budget: float | None = None,
             deadline: float | None = None, methods: list[str] | None = None,
             prices: dict[str, float] | None = None) -> Plan:
        """Asks the gateway's shuffle planner how to shuffle ``size`` bytes
        (a dry run: nothing runs), with the cluster's calibration (the
        ConfigMap ``ziptrail calibrate --configmap`` writes; without one the
        built-in defaults, and ``calibrated`` is False).

        ``fast_capacity``: the fast tier's (Redis's) bytes the shuffle may
        use (0: none); ``pod_memory``: what the producer pods' object stores
        may hold together (0: each pod's own limit); worker memory between
        ``min_worker_memory`` and ``max_worker_memory`` (defaults 128 MiB
        and 3 GiB); at most ``max_parallelism`` workers (default 1024).
        The objective: the fastest plan within ``budget`` dollars, or the
        cheapest within ``deadline`` seconds (one of them at most;
        ``objective`` "fastest"/"cheapest" without either). ``methods``
        limits the methods considered (s3, redis, podmemory, hybrid);
        ``prices`` overrides prices by their JSON names (workerPerGiBSecond,
        slowPerGet, slowPerPut, slowPerGiBMonth, fastPerGiBHour,
        fastPerNodeHour, fastPerGiBTransferred). Needs the right to start
        sessions in the namespace; a request the planner refuses raises
        InvalidError with the reason."""
        req: dict[str, Any] = {"dataBytes": size}
        for key, value in (("fastCapacity", fast_capacity), ("podMemory", pod_memory),
                           ("minWorkerMemory", min_worker_memory), ("maxWorkerMemory", max_worker_memory),
                           ("maxParallelism", max_parallelism), ("objective", objective), ("budget", budget),
                           ("deadline", deadline), ("methods", methods), ("prices", prices)):
            if value:  # zero and empty: the planner's defaults; the planner checks the rest
                req[key] = value
        body = json.dumps(req).encode()
        with self._open("plan", "POST", self._path("shuffle", "plan"), body, self.timeout,
                        headers={"Content-Type": "application/json"}) as r:
            return Plan.from_json(json.loads(r.read()))

    def run(self, workflow: str, input: bytes | str = b"", *, timeout: float | None = None,
            on_event: Callable[[Event], None] | None = None) -> bytes:
        """Starts a session, streams its progress to ``on_event`` (in a
        background thread) and returns its result."""
        s = self.start(workflow, input)
        if on_event is not None:
            import threading

            def follow() -> None:
                try:
                    for e in self.events(s.id):
                        on_event(e)
                except ZiptrailError:
                    pass  # progress is best effort; the result call reports failures

            t = threading.Thread(target=follow, name=f"ziptrail-events-{s.id}", daemon=True)
            t.start()
            try:
                return self.result(s.id, timeout)
            finally:
                t.join(timeout=self.timeout)
        return self.result(s.id, timeout)


class _Cut(Exception):
    """A result's transfer broke after ``written`` bytes of it were written."""

    def __init__(self, written: int, error: ZiptrailError) -> None:
        super().__init__(str(error))
        self.written, self.error = written, error


def _copy(src: Any, out: BinaryIO, size: int, session_id: str, written: int = 0) -> int:
    """Writes a result's body to out, skipping the ``written`` bytes an
    earlier, broken transfer wrote already; returns the bytes written in
    all, or raises _Cut."""
    n = 0
    try:
        while True:
            chunk = src.read(CHUNK)
            if not chunk:
                break
            if n < written:  # written already
                skip = min(len(chunk), written - n)
                n += skip
                chunk = chunk[skip:]
                if not chunk:
                    continue
            out.write(chunk)
            n += len(chunk)
    except (OSError, http.client.HTTPException) as e:
        raise _Cut(max(n, written), UnavailableError(
            "result", f"result of session {session_id} cut off after {max(n, written)} bytes: {e}")) from None
    if size >= 0 and n != size:
        raise _Cut(max(n, written), UnavailableError(
            "result", f"result of session {session_id} cut off after {n} of {size} bytes"))
    return n


class _Retryable(Exception):
    """A request that may be sent again: why, the pause the gateway asked
    for (Retry-After), and the error to raise when retries are over."""

    def __init__(self, why: str, retry_after: float, error: ZiptrailError) -> None:
        super().__init__(why)
        self.why, self.retry_after, self.error = why, retry_after, error


def _retry_after(value: str | None) -> float:
    """Reads a Retry-After header given in seconds (0 otherwise)."""
    try:
        return max(0.0, float(value or 0))
    except ValueError:
        return 0.0


class _Backoff:
    """Paces retries within a budget of ``retry_for`` seconds from the
    first failure: doubling pauses from 0.2 s to 5 s, half fixed and half
    random, or the gateway's Retry-After (at most 30 s) when longer."""

    def __init__(self, retry_for: float) -> None:
        self.retry_for = retry_for
        self.start: float | None = None
        self.step = _RETRY_FIRST

    def next(self, retry_after: float) -> float | None:
        """The pause before the next try, or None once the budget is spent."""
        if self.retry_for <= 0:
            return None
        now = time.monotonic()
        if self.start is None:
            self.start = now
        left = self.retry_for - (now - self.start)
        if left <= 0:
            return None
        pause = self.step / 2 + random.uniform(0, self.step / 2)
        self.step = min(2 * self.step, _RETRY_MAX)
        return min(max(pause, min(retry_after, _RETRY_AFTER_MAX)), left)


#: What a gateway's 503 says while a workflow's engine changes operator
#: replicas (internal/operator/gateway ErrEngineMoving), and the first pause before
#: asking again (doubling to 1 s).
_ENGINE_MOVING = "the workflow's engine is moving to another operator replica"
_MOVING_PAUSE = 0.05


def _gateway_error(op: str, code: int, message: str) -> ZiptrailError:
    if code == 404:
        return NotFoundError(op, message)
    if code == 409 and op == "result":
        return FunctionFailedError(op, message)
    if code == 409:
        return UnavailableError(op, message)  # workflow not ready
    if code == 410:
        return ExpiredError(op, message)
    if code in (400, 411, 413):
        return InvalidError(op, message)
    if code == 401:
        return ZiptrailError(op, f"not authenticated: {message} (pass token= or a kubeconfig whose user has a token)")
    if code == 403:
        return ZiptrailError(op, f"not allowed: {message}")
    if code == 503:
        return UnavailableError(op, message)
    return ZiptrailError(op, f"gateway answered {code}: {message}")
