"""Fixtures that run real servers: queue-proxy-zl sidecars (standalone
mode, built once per session with `go build`, or $ZIPTRAIL_QUEUE_PROXY),
Python function servers behind them, MinIO, and the envtest control plane.
Every process is started here and killed at teardown."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

import ziptrail

REPO = Path(__file__).resolve().parents[3]
SDK = REPO / "sdk" / "python"
CACHE = Path(os.environ.get("ZIPTRAIL_CACHE", Path.home() / ".cache" / "ziptrail"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen | None = None, limit: float = 60) -> None:
    """Polls ready() until it holds; fails if proc exits or after limit
    seconds (a bound on start-up, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {limit:.0f}s")
        time.sleep(0.02)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


READY = re.compile(r"standalone, invocations on (\S+), data plane on port (\d+),")


def ready_line(proc: subprocess.Popen) -> dict[str, str]:
    """Forwards a standalone sidecar's stderr to ours from a thread; the
    returned dict gets "listen" once the sidecar printed that it serves."""
    found: dict[str, str] = {}

    def forward() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            m = READY.search(line)
            if m and "listen" not in found:
                found["dataplane_port"] = m.group(2)
                found["listen"] = m.group(1)
            sys.stderr.write(line)

    threading.Thread(target=forward, daemon=True).start()
    return found


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def shm_base() -> str:
    """A tmpfs directory for object files when /dev/shm has room (4 GiB
    covers the 1 GiB test), else the normal temporary directory."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 4 << 30:
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


@pytest.fixture(scope="session")
def queue_proxy(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The queue-proxy-zl binary: $ZIPTRAIL_QUEUE_PROXY, else built once."""
    if os.environ.get("ZIPTRAIL_QUEUE_PROXY"):
        return os.environ["ZIPTRAIL_QUEUE_PROXY"]
    out = tmp_path_factory.mktemp("bin") / "queue-proxy-zl"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/queue-proxy-zl"], cwd=REPO, check=True)
    return str(out)


def write_keys(path: Path, key_id: str = "k1", fill: int = 7) -> str:
    secret = base64.b64encode(bytes([fill]) * 32).decode()
    path.write_text(f'{{"active":"{key_id}","keys":{{"{key_id}":"{secret}"}}}}')
    return str(path)


@pytest.fixture(scope="session")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_keys(tmp_path_factory.mktemp("keys") / "keys.json")


@dataclass
class Sidecar:
    """One running queue-proxy-zl process, as in a pod."""

    proc: subprocess.Popen
    listen: str  # host:port for invocations
    socket: str
    shm_dir: str
    namespace: str
    function_port: int = 0  # the user container's port (straight to the function, no sidecar)
    metrics_port: int = 0  # /metrics, when served
    dataplane_port: int = 0
    _client: ziptrail.Client | None = None
    _env: dict[str, str] = field(default_factory=dict, repr=False)  # the process's environment (restart)

    @property
    def url(self) -> str:
        return f"http://{self.listen}/"

    @property
    def client(self) -> ziptrail.Client:
        if self._client is None:
            self._client = ziptrail.Client(self.socket, self.shm_dir)
        return self._client

    def env(self) -> dict[str, str]:
        """The user container's environment for this pod."""
        return {"ZIPTRAIL_SOCKET": self.socket, "ZIPTRAIL_SHM_DIR": self.shm_dir}

    def metrics(self) -> str:
        """The sidecar's Prometheus metrics (text format)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as r:
            return r.read().decode()

    def kill(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        stop(self.proc)


@dataclass
class Sidecars:
    """Starts sidecars (and the user containers behind them) for a test."""

    binary: str
    key_file: str
    tmp: Path
    started: list[Sidecar] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    def start(self, namespace: str = "ns", function: str | None = None, key_file: str | None = None,
              **env: str) -> Sidecar:
        """Starts a pod: with ``function`` (Python source defining
        ``handler``), a function server behind the sidecar first, sharing
        the pod's socket and shared-memory directory."""
        sock_dir = tempfile.mkdtemp(prefix="zt")  # short: unix socket paths are limited
        shm = tempfile.mkdtemp(prefix="zt-objects-", dir=shm_base())
        self.dirs += [sock_dir, shm]
        sock = os.path.join(sock_dir, "sidecar.sock")
        upstream_port = free_port()
        if function is not None:
            self.function(function, {"ZIPTRAIL_SOCKET": sock, "ZIPTRAIL_SHM_DIR": shm}, upstream_port)
        # Port 0: the sidecar binds its ports itself and announces them once
        # it listens, so no port picked here can be taken in between.
        penv = dict(os.environ, SERVING_NAMESPACE=namespace, SERVING_POD_IP="127.0.0.1",
                    ZIPTRAIL_METRICS_PORT="0", ZIPTRAIL_SOCKET=sock,
                    ZIPTRAIL_SHM_DIR=shm, ZIPTRAIL_KEY_FILE=key_file or self.key_file)
        penv["ZIPTRAIL_DATAPLANE_PORT"] = "0"
        penv.update(env)
        return self._spawn(Sidecar(None, "127.0.0.1:0", sock, shm, namespace, upstream_port, _env=penv))  # type: ignore[arg-type]

    def restart(self, sc: Sidecar) -> Sidecar:
        """Kills ``sc`` (SIGKILL, as a crashed container) and starts a new
        queue-proxy-zl in its place: the same pod (socket, object
        directory, environment), the same user container behind it, the
        same invocation and data plane ports. The new process has none of
        the old one's memory (idempotency records, objects)."""
        sc.kill()
        env = dict(sc._env, ZIPTRAIL_DATAPLANE_PORT=str(sc.dataplane_port))
        return self._spawn(Sidecar(None, sc.listen, sc.socket, sc.shm_dir, sc.namespace, sc.function_port,  # type: ignore[arg-type]
                                   metrics_port=sc.metrics_port, _env=env))

    def _spawn(self, sc: Sidecar) -> Sidecar:
        proc = subprocess.Popen([self.binary, "--standalone", "--listen", sc.listen, "--upstream",
                                 f"http://127.0.0.1:{sc.function_port}"], env=sc._env, stderr=subprocess.PIPE, text=True)
        sc.proc = proc
        announced = ready_line(proc)
        self.started.append(sc)
        wait_for("queue-proxy-zl", lambda: announced.get("listen") is not None, proc)
        sc.listen, sc.dataplane_port = announced["listen"], int(announced["dataplane_port"])
        return sc

    def function(self, source: str, env: dict[str, str] | None = None, port: int | None = None) -> int:
        """Runs a Python function server (``serve(handler)`` from the SDK)
        in its own process; ``source`` defines ``handler``. Returns its port."""
        port = port or free_port()
        script = self.tmp / f"fn_{port}.py"
        script.write_text("import ziptrail\n" + textwrap.dedent(source) + "\nziptrail.serve(handler)\n")
        penv = dict(os.environ, PORT=str(port), PYTHONPATH=str(SDK) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        penv.update(env or {})
        proc = subprocess.Popen([sys.executable, str(script)], env=penv)
        self.procs.append(proc)
        wait_for("function server", lambda: port_open(port), proc)
        return port

    def close(self) -> None:
        for sc in self.started:
            sc.kill()
        for p in self.procs:
            stop(p)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sidecars(queue_proxy: str, key_file: str, tmp_path: Path) -> Iterator[Sidecars]:
    s = Sidecars(queue_proxy, key_file, tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def pair(sidecars: Sidecars) -> tuple[Sidecar, Sidecar]:
    """Two pods of one namespace: a producer and a consumer."""
    return sidecars.start(), sidecars.start()


# --- MinIO (the slow tier) ---------------------------------------------------

@dataclass
class MinIO:
    endpoint: str
    access_key: str = "ziptrail"
    secret_key: str = "ziptrail-secret"

    def env(self) -> dict[str, str]:
        return {"ZIPTRAIL_S3_ENDPOINT": self.endpoint, "ZIPTRAIL_S3_ACCESS_KEY": self.access_key,
                "ZIPTRAIL_S3_SECRET_KEY": self.secret_key}

    def make_bucket(self, name: str) -> None:
        """PUT /name, signed with AWS Signature V4 (no S3 client needed)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(b"").hexdigest()
        headers = {"host": self.endpoint, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canonical = "\n".join(["PUT", f"/{name}", "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload_hash])
        scope = f"{day}/us-east-1/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + self.secret_key).encode()
        for part in (day, "us-east-1", "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        req = urllib.request.Request(f"http://{self.endpoint}/{name}", method="PUT", headers={
            "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={signed}, Signature={sig}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinIO]:
    binary = shutil.which("minio") or str(CACHE / "bin" / "minio")
    if not os.path.exists(binary):
        pytest.fail("minio not found: run hack/install-deps.sh")
    m = MinIO(f"127.0.0.1:{free_port()}")
    env = dict(os.environ, MINIO_ROOT_USER=m.access_key, MINIO_ROOT_PASSWORD=m.secret_key, MINIO_BROWSER="off")
    proc = subprocess.Popen([binary, "server", "--quiet", "--address", m.endpoint, "--console-address",
                             f"127.0.0.1:{free_port()}", str(tmp_path_factory.mktemp("minio"))], env=env,
                            stdout=subprocess.DEVNULL)

    def live() -> bool:
        try:
            with urllib.request.urlopen(f"http://{m.endpoint}/minio/health/live", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    try:
        wait_for("minio", live, proc)

        def bucket_made() -> bool:  # 503 until MinIO finished initializing
            try:
                m.make_bucket("ziptrail")
                return True
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
                return False

        wait_for("minio bucket", bucket_made, proc)
        yield m
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            stop(proc)


# --- messaging: the operator's control server and sidecars on it ------------

@dataclass
class Control:
    """The operator's control server with its messaging directory, on a real
    API server (tests/testenv --control): sidecars connect to ``addr`` and
    authenticate with pod-bound tokens from :meth:`pod_token`."""

    proc: subprocess.Popen
    addr: str
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pod_token(self, namespace: str, pod: str) -> str:
        """Creates the pod (and its namespace) and returns the path of its
        token for the control stream's audience."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(f"pod {namespace} {pod}\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline().strip()
        if not line.startswith("TOKEN "):
            raise RuntimeError(f"testenv: pod {namespace}/{pod}: {line or 'exited'}")
        return line.split(" ", 1)[1]


@pytest.fixture(scope="session")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    if not os.environ.get("KUBEBUILDER_ASSETS"):
        pytest.fail('KUBEBUILDER_ASSETS is not set: eval "$(hack/install-deps.sh --env)"')
    tmp = tmp_path_factory.mktemp("control")
    binary = tmp / "testenv"
    subprocess.run(["go", "build", "-o", str(binary), "./sdk/python/tests/testenv"], cwd=REPO, check=True)
    proc = subprocess.Popen([str(binary), "--dir", str(tmp), "--control"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("CONTROL "):
            raise RuntimeError(f"testenv --control did not start (exit {proc.wait()})")
        yield Control(proc, line.split(" ", 1)[1].strip())
    finally:
        if proc.stdin:
            proc.stdin.close()  # the helper stops the control plane
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            stop(proc)


@pytest.fixture(scope="session")
def redis_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server (the fast tier: mailboxes) without persistence."""
    binary = shutil.which("redis-server") or str(CACHE / "bin" / "redis-server")
    if not os.path.exists(binary):
        pytest.fail("redis-server not found: run hack/install-deps.sh")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis"))], stdout=subprocess.DEVNULL)
    try:
        wait_for("redis-server", lambda: port_open(port), proc)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


@dataclass
class Pods:
    """Starts pods for messaging tests: each a queue-proxy-zl sidecar on the
    control server, as its own pod (pod-bound token), with Redis as its
    fast tier."""

    sidecars: Sidecars
    control: Control
    redis: str
    nodes: dict[str, str] = field(default_factory=dict)

    def start(self, namespace: str = "ns", pod: str | None = None, function: str | None = None,
              node: str | None = None, direct_tcp: bool = True) -> Sidecar:
        """A pod; with ``function`` (Python source defining ``handler``) its
        function server runs behind the sidecar; with ``node`` its sidecar
        shares that node's directory (same-node data plane and direct
        channels) and serves its metrics (``Sidecar.metrics``). Without
        ``direct_tcp`` its members in other pods talk through the
        sidecars' message streams, not over direct TCP channels."""
        pod = pod or f"pod-{uuid.uuid4().hex[:8]}"
        token = self.control.pod_token(namespace, pod)
        env = {} if direct_tcp else {"ZIPTRAIL_DIRECT_TCP": "off"}
        if node is not None:
            env |= {"ZIPTRAIL_NODE_DIR": self.node_dir(node), "ZIPTRAIL_NODE_NAME": node,
                    "ZIPTRAIL_POD_UID": token_pod_uid(token), "ZIPTRAIL_METRICS_PORT": str(free_port())}
        sc = self.sidecars.start(namespace, function, SERVING_POD=pod, ZIPTRAIL_OPERATOR_ADDR=self.control.addr,
                                 ZIPTRAIL_TOKEN_FILE=token, ZIPTRAIL_REDIS_ADDR=self.redis, **env)
        if node is not None:
            sc.metrics_port = int(env["ZIPTRAIL_METRICS_PORT"])
        return sc

    def node_dir(self, node: str) -> str:
        """The node directory of ``node`` (made once, with the mode the
        chart gives it: any pod creates its socket, none lists or removes
        the others')."""
        d = self.nodes.get(node)
        if d is None:
            d = self.nodes[node] = tempfile.mkdtemp(prefix="zn")  # short: socket paths are limited
            self.sidecars.dirs.append(d)
            os.chmod(d, 0o1733)
        return d

    def start_many(self, n: int, namespace: str = "ns", direct_tcp: bool = True) -> list[Sidecar]:
        return [self.start(namespace, direct_tcp=direct_tcp) for _ in range(n)]


def token_pod_uid(token_file: str) -> str:
    """The pod UID the API server bound a token to (its "kubernetes.io"
    claim): the UID views carry, after which a sidecar names its node
    messaging socket."""
    payload = Path(token_file).read_text().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims["kubernetes.io"]["pod"]["uid"]


@pytest.fixture
def pods(sidecars: Sidecars, control: Control, redis_addr: str) -> Pods:
    return Pods(sidecars, control, redis_addr)
