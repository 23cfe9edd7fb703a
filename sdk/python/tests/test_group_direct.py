"""Same-node direct channels (docs/messaging.md) against real sidecars:
queue-proxy-zl processes on the operator's control server, the pods of a
node sharing that node's directory. Members attach (their SDK receives
locally); pairs on one node send over direct channels, the others through
the sidecars."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest

import ziptrail
from conftest import REPO, SDK, Pods, Sidecar
from test_group_sidecars import LIMIT, MiB, collectives, ok, run_members, shm_files


def direct_opens(sc: Sidecar, result: str = "direct", tcp: bool = False) -> int:
    """The sidecar's count of direct channel requests on its node socket
    (tcp: on its data-plane port, across nodes) with that result (its
    metric)."""
    name = "ziptrail_messages_direct_tcp_opens_total" if tcp else "ziptrail_messages_direct_opens_total"
    m = re.search(r'^%s\{result="%s"\} (\d+)' % (name, result), sc.metrics(), re.M)
    return int(m.group(1)) if m else 0


def synced(n: int, fn: Any) -> Any:
    """fn, run once every member joined (wait_all) at every sidecar: each
    member's own view is whole then, and so is the view of every sidecar
    that decides an open (a sidecar that has not seen the sender join yet
    answers nodirect: see the report of the Python SDK's direct channels)."""
    sync = threading.Barrier(n)

    def run(g: ziptrail.Group) -> Any:
        sync.wait(LIMIT)
        return fn(g)
    return run


def open_fds() -> list[str]:
    """What this process's descriptors point to."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor
            pass
    return out


@pytest.mark.parametrize("far_tcp", [True, False], ids=["far-tcp", "far-sidecars"])
def test_same_node_pairs_send_over_direct_channels(pods: Pods, far_tcp: bool):
    """Two pods of one node and one of another: ranks 0 and 1 (same node)
    get direct channels both ways (the receivers' sidecars count them),
    rank 2 talks to them over direct TCP channels, or through the sidecars
    (far_tcp). 3,000 messages per pair arrive in order; large ones come as
    sealed memfds mapped without a copy between ranks 0 and 1; no file
    passes through the shared-memory directories."""
    a, b = pods.start(node="n1"), pods.start(node="n1")
    far = pods.start(node="n2", direct_tcp=far_tcp)
    n = 3000
    sizes = [0, 1, 64, 4096, 200_000, 130 * 1024, 2 * MiB]
    bodies = {size: os.urandom(size) for size in sizes}

    def payload(frm: int, i: int) -> bytes:
        size = sizes[i // 50 % len(sizes)] if i % 50 == 0 else 64
        return b"%d:%d;" % (frm, i) + bodies[size][:max(0, size - 12)] if size >= 12 else bodies[size]

    def member(g: ziptrail.Group) -> Any:
        assert g._att is not None, "the member did not attach"
        others = [r for r in range(3) if r != g.rank]
        done = threading.Event()

        def sender() -> None:
            for i in range(n):
                for r in others:
                    assert g.send(r, payload(g.rank, i), tag=i % 7) is False
            done.set()

        t = threading.Thread(target=sender)
        t.start()
        nxt = {r: 0 for r in others}
        while any(v < n for v in nxt.values()):
            with g.recv(timeout=LIMIT) as m:
                i = nxt[m.source]
                want = payload(m.source, i)
                assert (m.tag, len(m.data)) == (i % 7, len(want)), f"from {m.source} message {i}"
                if len(want) > 128 * 1024 and {m.source, g.rank} == {0, 1}:
                    assert isinstance(m.data, ziptrail.MappedObject)  # a memfd, mapped
                assert hashlib.sha256(m.data).digest() == hashlib.sha256(want).digest()
                nxt[m.source] = i + 1
        t.join(LIMIT)
        assert done.is_set()
        g.barrier()
        return None

    ok(run_members([a, b, far], 3, synced(3, member), session="direct-p2p"))
    assert direct_opens(a) == 1 and direct_opens(b) == 1  # 1 -> 0 at a, 0 -> 1 at b
    assert direct_opens(far) == 0
    # Over TCP, counted by the receiver: 2 -> 0 at a, 2 -> 1 at b, 0 -> 2 and 1 -> 2 at far.
    assert [direct_opens(sc, tcp=True) for sc in (a, b, far)] == ([1, 1, 2] if far_tcp else [0, 0, 0])
    for sc in (a, b, far):
        assert shm_files(sc) == []


@pytest.mark.parametrize("n, per_pod", [(4, 1), (8, 2)])
def test_every_collective_over_direct_channels(pods: Pods, n: int, per_pod: int):
    """Every collective with 4 members (one pod each) and 8 (two per pod),
    all pods on one node: every pair talks over a direct channel."""
    scs = [pods.start(node="n1") for _ in range(n // per_pod)]
    ok(run_members(scs, n, synced(n, collectives), session=f"direct-coll-{n}"))
    assert sum(direct_opens(sc) for sc in scs) == n * (n - 1)  # every ordered pair, once
    for sc in scs:
        assert shm_files(sc) == []


HOSTILE = r'''
import array, os, socket, struct, sys, fcntl
import ziptrail
from ziptrail import _direct

sock, shm, session, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = ziptrail.Client(sock, shm)
H = struct.Struct("<IBqQ")
M = 0x3144545A

def memfd(size, seal=True):
    fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _direct.SEALS)
    return fd

def fds(*f):
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", f))]

big = 200 << 10
r, w = os.pipe()
cases = [
    ([b"hello"], []),                                      # shorter than a header
    ([H.pack(0xDEADBEEF, 1, 0, 0)], []),                    # bad magic
    ([H.pack(M, 1, 0, 100), b"x" * 10], []),                # announces more than it carries
    ([H.pack(M, 1, 0, big), b"x" * big], []),               # over the inline bound
    ([H.pack(M, 2, 0, big)], fds(memfd(big, seal=False))),  # an unsealed memfd
    ([H.pack(M, 2, 0, big * 2)], fds(memfd(big))),          # a memfd of another size
    ([H.pack(M, 1, 0, 3), b"abc"], fds(r)),                 # inline with a descriptor
    ([H.pack(M, 2, 0, big)], fds(memfd(big), memfd(big))),  # two memfds
    ([H.pack(M, 2, 0, big)], fds(*[memfd(big) for _ in range(8)])),  # more than fit
    ([H.pack(M, 9, 0, 0)], []),                             # an unknown kind
    ([H.pack(M, 2, 0, big)], fds(w)),                       # a pipe, not a memfd
    ([H.pack(M, 2, 0, 1 << 40)], fds(memfd(big))),          # past the message cap
    ([H.pack(M, 4, 0, big)], fds(w)),                       # a copy frame with a pipe
    ([H.pack(M, 4, 0, big)], fds(memfd(big - 1, seal=False))),  # a copy frame's memfd short of its size
    ([H.pack(M, 4, 0, 5 << 20)], fds(memfd(5 << 20, seal=False))),  # a copy frame over COPY_MAX
    ([H.pack(M, 4, 0, big)], []),                           # a copy frame without its memfd
]
assert len(cases) == k
groups = [c.join(session, "g", s, k + 2, timeout=120) for s in range(1, k + 2)]
print("JOINED", flush=True)
sys.stdin.readline()  # the receiver's sidecar knows every rank
for s, (parts, anc) in enumerate(cases, 1):
    sender = _direct.open_direct(c.socket[:-len(".sock")] + ".msg.sock", session, "g", s, 0, "open", 60)
    assert sender is not None, "no direct channel"
    ch = sender.sock
    ch.sendmsg([H.pack(M, 1, 5, 2), b"ok"])
    ch.sendmsg(parts, anc)
    groups[s - 1]._hostile = ch
groups[-1].send(0, b"still here", tag=5)  # a well-behaved member
print("SENT", flush=True)
sys.stdin.read()  # until the test is done
'''


def test_hostile_peer_on_a_direct_channel(pods: Pods, tmp_path):
    """A same-node peer process writes, after one good frame, a malformed,
    oversized or descriptor-smuggling frame (an unsealed or wrong-size
    memfd, a pipe, extra descriptors) into its direct channel: the
    receiving SDK drops that channel and its recv names the rank (a
    DirectChannelError), it neither hangs nor crashes (a well-behaved
    member's message still arrives), and it keeps no descriptor of it."""
    a, b = pods.start(node="n1"), pods.start(node="n1")
    k = 16
    g = a.client.join("hostile", "g", 0, k + 2, timeout=LIMIT)
    try:
        assert g._att is not None
        script = tmp_path / "hostile.py"
        script.write_text(HOSTILE)
        env = dict(os.environ, PYTHONPATH=str(SDK))
        peer = subprocess.Popen([sys.executable, str(script), b.socket, b.shm_dir, "hostile", str(k)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        base = open_fds()
        try:
            assert peer.stdout is not None and peer.stdin is not None
            assert peer.stdout.readline().strip() == "JOINED"
            g._att.wait_view("join", lambda v: len(v.live) == k + 2, LIMIT)
            peer.stdin.write("go\n")
            peer.stdin.flush()
            assert peer.stdout.readline().strip() == "SENT"
            for s in range(1, k + 1):
                with g.recv(source=s, timeout=LIMIT) as m:
                    assert (m.tag, bytes(m.data)) == (5, b"ok")
                with pytest.raises(ziptrail.DirectChannelError) as e:
                    g.recv(source=s, timeout=LIMIT)
                assert e.value.rank == s and f"rank {s}" in str(e.value), str(e.value)
            with g.recv(source=k + 1, timeout=LIMIT) as m:
                assert bytes(m.data) == b"still here"
            with pytest.raises(ziptrail.DirectChannelError):  # again for a receive from that rank
                g.recv(source=1, timeout=LIMIT)
            assert direct_opens(a) == k + 1
            new = Counter(open_fds()) - Counter(base)  # the well-behaved member's channel, nothing else
            assert sum(new.values()) == 1 and next(iter(new)).startswith("socket:"), f"descriptors leaked: {new}"
        finally:
            peer.communicate("", timeout=LIMIT)
    finally:
        g.leave()


VICTIM = """
import time
def handler(inv):
    g = ziptrail.join("g", 1, 2, wait_all=True, timeout=120)
    g.recv(source=0, timeout=120)  # rank 0's sidecar knows this rank
    g.send(0, b"ready")
    while True:
        time.sleep(1)  # until killed
"""


@pytest.mark.parametrize("how", ["same-node", "across-nodes", "node-gone"])
def test_peer_process_killed_is_peer_gone(pods: Pods, how: str):
    """A peer's function process is SIGKILLed while this member waits for
    it: recv gets PeerGoneError naming it (its direct channel ended and the
    view says it left), not a timeout; so does a send to it. On the same
    node (a socketpair), on another (a TCP channel), and as a node that
    goes away: the peer frozen (SIGSTOP: its socket sends no FIN) and its
    pod's sidecar SIGKILLed, so that only the view says it is gone."""
    a = pods.start(node="n1")
    fn = pods.start(node="n1" if how == "same-node" else "n2", function=VICTIM)
    victim = pods.sidecars.procs[-1]
    g = a.client.join("kill", "g", 0, 2, timeout=LIMIT)
    out: list[Any] = []

    def invoke() -> None:  # its outcome is the victim's: killed, or its sidecar killed
        try:
            out.append(a.client.invoke(fn.url, b"", session="kill", timeout=LIMIT))
        except Exception as e:  # noqa: BLE001
            out.append(e)

    call = threading.Thread(target=invoke, daemon=True)
    try:
        call.start()
        g._att.wait_view("join", lambda v: 1 in v.live, LIMIT)
        g.send(1, b"go", timeout=LIMIT)
        with g.recv(source=1, timeout=LIMIT) as m:
            assert bytes(m.data) == b"ready"
        assert direct_opens(a, tcp=how != "same-node") == 1  # the victim's channel to rank 0
        t0 = time.monotonic()
        if how == "node-gone":
            victim.send_signal(signal.SIGSTOP)
            fn.proc.kill()
        else:
            victim.kill()
        with pytest.raises(ziptrail.PeerGoneError) as e:
            g.recv(source=1, timeout=LIMIT)
        print(f"PeerGone {1000 * (time.monotonic() - t0):.0f} ms after SIGKILL")
        assert e.value.rank == 1
        with pytest.raises(ziptrail.PeerGoneError) as e:
            g.send(1, b"anyone?", timeout=LIMIT)
        assert e.value.rank == 1
    finally:
        g.leave()
        if how == "node-gone":
            victim.kill()
        call.join(LIMIT)


@pytest.mark.parametrize("size", [100 << 10, 1 << 20])
def test_back_pressure_over_a_direct_channel(pods: Pods, size: int):
    """A receiver that does not receive: its SDK's inbox takes 64 MiB, then
    its reader stops reading the channel, so the sender waits (inline
    messages: the socket's buffer fills; memfds: the sender holds at most
    16 MiB not credited) and its send times out. Nothing is lost: the
    receiver then gets every message sent, in order, and the sender can
    send again."""
    a, b = pods.start(node="n1"), pods.start(node="n1")
    g0 = a.client.join("bp", "g", 0, 2, timeout=LIMIT)
    g1 = b.client.join("bp", "g", 1, 2, wait_all=True, timeout=LIMIT)
    try:
        body = os.urandom(size)
        sent = 0
        with pytest.raises(ziptrail.MessageTimeout):
            while sent < 2 * (64 << 20) // size:
                g0.send(1, body, tag=sent, timeout=3)
                sent += 1
        inflight = 16 << 20 if size > 128 << 10 else 2 << 20  # credits, or the socket's buffer (1 MiB, doubled)
        assert 64 << 20 <= sent * size <= (64 << 20) + inflight + 2 * size, sent
        assert direct_opens(b) == 1
        for i in range(sent):
            with g1.recv(source=0, timeout=LIMIT) as m:
                assert m.tag == i and bytes(m.data[:64]) == body[:64]
        g0.send(1, b"again", tag=7, timeout=LIMIT)
        with g1.recv(source=0, timeout=LIMIT) as m:
            assert (m.tag, bytes(m.data)) == (7, b"again")
    finally:
        g0.leave()
        g1.leave()


@pytest.fixture(scope="module")
def directpeer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Go member (tests/directpeer): the Go framing of direct channels."""
    out = tmp_path_factory.mktemp("bin") / "directpeer"
    subprocess.run(["go", "build", "-o", str(out), "./sdk/python/tests/directpeer"], cwd=REPO, check=True)
    return str(out)


@pytest.mark.parametrize("across", [False, True], ids=["same-node", "across-nodes"])
def test_mixed_go_and_python_members_share_direct_channels(pods: Pods, directpeer: str, across: bool):
    """A Python member and a Go member (the Go client of the messaging
    socket and the Go framing, as the Go SDK's) on one node: the Go member
    echoes what the Python member sends over direct channels both ways;
    every byte, tag and the order come back. Python sends inline frames up
    to 128 KiB and sealed memfds above; the Go member echoes 128 KiB-4 MiB
    as copy frames (kind 4) in the memfds it reuses (eight 1 MiB messages
    of different bytes in a row: a stale page would show) and larger ones
    as sealed memfds, which the Python member maps. Both opens are direct,
    and no message takes the sidecar path (the Go member fails at once if
    one does). Across nodes the same over TCP channels: every message
    inline, each way."""
    a, b = pods.start(node="n1"), pods.start(node="n2" if across else "n1")
    sizes = [0, 64, 100 << 10, 128 << 10, (128 << 10) + 1, 1 << 20, 3 << 20, 4 << 20, (4 << 20) + 1, 6 << 20]
    sizes += [1 << 20] * 8
    bodies = [os.urandom(s) for s in sizes]
    peer = subprocess.Popen([directpeer, "-socket", b.socket, "-session", "mixed-tcp" if across else "mixed", "-group", "g", "-rank", "1",
                             "-size", "2", "-peer", "0", "-n", str(len(sizes))], stdout=subprocess.PIPE, text=True)

    def peer_failed() -> str | None:
        if peer.poll() in (None, 0):  # running, or done (its last echoes may still be queued)
            return None
        out, _ = peer.communicate()
        return f"the Go member exited {peer.returncode}: {out.strip()}"

    try:
        with a.client.join("mixed-tcp" if across else "mixed", "g", 0, 2, wait_all=True, timeout=LIMIT) as g:
            assert peer.stdout is not None
            line = peer.stdout.readline().strip()
            assert line == "LIVE", peer_failed() or line  # its sidecar knows rank 0
            for i, body in enumerate(bodies):
                assert g.send(1, body, tag=100 + i, timeout=LIMIT) is False
            assert g._att is not None and g._att._outs[1].sock is not None, "rank 0's open was answered nodirect"
            deadline = time.monotonic() + LIMIT  # a bound against hangs
            for i, body in enumerate(bodies):
                while True:
                    ic = g._att.ins.get(1)
                    # The Go member finished and its channel's end was read: all it sent is queued.
                    ended = peer.poll() == 0 and ic is not None and ic.eof
                    try:
                        m = g.recv(source=1, timeout=1)
                        break
                    except ziptrail.MessageTimeout:
                        failed = peer_failed()
                        assert failed is None, f"echo {i}: {failed}"
                        state = "no channel from it" if ic is None else f"its channel: eof {ic.eof}, error {ic.err}"
                        assert not ended, f"echo {i} lost: the Go member sent it and ended ({state})"
                        assert time.monotonic() < deadline, f"echo {i}: nothing from the Go member ({state})"
                with m:
                    assert (m.tag, len(m.data)) == (100 + i, len(body))
                    assert hashlib.sha256(m.data).digest() == hashlib.sha256(body).digest(), f"echo {i}"
                    if len(body) > 4 << 20 and not across:  # a sealed memfd, mapped
                        assert isinstance(m.data, ziptrail.MappedObject)
                    else:  # inline, or a copy frame copied out
                        assert isinstance(m.data, ziptrail.InlineObject)
            assert g._att._outs[1].sock.stream == across
            assert (direct_opens(a, tcp=across), direct_opens(b, tcp=across)) == (1, 1)
            assert (direct_opens(a, "nodirect", across), direct_opens(b, "nodirect", across)) == (0, 0)
        out, _ = peer.communicate(timeout=LIMIT)
        assert peer.returncode == 0 and out.strip() == "DONE", out
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
