"""The Pheromone library inside a handler (which transport send_object
takes, the metadata the trigger engine reads), and that the committed gRPC
stubs match the proto."""

from __future__ import annotations

import base64
import filecmp
import json
import subprocess
import sys
import threading
import urllib.request

import pytest

import ziptrail
from conftest import REPO, SDK, Sidecars


def call(handler, env: dict | None = None) -> tuple[str, dict]:
    """Runs one invocation through make_server; returns (content type, outputs)."""
    srv = ziptrail.make_server(handler, port=0, host="127.0.0.1")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        body = json.dumps(env or {"function": "wf-map", "session": "s1", "invocation": "i1"}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{srv.server_address[1]}/", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.headers["Content-Type"], json.loads(r.read())
    finally:
        srv.shutdown()
        srv.server_close()


def test_created_objects_carry_engine_metadata_in_the_response():
    """create_object + send_object(obj) inside a handler return the objects
    with the response, with the metadata keys internal/engine reads
    (group, ziptrail.expected-keys/-count, ziptrail.declare-only); the old
    positional form still works next to it."""
    sent = []

    def handler(inv):
        sent.append(ziptrail.send_object(ziptrail.create_object("shuffle", "w-a", group="p1", value=b"1")))
        decl = ziptrail.create_object("parts", "plan", expected_keys=["a", "b"], expected_count=2, declare_only=True)
        sent.append(ziptrail.send_object(decl))
        sent.append(ziptrail.send_object("parts", "a", "x", metadata={"n": 1}))
        return b"ok"

    ctype, out = call(handler)
    assert ctype == ziptrail.server.OUTPUTS_CONTENT_TYPE
    objs = [(o["bucket"], o["key"], base64.b64decode(o["inline"]), o.get("metadata")) for o in out["objects"]]
    assert objs == [
        ("shuffle", "w-a", b"1", {"group": "p1"}),
        ("parts", "plan", b"", {"ziptrail.expected-keys": "a,b", "ziptrail.expected-count": "2", "ziptrail.declare-only": "true"}),
        ("parts", "a", b"x", {"n": "1"}),
    ]
    assert [s.transport for s in sent] == ["response"] * 3


def test_metadata_validation():
    with pytest.raises(ziptrail.InvalidError, match="without commas"):
        ziptrail.create_object("b", "k", expected_keys=["a,b"])
    with pytest.raises(ziptrail.InvalidError, match="at least 1"):
        ziptrail.create_object("b", "k", expected_count=0)
    with pytest.raises(ziptrail.InvalidError, match="bucket and key"):
        ziptrail.create_object("", "k")
    with pytest.raises(ziptrail.InvalidError, match="either an object"):
        ziptrail.send_object(ziptrail.create_object("b", "k"), "k2", b"x")


def test_persist_inside_a_handler_goes_through_the_sidecar(sidecars: Sidecars, minio):
    """persist=True inside a handler uses the sidecar (session and
    invocation of the current invocation), not the response: the object is
    reported once, and another pod reads it back from S3."""
    a, b = sidecars.start(**minio.env()), sidecars.start(**minio.env())
    ziptrail.set_default_client(a.client)
    results = []

    def handler(inv):
        results.append(ziptrail.send_object(ziptrail.create_object("final", "r", value=b"z" * 100_000), persist=True))
        ziptrail.send_object("log", "line", b"kept in the response")
        return b"done"

    try:
        _, out = call(handler)
    finally:
        ziptrail.set_default_client(None)
    assert [(o["bucket"], o["key"]) for o in out["objects"]] == [("log", "line")]
    assert results[0].transport == "sidecar" and results[0].persisted
    with ziptrail.get_object("final", "r", session="s1", client=b.client) as got:
        assert bytes(got) == b"z" * 100_000 and got.source == "s3"


def test_large_send_object_inside_a_handler_goes_by_reference(sidecars: Sidecars):
    """An object a handler sends larger than BY_REFERENCE is put into the
    pod's object store for the session at once and travels in the response
    as a reference (no base64 copy, no 64 MiB response cap); a small one
    stays inline, and a handler served without a sidecar keeps it inline."""
    a = sidecars.start()
    big = bytes(range(256)) * ((ziptrail.server.BY_REFERENCE + 4096) // 256)
    ziptrail.set_default_client(a.client)

    def handler(inv):
        ziptrail.send_object("big", "b", big, metadata={"part": "1"})
        ziptrail.send_object("small", "s", b"tiny")
        return b"done"

    try:
        _, out = call(handler)
    finally:
        ziptrail.set_default_client(None)
    large, small = out["objects"]
    assert large["key"] == "b" and large["size"] == len(big) and large["ref"] and "inline" not in large
    assert large["metadata"] == {"part": "1"}
    assert small["key"] == "s" and base64.b64decode(small["inline"]) == b"tiny" and "ref" not in small
    with a.client.get(large["ref"]) as got:
        assert bytes(got) == big
    # No sidecar: inline, as before.
    _, out = call(lambda inv: ziptrail.send_object("big", "b", big) and b"")
    assert base64.b64decode(out["objects"][0]["inline"]) == big and "ref" not in out["objects"][0]


def test_committed_stubs_match_the_proto(tmp_path):
    """sdk/python/ziptrail/_proto is what hack/generate.sh produces from
    proto/ziptrail/sidecar/v1/sidecar.proto (nothing hand-edited)."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools generates the stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iziptrail/_proto=proto/ziptrail/sidecar/v1",
                    f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                    "ziptrail/_proto/sidecar.proto"], cwd=REPO, check=True)
    names = ["sidecar_pb2.py", "sidecar_pb2.pyi", "sidecar_pb2_grpc.py"]
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "ziptrail" / "_proto", SDK / "ziptrail" / "_proto", names, shallow=False)
    assert (mismatch, errors) == ([], []), "stale stubs: run `make generate`"
