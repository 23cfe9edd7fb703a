"""Direct messages against real sidecars: queue-proxy-zl processes (one per
pod) on the operator's control server and its directory (tests/testenv
--control: a real API server, TokenReview of pod-bound tokens), Redis as the
fast tier for mailboxes. Members are threads; each uses its pod's sidecar
through the SDK, as a function would."""

from __future__ import annotations

import faulthandler
import hashlib
import os
import sys
import threading
from array import array
from typing import Any, Callable

import pytest

import ziptrail
from conftest import Pods, Sidecar

MiB = 1 << 20
LIMIT = 120  # seconds: a bound against hangs, never a timing assertion


def run_members(sidecars: list[Sidecar], n: int, fn: Callable[[ziptrail.Group], Any], *, session: str, name: str = "g",
                before: Callable[[], None] | None = None) -> list[Any]:
    """Rank r joins through sidecars[r % len(sidecars)] (wait_all) and runs
    fn in its own thread; returns each rank's result or exception."""
    out: list[Any] = [None] * n

    def member(r: int) -> None:
        try:
            with sidecars[r % len(sidecars)].client.join(session, name, r, n, wait_all=True, timeout=LIMIT) as g:
                out[r] = fn(g)
        except BaseException as e:  # noqa: BLE001 - checked by the test
            out[r] = e

    threads = [threading.Thread(target=member, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    if before is not None:
        before()
    for t in threads:
        t.join(LIMIT)
        if t.is_alive():  # every thread's stack, for the hang's cause
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        assert not t.is_alive(), "a member hung"
    return out


def ok(results: list[Any]) -> list[Any]:
    for r, v in enumerate(results):
        if isinstance(v, BaseException):
            raise AssertionError(f"rank {r} failed: {v!r}") from v
    return results


def shm_files(sc: Sidecar) -> list[str]:
    """What is left in the pod's shared-memory directory besides the files
    kept for reuse (docs/messaging.md "Reused files"): the sidecar's pool
    (get-*, at most 64 MiB in all) and the files the client's sends got back
    (put-*, at most 4)."""
    names = [f for f in os.listdir(sc.shm_dir) if not f.startswith(".")]
    puts = [f for f in names if f.startswith("put-")]
    if len(puts) <= 4:
        names = [f for f in names if not f.startswith("put-")]
    pooled = 0
    for f in names:
        if f.startswith("get-"):
            try:
                pooled += os.stat(os.path.join(sc.shm_dir, f)).st_size
            except FileNotFoundError:
                pass
    left = [f for f in names if not f.startswith("get-")]
    if pooled > 64 * MiB:
        left.append(f"{pooled} bytes of get-* files (the pool keeps at most 64 MiB)")
    return left


def test_point_to_point_across_two_sidecars(pods: Pods):
    """Small and 8 MiB messages between two pods through their sidecars, in
    order per sender; the large ones arrive mapped from shared memory;
    nothing is left behind."""
    a, b = pods.start_many(2, direct_tcp=False)
    big = [os.urandom(8 * MiB), os.urandom(8 * MiB)]
    msgs = [b"one", big[0], b"", b"four" * 100, big[1], os.urandom(70_000)]

    def member(g: ziptrail.Group) -> Any:
        if g.rank == 0:
            for i, m in enumerate(msgs):
                assert g.send(1, m, tag=i % 2) is False
            g.barrier()
            return None
        got = []
        for i, want in enumerate(msgs):
            with g.recv(source=ziptrail.ANY, timeout=LIMIT) as m:
                assert (m.source, m.tag) == (0, i % 2)
                if len(want) == 8 * MiB:
                    assert isinstance(m.data, ziptrail.MappedObject)  # not copied into Python
                got.append(hashlib.sha256(m.data).hexdigest())
        assert got == [hashlib.sha256(m).hexdigest() for m in msgs]
        view = g.members()
        assert view.live == (0, 1) and view.size == 2
        g.barrier()
        return None

    ok(run_members([a, b], 2, member, session="p2p"))
    assert shm_files(b) == [] and shm_files(a) == []


def collectives(g: ziptrail.Group) -> None:
    """Every collective against a direct computation (roots 0 and n-1)."""
    n, r = g.size, g.rank
    for root in sorted({0, n - 1}):
        for size in (100, 200_000):
            data = bytes([root]) * size
            got = g.broadcast(data if r == root else None, root=root)
            assert bytes(got) == data
            got = g.scatter([bytes([i]) * size for i in range(n)] if r == root else None, root=root)
            assert bytes(got) == bytes([r]) * size
            got = g.gather(bytes([r + 1]) * size, root=root)
            assert (None if got is None else [bytes(x) for x in got]) == \
                ([bytes([i + 1]) * size for i in range(n)] if r == root else None)
        assert g.reduce([r, -r, 1.5], ziptrail.SUM, root=root) == \
            ([float(sum(range(n))), float(-sum(range(n))), 1.5 * n] if r == root else None)
        assert g.reduce(r, ziptrail.MAX, root=root) == (n - 1 if r == root else None)
    assert g.allreduce([r, 10 - r], ziptrail.MIN) == [0, 10 - (n - 1)]
    ring = g.allreduce(array("d", [float(r)]) * 100_000)  # 800 KB: the ring
    assert ring == array("d", [float(sum(range(n)))]) * 100_000
    assert g.allreduce(b"%d," % r, lambda a, b: b",".join(sorted(set(bytes(a).split(b",") + bytes(b).split(b","))))) \
        .split(b",")[1:] == sorted(b"%d" % i for i in range(n))
    for size in (10, 100_000):
        got = g.alltoall([bytes([r, j]) * size for j in range(n)])
        assert [bytes(x) for x in got] == [bytes([i, r]) * size for i in range(n)]
    g.barrier()


@pytest.mark.parametrize("direct_tcp", [True, False], ids=["tcp", "sidecars"])
@pytest.mark.parametrize("n, per_pod", [(4, 1), (8, 2)])
def test_every_collective(pods: Pods, n: int, per_pod: int, direct_tcp: bool):
    """Every collective with 4 members (one pod each) and 8 members (two per
    pod), over direct TCP channels between pods and through the sidecars."""
    ok(run_members(pods.start_many(n // per_pod, direct_tcp=direct_tcp), n, collectives, session=f"coll-{n}"))


def test_point_to_point_over_tcp_channels(pods: Pods):
    """Two pods (as on two nodes): every path between them is a direct TCP
    channel the sidecars opened, in both directions; messages of every
    size (inline, beyond the reader's buffer, beyond what it allocates up
    front) arrive whole and in order; a receiver that reads nothing holds
    its sender back (a send times out, nothing is lost); a member that
    leaves is PeerGone to the other."""
    a, b = pods.start_many(2)
    sizes = [0, 1, 100, 200_000, 5 * MiB, 70 * MiB]

    def payload(i: int, n: int) -> bytes:
        return bytes([i + 1]) * n

    def member(g: ziptrail.Group) -> Any:
        other = 1 - g.rank
        if g.rank == 0:
            for i, n in enumerate(sizes):
                g.send(1, payload(i, n), tag=i)
        got = []
        if g.rank == 1:
            for i, n in enumerate(sizes):
                with g.recv(source=0, timeout=LIMIT) as m:
                    got.append((m.tag, len(m.data), bytes(m.data[:1]), bytes(m.data[-1:])))
            assert got == [(i, n, payload(i, n)[:1], payload(i, n)[-1:]) for i, n in enumerate(sizes)]
            g.send(0, b"back", tag=1)
        else:
            with g.recv(source=1, timeout=LIMIT) as m:
                assert bytes(m.data) == b"back"
        att = g._att
        assert att is not None
        out = att._outs[other].sock
        assert out is not None and out.stream, "the path to the other pod is not a TCP channel"
        assert isinstance(att.ins[other].reader, ziptrail._directrecv.StreamReader)
        g.barrier()
        # Back-pressure: rank 1 reads nothing while rank 0 fills its inbox.
        if g.rank == 0:
            sent = 0
            while sent < 400:
                try:
                    g.send(1, payload(sent, MiB), tag=5, timeout=2)
                except ziptrail.MessageTimeoutError:
                    break
                sent += 1
            assert sent < 400, "no back-pressure"
            g.send(1, str(sent).encode(), tag=6)
            with g.recv(source=1, tag=7, timeout=LIMIT):
                pass
            # Rank 1 has left: its channel is closed, sends fail PeerGone.
            with pytest.raises(ziptrail.PeerGoneError):
                for _ in range(1000):
                    g.send(1, b"x" * 60_000, tag=8, timeout=LIMIT)
            return sent
        with g.recv(source=0, tag=6, timeout=LIMIT * 2) as m:
            sent = int(bytes(m.data))
        for i in range(sent):
            with g.recv(source=0, tag=5, timeout=LIMIT) as m:
                assert len(m.data) == MiB and m.data[0] == (i + 1) % 256
        g.send(0, b"", tag=7)
        return sent

    res = ok(run_members([a, b], 2, member, session="tcp"))
    assert res[0] == res[1] and res[0] > 0


def test_tcp_bursts_from_two_senders_all_arrive(pods: Pods):
    """Ranks 1 and 2 (other pods, as on other nodes) each burst 30,000
    small messages at rank 0 over TCP channels, then stop: every one
    arrives. Their frames come off the sockets many at a time, so the
    reader keeps whole frames it read but did not deliver yet, which no
    socket readiness announces; it once marked them with a byte on its
    wake socket, and a turn that drained that socket for another wake lost
    the mark: the last frames stayed in the reader's buffer and the
    receiver waited for ever (a 3-rank all-to-all hung, stop 29)."""
    scs = pods.start_many(3)
    n = 30_000

    def member(g: ziptrail.Group) -> Any:
        if g.rank == 0:
            nxt = {1: 0, 2: 0}
            while nxt[1] < n or nxt[2] < n:
                with g.recv(timeout=LIMIT) as m:
                    assert bytes(m.data) == b"%d:%d" % (m.source, nxt[m.source]), f"from {m.source}"
                    nxt[m.source] += 1
            assert all(isinstance(ic.reader, ziptrail._directrecv.StreamReader) for ic in g._att.ins.values())
        else:
            for i in range(n):
                g.send(0, b"%d:%d" % (g.rank, i))
        g.barrier()
        return None

    ok(run_members(scs, 3, member, session="tcp-bursts"))


@pytest.mark.parametrize("collective", ["allreduce", "barrier", "alltoall"])
def test_sidecar_sigkilled_mid_collective(pods: Pods, collective: str):
    """A member's pod is SIGKILLed while the others are in a collective:
    every other member gets PeerGone naming its rank (not a timeout)."""
    n, victim = 4, 2
    scs = pods.start_many(n)
    started = threading.Barrier(n + 1)  # every member and the killer
    killed = threading.Event()

    def member(g: ziptrail.Group) -> Any:
        g.barrier()
        started.wait(LIMIT)
        if g.rank == victim:
            killed.wait(LIMIT)  # a member until its pod dies under it
            return "victim"
        call = {"allreduce": lambda: g.allreduce(array("d", [1.0]) * 50_000),
                "barrier": lambda: g.barrier(),
                "alltoall": lambda: g.alltoall([b"x" * 1000] * n)}[collective]
        call()
        return "finished"

    def kill() -> None:
        started.wait(LIMIT)
        scs[victim].proc.kill()  # SIGKILL: the pod dies without a word
        killed.set()

    res = run_members(scs, n, member, session=f"kill-{collective}", before=kill)
    for r, v in enumerate(res):
        if r != victim:
            assert isinstance(v, ziptrail.PeerGoneError), f"rank {r}: {v!r}"
            assert v.rank == victim, f"rank {r}: {v}"


def test_mailbox_delivers_to_a_rank_that_joins_later(pods: Pods):
    """A mailbox group: messages to rank 1 before any instance of it runs
    wait in the fast tier and reach the pod that joins as rank 1 later."""
    a = pods.start()
    g0 = a.client.join("mb", "g", 0, 2, mailbox=True)
    big = os.urandom(2 * MiB)
    assert g0.send(1, b"early", tag=3, timeout=LIMIT) is True
    assert g0.send(1, big, tag=4, timeout=LIMIT) is True
    b = pods.start()  # the receiver's pod starts only now
    with b.client.join("mb", "g", 1, 2) as g1:
        assert g1.mailbox
        with g1.recv(source=0, tag=3, timeout=LIMIT) as m:
            assert bytes(m.data) == b"early"
        with g1.recv(source=0, tag=4, timeout=LIMIT) as m:
            assert hashlib.sha256(m.data).digest() == hashlib.sha256(big).digest()
        g1.send(0, b"thanks")
        with g0.recv(source=1, timeout=LIMIT) as m:
            assert bytes(m.data) == b"thanks"
    g0.leave()


def test_namespaces_are_apart(pods: Pods):
    """The same session and group names in two namespaces are two groups:
    a member of one never reaches or sees the other's."""
    a, b = pods.start("team-a"), pods.start("team-b")
    ga = a.client.join("shared", "g", 0, 2)
    gb = b.client.join("shared", "g", 1, 2)  # rank 1 of team-b's group, not team-a's
    try:
        assert ga.members().live == (0,) and gb.members().live == (1,)
        with pytest.raises(ziptrail.MessageTimeout):
            ga.send(1, b"hello?", timeout=1)  # team-a's rank 1 never joins
        gb2 = b.client.join("shared", "g", 0, 2)  # rank 0 is free in team-b
        gb2.send(1, b"same namespace")
        with gb.recv(timeout=LIMIT) as m:
            assert (m.source, bytes(m.data)) == (0, b"same namespace")
        with pytest.raises(ziptrail.MessageTimeout):
            gb.recv(timeout=1)  # nothing from team-a arrived
        gb2.leave()
    finally:
        ga.leave()
        gb.leave()


def test_join_conflict_and_closed(pods: Pods):
    a, b = pods.start_many(2)
    g = a.client.join("conf", "g", 0, 3)
    with pytest.raises(ziptrail.Conflict):
        b.client.join("conf", "g", 0, 3)
    with pytest.raises(ziptrail.ConflictError):
        b.client.join("conf", "g", 1, 5)
    g.leave()
    with pytest.raises(ziptrail.Closed):
        g.recv(timeout=5)


HANDLER = """
def handler(inv):
    rank = int(inv.args)
    g = ziptrail.join("in-handler", rank, 2, wait_all=True, timeout=120)  # no leave: the invocation's end ends it
    total = g.allreduce(rank + 1)
    return f"{g.session} {g.invocation_id == inv.id and inv.id != ''} {total}"
"""


def test_join_in_a_handler_ends_with_the_invocation(pods: Pods):
    """Functions join from their handlers (session and invocation from the
    envelope); the memberships end when the invocations end, so the ranks
    are free again afterwards without any leave."""
    caller = pods.start()
    fns = [pods.start(function=HANDLER) for _ in range(2)]
    results: list[Any] = [None, None]

    def call(r: int) -> None:
        results[r] = caller.client.invoke(fns[r].url, b"", session="sess-h", args=str(r).encode(), timeout=LIMIT)

    threads = [threading.Thread(target=call, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LIMIT)
    for resp in results:
        assert resp is not None and resp.ok, resp
        assert resp.text() == "sess-h True 3"
    for r in range(2):  # both ranks free again: a join neither conflicts nor waits
        with caller.client.join("sess-h", "in-handler", r, 2, timeout=LIMIT) as g:
            assert r in g.members().live


class _NoGRPC:
    """Stands for the gRPC Send and Recv: the groups must not call them."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *a: Any, **kw: Any) -> Any:
        raise AssertionError(f"{self.name} went through gRPC, not the messaging socket")

    future = __call__


def test_send_and_recv_take_the_messaging_socket(pods: Pods):
    """Send, Recv and the collectives over msg.sock (the gRPC Send and Recv
    fail if called): small and 5 MiB messages (the large one handed over and
    received as files, nothing left), typed errors from the sidecar's
    reasons, a broken connection dropped (the next call makes a new one),
    connections of ended threads and of a closed client closed."""
    a, b = pods.start_many(2, direct_tcp=False)
    for sc in (a, b):
        sc.client._stub.Send, sc.client._stub.Recv = _NoGRPC("Send"), _NoGRPC("Recv")
    big = os.urandom(5 * MiB)

    def member(g: ziptrail.Group) -> Any:
        other = 1 - g.rank
        assert g.send(other, b"hi %d" % g.rank, tag=1) is False
        with g.recv(source=other, tag=1, timeout=LIMIT) as m:
            assert (m.source, m.tag, bytes(m.data)) == (other, 1, b"hi %d" % other)
        if g.rank == 0:
            g.send(1, big, tag=2)
        else:
            with g.recv(source=0, tag=2, timeout=LIMIT) as m:
                assert isinstance(m.data, ziptrail.MappedObject)
                assert hashlib.sha256(m.data).digest() == hashlib.sha256(big).digest()
        assert g.allreduce(array("d", [float(g.rank)]) * 20_000) == array("d", [1.0]) * 20_000  # the ring: send while receiving
        assert [bytes(x) for x in g.alltoall([b"%d>%d" % (g.rank, j) for j in range(2)])] == \
            [b"%d>%d" % (i, g.rank) for i in range(2)]
        with pytest.raises(ziptrail.MessageTimeout) as e:
            g.recv(source=other, tag=3, timeout=0.2)
        assert e.value.reason == "MSG_TIMEOUT"  # the sidecar's answer, through errors.BY_REASON
        msg = g._msg
        conn = msg._local.t.main
        conn.sock.close()  # broken under the client: the call fails and drops it
        with pytest.raises(ziptrail.UnavailableError):
            g.send(other, b"lost", tag=4)
        assert msg._local.t.main is None and conn not in msg._conns
        g.barrier()  # a new connection
        assert msg._local.t.main is not None and msg._local.t.main is not conn

    ok(run_members([a, b], 2, member, session="fast"))
    assert shm_files(a) == [] and shm_files(b) == []
    g0, g1 = a.client.join("fast2", "g", 0, 2), b.client.join("fast2", "g", 1, 2)
    g1.leave()
    with pytest.raises(ziptrail.PeerGone) as e:
        g0.send(1, b"x", timeout=LIMIT)
    assert e.value.rank == 1 and e.value.reason == "PEER_GONE"
    with pytest.raises(ziptrail.Closed):
        g1.recv(timeout=LIMIT)
    g0.leave()
    conns = a.client._messages()._conns
    assert len(conns) == 1  # this thread's: the members' threads ended and closed theirs
    socks = [c.sock for c in conns]
    a.client.close()
    assert not a.client._messages()._conns and all(s.fileno() == -1 for s in socks)


def test_large_messages_reuse_the_sidecars_files(pods: Pods):
    """A large message's file is lent to the receiving member and given
    back when its mapping goes (close, or garbage collection), so the
    receiver's sidecar fills the same few files again instead of a new one
    per message; the sender writes each message into the file its last
    send got back; a message kept open keeps its bytes while later ones
    arrive (docs/messaging.md, "Reused files")."""
    a, b = pods.start_many(2, direct_tcp=False)
    n, size = 20, MiB

    def pooled() -> set[str]:
        return {f for f in os.listdir(b.shm_dir) if f.startswith("get-")}

    def member(g: ziptrail.Group) -> Any:
        if g.rank == 0:
            sent: set[str] = set()
            for i in range(n + 5):
                g.send(1, bytes([i + 1]) * size, tag=0)
                sent |= {f for f in os.listdir(a.shm_dir) if f.startswith("put-")}
            g.barrier()
            return sent
        seen: set[str] = set()
        for i in range(n):
            m = g.recv(source=0, tag=0, timeout=LIMIT)
            assert isinstance(m.data, ziptrail.MappedObject)
            assert m.data[:] == bytes([i + 1]) * size
            seen |= pooled()
            if i % 2:
                m.close()
            else:
                del m  # garbage-collected: given back too
        held = g.recv(source=0, tag=0, timeout=LIMIT)
        for i in range(n + 1, n + 5):
            with g.recv(source=0, tag=0, timeout=LIMIT) as m:
                assert m.data[:] == bytes([i + 1]) * size
        assert held.data[:] == bytes([n + 1]) * size, "a message kept open changed"
        held.close()
        g.barrier()
        return seen

    sent, seen = ok(run_members([a, b], 2, member, session="lend"))
    # A new file per message would be 25 names at each end, none left to
    # see (each removed once sent, or once mapped).
    assert len(sent) == 1, sent  # the sender's file came back each time
    assert 1 <= len(seen) <= 3, seen
    assert shm_files(b) == []
