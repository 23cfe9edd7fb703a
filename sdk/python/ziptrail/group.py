"""Direct messages between function instances (Pikachu): groups, ``send``
and ``recv``, and MPI-style collectives, over the pod's sidecar.

An instance joins a group of its session as rank ``r`` of ``size`` ranks;
it then sends to and receives from the other ranks by rank. The sidecars
resolve ranks to pods through the operator's directory (no address reaches
the function), deliver messages over their data-plane connections, and keep
the messages of one sender in order. Join, leave and membership go through
the sidecar's gRPC local API; send and receive (and so the collectives) go
through its messaging socket (``sidecar.msg.sock`` next to the API's socket, a
minimal framing: see ``ziptrail._fastmsg``), one connection per thread.
Inside a handler::

    with ziptrail.join("train", rank, size) as g:     # session and invocation from the handler
        g.send(0, b"hello", tag=7)
        msg = g.recv(source=ziptrail.ANY)            # Message(source, tag, data)
        total = g.allreduce([1.5, 2.0], ziptrail.SUM)

Outside a handler (tests, tools) use :meth:`Client.join` with the session
and call :meth:`Group.leave` (or use the group as a context manager).

Same-node direct channels (docs/messaging.md): with a sidecar that has
member channels, ``join`` attaches (``ziptrail._direct``): the sidecar
pushes this member's messages, the group's views and the direct channels of
same-node senders on one connection, and one background thread
(``ziptrail._attached``) reads it and every direct channel into a local
inbox bounded at 64 MiB (past it, the thread stops reading and the senders
wait); ``recv`` filters that inbox. The first send to a rank asks the
sidecar for a direct channel: when both run on one node (and the group
keeps no mailboxes), messages to that rank go straight into a socketpair
(inline, or one sealed memfd, mapped read-only by the receiver), else
through the sidecars, for the group's lifetime. A peer that breaks the
channel's framing raises :class:`~ziptrail.DirectChannelError` naming its
rank at the receiver. With an older sidecar, everything goes through it.

Large messages travel as files in the shared-memory directory, as objects
do: a send writes the caller's buffer once into a file there and the sidecar
takes it over; a received large message is a :class:`~ziptrail.MappedObject`
over its file (no copy into Python), a small one an
:class:`~ziptrail.InlineObject`.

Errors are typed (``ziptrail.errors``): :class:`PeerGoneError` (the peer's
instance ended or its pod died: immediate, not a timeout),
:class:`MessageTimeoutError`, :class:`ForeignError`, :class:`ClosedError`,
:class:`GroupConflictError`.

Collectives (every member calls the same collectives in the same order, one
at a time per group): :meth:`Group.barrier`, :meth:`~Group.broadcast`,
:meth:`~Group.scatter`, :meth:`~Group.gather`, :meth:`~Group.reduce`,
:meth:`~Group.allreduce` and :meth:`~Group.alltoall`. They run over send and
recv with reserved negative tags: collective number ``seq`` of the group
(counted by every member) of kind ``k`` uses tag ``-(seq << 3 | k)``, so
consecutive collectives never mix and never see user messages (user tags are
``>= 0``). Broadcast, reduce and barrier use binomial trees (log2 n rounds);
allreduce is a reduce and a broadcast for small arrays and user functions, a
ring (reduce-scatter, then allgather) for built-in operations on arrays of
at least 64 KiB; alltoall is a pairwise exchange. A member that fails in a
collective (a gone peer, a timeout, an error of a user function) tells the
other members, so every member's collective ends with an error: a
:class:`PeerGoneError` naming the gone rank, else a
:class:`CollectiveAbortedError` naming the member that failed.

Reductions take numeric arrays: a list (or tuple) of ints (int64) or of
floats (float64), an ``array.array``, a numpy array (numpy is used when it
is installed, never required) or a single int or float; the result has the
caller's kind. int64 meets float64 as float64; other element types must
match. A user function ``op(a, b)`` gets two such values (the caller's kind)
and returns one, or, for bytes-like inputs, gets two bytes-like objects and
returns one. User functions must be associative and commutative.

Wire format of collective messages (shared with the other SDKs): a frame
``<BBHQ`` (version 1, type 0 data / 1 abort, header length, data offset),
the header (data: the element format such as ``f8``, ``i8``, empty for
bytes; abort: JSON ``{"gone": bool, "rank": r, "message": str}``), then the
data at the data offset: right after the header, or at the next page
boundary for messages larger than the inline threshold, so the receiver
maps the data straight from its file.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from . import _direct
from ._attached import Attached
from ._membermsgs import Lent
from ._collectives import RING_MIN_BYTES, _Collectives
from ._current import current_invocation
from ._fastmsg import ANY_SOURCE, ANY_TAG, MAX_NAMES, Payload, messaging_call, slack, socket_path, timeout_ms
from ._reduce import MAX, MIN, SUM, Op, Reduction
from ._objects import BytesLike, Data, InlineObject, MappedObject, SharedBuffer, _lent_object, _view
from .errors import InvalidError, ZiptrailError

if TYPE_CHECKING:
    from ._proto import sidecar_pb2
    from .client import Client

__all__ = ["ANY", "MAX", "MIN", "RING_MIN_BYTES", "SUM", "Group", "Members", "Message", "Op", "Reduction", "join"]

#: Any source or any (user) tag in :meth:`Group.recv`.
ANY = -1


@dataclass(frozen=True)
class Members:
    """A group's membership at one epoch: live ranks, ranks that joined and
    then left or died, the epoch (grows with every change)."""

    size: int
    live: tuple[int, ...]
    gone: tuple[int, ...]
    epoch: int
    mailbox: bool


@dataclass(frozen=True)
class Message:
    """A received message. ``data`` is an InlineObject (small) or a
    MappedObject over the message's shared-memory file (large): close it
    (or the message) when done, or let it be garbage-collected."""

    source: int
    tag: int
    data: Data

    def close(self) -> None:
        self.data.close()

    def __enter__(self) -> Message:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Group(_Collectives):
    """This instance's membership of a group (see the module doc). Made by
    :meth:`Client.join` or :func:`join`; safe to share between threads for
    send and recv; collectives run one at a time per group."""

    def __init__(self, client: Client, session: str, name: str, rank: int, size: int, invocation_id: str,
                 view: Any, att: Attached | None = None) -> None:
        self.client = client
        self.session = session
        self.name = name
        self.rank = rank
        self.size = view.size or size
        self.invocation_id = invocation_id
        self.mailbox = view.mailbox
        self.joined = _members(view)
        self._pb = client._pb
        self._stub = client._stub
        # Send and Recv take the messaging fast path (sidecar.msg.sock), not gRPC.
        self._msg = client._messages()
        s, g = session.encode(), name.encode()
        self._names, self._name_lens = s + g, (len(s), len(g))
        self._seq = 0
        self._coll = threading.Lock()
        self._left = False
        # Attached (a sidecar with member channels): receives locally, sends
        # to same-node ranks over direct channels; else None.
        self._att = att

    # --- membership -----------------------------------------------------------

    @classmethod
    def _join(cls, client: Client, session: str, group: str, rank: int, size: int, *, mailbox: bool = False,
              invocation_id: str | None = None, wait_all: bool = False, timeout: float | None = None) -> Group:
        if not session or not group:
            raise InvalidError("join", "session and group are required")
        if size < 1 or not 0 <= rank < size:
            raise InvalidError("join", f"rank must be in 0..size-1 and size at least 1, got rank {rank} of {size}")
        if invocation_id is None:
            inv = current_invocation()
            invocation_id = inv.id if inv is not None and inv.session == session else ""
        timeout = timeout if timeout is not None else client.timeout
        att = cls._attach(client, session, group, rank, size, mailbox, invocation_id, wait_all, timeout)
        if att is not None:
            return cls(client, session, group, rank, size, invocation_id, att[1], att[0])
        req = client._pb.JoinRequest(session=session, group=group, rank=rank, size=size, mailbox=mailbox,
                                     invocation_id=invocation_id, wait_all=wait_all, timeout_ms=timeout_ms(timeout))
        view = messaging_call(client, "join", lambda: client._call("join", client._stub.Join, req, slack(timeout)))
        return cls(client, session, group, rank, size, invocation_id, view)

    @classmethod
    def _attach(cls, client: Client, session: str, group: str, rank: int, size: int, mailbox: bool,
                invocation_id: str, wait_all: bool, timeout: float | None) -> tuple[Attached, Any] | None:
        """Joins with the member channel attached: (the attached member, its
        first view); None with a sidecar without member channels."""
        if len(session.encode()) > MAX_NAMES or len(group.encode()) > MAX_NAMES or len(invocation_id) > MAX_NAMES:
            return None  # gRPC says what is wrong
        path = socket_path(client.socket)
        try:
            sock, mbox = _direct.attach(path, session, group, rank, size, mailbox, invocation_id, timeout_ms(timeout),
                                        slack(timeout))
        except _direct.NoAttach:
            return None
        att = Attached(path, session, group, rank, mbox, sock)
        try:
            view = att.wait_view("join", (lambda v: len(v.live) + len(v.gone) >= v.size) if wait_all else (lambda v: True),
                                 timeout)
        except BaseException:
            att.close()
            try:
                client._call("leave", client._stub.Leave, client._pb.LeaveRequest(session=session, group=group, rank=rank),
                             slack(timeout))
            except ZiptrailError:
                pass
            raise
        return att, view

    def members(self, *, timeout: float | None = None) -> Members:
        """The group's membership now."""
        return self.watch(0, timeout=timeout)

    def watch(self, after_epoch: int, timeout: float | None = None) -> Members:
        """Waits (up to ``timeout`` seconds) for a membership newer than
        ``after_epoch`` and returns it; after the timeout, the current one."""
        wait = 0 if not timeout else timeout_ms(timeout)
        req = self._pb.MembersRequest(session=self.session, group=self.name, after_epoch=after_epoch, timeout_ms=wait)
        return _members(self._call("members", self._stub.Members, req, timeout))

    def leave(self) -> None:
        """Ends this membership (idempotent). A membership that joined with
        an invocation also ends with that invocation."""
        if self._left:
            return
        self._left = True
        try:
            self._call("leave", self._stub.Leave, self._pb.LeaveRequest(session=self.session, group=self.name, rank=self.rank), None)
        finally:
            if self._att is not None:
                self._att.close()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.leave()
        except ZiptrailError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return f"Group({self.session}/{self.name} rank {self.rank} of {self.size})"

    # --- point to point ---------------------------------------------------------

    def send(self, to: int, data: BytesLike, tag: int = 0, timeout: float | None = None) -> bool:
        """Sends ``data`` to rank ``to``; returns once the receiver's sidecar
        queued it (True when a mailbox group held it for a rank not running).
        Large data goes through one file in the shared-memory directory."""
        if tag < 0:
            raise InvalidError("send", f"tags are >= 0 (negative tags are the collectives'), got {tag}")
        self._check_rank("send", to)
        if self._att is not None:
            t = timeout if timeout is not None else self.client.timeout
            sock = self._att.path("send", to, t)
            if sock is not None:
                if isinstance(data, SharedBuffer):
                    try:
                        self._att.send("send", to, sock, tag, data.data, t)
                    finally:
                        data.discard()
                else:
                    self._att.send("send", to, sock, tag, _view(data), t)
                return False
        if not isinstance(data, SharedBuffer):
            mv = _view(data)
            if mv.nbytes > self.client.inline_threshold:
                # A file this client reuses: the sidecar gives it back once sent.
                self._check_names("send")
                try:
                    path = self._msg.message_file(self.client.shm_dir, mv)
                except OSError as e:
                    raise ZiptrailError("send", f"write the message into {self.client.shm_dir}: {e}") from None
                t = timeout if timeout is not None else self.client.timeout
                ms = timeout_ms(t)
                return messaging_call(self.client, "send", lambda: self._msg.send_file(
                    "send", self._names, self._name_lens, self.rank, to, tag, path, ms, slack(t)), to)
        (payload,) = self.client._raw_payloads(data, "send")
        return self._send_payload("send", to, tag, payload, timeout)

    def recv(self, source: int = ANY, tag: int = ANY, timeout: float | None = None) -> Message:
        """The oldest queued message from ``source`` (a rank or ANY) with
        ``tag`` (>= 0, or ANY); waits up to ``timeout`` seconds."""
        if tag < 0 and tag != ANY:
            raise InvalidError("recv", f"tags are >= 0 (negative tags are the collectives'), got {tag}")
        if source != ANY:
            self._check_rank("recv", source)
        frm, got, payload = self._recv("recv", None if source == ANY else source, None if tag == ANY else tag, timeout)
        if type(payload) is InlineObject:  # a direct channel's small message, copied once already
            return Message(frm, got, payload)
        if isinstance(payload, _direct.Memfd):  # a large message of a direct channel: mapped, not copied
            try:
                return Message(frm, got, MappedObject(payload.fd, payload.size, prot=mmap.PROT_READ))
            finally:
                payload.close()
        if isinstance(payload, Lent):  # a file the sidecar lent: given back when the mapping goes
            if payload.err:
                payload.close()
                raise ZiptrailError("recv", payload.err)
            fd, give_back = payload.take()
            try:
                return Message(frm, got, _lent_object(fd, payload.size, 0, give_back))
            except BaseException:
                give_back()
                raise
            finally:
                os.close(fd)
        return Message(frm, got, self.client._data("recv", payload, ""))

    def _check_rank(self, op: str, r: int) -> None:
        if not 0 <= r < self.size:
            raise InvalidError(op, f"rank {r} is not in the group of size {self.size}")

    def _call(self, op: str, method: Callable[..., Any], req: Any, timeout: float | None) -> Any:
        t = timeout if timeout is not None else self.client.timeout
        return messaging_call(self.client, op, lambda: self.client._call(op, method, req, slack(t)))

    def _check_names(self, op: str) -> None:
        if self._name_lens[0] > MAX_NAMES or self._name_lens[1] > MAX_NAMES:
            raise InvalidError(op, f"session and group names are at most {MAX_NAMES} bytes to send and receive")

    def _send_payload(self, op: str, to: int, tag: int, payload: Payload, timeout: float | None) -> bool:
        """Sends payload (bytes, or a str: a file's path the sidecar takes over)."""
        t = timeout if timeout is not None else self.client.timeout
        try:
            if self._att is not None:
                sock = self._att.path(op, to, t)
                if sock is not None:
                    self._send_direct(op, to, sock, tag, payload, t)
                    return False
            self._check_names(op)
            ms = timeout_ms(t)
            return messaging_call(self.client, op, lambda: self._msg.send(
                op, self._names, self._name_lens, self.rank, to, tag, payload, ms, slack(t)), to)
        except BaseException:
            self.client._discard(payload)
            raise

    def _recv(self, op: str, source: int | None, tag: int | None, timeout: float | None) -> tuple[int, int, Payload]:
        """(from, tag, payload) of the oldest matching message; None is any
        source, or any (user) tag."""
        t = timeout if timeout is not None else self.client.timeout
        if self._att is not None:
            return self._att.recv(op, source, tag, t)
        self._check_names(op)
        flags = (ANY_SOURCE if source is None else 0) | (ANY_TAG if tag is None else 0)
        ms = timeout_ms(t)
        return messaging_call(self.client, op, lambda: self._msg.recv(
            op, self._names, self._name_lens, self.rank, source or 0, tag or 0, flags, ms, slack(t)), source)


    def _send_direct(self, op: str, to: int, sock: Any, tag: int, payload: Payload, timeout: float | None) -> None:
        """Sends a payload into a direct channel; a file (str) is taken
        over: small ones inline, large ones moved into a sealed memfd."""
        assert self._att is not None
        if not isinstance(payload, str):
            self._att.send(op, to, sock, tag, payload, timeout)
            return
        try:
            src = os.open(payload, os.O_RDONLY)
        finally:
            try:
                os.unlink(payload)
            except OSError:
                pass
        try:
            with mmap.mmap(src, 0, prot=mmap.PROT_READ) if os.fstat(src).st_size else memoryview(b"") as m:
                self._att.send(op, to, sock, tag, m, timeout)
        finally:
            os.close(src)

    def _direct_dests(self, op: str, dests: list[int], timeout: float | None) -> tuple[list[tuple[int, Any]], list[int]]:
        """Splits dests into those with a direct channel (with it) and the others."""
        if self._att is None:
            return [], dests
        direct, rest = [], []
        for d in dests:
            sock = self._att.path(op, d, timeout)
            if sock is None:
                rest.append(d)
            else:
                direct.append((d, sock))
        return direct, rest


# --- helpers --------------------------------------------------------------------

def _members(r: Any) -> Members:
    return Members(size=r.size, live=tuple(r.live), gone=tuple(r.gone), epoch=r.epoch, mailbox=r.mailbox)
