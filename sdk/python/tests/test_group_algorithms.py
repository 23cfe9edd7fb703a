"""The group API and its collective algorithms over an in-memory sidecar
(tests/fakesidecar.py): every collective for 1..9 members and every root,
checked against a direct computation; large messages through shared-memory
files; failures (a pod killed mid-collective, a failing user function)
ending every member's collective with a typed error."""

from __future__ import annotations

import math
import threading
from array import array
from typing import Any, Callable

import pytest

import ziptrail
from fakesidecar import Hub
from ziptrail import _reduce as zreduce
from ziptrail.errors import from_reason

SMALL, BIG = 40, 3000  # the hub's inline threshold is 256: BIG travels as files


def blob(r: int, size: int) -> bytes:
    return (f"<rank {r}>".encode() * (size // 8 + 1))[:size]


def chunk(src: int, dst: int, size: int) -> bytes:
    return (f"[{src}->{dst}]".encode() * (size // 6 + 1))[:size]


def run_members(n: int, fn: Callable[[ziptrail.Group], Any], *, hub: Hub | None = None, per_pod: int = 2,
                mailbox: bool = False, session: str = "s", name: str = "g") -> list[Any]:
    """Runs fn(group) for ranks 0..n-1, each in its own thread, per_pod ranks
    sharing a pod; returns each rank's result or exception."""
    own = hub is None
    hub = hub or Hub()
    pods = [hub.pod() for _ in range(math.ceil(n / per_pod))]
    out: list[Any] = [None] * n

    def member(r: int) -> None:
        try:
            g = pods[r // per_pod].client.join(session, name, r, n, mailbox=mailbox)
            with g:
                out[r] = fn(g)
        except BaseException as e:  # noqa: BLE001 - checked by the test
            out[r] = e

    threads = [threading.Thread(target=member, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)  # a bound against hangs, not a timing assertion
        assert not t.is_alive(), "a member hung"
    if own:
        for p in pods:
            assert p.files() == [], "message files left behind"
        hub.close()
    return out


def ok(results: list[Any]) -> list[Any]:
    for r, v in enumerate(results):
        if isinstance(v, BaseException):
            raise AssertionError(f"rank {r} failed: {v!r}") from v
    return results


@pytest.mark.parametrize("n", range(1, 10))
def test_every_collective_every_root(n: int):
    """broadcast, scatter, gather and reduce from every root, allreduce
    (tree and ring), alltoall and barrier, small and large data."""

    def member(g: ziptrail.Group) -> None:
        r = g.rank
        for root in range(n):
            for size in (SMALL, BIG):
                got = g.broadcast(blob(root, size) if r == root else None, root=root)
                assert bytes(got) == blob(root, size)
                if r != root and size == BIG:
                    assert isinstance(got, ziptrail.MappedObject)  # mapped from its file, not copied
                    got.close()
                got = g.scatter([chunk(root, i, size) for i in range(n)] if r == root else None, root=root)
                assert bytes(got) == chunk(root, r, size)
                got = g.gather(blob(r, size + root), root=root)
                if r == root:
                    assert [bytes(x) for x in got] == [blob(i, size + root) for i in range(n)]
                else:
                    assert got is None
            mine = [r + 1, -r, 7 * r + root]
            expect = {ziptrail.SUM: [sum(i + 1 for i in range(n)), -sum(range(n)), sum(7 * i + root for i in range(n))],
                      ziptrail.MIN: [1, -(n - 1), root], ziptrail.MAX: [n, 0, 7 * (n - 1) + root]}
            for op, want in expect.items():
                got = g.reduce(mine, op, root=root)
                assert got == (want if r == root else None)
            got = g.reduce(float(r), lambda a, b: a + b, root=root)  # a user function on numbers
            assert got == (float(sum(range(n))) if r == root else None)
        # allreduce: tree (small) and ring (>= 64 KiB), lists, arrays, scalars
        assert g.allreduce([r, 2 * r]) == [sum(range(n)), 2 * sum(range(n))]
        assert g.allreduce(r, ziptrail.MAX) == n - 1
        assert g.allreduce(array("i", [r, -r]), ziptrail.MIN) == array("i", [0, -(n - 1)])
        big = array("d", (float(r * 3 + i % 11) for i in range(10_000)))  # 80 KB: the ring
        got = g.allreduce(big)
        assert isinstance(got, array) and got.typecode == "d"
        assert got == array("d", (float(sum(j * 3 for j in range(n)) + n * (i % 11)) for i in range(10_000)))
        got = g.allreduce(list(range(r, r + 9000)), ziptrail.MAX)  # int64 list, 72 KB: the ring
        assert got == list(range(n - 1, n - 1 + 9000))
        # user function on bytes: XOR (associative and commutative)
        xor = g.allreduce(bytes([r + 1]) * 300, lambda a, b: bytes(x ^ y for x, y in zip(bytes(a), bytes(b))))
        want = 0
        for i in range(n):
            want ^= i + 1
        assert bytes(xor) == bytes([want]) * 300
        for size in (SMALL, BIG):
            got = g.alltoall([chunk(r, j, size) for j in range(n)])
            assert [bytes(x) for x in got] == [chunk(i, r, size) for i in range(n)]
        g.barrier()

    ok(run_members(n, member))


@pytest.mark.parametrize("n", [4, 5, 8])
def test_back_pressure_one_message_per_pair(n: int):
    """With one queued message per sender-receiver pair, no algorithm
    deadlocks (ring and pairwise exchange send while they receive)."""
    hub = Hub(pair_capacity=1)

    def member(g: ziptrail.Group) -> Any:
        big = array("q", range(g.rank, g.rank + 20_000))
        s = g.allreduce(big)
        a = g.alltoall([chunk(g.rank, j, BIG) for j in range(n)])
        b = g.broadcast(blob(3, BIG) if g.rank == 3 else None, root=3)
        g.barrier()
        return s, [bytes(x) for x in a], bytes(b)

    for r, (s, a, b) in enumerate(ok(run_members(n, member, hub=hub))):
        assert s == array("q", (sum(range(n)) + n * i for i in range(20_000)))
        assert a == [chunk(i, r, BIG) for i in range(n)]
        assert b == blob(3, BIG)
    hub.close()


def test_int_meets_float():
    """A member whose list holds a float makes the result float64."""
    def member(g: ziptrail.Group) -> Any:
        return g.allreduce([1.5] if g.rank == 2 else [1]), g.allreduce([0.5] * 9000 if g.rank == 0 else [1] * 9000)

    for small, ring in ok(run_members(4, member)):
        assert small == [4.5] and isinstance(small[0], float)
        assert ring == [3.5] * 9000


def test_mismatched_lengths_fail_everywhere():
    def member(g: ziptrail.Group) -> Any:
        return g.allreduce([1, 2, 3] if g.rank == 1 else [1, 2])

    res = run_members(3, member)
    assert all(isinstance(e, ziptrail.ZiptrailError) for e in res), res


EVERYONE = ("barrier", "allreduce", "ring", "alltoall")  # every member's part needs every other member


@pytest.mark.parametrize("victim", [0, 2, 5])
@pytest.mark.parametrize("collective", ["barrier", "allreduce", "ring", "alltoall", "broadcast", "reduce", "gather",
                                        "scatter"])
def test_pod_killed_mid_collective_is_peer_gone(collective: str, victim: int):
    """A member whose pod dies instead of taking part: the collective fails
    with PeerGone naming it at every member whose part depends on it (for
    barrier, allreduce and alltoall: every member; for rooted ones at least
    the root of a reduce or gather), never hangs, and no member returns a
    wrong result."""
    n = 6
    hub = Hub()
    entered = threading.Barrier(n)
    root = 1 if victim != 1 else 0

    def member(g: ziptrail.Group) -> Any:
        g.barrier()
        entered.wait()
        if g.rank == victim:
            hub.kill(pods_of[victim])
            return "killed"
        r = g.rank
        call = {"barrier": lambda: g.barrier() or "ok",
                "allreduce": lambda: g.allreduce([r]),
                "ring": lambda: g.allreduce(array("d", [1.0]) * 20_000),
                "alltoall": lambda: g.alltoall([b"z"] * n),
                "broadcast": lambda: bytes(g.broadcast(b"x" * 500 if r == root else None, root=root)),
                "reduce": lambda: g.reduce([r], root=root),
                "gather": lambda: g.gather(b"y", root=root),
                "scatter": lambda: bytes(g.scatter([b"s%d" % i for i in range(n)] if r == root else None, root=root))}
        return call[collective]()

    pods_of: dict[int, Any] = {}
    orig_pod = hub.pod

    def pod() -> Any:  # one member per pod, so that a kill takes exactly one rank
        p = orig_pod()
        pods_of[len(pods_of)] = p
        return p

    hub.pod = pod  # type: ignore[method-assign]
    res = run_members(n, member, hub=hub, per_pod=1)
    must_fail = set(range(n)) - {victim} if collective in EVERYONE else ({root} if collective in ("reduce", "gather") else set())
    for r, v in enumerate(res):
        if r == victim:
            continue
        if r in must_fail or isinstance(v, BaseException):
            assert isinstance(v, ziptrail.PeerGoneError), f"rank {r}: {v!r}"
            assert v.rank == victim, f"rank {r} names rank {v.rank}: {v}"
        else:  # its part was done before the death mattered: the right result
            assert v == {"broadcast": b"x" * 500, "scatter": b"s%d" % r, "reduce": None, "gather": None}[collective]
    hub.close()


def test_failing_user_function_aborts_the_others():
    """A user function failing at rank 0 (the tree's root): rank 0 raises
    its error, every other member a CollectiveAbortedError naming rank 0."""
    def op(a: Any, b: Any) -> Any:
        if threading.current_thread().name == "fail":
            raise ValueError("boom")
        return a + b

    def member(g: ziptrail.Group) -> Any:
        if g.rank == 0:
            threading.current_thread().name = "fail"
        return g.allreduce(1.0, op)

    res = run_members(5, member)
    assert isinstance(res[0], ValueError)
    for v in res[1:]:
        assert isinstance(v, ziptrail.CollectiveAbortedError) and v.rank == 0, v


def test_consecutive_collectives_do_not_mix():
    """Different members reach the next collective at different times; the
    per-group sequence keeps their messages apart (and apart from user tags)."""
    def member(g: ziptrail.Group) -> Any:
        out = []
        if g.rank != 0:
            g.send(0, b"user", tag=0)
        for i in range(20):
            out.append(bytes(g.broadcast(bytes([i]) * (i * 37) if g.rank == i % g.size else None, root=i % g.size)))
        if g.rank == 0:
            users = sorted(g.recv(tag=0).source for _ in range(g.size - 1))
            assert users == list(range(1, g.size))
        return out

    for got in ok(run_members(4, member)):
        assert got == [bytes([i]) * (i * 37) for i in range(20)]


def test_point_to_point():
    """Order per sender, tags, ANY, large messages mapped from their file,
    negative tags refused, timeouts typed."""
    def member(g: ziptrail.Group) -> Any:
        if g.rank == 1:
            for i in range(50):
                g.send(0, blob(i, BIG if i % 7 == 0 else SMALL), tag=i % 3)
            g.send(0, b"last", tag=9)
            g.barrier()  # stay a member while rank 0 reads
            return None
        got = [g.recv(source=1, tag=t) for t in (9,)]  # out of order by tag: the oldest with tag 9
        assert bytes(got[0].data) == b"last"
        msgs = [g.recv(source=ziptrail.ANY) for _ in range(50)]
        assert [bytes(m.data) for m in msgs] == [blob(i, BIG if i % 7 == 0 else SMALL) for i in range(50)]
        assert [m.tag for m in msgs] == [i % 3 for i in range(50)]
        assert all(m.source == 1 for m in msgs)
        assert isinstance(msgs[0].data, ziptrail.MappedObject) and isinstance(msgs[1].data, ziptrail.InlineObject)
        for m in msgs:
            m.close()
        with pytest.raises(ziptrail.InvalidError):
            g.send(1, b"x", tag=-1)
        with pytest.raises(ziptrail.InvalidError):
            g.recv(tag=-5)
        with pytest.raises(ziptrail.MessageTimeout) as e:
            g.recv(source=1, timeout=0.05)
        assert isinstance(e.value, TimeoutError) and isinstance(e.value, ziptrail.ZiptrailTimeoutError)
        g.barrier()  # the collective's messages never match a user recv, and vice versa
        return None

    ok(run_members(2, member, per_pod=1))


def test_membership_join_conflict_leave_and_closed():
    hub = Hub()
    a, b = hub.pod(), hub.pod()
    g0 = a.client.join("s", "m", 0, 3)
    assert g0.size == 3 and g0.joined.live == (0,)
    with pytest.raises(ziptrail.Conflict):
        b.client.join("s", "m", 0, 3)  # rank taken
    with pytest.raises(ziptrail.ConflictError):
        b.client.join("s", "m", 1, 4)  # size differs
    g1 = b.client.join("s", "m", 1, 3)
    m = g0.watch(g0.joined.epoch, timeout=5)
    assert m.live == (0, 1) and m.epoch > g0.joined.epoch
    g1.leave()
    g1.leave()  # idempotent
    m = g0.members()
    assert m.live == (0,) and m.gone == (1,)
    with pytest.raises(ziptrail.Closed):
        g1.send(0, b"x")
    with pytest.raises(ziptrail.PeerGone) as e:
        g0.send(1, b"x")
    assert e.value.rank == 1
    with pytest.raises(ziptrail.PeerGone) as e:
        g0.recv(source=1)
    assert e.value.rank == 1
    with pytest.raises(ziptrail.InvalidError):
        a.client.join("s", "m", 3, 3)
    g0.leave()
    hub.close()


def test_mailbox_delivers_to_a_rank_that_joins_later():
    hub = Hub()
    a, b = hub.pod(), hub.pod()
    g0 = a.client.join("s", "mb", 0, 2, mailbox=True)
    assert g0.mailbox
    assert g0.send(1, blob(1, BIG), tag=4) is True  # mailboxed: rank 1 is not running
    g1 = b.client.join("s", "mb", 1, 2)
    with g1.recv(source=0, tag=4) as m:
        assert bytes(m.data) == blob(1, BIG)
    g0.leave()
    g1.leave()
    hub.close()


def test_join_in_a_handler_takes_session_and_invocation():
    hub = Hub()
    pod = hub.pod()
    seen: dict[str, Any] = {}
    orig = pod.client._stub.Join

    class Spy:
        def __call__(self, req: Any, timeout: float | None = None) -> Any:
            seen["req"] = req
            return orig(req, timeout)

    pod.client._stub.Join = Spy()
    with pytest.raises(ziptrail.InvalidError):
        ziptrail.join("g", 0, 1, client=pod.client)  # outside a handler, no session
    from ziptrail import server
    server._current.inv = ziptrail.Invocation(namespace="ns", function="f", session="sess-1", id="inv-9")
    try:
        with ziptrail.join("g", 0, 1, client=pod.client) as g:
            assert g.session == "sess-1" and g.invocation_id == "inv-9"
            assert seen["req"].invocation_id == "inv-9" and seen["req"].session == "sess-1"
            g.barrier()
            assert g.allreduce([2.5]) == [2.5]
    finally:
        server._current.inv = None
    hub.close()


def test_error_reasons_map_to_types():
    assert type(from_reason("PEER_GONE", "recv", "x", {"rank": "3"})) is ziptrail.PeerGoneError
    assert from_reason("PEER_GONE", "recv", "x", {"rank": "3"}).rank == 3
    assert type(from_reason("MSG_TIMEOUT", "recv", "x")) is ziptrail.MessageTimeoutError
    assert type(from_reason("MSG_FOREIGN", "send", "x")) is ziptrail.ForeignError
    assert type(from_reason("GROUP_CLOSED", "recv", "x")) is ziptrail.ClosedError
    assert type(from_reason("GROUP_CONFLICT", "join", "x")) is ziptrail.GroupConflictError
    assert isinstance(from_reason("GROUP_CONFLICT", "join", "x"), ziptrail.ConflictError)
    assert isinstance(from_reason("MSG_TIMEOUT", "recv", "x"), TimeoutError)
    assert ziptrail.PeerGone is ziptrail.PeerGoneError and ziptrail.MessageTimeout is ziptrail.MessageTimeoutError


def test_frames_round_trip_and_refuse_garbage():
    hub = Hub()
    pod = hub.pod()
    g = pod.client.join("s", "f", 0, 1)
    for data in (b"", b"a", blob(0, 255), blob(0, 4096), blob(0, 100_000)):
        for payload in g._frame(0, b"f8", data, 2, "t"):
            typ, hdr, out = g._unframe("t", payload)
            assert (typ, hdr, bytes(out)) == (0, b"f8", data)
            out.close()
    with pytest.raises(ziptrail.ZiptrailError, match="malformed"):
        g._unframe("t", _garbage())
    g.leave()
    assert pod.files() == []
    hub.close()


def _garbage() -> Any:
    return b"\x07garbage-not-a-frame"


def test_vectors_reject_non_numbers():
    with pytest.raises(ziptrail.InvalidError):
        zreduce._Vec(["a"])
    with pytest.raises(ziptrail.InvalidError):
        zreduce._Vec([1 << 70])
    hub = Hub()
    pod = hub.pod()
    g = pod.client.join("s", "v", 0, 1)
    with pytest.raises(ziptrail.InvalidError):
        g.allreduce(b"bytes", ziptrail.SUM)
    g.leave()
    hub.close()
