"""The shuffle library (ziptrail.shuffle) against real sidecars: mappers are
pods whose clients write partitions (pod memory, Redis through TierPut, S3
through TierPut); the reducer is a function server behind its own sidecar,
invoked with the group's objects the way the trigger engine invokes it (an
envelope naming references and inline objects), which pulls pod-memory
pieces and resolves pointers with TierGet. Real redis-server and MinIO."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import urllib.request

import pytest

import ziptrail
from conftest import MinIO, Sidecar, Sidecars
from ziptrail import shuffle

MiB = 1 << 20

REDUCER = r'''
import hashlib, json
from ziptrail import shuffle

def concat(datas):
    return b"".join(bytes(d) for d in datas)

def handler(inv):
    op = json.loads(inv.args or b"{}")
    if op.get("op") == "round_merge":
        job = shuffle.job_of(inv.objects)
        s = shuffle.round_merge(job, inv.objects, concat)
        return json.dumps({"bucket": s.bucket, "key": s.key, "size": s.size})
    if op.get("op") == "final":
        job = shuffle.Job.from_json(op["job"])
        runs = shuffle.read_runs(job, op["partition"])
        out = concat([r.data for r in runs])
        for r in runs:
            r.close()
        shuffle.write_output(job, op["partition"], out, b"summary")
        shuffle.delete_runs(job, op["partition"])
        return json.dumps({"sha256": hashlib.sha256(out).hexdigest(), "size": len(out)})
    inputs = shuffle.read_inputs(inv.objects)
    res = [[i.mapper, i.partition, i.round, hashlib.sha256(i.data).hexdigest(), len(i.data), i.tier]
           for i in inputs]
    for i in inputs:
        i.close()
    shuffle.cleanup(inputs)
    return json.dumps(res)
'''


def piece(m: int, p: int, size: int, rnd: int = 0) -> bytes:
    """Distinct, recognizable bytes for mapper m's piece of partition p."""
    seed = hashlib.sha256(f"{rnd}/{m}/{p}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def pod(sidecars: Sidecars, redis_addr: str, minio: MinIO, function: str | None = None) -> Sidecar:
    return sidecars.start(function=function, ZIPTRAIL_REDIS_ADDR=redis_addr, **minio.env())


def envelope_objects(producer: Sidecar, sent: list[ziptrail.Sent], session: str) -> list[dict]:
    """The envelope entries the engine would send for these objects: large
    ones by reference, small ones inline (the engine got their bytes with
    the object-ready event; here they are read back from the producer)."""
    out = []
    for s in sent:
        entry = {"bucket": s.bucket, "key": s.key, "size": s.size}
        if s.ref:
            entry["ref"] = s.ref
        else:
            with producer.client.get_object(s.bucket, s.key, session=session) as d:
                entry["inline"] = base64.b64encode(bytes(d)).decode()
        out.append(entry)
    return out


_invocations = itertools.count(1)


def invoke(reducer: Sidecar, session: str, group: str, objects: list[dict], args: dict | None = None,
           invocation: str | None = None) -> bytes:
    # An invocation id names one invocation of its session: the sidecar
    # answers a second delivery of it from its record (idempotency key).
    if invocation is None:
        invocation = f"inv-{next(_invocations)}"
    env = {"namespace": reducer.namespace, "function": "reduce", "session": session, "invocation": invocation,
           "group": group, "objects": objects}
    if args is not None:
        env["args"] = base64.b64encode(json.dumps(args).encode()).decode()
    req = urllib.request.Request(reducer.url, data=json.dumps(env).encode(), method="POST",
                                 headers={"Content-Type": "application/vnd.ziptrail.invocation+json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        return r.read()


class Mapper:
    """A mapper pod: writes with shuffle.Writer and remembers each object's
    metadata (the engine gets it with the object-ready event)."""

    def __init__(self, pod: Sidecar, job: shuffle.Job, mapper: int, session: str, rnd: int = 0) -> None:
        self.pod, self.session = pod, session
        self.w = shuffle.Writer(job, mapper, rnd, session=session, client=pod.client)
        self.objects: dict[int, dict] = {}

    def write(self, p: int, data: bytes) -> None:
        s = self.w.write(p, data)
        (entry,) = envelope_objects(self.pod, [s], self.session)
        entry["metadata"] = self.w.metadata[s.key]
        assert entry["metadata"][shuffle.META_GROUP] == f"p{p}"
        self.objects[p] = entry


@pytest.mark.parametrize("method", ["podmemory", "redis", "s3"])
def test_mappers_write_and_the_reducer_reads_every_piece(sidecars: Sidecars, redis_addr: str, minio: MinIO, method: str):
    """Two mappers, three partitions: small, large (a shared-memory file)
    and empty pieces; the reducer gets each of its pieces intact, whatever
    the method, and deletes the tier objects it consumed."""
    session = f"s-{method}"
    job = shuffle.Job("j1", method, partitions=3)
    maps = [Mapper(pod(sidecars, redis_addr, minio), job, m, session) for m in range(2)]
    sizes = {0: 1000, 1: 3 * MiB, 2: 0}
    for mp in maps:
        for p, size in sizes.items():
            mp.write(p, piece(int(mp.w.mapper), p, size))
    if method != "podmemory":
        tier = job.tier
        with maps[0].pod.client.tier_get(tier, session, shuffle.tier_key(job, 0, 1, 0)) as d:
            assert bytes(d) == piece(0, 1, 3 * MiB)
        assert all("ref" not in mp.objects[p] for mp in maps for p in sizes), "pointers travel inline"
    else:
        assert "ref" in maps[0].objects[1], "a large piece stays in the mapper's pod (by reference)"
    reducer = pod(sidecars, redis_addr, minio, REDUCER)
    for p, size in sizes.items():
        got = json.loads(invoke(reducer, session, shuffle.group(p), [mp.objects[p] for mp in maps]))
        want_tier = None if method == "podmemory" else job.tier
        assert got == [[str(m), p, 0, hashlib.sha256(piece(m, p, size)).hexdigest(), size, want_tier] for m in range(2)]
    if method != "podmemory":
        for m in range(2):
            for p in sizes:
                with pytest.raises(ziptrail.NotFoundError):
                    maps[0].pod.client.tier_get(job.tier, session, shuffle.tier_key(job, 0, p, m))


def test_tier_keys_are_scoped_to_the_session(sidecars: Sidecars, redis_addr: str, minio: MinIO):
    a = pod(sidecars, redis_addr, minio)
    for tier in ("fast", "slow"):
        assert a.client.tier_put(tier, "s-a", "k", b"x" * 10) == 10
        with pytest.raises(ziptrail.NotFoundError):
            a.client.tier_get(tier, "s-b", "k")
        a.client.tier_delete(tier, "s-a", ["k", "never-written"])
        with pytest.raises(ziptrail.NotFoundError):
            a.client.tier_get(tier, "s-a", "k")
    with pytest.raises(ziptrail.InvalidError):
        a.client.tier_get("disk", "s-a", "k")


def test_hybrid_rounds_runs_and_final_merge(sidecars: Sidecars, redis_addr: str, minio: MinIO):
    """Two rounds of two mappers through Redis; a round merge per partition
    writes one run per round to S3 and frees Redis; the final merge reads a
    partition's runs in round order, writes the output and deletes the
    runs. A re-executed round merge (its inputs already consumed) sends
    its run's pointer again instead of failing."""
    session = "s-hybrid"
    job = shuffle.Job("h1", "hybrid", partitions=2, rounds=2)
    mpods = [pod(sidecars, redis_addr, minio) for _ in range(2)]
    reducer = pod(sidecars, redis_addr, minio, REDUCER)
    c = reducer.client
    size = lambda r, m, p: 200_000 + 1000 * (r + m + p)  # noqa: E731
    for rnd in range(2):
        maps = [Mapper(mpods[m], job, m, session, rnd) for m in range(2)]
        for mp in maps:
            for p in range(2):
                mp.write(p, piece(int(mp.w.mapper), p, size(rnd, int(mp.w.mapper), p), rnd))
        for p in range(2):
            objs = [mp.objects[p] for mp in maps]
            got = json.loads(invoke(reducer, session, shuffle.group(p), objs, {"op": "round_merge"}))
            assert got["bucket"] == f"runs-r{rnd}" and got["key"] == f"h1.run.r{rnd}.p{p}"
            with c.get_object(got["bucket"], got["key"], session=session) as d:
                ptr = json.loads(bytes(d))
            assert ptr["key"] == shuffle.run_key(job, p, rnd) and ptr["tier"] == "slow"
            with c.tier_get("slow", session, shuffle.run_key(job, p, rnd)) as run:
                assert bytes(run) == b"".join(piece(m, p, size(rnd, m, p), rnd) for m in range(2))
            for m in range(2):
                with pytest.raises(ziptrail.NotFoundError):
                    c.tier_get("fast", session, shuffle.tier_key(job, rnd, p, m))
            # Re-executed: the pieces are gone, the run is there.
            again = json.loads(invoke(reducer, session, shuffle.group(p), objs, {"op": "round_merge"}, f"rerun-{rnd}-{p}"))
            assert again == got
    for p in range(2):
        got = json.loads(invoke(reducer, session, "", [], {"op": "final", "partition": p, "job": job.to_json()}))
        want = b"".join(piece(m, p, size(r, m, p), r) for r in range(2) for m in range(2))
        assert got == {"sha256": hashlib.sha256(want).hexdigest(), "size": len(want)}
        with shuffle.read_output(job, p, session=session, client=c) as out:
            assert bytes(out) == want
        for r in range(2):
            with pytest.raises(ziptrail.NotFoundError):
                c.tier_get("slow", session, shuffle.run_key(job, p, r))


def test_job_validation():
    with pytest.raises(ziptrail.InvalidError, match="method"):
        shuffle.Job("j", "disk", 2)
    with pytest.raises(ziptrail.InvalidError, match="rounds"):
        shuffle.Job("j", "redis", 2, rounds=2)
    with pytest.raises(ziptrail.InvalidError, match="job name"):
        shuffle.Job("a/b", "s3", 2)
    j = shuffle.Job("j", "hybrid", 4, rounds=3, params={"x": [1, 2]})
    assert shuffle.Job.from_json(j.encode()) == j
    assert shuffle.partition_of(shuffle.group(3)) == 3
