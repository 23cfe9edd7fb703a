"""The function server's trust boundary, tested as an attacker would: a
function reads only files its own sidecar placed in the pod's object
directory, and every malformed envelope gets a 400 naming the cause."""

from __future__ import annotations

import base64
import http.client
import json
import os
import threading
from pathlib import Path

import pytest

import ziptrail
from conftest import Sidecars

ECHO_FN = """
def handler(inv):
    return b"".join(o.bytes() for o in inv.objects)
"""

SIDECAR_NAME = "in-0123456789abcdef0123456789abcdef"  # the form of names the sidecar gives


def plant_secrets(shm: Path, outside: Path) -> tuple[dict[str, str], list[bytes]]:
    """What an attacker is after: another session's input in the object
    directory, a file outside it, symlinks to it from inside."""
    shm.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "token").write_bytes(b"SERVICE-ACCOUNT-TOKEN")
    (shm / "put-other").write_bytes(b"OTHER-SESSION-INPUT")
    (shm / (SIDECAR_NAME + "0")).write_bytes(b"NOT-FOR-THIS-CALL")
    os.symlink(outside / "token", shm / "link")
    os.symlink(outside / "token", shm / SIDECAR_NAME)
    (shm / "in-fedcba9876543210fedcba9876543210").mkdir()
    paths = {
        "file outside the directory": str(outside / "token"),
        "/etc/hostname": "/etc/hostname",
        "service account token": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "dot-dot out of the directory": os.path.relpath(outside / "token", shm),
        "another file in the directory": "put-other",
        "absolute path in the directory": str(shm / "put-other"),
        "symlink in the directory": "link",
        "symlink with a sidecar-like name": SIDECAR_NAME,
        "name with a separator": SIDECAR_NAME + "/x",
        "directory with a sidecar name": "in-fedcba9876543210fedcba9876543210",
        "sidecar-like name, wrong length": SIDECAR_NAME + "0",
        "missing file with a sidecar name": "in-00000000000000000000000000000000",
        "dot": ".",
        "dot-dot": "..",
    }
    return paths, [b"SERVICE-ACCOUNT-TOKEN", b"OTHER-SESSION-INPUT", b"NOT-FOR-THIS-CALL"]


