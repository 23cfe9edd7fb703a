"""The Zipline API and the Pheromone library against real queue-proxy-zl
processes (no mocks of the sidecar): put/get across pods, invoke with a
100 MB object, scatter/gather/broadcast, send_object/get_object, and every
error class the sidecar reports."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import time

import pytest

import ziptrail
from conftest import Sidecars, write_keys

MiB = 1 << 20

# A function behind a sidecar: reports what it received.
DIGEST_FN = """
import hashlib, json
def handler(inv):
    o = inv.objects[0]
    return json.dumps({"bucket": o.bucket, "size": o.size, "mapped": o._map is not None,
                       "sha256": hashlib.sha256(o.data).hexdigest(), "args": inv.args.decode()})
"""


def pattern(n: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


def files(d: str) -> list[str]:
    return sorted(os.listdir(d))


@pytest.mark.parametrize("size", [0, 10, 64 << 10, (64 << 10) + 1, 5 * MiB])
def test_put_get_across_pods(pair, size):
    """An object put in pod A is read in pod B, byte for byte: inline up to
    the threshold, mapped above it; no object file is left behind in
    either shared-memory directory (the sidecar took the put's file, the
    SDK removed the get's file once mapped)."""
    a, b = pair
    data = pattern(size)
    ref = a.client.put(data)
    assert ref.startswith("zt1.")
    with b.client.get(ref) as got:
        assert bytes(got) == data
        assert got.source == "remote"
        if size > 64 << 10:
            assert isinstance(got, ziptrail.MappedObject)
            assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()  # buffer protocol
        else:
            assert isinstance(got, ziptrail.InlineObject)
        assert files(a.shm_dir) == [] and files(b.shm_dir) == []


def test_put_accepts_buffers_without_copy_and_get_locally(pair):
    """bytearray, memoryview (also a non-byte format), mmap and a buffer
    allocated in shared memory all round-trip; a get in the producer's own
    pod is served locally; n=3 allows three reads."""
    a, b = pair
    raw = pattern(2 * MiB, 1)
    anon = mmap.mmap(-1, len(raw))
    anon.write(raw)
    inputs = [bytearray(raw), memoryview(raw), memoryview(raw).cast("I"), anon]
    for obj in inputs:
        with b.client.get(a.client.put(obj)) as got:
            assert bytes(got) == raw
    buf = a.client.allocate(len(raw))
    buf.data[:] = raw
    ref = a.client.put(buf, n=3)
    with pytest.raises(ziptrail.ZiptrailError, match="already handed"):
        buf.data
    for c, where in ((a.client, "local"), (b.client, "remote"), (b.client, "remote")):
        with c.get(ref) as got:
            assert got.source == where and bytes(got) == raw
    with pytest.raises(ziptrail.ExhaustedError):
        b.client.get(ref)


def test_module_level_api_uses_the_environment(pair, monkeypatch):
    """ziptrail.put/get (the contract with the Go SDK's tests) read
    ZIPTRAIL_SOCKET and ZIPTRAIL_SHM_DIR."""
    a, b = pair
    monkeypatch.setenv("ZIPTRAIL_SOCKET", a.socket)
    monkeypatch.setenv("ZIPTRAIL_SHM_DIR", a.shm_dir)
    ziptrail.set_default_client(None)
    try:
        ref = ziptrail.put(b"x" * MiB, n=1)
        assert ziptrail.default_client().socket == a.socket
    finally:
        ziptrail.set_default_client(None)
    assert bytes(b.client.get(ref)) == b"x" * MiB


def test_invoke_100mb(sidecars: Sidecars):
    """Pod A invokes a Python function (serve) behind pod B's sidecar with
    a 100 MB object: B's sidecar pulls it from A into shared memory and the
    function reads it through a mapping, intact."""
    a = sidecars.start()
    b = sidecars.start(function=DIGEST_FN)
    data = pattern(100_000_000, 2)
    resp = a.client.invoke(b.url, data, args=b"hello")
    assert resp.status == 200, resp.body[:500]
    out = json.loads(resp.body)
    assert out == {"bucket": "input", "size": len(data), "mapped": True,
                   "sha256": hashlib.sha256(data).hexdigest(), "args": "hello"}
    assert files(a.shm_dir) == [] and files(b.shm_dir) == []  # inputs removed after the call
    small = a.client.invoke(b.url, b"tiny", bucket="in", key="k")
    assert json.loads(small.body)["mapped"] is False and json.loads(small.body)["bucket"] == "in"


def test_scatter_broadcast_gather(sidecars: Sidecars):
    """scatter sends each object to its own invocation; broadcast sends one
    object (written once, hard-linked per request) to every URL; gather
    reads many references concurrently, in order."""
    a = sidecars.start()
    b = sidecars.start(function=DIGEST_FN)
    objs = [pattern(MiB + i, i) for i in range(4)]
    got = [json.loads(r.raise_for_status().body)["sha256"] for r in a.client.scatter(b.url, objs)]
    assert got == [hashlib.sha256(o).hexdigest() for o in objs]
    shared = pattern(3 * MiB, 9)
    got = [json.loads(r.body) for r in a.client.broadcast([b.url] * 3, shared)]
    assert [g["sha256"] for g in got] == [hashlib.sha256(shared).hexdigest()] * 3
    assert files(a.shm_dir) == []
    refs = [a.client.put(o) for o in objs]
    gathered = b.client.gather(refs)
    assert [bytes(g) for g in gathered] == objs
    for g in gathered:
        g.close()
    # A failed gather closes what it got and raises the first error.
    with pytest.raises(ziptrail.ExhaustedError):
        b.client.gather([a.client.put(objs[0]), refs[0]])


def test_invoke_answers_are_returned_and_raised_on_request(sidecars: Sidecars):
    a = sidecars.start()
    b = sidecars.start(function="def handler(inv):\n    raise ValueError('no such word')\n")
    resp = a.client.invoke(b.url, b"x")
    assert resp.status == 500 and not resp.ok
    with pytest.raises(ziptrail.FunctionFailedError, match="answered 500: ValueError: no such word"):
        resp.raise_for_status(b.url)


# --- error classes ------------------------------------------------------------

def tamper(ref: str) -> str:
    i = len(ref) // 2
    return ref[:i] + ("A" if ref[i] != "A" else "B") + ref[i + 1:]


def test_bad_references(sidecars: Sidecars, tmp_path):
    """Tampered and malformed references, a foreign namespace (same key
    file, other SERVING_NAMESPACE) and an unknown key (other key file) are
    BadReferenceErrors with the sidecar's reason."""
    a, b = sidecars.start(), sidecars.start()
    other_ns = sidecars.start(namespace="other")
    other_key = sidecars.start(key_file=write_keys(tmp_path / "k2.json", "k2", 9))
    ref = a.client.put(pattern(MiB), n=10)
    cases = [(b, tamper(ref), "REF_TAMPERED"), (b, "not-a-reference", "REF_MALFORMED"),
             (other_ns, ref, "REF_FOREIGN_NAMESPACE"), (other_key, ref, "REF_UNKNOWN_KEY")]
    for sc, r, reason in cases:
        with pytest.raises(ziptrail.BadReferenceError) as e:
            sc.client.get(r)
        assert e.value.reason == reason, e.value
        assert f"BadReference ({reason})" in str(e.value)
    assert bytes(b.client.get(ref)) == pattern(MiB)  # the genuine reference still works


def test_expired(pair):
    """A reference past its TTL is refused as expired. The sleep only makes
    sure the 1 ms TTL has passed; nothing is timed."""
    a, b = pair
    ref = a.client.put(pattern(MiB), ttl=0.001)
    time.sleep(0.05)
    with pytest.raises(ziptrail.ExpiredError) as e:
        b.client.get(ref)
    assert e.value.reason == "OBJECT_EXPIRED"


def test_exhausted(pair):
    """n=1: the second read of the reference is refused."""
    a, b = pair
    ref = a.client.put(pattern(MiB), n=1)
    assert len(b.client.get(ref)) == MiB
    with pytest.raises(ziptrail.ExhaustedError) as e:
        b.client.get(ref)
    assert e.value.reason == "OBJECT_EXHAUSTED"


def test_producer_gone(pair):
    """The producer pod is killed (no tier holds the object): the consumer
    gets ProducerGoneError, not a hang or a crash."""
    a, b = pair
    ref = a.client.put(pattern(MiB))
    a.kill()
    with pytest.raises(ziptrail.ProducerGoneError) as e:
        b.client.get(ref)
    assert e.value.reason == "PRODUCER_GONE"


def test_not_found_too_large_invalid_unavailable(sidecars: Sidecars, tmp_path):
    small = sidecars.start(ZIPTRAIL_MEMORY_LIMIT=str(MiB))
    with pytest.raises(ziptrail.NotFoundError) as e:
        small.client.get_object("nothing", "here")
    assert e.value.reason == "OBJECT_NOT_FOUND"
    with pytest.raises(ziptrail.TooLargeError) as e:
        small.client.put(pattern(2 * MiB))
    assert e.value.reason == "OBJECT_TOO_LARGE"
    assert os.listdir(small.shm_dir) == []  # the refused file was removed
    with pytest.raises(ziptrail.InvalidError) as e:  # persist without an S3 tier
        ziptrail.send_object(ziptrail.create_object("b", "k", value=b"x"), persist=True, client=small.client)
    assert e.value.reason == "BAD_PAYLOAD" and "no S3 tier" in str(e.value)
    with pytest.raises(ziptrail.InvalidError, match="between 1 and"):
        small.client.put(b"x", n=0)
    with ziptrail.Client(str(tmp_path / "no.sock"), str(tmp_path)) as gone:
        with pytest.raises(ziptrail.UnavailableError, match="cannot reach the sidecar"):
            gone.put(b"x")


def test_timeout(sidecars: Sidecars):
    """A deadline that passes before the sidecar answers is a
    ZiptrailTimeoutError (also a builtin TimeoutError); the payload file
    the SDK wrote is not left behind. The sidecar is made to hold the put
    (a full pod waits up to a minute for memory), so the client's deadline
    is what ends the call, whatever the machine's speed."""
    full = sidecars.start(ZIPTRAIL_MEMORY_LIMIT=str(MiB), ZIPTRAIL_PUT_TIMEOUT="60s")
    full.client.put(pattern(768 * 1024))  # unread: holds 768 KiB of the 1 MiB cap
    with pytest.raises(TimeoutError) as e:
        full.client.put(pattern(512 * 1024), timeout=0.3)
    assert isinstance(e.value, ziptrail.ZiptrailTimeoutError)
    assert [f for f in os.listdir(full.shm_dir) if f.startswith("put-")] == []


def test_invoke_whose_input_the_callee_cannot_resolve(sidecars: Sidecars):
    """The callee's sidecar (another namespace) refuses the reference of a
    large input: it answers 424 naming the class, and raise_for_status
    raises that class (the function never ran), not FunctionFailedError."""
    a, elsewhere = sidecars.start(), sidecars.start(namespace="elsewhere")
    resp = a.client.invoke(elsewhere.url, pattern(MiB))
    assert resp.status == 424 and resp.error_reason == "REF_FOREIGN_NAMESPACE"
    with pytest.raises(ziptrail.BadReferenceError) as e:
        resp.raise_for_status(elsewhere.url)
    assert e.value.reason == "REF_FOREIGN_NAMESPACE" and "answered 424" in str(e.value)
    assert not isinstance(e.value, ziptrail.FunctionFailedError)


def test_failure_after_the_deadline_is_a_timeout(tmp_path):
    """When the sidecar's copy of the deadline fires first it resets the
    stream, and gRPC Python reports INTERNAL ("Stream removed") instead of
    DEADLINE_EXCEEDED (a race seen in CI). The SDK checks the deadline, as
    the gRPC protocol advises: after it, such a failure is a timeout;
    before it, the same failure keeps its class."""
    import grpc

    class StreamRemoved(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.INTERNAL

        def details(self):
            return "Stream removed"

        def trailing_metadata(self):
            return None

    def late(request, timeout):
        time.sleep(timeout)
        raise StreamRemoved()

    def early(request, timeout):
        raise StreamRemoved()

    with ziptrail.Client(str(tmp_path / "no.sock"), str(tmp_path)) as c:
        with pytest.raises(ziptrail.ZiptrailTimeoutError, match="deadline of 0.05s exceeded"):
            c._call("put", late, None, 0.05)
        with pytest.raises(ziptrail.ZiptrailError, match="Stream removed") as e:
            c._call("put", early, None, 30)
        assert not isinstance(e.value, TimeoutError)


# --- the Pheromone library ---------------------------------------------------

def test_send_and_get_object_through_the_sidecar(pair):
    """Outside a handler send_object goes through the sidecar, which keeps
    the object in this pod; get_object finds it by bucket and key."""
    a, _ = pair
    obj = ziptrail.create_object("counts", "w1", {"x": 1}, group="g1", expected_keys=["w1", "w2"])
    obj.set_value(pattern(MiB, 4))
    sent = ziptrail.send_object(obj, session="s1", client=a.client)
    assert (sent.transport, sent.size, sent.persisted) == ("sidecar", MiB, False) and sent.ref.startswith("zt1.")
    with ziptrail.get_object("counts", "w1", session="s1", client=a.client) as got:
        assert bytes(got) == pattern(MiB, 4) and got.source == "local"
    with pytest.raises(ziptrail.NotFoundError):
        ziptrail.get_object("counts", "w1", session="other", client=a.client)


def test_persisted_object_is_read_from_another_pod(sidecars: Sidecars, minio):
    """persist=True writes the slow tier (a real MinIO): another pod reads
    the object back by bucket and key, from S3."""
    a, b = sidecars.start(**minio.env()), sidecars.start(**minio.env())
    sent = ziptrail.send_object("results", "final", pattern(2 * MiB, 5), persist=True, session="s9", client=a.client)
    assert sent.persisted and sent.transport == "sidecar"
    with ziptrail.get_object("results", "final", session="s9", client=b.client) as got:
        assert bytes(got) == pattern(2 * MiB, 5) and got.source == "s3"


def test_store_full(sidecars: Sidecars):
    """A put into a full pod (no fast tier to spill to) waits for memory,
    then fails with StoreFullError; the waiting payload file is removed."""
    full = sidecars.start(ZIPTRAIL_MEMORY_LIMIT=str(MiB), ZIPTRAIL_PUT_TIMEOUT="200ms")
    full.client.put(pattern(768 * 1024))  # unread: holds 768 KiB of the 1 MiB cap
    with pytest.raises(ziptrail.StoreFullError) as e:
        full.client.put(pattern(512 * 1024))
    assert e.value.reason == "STORE_FULL"
    assert os.listdir(full.shm_dir) == []
