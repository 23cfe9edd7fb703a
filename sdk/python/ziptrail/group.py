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

import json
import math
import mmap
import operator
import os
import struct
import sys
import threading
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

from .client import BytesLike, Data, InlineObject, MappedObject, _remove, _view
from ._fastmsg import ANY_SOURCE, ANY_TAG, MAX_NAMES, Payload
from .errors import (CollectiveAbortedError, InvalidError, MessageTimeoutError, PeerGoneError, ZiptrailError,
                     ZiptrailTimeoutError)

if TYPE_CHECKING:
    from ._proto import sidecar_pb2
    from .client import Client

#: Any source or any (user) tag in :meth:`Group.recv`.
ANY = -1

#: Allreduce of built-in operations over at least this many bytes uses the ring.
RING_MIN_BYTES = 64 << 10

# Extra seconds a call's gRPC deadline (or socket timeout) gets over the
# timeout it sends the sidecar, so that the sidecar's answer (MSG_TIMEOUT)
# arrives first.
_SLACK = 5.0
# How long a failing member spends telling the others (in parallel).
_ABORT_TIMEOUT = 2.0

_FRAME = struct.Struct("<BBHQ")
_VERSION = 1
_DATA, _ABORT = 0, 1
_PAGE = mmap.ALLOCATIONGRANULARITY

# Collective kinds (the low 3 bits of a reserved tag).
_BARRIER, _BCAST, _SCATTER, _GATHER, _REDUCE, _ALLREDUCE, _ALLTOALL = range(1, 8)


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


class Op:
    """A built-in reduction: :data:`SUM`, :data:`MIN` or :data:`MAX`."""

    def __init__(self, name: str, py: Callable[[Any, Any], Any], ufunc: str) -> None:
        self.name, self.py, self.ufunc = name, py, ufunc

    def __repr__(self) -> str:
        return f"ziptrail.{self.name.upper()}"


SUM = Op("sum", operator.add, "add")
MIN = Op("min", min, "minimum")
MAX = Op("max", max, "maximum")

#: A reduction: a built-in Op or a user function of two values.
Reduction = Union[Op, Callable[[Any, Any], Any]]


# --- numeric vectors ------------------------------------------------------------

_TYPECODES = "bBhHiIlLqQfd"


def _fmt_of_typecode(tc: str) -> str:
    kind = "f" if tc in "fd" else ("u" if tc.isupper() else "i")
    return f"{kind}{array(tc).itemsize}"


_FMT_TYPECODE: dict[str, str] = {}
for _tc in _TYPECODES:
    _FMT_TYPECODE.setdefault(_fmt_of_typecode(_tc), _tc)


def _numpy() -> Any:
    """numpy when it is installed, else None (imported on first use)."""
    global _np
    if _np is False:
        try:
            import numpy
            _np = numpy
        except ImportError:
            _np = None
    return _np


_np: Any = False


