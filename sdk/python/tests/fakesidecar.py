"""An in-memory stand-in for the sidecars' messaging calls (Join, Leave,
Send, Recv, Members), for testing the SDK's group code and collective
algorithms without processes: every "pod" is a real ziptrail.Client whose
stub talks to one shared Hub, and whose Send and Recv reach the Hub through
a fast-path socket (msg.sock, the sidecar's framing, served here). A dead
pod's socket drops its connections, as a dead sidecar's would. Payloads cross the shared-memory directories
as with real sidecars: a path payload is read and removed (the sidecar takes
it over), a received message larger than the inline threshold is written as
a file into the receiver's directory. The Hub follows the contract in
/work/messaging-spec.md (ordering per sender, any_tag only >= 0, PEER_GONE,
GROUP_CLOSED, GROUP_CONFLICT, mailboxes), and bounds every (sender,
receiver) pair to ``pair_capacity`` queued messages (back-pressure)."""

from __future__ import annotations

import os
import select
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ziptrail
from ziptrail._fastmsg import socket_path
from ziptrail._proto import sidecar_pb2 as pb
from ziptrail.errors import (ClosedError, GroupConflictError, InvalidError, MessageTimeoutError, PeerGoneError,
                             ZiptrailTimeoutError)


@dataclass
class _Group:
    size: int
    mailbox: bool
    epoch: int = 1
    live: dict[int, int] = field(default_factory=dict)  # rank -> pod
    gone: set[int] = field(default_factory=set)
    queues: dict[int, list[tuple[int, int, bytes]]] = field(default_factory=dict)  # rank -> (from, tag, data)


class Hub:
    def __init__(self, inline_threshold: int = 256, pair_capacity: int = 0) -> None:
        self.inline_threshold = inline_threshold
        self.pair_capacity = pair_capacity
        self.cond = threading.Condition()
        self.groups: dict[tuple[str, str], _Group] = {}
        self.pods: list[Pod] = []
        self.dead: set[int] = set()

    def pod(self) -> Pod:
        p = Pod(self, len(self.pods))
        self.pods.append(p)
        return p

    def kill(self, pod: Pod) -> None:
        """The pod dies: every rank it runs is gone."""
        with self.cond:
            self.dead.add(pod.id)
            for g in self.groups.values():
                for r, p in list(g.live.items()):
                    if p == pod.id:
                        del g.live[r]
                        g.gone.add(r)
                        g.epoch += 1
            self.cond.notify_all()

    def close(self) -> None:
        for p in self.pods:
            p.close()


class Pod:
    """A pod: a client with its own shared-memory directory, and the
    fast-path socket in a directory of its own."""

    def __init__(self, hub: Hub, pid: int) -> None:
        self.hub, self.id = hub, pid
        self.shm_dir = tempfile.mkdtemp(prefix="zt-fake-")
        self.sock_dir = tempfile.mkdtemp(prefix="zt-fake-sock-")
        self.client = ziptrail.Client(os.path.join(self.sock_dir, "sidecar.sock"), self.shm_dir,
                                      inline_threshold=hub.inline_threshold)
        self.client._stub = stub = _Stub(hub, self)
        self.fast = _FastServer(socket_path(os.path.join(self.sock_dir, "sidecar.sock")), stub)

    def files(self) -> list[str]:
        return os.listdir(self.shm_dir)

    def close(self) -> None:
        self.client.close()
        self.fast.close()
        for f in os.listdir(self.shm_dir):
            os.unlink(os.path.join(self.shm_dir, f))
        os.rmdir(self.shm_dir)
        for f in os.listdir(self.sock_dir):
            os.unlink(os.path.join(self.sock_dir, f))
        os.rmdir(self.sock_dir)


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, req: Any, timeout: float | None = None) -> Any:
        return self.fn(req, timeout, threading.Event())


# The fast path's framing (internal/dataplane/localapi/fastmsg.go).
_REQ = struct.Struct("<IBBHHHIIqq")
_RESP = struct.Struct("<IBBHIqQ")