def post(port: int, body: bytes, content_type: str = ziptrail.invocation.CONTENT_TYPE) -> tuple[int, bytes]:
    """POSTs raw bytes; a dropped connection is reported as status 0."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/", body=body, headers={"Content-Type": content_type})
        r = conn.getresponse()
        return r.status, r.read()
    except (http.client.HTTPException, ConnectionError) as e:
        return 0, f"connection dropped: {e!r}".encode()
    finally:
        conn.close()


def envelope(obj: dict | None = None, **kw) -> bytes:
    env = {"function": "f", "session": "s", "invocation": "i", **kw}
    if obj is not None:
        env["objects"] = [obj]
    return json.dumps(env).encode()


def assert_refused(where: str, code: int, body: bytes, leaks: list[bytes]) -> None:
    for s in leaks:
        assert s not in body, f"{where}: LEAKED {s!r}: {code} {body!r}"
    assert code == 400, f"{where}: {code} {body!r}, want 400"


@pytest.fixture
def echo_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    shm = tmp_path / "objects"
    monkeypatch.setenv("ZIPTRAIL_SHM_DIR", str(shm))
    paths, leaks = plant_secrets(shm, tmp_path / "secrets")
    srv = ziptrail.make_server(lambda inv: b"".join(o.bytes() for o in inv.objects), port=0, host="127.0.0.1")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1], paths, leaks
    finally:
        srv.shutdown()
        srv.server_close()


def test_paths_straight_to_the_function_are_refused(echo_server):
    """A request straight to the user container's port (no sidecar in
    between) cannot make the function read any file."""
    port, paths, leaks = echo_server
    for name, path in paths.items():
        for ct in (ziptrail.invocation.CONTENT_TYPE, "text/plain"):
            code, body = post(port, envelope({"bucket": "b", "key": "k", "path": path}), ct)
            assert_refused(f"{name} ({ct})", code, body, leaks)
    code, body = post(port, envelope({"bucket": "b", "key": "k", "path": "put-other",
                                      "inline": base64.b64encode(b"inline").decode()}))
    assert_refused("path next to inline bytes", code, body, leaks)


def test_paths_through_the_sidecar_are_refused(sidecars: Sidecars, tmp_path: Path):
    """The same attack against a real queue-proxy-zl with a Python function
    behind it: via the sidecar (it refuses envelopes naming paths; without
    ziptrail's content type they reach the function, which refuses them)
    and straight to the function's port; a real invocation still works."""
    a = sidecars.start()
    b = sidecars.start(function=ECHO_FN)
    paths, leaks = plant_secrets(Path(b.shm_dir), tmp_path / "secrets")
    for name, path in paths.items():
        for port in (int(b.listen.rsplit(":", 1)[1]), b.function_port):
            for ct in (ziptrail.invocation.CONTENT_TYPE, "text/plain"):
                code, body = post(port, envelope({"bucket": "b", "key": "k", "path": path}, namespace="ns"), ct)
                assert_refused(f"{name} (port {port}, {ct})", code, body, leaks)
    data = os.urandom(1 << 20)
    resp = a.client.invoke(b.url, data)
    assert resp.status == 200 and resp.body == data


GOOD = {"function": "f", "session": "s", "invocation": "i"}
OBJ = {"bucket": "b", "key": "k", "inline": base64.b64encode(b"x").decode()}


@pytest.mark.parametrize("env,reason", [
    ({**GOOD, "attempt": "x"}, b"attempt"),
    ({**GOOD, "attempt": 1.5}, b"attempt"),
    ({**GOOD, "attempt": [1]}, b"attempt"),
    ({**GOOD, "objects": "x"}, b"objects"),
    ({**GOOD, "objects": {"bucket": "b"}}, b"objects"),
    ({**GOOD, "objects": [1]}, b"object"),
    ({**GOOD, "objects": ["x"]}, b"object"),
    ({**GOOD, "objects": [{**OBJ, "size": "x"}]}, b"size"),
    ({**GOOD, "objects": [{**OBJ, "size": {}}]}, b"size"),
    ({**GOOD, "objects": [{**OBJ, "inline": "not base64!"}]}, b"base64"),
    ({**GOOD, "objects": [{**OBJ, "inline": "eA"}]}, b"base64"),
    ({**GOOD, "objects": [{**OBJ, "inline": 5}]}, b"inline"),
    ({**GOOD, "objects": [{**OBJ, "metadata": "x"}]}, b"metadata"),
    ({**GOOD, "objects": [{**OBJ, "metadata": {"a": 1}}]}, b"metadata"),
    ({**GOOD, "objects": [{**OBJ, "bucket": 5}]}, b"bucket"),
    ({**GOOD, "objects": [{"bucket": "b", "key": "k"}]}, b"neither a reference nor inline bytes"),
    ({**GOOD, "args": "%%%"}, b"base64"),
    ({**GOOD, "args": 7}, b"args"),
    ({**GOOD, "session": 1}, b"session"),
    ({**GOOD, "namespace": ["ns"]}, b"namespace"),
    ({**GOOD, "group": {}}, b"group"),
    ([GOOD], b"object"),
    ("GOOD", b"object"),
])
def test_malformed_envelopes_get_400(echo_server, env, reason):
    port, _, _ = echo_server
    code, body = post(port, json.dumps(env).encode())
    assert code == 400 and reason in body, (code, body)


@pytest.mark.parametrize("headers,reason", [
    ({"Content-Length": "x"}, b"Content-Length"),
    ({"Content-Length": "-1"}, b"Content-Length"),
    ({"Content-Length": str((64 << 20) + 1)}, b"exceeds"),
])
def test_bad_content_length_gets_a_clear_error(echo_server, headers, reason):
    port, _, _ = echo_server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", "/")
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        code, body = r.status, r.read()
    except (http.client.HTTPException, ConnectionError) as e:
        code, body = 0, repr(e).encode()
    finally:
        conn.close()
    assert code in (400, 413) and reason in body, (code, body)