def _is_ndarray(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _itemsize(fmt: str) -> int:
    return int(fmt[1:])


class _Vec:
    """How a member's reduction input becomes elements of one format (and
    bytes on the wire), and how a result goes back to the caller's kind."""

    def __init__(self, value: Any) -> None:
        self.shape: tuple[int, ...] | None = None
        if _is_ndarray(value):
            np = sys.modules["numpy"]
            a = np.ascontiguousarray(value)
            self.kind, self.fmt, self.shape = "numpy", f"{a.dtype.kind}{a.dtype.itemsize}", a.shape
            self.buf = memoryview(a.reshape(-1).view(np.uint8))
        elif isinstance(value, array):
            if value.typecode not in _TYPECODES:
                raise InvalidError("reduce", f"array.array of typecode {value.typecode!r} is not numeric")
            self.kind, self.fmt = "array", _fmt_of_typecode(value.typecode)
            self.buf = memoryview(value).cast("B")
        elif isinstance(value, (bool, int, float)):
            self.kind = "scalar"
            self.fmt, self.buf = self._pack([value])
        elif isinstance(value, (list, tuple)):
            self.kind = "list"
            self.fmt, self.buf = self._pack(value)
        else:
            self.kind, self.fmt, self.buf = "bytes", "", _view(value)

    @staticmethod
    def _pack(values: Sequence[Any]) -> tuple[str, memoryview]:
        if all(isinstance(v, int) for v in values):
            tc = "q"
        elif all(isinstance(v, (int, float)) for v in values):
            tc = "d"
        else:
            bad = next(v for v in values if not isinstance(v, (int, float)))
            raise InvalidError("reduce", f"reductions take numbers, got a {type(bad).__name__}")
        try:
            return _fmt_of_typecode(tc), memoryview(array(tc, values)).cast("B")
        except OverflowError as e:
            raise InvalidError("reduce", f"an int does not fit in int64: {e}") from None

    def decode(self, fmt: str, buf: Any) -> Any:
        """The caller's kind of value for a result."""
        if self.kind == "bytes":
            return buf
        if self.kind == "numpy" or fmt not in _FMT_TYPECODE:
            np = _numpy()
            if np is None:
                raise InvalidError("reduce", f"elements of format {fmt} need numpy")
            out = np.frombuffer(bytearray(buf), dtype=np.dtype(fmt))
            if self.kind == "numpy" and self.shape is not None:
                return out.reshape(self.shape)
            return out if self.kind != "scalar" else out[0].item()
        a = array(_FMT_TYPECODE[fmt])
        a.frombytes(buf)
        if self.kind == "array":
            return a
        if self.kind == "scalar":
            return a[0]
        return a.tolist()


def _promote(fa: str, fb: str) -> str:
    if fa == fb:
        return fa
    if {fa, fb} == {"i8", "f8"}:
        return "f8"
    raise InvalidError("reduce", f"members reduce different element types ({fa} and {fb})")


def _convert(buf: Any, src: str, dst: str) -> Any:
    if src == dst:
        return buf
    np = _numpy()
    if np is not None:
        return np.frombuffer(buf, dtype=np.dtype(src)).astype(np.dtype(dst)).tobytes()
    a = array(_FMT_TYPECODE[src])
    a.frombytes(buf)
    return array(_FMT_TYPECODE[dst], a).tobytes()


def _apply(op: Op, fmt: str, a: Any, b: Any) -> bytes:
    """Elementwise op over two buffers of elements of format fmt."""
    if len(memoryview(a)) != len(memoryview(b)):
        raise InvalidError("reduce", f"members reduce arrays of different lengths ({len(memoryview(a)) // _itemsize(fmt)} "
                           f"and {len(memoryview(b)) // _itemsize(fmt)} elements)")
    np = _numpy()
    if np is not None:
        dt = np.dtype(fmt)
        x, y = np.frombuffer(a, dtype=dt), np.frombuffer(b, dtype=dt)
        out = getattr(np, op.ufunc)(x, y).tobytes()
        del x, y
        return out
    if fmt not in _FMT_TYPECODE:
        raise InvalidError("reduce", f"elements of format {fmt} need numpy")
    tc = _FMT_TYPECODE[fmt]
    x, y = array(tc), array(tc)
    x.frombytes(a)
    y.frombytes(b)
    try:
        return array(tc, map(op.py, x, y)).tobytes()
    except OverflowError as e:
        raise InvalidError("reduce", f"{op.name} overflows {fmt}: {e}") from None


def _close(d: Any) -> None:
    if isinstance(d, MappedObject):
        try:
            d.close()
        except BufferError:  # still viewed (a user function kept it): the GC frees it
            pass


# --- groups ---------------------------------------------------------------------

class _Ctx:
    """One running collective: its tag and deadline."""

    def __init__(self, op: str, tag: int, timeout: float | None) -> None:
        self.op, self.tag = op, tag
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise MessageTimeoutError(self.op, "the collective's timeout passed")
        return left


class Group:
    """This instance's membership of a group (see the module doc). Made by
    :meth:`Client.join` or :func:`join`; safe to share between threads for
    send and recv; collectives run one at a time per group."""

    def __init__(self, client: Client, session: str, name: str, rank: int, size: int, invocation_id: str,
                 view: sidecar_pb2.MembersResponse) -> None:
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

    # --- membership -----------------------------------------------------------

    @classmethod
    def _join(cls, client: Client, session: str, group: str, rank: int, size: int, *, mailbox: bool = False,
              invocation_id: str | None = None, wait_all: bool = False, timeout: float | None = None) -> Group:
        if not session or not group:
            raise InvalidError("join", "session and group are required")
        if size < 1 or not 0 <= rank < size:
            raise InvalidError("join", f"rank must be in 0..size-1 and size at least 1, got rank {rank} of {size}")
        if invocation_id is None:
            from .server import current_invocation
            inv = current_invocation()
            invocation_id = inv.id if inv is not None and inv.session == session else ""
        timeout = timeout if timeout is not None else client.timeout
        req = client._pb.JoinRequest(session=session, group=group, rank=rank, size=size, mailbox=mailbox,
                                     invocation_id=invocation_id, wait_all=wait_all, timeout_ms=_ms(timeout))
        view = _messaging(client, "join", lambda: client._call("join", client._stub.Join, req, _slack(timeout)))
        return cls(client, session, group, rank, size, invocation_id, view)

    def members(self, *, timeout: float | None = None) -> Members:
        """The group's membership now."""
        return self.watch(0, timeout=timeout)

    def watch(self, after_epoch: int, timeout: float | None = None) -> Members:
        """Waits (up to ``timeout`` seconds) for a membership newer than
        ``after_epoch`` and returns it; after the timeout, the current one."""
        wait = 0 if not timeout else _ms(timeout)
        req = self._pb.MembersRequest(session=self.session, group=self.name, after_epoch=after_epoch, timeout_ms=wait)
        return _members(self._call("members", self._stub.Members, req, timeout))

    def leave(self) -> None:
        """Ends this membership (idempotent). A membership that joined with
        an invocation also ends with that invocation."""
        if self._left:
            return
        self._left = True
        self._call("leave", self._stub.Leave, self._pb.LeaveRequest(session=self.session, group=self.name, rank=self.rank), None)

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
        return Message(frm, got, self.client._data("recv", payload, ""))

    def _check_rank(self, op: str, r: int) -> None:
        if not 0 <= r < self.size:
            raise InvalidError(op, f"rank {r} is not in the group of size {self.size}")

    def _call(self, op: str, method: Callable[..., Any], req: Any, timeout: float | None) -> Any:
        t = timeout if timeout is not None else self.client.timeout
        return _messaging(self.client, op, lambda: self.client._call(op, method, req, _slack(t)))

    def _check_names(self, op: str) -> None:
        if self._name_lens[0] > MAX_NAMES or self._name_lens[1] > MAX_NAMES:
            raise InvalidError(op, f"session and group names are at most {MAX_NAMES} bytes to send and receive")

    def _send_payload(self, op: str, to: int, tag: int, payload: Payload, timeout: float | None) -> bool:
        """Sends payload (bytes, or a str: a file's path the sidecar takes over)."""
        t = timeout if timeout is not None else self.client.timeout
        try:
            self._check_names(op)
            ms = _ms(t)
            return _messaging(self.client, op, lambda: self._msg.send(
                op, self._names, self._name_lens, self.rank, to, tag, payload, ms, _slack(t)), to)
        except BaseException:
            self.client._discard(payload)
            raise

    def _recv(self, op: str, source: int | None, tag: int | None, timeout: float | None) -> tuple[int, int, Payload]:
        """(from, tag, payload) of the oldest matching message; None is any
        source, or any (user) tag."""
        t = timeout if timeout is not None else self.client.timeout
        self._check_names(op)
        flags = (ANY_SOURCE if source is None else 0) | (ANY_TAG if tag is None else 0)
        ms = _ms(t)
        return _messaging(self.client, op, lambda: self._msg.recv(
            op, self._names, self._name_lens, self.rank, source or 0, tag or 0, flags, ms, _slack(t)), source)

    # --- collective plumbing -----------------------------------------------------

    def _collective(self, kind: int, op: str, timeout: float | None, fn: Callable[[_Ctx], Any]) -> Any:
        with self._coll:
            tag = -((self._seq << 3) | kind)
            self._seq += 1
            ctx = _Ctx(op, tag, timeout if timeout is not None else self.client.timeout)
            try:
                return fn(ctx)
            except PeerGoneError as e:
                err = self._origin(ctx, e)
                self._abort(ctx, err)
                if err is e:
                    raise
                raise err from None
            except Exception as e:
                self._abort(ctx, e)
                raise

    def _origin(self, ctx: _Ctx, err: PeerGoneError) -> ZiptrailError:
        """The first failure behind a gone peer: a member that aborted this
        collective tells the others before it leaves, so when the gone peer
        left after an abort, its abort message (naming the rank that died
        first) is queued here; else the peer itself is the one."""
        if err.rank is None or getattr(err, "_abort", False):
            return err
        try:
            typ, hdr, data = self._unframe(ctx.op, self._recv(ctx.op, err.rank, ctx.tag, _ABORT_TIMEOUT)[2])
            _close(data)
            if typ == _ABORT:
                return self._abort_error(ctx, hdr)
        except ZiptrailError:
            pass
        return err

    def _abort(self, ctx: _Ctx, err: Exception) -> None:
        """Tells every other member that this collective failed here, so
        that none of them waits for this one for ever."""
        if self.size == 1:
            return
        gone = isinstance(err, PeerGoneError) and err.rank is not None
        if gone or (isinstance(err, CollectiveAbortedError) and err.rank is not None):
            culprit = err.rank
        else:
            culprit = self.rank
        hdr = json.dumps({"gone": gone, "rank": culprit, "message": str(err)[:512]}).encode()
        dests = [r for r in range(self.size) if r != self.rank and not (gone and r == culprit)]
        try:
            payloads = self._frame(_ABORT, hdr, None, len(dests), ctx.op)
        except ZiptrailError:
            return

        def one(i: int) -> None:
            try:
                self._send_payload(ctx.op, dests[i], ctx.tag, payloads[i], _ABORT_TIMEOUT)
            except ZiptrailError:
                pass

        with ThreadPoolExecutor(max_workers=min(16, len(dests))) as ex:
            wait_futures([ex.submit(one, i) for i in range(len(dests))])

    def _frame(self, typ: int, hdr: bytes, data: Any, links: int, op: str) -> list[Payload]:
        """``links`` payloads of one collective message (one file, hard-linked)."""
        if links == 0:
            return []
        mv = _view(data) if data is not None else memoryview(b"")
        base = _FRAME.size + len(hdr)
        c = self.client
        if base + mv.nbytes <= c.inline_threshold:
            return c._raw_payloads(_FRAME.pack(_VERSION, typ, len(hdr), base) + hdr + mv.tobytes(), op, links)
        off = -(-base // _PAGE) * _PAGE
        buf = c.allocate(off + mv.nbytes)
        try:
            view = buf.data
            view[:base] = _FRAME.pack(_VERSION, typ, len(hdr), off) + hdr
            view[off:] = mv
            del view
        except BaseException:
            buf.discard()
            raise
        return c._raw_payloads(buf, op, links)

    def _unframe(self, op: str, payload: Payload) -> tuple[int, bytes, Data]:
        """A collective message's type, header and data; a str payload is
        the path of the message's file (mapped, then removed)."""
        if isinstance(payload, str):
            path = payload
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise ZiptrailError(op, f"open the message file {path} the sidecar wrote: {e}") from None
            try:
                size = os.fstat(fd).st_size
                typ, hdr, off = self._parse(op, os.pread(fd, _FRAME.size, 0), size,
                                            lambda n: os.pread(fd, n, _FRAME.size))
                n = size - off
                data: Data
                if n == 0:
                    data = InlineObject(b"")
                elif off % _PAGE == 0:
                    data = MappedObject(fd, n, prot=mmap.PROT_READ, offset=off)
                else:
                    data = InlineObject(_pread(fd, n, off))
            finally:
                os.close(fd)
                _remove(path)
            return typ, hdr, data
        raw = payload
        typ, hdr, off = self._parse(op, raw[:_FRAME.size], len(raw), lambda n: raw[_FRAME.size:_FRAME.size + n])
        return typ, hdr, InlineObject(raw[off:])

    @staticmethod
    def _parse(op: str, head: bytes, size: int, read_hdr: Callable[[int], bytes]) -> tuple[int, bytes, int]:
        if len(head) == _FRAME.size:
            ver, typ, hl, off = _FRAME.unpack(head)
            if ver == _VERSION and typ in (_DATA, _ABORT) and _FRAME.size + hl <= off <= size:
                hdr = read_hdr(hl)
                if len(hdr) == hl:
                    return typ, hdr, off
        raise ZiptrailError(op, "a malformed collective message (a member with another SDK version?)")

    def _send_to(self, ctx: _Ctx, dests: Sequence[int], fmt: str, data: Any) -> None:
        """Sends one data message to each of dests (one file, hard-linked)."""
        payloads = self._frame(_DATA, fmt.encode(), data, len(dests), ctx.op)
        for i, d in enumerate(dests):
            try:
                self._send_payload(ctx.op, d, ctx.tag, payloads[i], ctx.remaining())
            except BaseException:
                for p in payloads[i + 1:]:
                    self.client._discard(p)
                raise

    def _recv_from(self, ctx: _Ctx, source: int) -> tuple[str, Data]:
        return self._data(ctx, self._recv(ctx.op, source, ctx.tag, ctx.remaining())[2])

    def _data(self, ctx: _Ctx, payload: Payload) -> tuple[str, Data]:
        typ, hdr, data = self._unframe(ctx.op, payload)
        if typ == _ABORT:
            _close(data)
            raise self._abort_error(ctx, hdr)
        return hdr.decode(), data

    @staticmethod
    def _abort_error(ctx: _Ctx, hdr: bytes) -> ZiptrailError:
        """The error an abort message stands for."""
        try:
            info = json.loads(hdr)
            rank, gone, message = int(info["rank"]), bool(info["gone"]), str(info.get("message", ""))
        except (ValueError, KeyError, TypeError):
            return ZiptrailError(ctx.op, "a malformed abort message")
        err: PeerGoneError | CollectiveAbortedError
        if gone:
            err = PeerGoneError(ctx.op, f"rank {rank} is gone ({message})", "PEER_GONE", rank=rank)
        else:
            err = CollectiveAbortedError(ctx.op, f"rank {rank} failed: {message}", rank=rank)
        err._abort = True  # type: ignore[attr-defined]
        return err

    def _sendrecv(self, ctx: _Ctx, to: int, fmt: str, data: Any, source: int) -> tuple[str, Data]:
        """Sends to ``to`` while receiving from ``source`` (neither waits for
        the other, so a ring never deadlocks on back-pressure)."""
        t = ctx.remaining()
        ms = _ms(t)
        pending = _messaging(self.client, ctx.op, lambda: self._msg.start_recv(
            ctx.op, self._names, self._name_lens, self.rank, source, ctx.tag, 0, ms, _slack(t)), source)
        try:
            self._send_to(ctx, [to], fmt, data)
        except BaseException:
            pending.cancel()
            raise
        return self._data(ctx, _messaging(self.client, ctx.op, pending.result, source)[2])

    # --- algorithms ---------------------------------------------------------------

    def _tree_bcast(self, ctx: _Ctx, root: int, fmt: str, data: Any) -> tuple[str, Any]:
        """Binomial-tree broadcast of (fmt, data) from root; every rank
        returns what it got (the root its own data)."""
        n, v = self.size, (self.rank - root) % self.size
        mask = 1
        while mask < n:
            if v & mask:
                fmt, data = self._recv_from(ctx, (v - mask + root) % n)
                break
            mask <<= 1
        children = []
        mask >>= 1
        while mask > 0:
            if v + mask < n:
                children.append((v + mask + root) % n)
            mask >>= 1
        if children:
            self._send_to(ctx, children, fmt, data)
        return fmt, data

    def _tree_reduce(self, ctx: _Ctx, root: int, fmt: str, data: Any,
                     combine: Callable[[str, Any, str, Data], tuple[str, Any]]) -> tuple[str, Any] | None:
        """Binomial-tree reduction to root: the root returns the result,
        the others None. ``combine`` folds a child's partial result (ranks
        above, in tree order) into this rank's."""
        n, v = self.size, (self.rank - root) % self.size
        mask = 1
        while mask < n:
            if v & mask:
                self._send_to(ctx, [(v - mask + root) % n], fmt, data)
                return None
            if v + mask < n:
                cf, cd = self._recv_from(ctx, (v + mask + root) % n)
                fmt, data = combine(fmt, data, cf, cd)
            mask <<= 1
        return fmt, data

    def _combiner(self, op: Reduction, vec: _Vec, opname: str) -> Callable[[str, Any, str, Data], tuple[str, Any]]:
        if isinstance(op, Op):
            if vec.kind == "bytes":
                raise InvalidError(opname, f"{op!r} takes numeric arrays (a list, array.array, numpy array or number); "
                                   "reduce bytes with a function")

            def builtin(fa: str, a: Any, fb: str, b: Data) -> tuple[str, Any]:
                try:
                    f = _promote(fa, fb)
                    return f, _apply(op, f, _convert(a, fa, f), _convert(b, fb, f))
                finally:
                    _close(b)
            return builtin
        if not callable(op):
            raise InvalidError(opname, f"op must be SUM, MIN, MAX or a function, not {type(op).__name__}")

        def user(fa: str, a: Any, fb: str, b: Data) -> tuple[str, Any]:
            if vec.kind == "bytes":
                return "", op(a, b)
            try:
                out = _Vec(op(vec.decode(fa, a), vec.decode(fb, b)))
            finally:
                _close(b)
            return out.fmt, out.buf
        return user

    def _ring_allreduce(self, ctx: _Ctx, op: Op, fmt: str, buf: memoryview) -> tuple[str, bytes]:
        """Ring allreduce: reduce-scatter, then allgather, n-1 steps each;
        every rank sends and receives about 2x the array in total."""
        n, r = self.size, self.rank
        isz = _itemsize(fmt)
        count = len(buf) // isz
        bounds = [count * i // n for i in range(n + 1)]
        chunks: list[tuple[str, Any]] = [(fmt, buf[bounds[i] * isz:bounds[i + 1] * isz]) for i in range(n)]
        right, left = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):
            si, ri = (r - s) % n, (r - s - 1) % n
            gf, got = self._sendrecv(ctx, right, chunks[si][0], chunks[si][1], left)
            try:
                f = _promote(chunks[ri][0], gf)
                chunks[ri] = (f, _apply(op, f, _convert(chunks[ri][1], chunks[ri][0], f), _convert(got, gf, f)))
            finally:
                _close(got)
        for s in range(n - 1):
            si, ri = (r + 1 - s) % n, (r - s) % n
            gf, got = self._sendrecv(ctx, right, chunks[si][0], chunks[si][1], left)
            chunks[ri] = (gf, got)
        out_fmt = chunks[0][0]
        for f, _ in chunks[1:]:
            out_fmt = _promote(out_fmt, f)
        out = bytearray()
        for f, c in chunks:
            out += _convert(c, f, out_fmt)
            _close(c)
        return out_fmt, bytes(out)

    # --- collectives ------------------------------------------------------------------

    def barrier(self, timeout: float | None = None) -> None:
        """Returns once every member called barrier (binomial tree in, then out)."""
        def run(ctx: _Ctx) -> None:
            self._tree_reduce(ctx, 0, "", b"", lambda fa, a, fb, b: ("", b""))
            self._tree_bcast(ctx, 0, "", b"")
        self._collective(_BARRIER, "barrier", timeout, run)

    def broadcast(self, data: BytesLike | None, root: int = 0, timeout: float | None = None) -> Any:
        """The root's ``data`` at every member (binomial tree; other members
        pass None). The root gets its own ``data`` back, the others a Data
        (InlineObject, or a MappedObject for large data)."""
        self._check_rank("broadcast", root)
        if self.rank == root and data is None:
            raise InvalidError("broadcast", "the root passes the data")

        def run(ctx: _Ctx) -> Any:
            return self._tree_bcast(ctx, root, "", data if self.rank == root else None)[1]
        return self._collective(_BCAST, "broadcast", timeout, run)

    def scatter(self, chunks: Sequence[BytesLike] | None, root: int = 0, timeout: float | None = None) -> Any:
        """Member i gets ``chunks[i]`` of the root (the others pass None)."""
        self._check_rank("scatter", root)
        if self.rank == root and (chunks is None or len(chunks) != self.size):
            raise InvalidError("scatter", f"the root passes one chunk per member ({self.size})")

        def run(ctx: _Ctx) -> Any:
            if self.rank != root:
                return self._recv_from(ctx, root)[1]
            assert chunks is not None
            for i in range(self.size):
                if i != root:
                    self._send_to(ctx, [i], "", chunks[i])
            return chunks[root]
        return self._collective(_SCATTER, "scatter", timeout, run)

    def gather(self, data: BytesLike, root: int = 0, timeout: float | None = None) -> list[Any] | None:
        """Every member's ``data`` at the root, by rank (its own as given);
        None at the other members."""
        self._check_rank("gather", root)

        def run(ctx: _Ctx) -> list[Any] | None:
            if self.rank != root:
                self._send_to(ctx, [root], "", data)
                return None
            out: list[Any] = []
            try:
                for i in range(self.size):
                    out.append(data if i == root else self._recv_from(ctx, i)[1])
            except BaseException:
                for d in out:
                    if d is not data:
                        _close(d)
                raise
            return out
        return self._collective(_GATHER, "gather", timeout, run)

    def reduce(self, data: Any, op: Reduction = SUM, root: int = 0, timeout: float | None = None) -> Any:
        """The reduction of every member's ``data`` with ``op`` at the root
        (binomial tree); None at the other members."""
        self._check_rank("reduce", root)
        vec = _Vec(data)
        combine = self._combiner(op, vec, "reduce")

        def run(ctx: _Ctx) -> Any:
            got = self._tree_reduce(ctx, root, vec.fmt, data if vec.kind == "bytes" else vec.buf, combine)
            return None if got is None else vec.decode(*got)
        return self._collective(_REDUCE, "reduce", timeout, run)

    def allreduce(self, data: Any, op: Reduction = SUM, timeout: float | None = None) -> Any:
        """The reduction of every member's ``data`` with ``op``, at every
        member: a ring for built-in ops on arrays of at least RING_MIN_BYTES
        (every member must pass the same length), else a binomial-tree
        reduce to rank 0 and a broadcast."""
        vec = _Vec(data)
        combine = self._combiner(op, vec, "allreduce")

        def run(ctx: _Ctx) -> Any:
            if isinstance(op, Op) and self.size > 1 and len(vec.buf) >= RING_MIN_BYTES:
                return vec.decode(*self._ring_allreduce(ctx, op, vec.fmt, vec.buf))
            got = self._tree_reduce(ctx, 0, vec.fmt, data if vec.kind == "bytes" else vec.buf, combine)
            fmt, out = self._tree_bcast(ctx, 0, *(got if got is not None else ("", None)))
            if vec.kind == "bytes":
                return out
            try:
                return vec.decode(fmt, out)
            finally:
                _close(out)
        return self._collective(_ALLREDUCE, "allreduce", timeout, run)

    def alltoall(self, chunks: Sequence[BytesLike], timeout: float | None = None) -> list[Any]:
        """Member i sends ``chunks[j]`` to member j and gets, by rank, what
        every member sent it (its own chunk as given): pairwise exchange,
        n-1 steps of one send and one receive each."""
        if len(chunks) != self.size:
            raise InvalidError("alltoall", f"pass one chunk per member ({self.size}), got {len(chunks)}")

        def run(ctx: _Ctx) -> list[Any]:
            n, r = self.size, self.rank
            out: list[Any] = [None] * n
            out[r] = chunks[r]
            try:
                for k in range(1, n):
                    to, source = (r + k) % n, (r - k) % n
                    out[source] = self._sendrecv(ctx, to, "", chunks[to], source)[1]
            except BaseException:
                for i, d in enumerate(out):
                    if i != r and d is not None:
                        _close(d)
                raise
            return out
        return self._collective(_ALLTOALL, "alltoall", timeout, run)


# --- helpers --------------------------------------------------------------------

def _members(r: sidecar_pb2.MembersResponse) -> Members:
    return Members(size=r.size, live=tuple(r.live), gone=tuple(r.gone), epoch=r.epoch, mailbox=r.mailbox)


def _ms(timeout: float | None) -> int:
    if timeout is None:
        return 0
    if timeout <= 0:
        raise MessageTimeoutError("messaging", "the timeout passed")
    return max(1, math.ceil(timeout * 1000))


def _slack(timeout: float | None) -> float | None:
    """The gRPC deadline or socket timeout of a call that sends the sidecar ``timeout``."""
    return None if timeout is None else timeout + _SLACK


def _messaging(client: Client, op: str, call: Callable[[], Any], peer: int | None = None) -> Any:
    """Runs a messaging call: a deadline the gRPC call hit is a message
    timeout, and a gone peer is named."""
    try:
        return call()
    except MessageTimeoutError:
        raise
    except ZiptrailTimeoutError as e:
        raise MessageTimeoutError(op, e.message, e.reason or "MSG_TIMEOUT") from None
    except PeerGoneError as e:
        if e.rank is None and peer is not None:
            e.rank = peer
        raise


def _pread(fd: int, n: int, off: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.pread(fd, n - got, off + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def join(group: str, rank: int, size: int, *, session: str | None = None, mailbox: bool = False, wait_all: bool = False,
         timeout: float | None = None, client: Client | None = None, invocation_id: str | None = None) -> Group:
    """Joins ``group`` as ``rank`` of ``size`` from inside a handler: the
    session and the invocation (whose end ends the membership) are the
    handler's. Outside a handler pass ``session`` (and leave the group)."""
    from .client import default_client
    from .server import current_invocation
    inv = current_invocation()
    if session is None:
        if inv is None:
            raise InvalidError("join", "called outside a function invocation: pass session= (or use Client.join)")
        session = inv.session
    return (client or default_client()).join(session, group, rank, size, mailbox=mailbox, invocation_id=invocation_id,
                                             wait_all=wait_all, timeout=timeout)
