import base64
import json
import os
import threading
import urllib.error
import urllib.request

import pytest

import ziptrail


@pytest.fixture
def server(tmp_path):
    seen = {}

    def handler(inv: ziptrail.Invocation):
        assert ziptrail.current_invocation() is inv
        if inv.args == b"fail":
            raise RuntimeError("the handler failed")
        big = inv.object("chunks", "big")
        seen["big_is_view"] = isinstance(big.data, memoryview)
        seen["group"] = inv.group
        return inv.object("chunks", "small").bytes() + b":" + bytes(big.data[-4:])

    srv = ziptrail.make_server(handler, port=0, host="127.0.0.1", shm_dir=str(tmp_path))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/", seen
    srv.shutdown()
    srv.server_close()


def post(url, env):
    req = urllib.request.Request(url, data=json.dumps(env).encode(), method="POST",
                                 headers={"Content-Type": ziptrail.invocation.CONTENT_TYPE})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_inputs_inline_and_mapped(server, tmp_path):
    url, seen = server
    big = b"0123456789abcdef" * (1 << 16)
    name = "in-" + os.urandom(16).hex()  # as the sidecar names a pulled input
    (tmp_path / name).write_bytes(big)
    env = {"namespace": "ns", "function": "map", "session": "s", "invocation": "i", "group": "g1",
           "objects": [{"bucket": "chunks", "key": "small", "size": 2, "inline": base64.b64encode(b"hi").decode()},
                       {"bucket": "chunks", "key": "big", "size": len(big), "path": name, "ref": "zt1.x"}]}
    assert post(url, env) == (200, b"hi:cdef")
    assert seen == {"big_is_view": True, "group": "g1"}


@pytest.mark.parametrize("env,code,msg", [
    ({"session": 1}, 400, b"session, function and invocation id are required"),
    ({"function": "f", "session": "s", "invocation": "i", "args": base64.b64encode(b"fail").decode()}, 500, b"the handler failed"),
    ({"function": "f", "session": "s", "invocation": "i", "objects": [{"bucket": "b", "key": "k", "path": "/nonexistent/x"}]}, 400,
     b"not a name the pod's sidecar gives"),
    ({"function": "f", "session": "s", "invocation": "i", "objects": [{"bucket": "b", "key": "k", "path": "in-" + "0" * 32}]}, 400,
     b"No such file"),
    ({"function": "f", "session": "s", "invocation": "i", "objects": [{"bucket": "b", "key": "k", "ref": "zt1.x"}]}, 400, b"unresolved"),
])
def test_bad_input_gets_clear_errors(server, env, code, msg):
    url, _ = server
    got_code, body = post(url, env)
    assert got_code == code and msg in body, (got_code, body)


def test_malformed_body(server):
    url, _ = server
    req = urllib.request.Request(url, data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and b"malformed envelope" in e.value.read()


def test_send_object_returns_outputs(tmp_path):
    def handler(inv):
        ziptrail.send_object("shuffle", "w-a", b"1", metadata={"group": "a"})
        ziptrail.send_object("shuffle", "w-b", "2", metadata={"group": "b"})
        return b"done"

    srv = ziptrail.make_server(handler, port=0, host="127.0.0.1")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        env = {"function": "map", "session": "s", "invocation": "i"}
        req = urllib.request.Request(f"http://127.0.0.1:{srv.server_address[1]}/", data=json.dumps(env).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"] == ziptrail.server.OUTPUTS_CONTENT_TYPE
            out = json.loads(r.read())
    finally:
        srv.shutdown()
        srv.server_close()
    assert base64.b64decode(out["return"]) == b"done"
    assert [(o["bucket"], o["key"], base64.b64decode(o["inline"]), o["metadata"]["group"]) for o in out["objects"]] == [
        ("shuffle", "w-a", b"1", "a"), ("shuffle", "w-b", b"2", "b")]


def test_send_object_outside_a_handler():
    with pytest.raises(ziptrail.ZiptrailError, match="outside a function invocation"):
        ziptrail.send_object("b", "k", b"x")
