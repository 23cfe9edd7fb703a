"""An in-memory stand-in for the sidecars' messaging calls (Join, Leave,
Send, Recv, Members), for testing the SDK's group code and collective
algorithms without processes: every "pod" is a real ziptrail.Client whose
stub talks to one shared Hub. Payloads cross the shared-memory directories
as with real sidecars: a path payload is read and removed (the sidecar takes
it over), a received message larger than the inline threshold is written as
a file into the receiver's directory. The Hub follows the contract in
/work/messaging-spec.md (ordering per sender, any_tag only >= 0, PEER_GONE,
GROUP_CLOSED, GROUP_CONFLICT, mailboxes), and bounds every (sender,
receiver) pair to ``pair_capacity`` queued messages (back-pressure)."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ziptrail
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
    """A pod: a client with its own shared-memory directory."""

    def __init__(self, hub: Hub, pid: int) -> None:
        self.hub, self.id = hub, pid
        self.shm_dir = tempfile.mkdtemp(prefix="zt-fake-")
        self.client = ziptrail.Client(os.path.join(self.shm_dir, "none.sock"), self.shm_dir,
                                      inline_threshold=hub.inline_threshold)
        self.client._stub = _Stub(hub, self)

    def files(self) -> list[str]:
        return os.listdir(self.shm_dir)

    def close(self) -> None:
        self.client.close()
        for f in os.listdir(self.shm_dir):
            os.unlink(os.path.join(self.shm_dir, f))
        os.rmdir(self.shm_dir)


class _Future:
    """What a gRPC future offers the SDK: result() and cancel()."""

    def __init__(self, fn: Callable[[threading.Event], Any]) -> None:
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._value: Any = None
        self._err: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(self._cancel)
            except BaseException as e:  # noqa: BLE001 - handed to result()
                self._err = e
            self._done.set()

        threading.Thread(target=run, daemon=True).start()

    def cancel(self) -> bool:
        self._cancel.set()
        return True

    def result(self) -> Any:
        self._done.wait()
        if self._err is not None:
            raise self._err
        return self._value


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, req: Any, timeout: float | None = None) -> Any:
        return self.fn(req, timeout, threading.Event())

    def future(self, req: Any, timeout: float | None = None) -> _Future:
        return _Future(lambda cancel: self.fn(req, timeout, cancel))


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