def _read(c: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        b = c.recv(n - len(buf))
        if not b:
            return None
        buf += b
    return bytes(buf)


class _FastServer:
    """The fast path of one pod: Send and Recv frames turned into the
    stub's requests; a Recv ends (cancelled) when its client hangs up; a
    dead pod drops the connection instead of answering."""

    def __init__(self, path: str, stub: _Stub) -> None:
        self.stub = stub
        self.ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ln.bind(path)
        self.ln.listen(64)
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.ln.close()
        with self.lock:
            for c in self.conns:
                c.close()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.ln.accept()
            except OSError:
                return
            with self.lock:
                self.conns.add(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            while True:
                head = _read(c, _REQ.size)
                if head is None:
                    return
                n, op, flags, sl, gl, _, rank, peer, tag, timeout_ms = _REQ.unpack(head)
                body = _read(c, n - (_REQ.size - 4))
                if body is None:
                    return
                session, group, payload = body[:sl].decode(), body[sl:sl + gl].decode(), body[sl + gl:]
                try:
                    resp = self._call(c, op, flags, session, group, rank, peer, tag, timeout_ms, payload)
                except ziptrail.UnavailableError:
                    return  # the pod died: its sidecar answers nothing
                except ziptrail.ZiptrailError as e:
                    reason, msg = (e.reason or "INTERNAL").encode(), e.message.encode()
                    resp = _RESP.pack(_RESP.size - 4 + len(reason) + len(msg), 1, 0, len(reason), 0, 0, 0) + reason + msg
                try:
                    c.sendall(resp)
                except OSError:
                    return
        except OSError:
            return
        finally:
            with self.lock:
                self.conns.discard(c)
            c.close()

    def _call(self, c: socket.socket, op: int, flags: int, session: str, group: str, rank: int, peer: int, tag: int,
              timeout_ms: int, payload: bytes) -> bytes:
        if op not in (1, 2):  # as a sidecar without member channels answers attach and open
            raise InvalidError("messaging", f"unknown operation {op}", "BAD_PAYLOAD")
        if op == 1:
            data = pb.Payload(path=payload.decode()) if flags & 1 else pb.Payload(inline=payload)
            req = pb.SendRequest(session=session, group=group, to=peer, tag=tag, data=data, timeout_ms=timeout_ms)
            setattr(req, "from", rank)
            out = self.stub._send(req, None, threading.Event())
            return _RESP.pack(_RESP.size - 4, 0, 2 if out.mailboxed else 0, 0, 0, 0, 0)
        rreq = pb.RecvRequest(session=session, group=group, rank=rank, any_source=bool(flags & 1),
                              any_tag=bool(flags & 2), tag=tag, timeout_ms=timeout_ms)
        setattr(rreq, "from", peer)
        cancel, done = threading.Event(), threading.Event()

        def watch() -> None:  # the client sends nothing while it waits: a readable socket means it hung up
            while not done.is_set():
                if select.select([c], [], [], 0.02)[0]:
                    cancel.set()
                    return

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        try:
            m = self.stub._recv(rreq, None, cancel)
        finally:
            done.set()
            w.join()
        path = m.data.WhichOneof("source") == "path"
        body = m.data.path.encode() if path else m.data.inline
        return _RESP.pack(_RESP.size - 4 + len(body), 0, 1 if path else 0, 0, getattr(m, "from"), m.tag, m.size) + body


def _deadline(timeout_ms: int, timeout: float | None) -> float | None:
    limits = [t for t in (timeout_ms / 1000 if timeout_ms else None, timeout) if t is not None]
    return time.monotonic() + min(limits) if limits else None


class _Stub:
    def __init__(self, hub: Hub, pod: Pod) -> None:
        self.hub, self.pod = hub, pod
        self.Join = _Method(self._join)
        self.Leave = _Method(self._leave)
        self.Send = _Method(self._send)
        self.Recv = _Method(self._recv)
        self.Members = _Method(self._members)

    def _wait(self, deadline: float | None, cancel: threading.Event, op: str) -> None:
        if cancel.is_set():
            raise ZiptrailTimeoutError(op, "cancelled")
        if self.pod.id in self.hub.dead:
            raise ziptrail.UnavailableError(op, "the pod is dead")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise MessageTimeoutError(op, "timeout", "MSG_TIMEOUT")
        self.hub.cond.wait(0.05 if left is None else min(left, 0.05))

    @staticmethod
    def _view(g: _Group) -> pb.MembersResponse:
        return pb.MembersResponse(size=g.size, live=sorted(g.live), gone=sorted(g.gone), epoch=g.epoch, mailbox=g.mailbox)

    def _join(self, req: pb.JoinRequest, timeout: float | None, cancel: threading.Event) -> pb.MembersResponse:
        hub = self.hub
        with hub.cond:
            g = hub.groups.setdefault((req.session, req.group), _Group(req.size, req.mailbox))
            if g.size != req.size or req.rank in g.live:
                raise GroupConflictError("join", f"rank {req.rank} of {req.size}: conflict", "GROUP_CONFLICT")
            g.live[req.rank] = self.pod.id
            g.gone.discard(req.rank)
            g.epoch += 1
            hub.cond.notify_all()
            deadline = _deadline(req.timeout_ms, timeout)
            while req.wait_all and len(g.live) + len(g.gone) < g.size:
                self._wait(deadline, cancel, "join")
            return self._view(g)

    def _member(self, session: str, group: str, rank: int, op: str) -> _Group:
        g = self.hub.groups.get((session, group))
        if g is None or g.live.get(rank) != self.pod.id:
            raise ClosedError(op, f"rank {rank} is not a member here", "GROUP_CLOSED")
        return g

    def _leave(self, req: pb.LeaveRequest, timeout: float | None, cancel: threading.Event) -> pb.LeaveResponse:
        with self.hub.cond:
            g = self._member(req.session, req.group, req.rank, "leave")
            del g.live[req.rank]
            g.gone.add(req.rank)
            g.epoch += 1
            self.hub.cond.notify_all()
        return pb.LeaveResponse()

    def _send(self, req: pb.SendRequest, timeout: float | None, cancel: threading.Event) -> pb.SendResponse:
        src = getattr(req, "from")
        if req.data.WhichOneof("source") == "path":
            path = req.data.path
            if os.path.dirname(path) != self.pod.shm_dir:
                raise InvalidError("send", f"{path} is not in the shared-memory directory", "BAD_PAYLOAD")
            with open(path, "rb") as f:
                data = f.read()
            os.unlink(path)
        else:
            data = req.data.inline
        hub = self.hub
        with hub.cond:
            g = self._member(req.session, req.group, src, "send")
            deadline = _deadline(req.timeout_ms, timeout)
            while True:
                if req.to in g.gone and not g.mailbox:
                    raise PeerGoneError("send", f"rank {req.to} is gone", "PEER_GONE")
                if req.to in g.live or g.mailbox:
                    q = g.queues.setdefault(req.to, [])
                    if not hub.pair_capacity or sum(1 for m in q if m[0] == src) < hub.pair_capacity:
                        q.append((src, req.tag, data))
                        hub.cond.notify_all()
                        return pb.SendResponse(mailboxed=req.to not in g.live)
                self._wait(deadline, cancel, "send")
                self._member(req.session, req.group, src, "send")

    def _recv(self, req: pb.RecvRequest, timeout: float | None, cancel: threading.Event) -> pb.RecvResponse:
        src = getattr(req, "from")
        hub = self.hub
        with hub.cond:
            deadline = _deadline(req.timeout_ms, timeout)
            while True:
                g = self._member(req.session, req.group, req.rank, "recv")
                q = g.queues.setdefault(req.rank, [])
                for i, (f, tag, data) in enumerate(q):
                    if (req.any_source or f == src) and ((req.any_tag and tag >= 0) or (not req.any_tag and tag == req.tag)):
                        del q[i]
                        hub.cond.notify_all()
                        return pb.RecvResponse(tag=tag, data=self._deliver(data), size=len(data), **{"from": f})
                others = set(range(g.size)) - {req.rank}
                if (not req.any_source and src in g.gone) or (req.any_source and others and others <= g.gone):
                    raise PeerGoneError("recv", "the peer is gone", "PEER_GONE")
                self._wait(deadline, cancel, "recv")

    def _deliver(self, data: bytes) -> pb.Payload:
        if len(data) <= self.hub.inline_threshold:
            return pb.Payload(inline=data)
        fd, path = tempfile.mkstemp(prefix="msg-", dir=self.pod.shm_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return pb.Payload(path=path)

    def _members(self, req: pb.MembersRequest, timeout: float | None, cancel: threading.Event) -> pb.MembersResponse:
        hub = self.hub
        with hub.cond:
            g = hub.groups.get((req.session, req.group))
            if g is None:
                raise ClosedError("members", "no such group", "GROUP_CLOSED")
            deadline = _deadline(req.timeout_ms, timeout) if req.timeout_ms else None
            while req.after_epoch and g.epoch <= req.after_epoch and deadline is not None:
                try:
                    self._wait(deadline, cancel, "members")
                except MessageTimeoutError:
                    break
            return self._view(g)
