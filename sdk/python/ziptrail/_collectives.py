"""The collectives of a group (``ziptrail.group``): the plumbing that runs
one collective at a time under its reserved tag, tells the other members
when it fails here, frames its messages, and the algorithms (binomial trees,
the ring allreduce, the pairwise alltoall). :class:`~ziptrail.Group` mixes
them in; the module doc of ``ziptrail.group`` describes the semantics and
the wire format."""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ._direct import INLINE_MAX, MEMFD, Memfd, header, sealed_memfd
from ._fastmsg import Payload, messaging_call, slack, timeout_ms
from ._reduce import SUM, Op, Reduction, _apply, _convert, _itemsize, _promote, _Vec
from ._membermsgs import Lent
from ._objects import BytesLike, Data, InlineObject, MappedObject, _lent_object, _remove, _view
from .errors import CollectiveAbortedError, InvalidError, MessageTimeoutError, PeerGoneError, ZiptrailError

if TYPE_CHECKING:
    from .client import Client

#: Allreduce of built-in operations over at least this many bytes uses the ring.
RING_MIN_BYTES = 64 << 10

# How long a failing member spends telling the others (in parallel).
_ABORT_TIMEOUT = 2.0

_FRAME = struct.Struct("<BBHQ")
_VERSION = 1
_DATA, _ABORT = 0, 1
_PAGE = mmap.ALLOCATIONGRANULARITY

# Collective kinds (the low 3 bits of a reserved tag).
_BARRIER, _BCAST, _SCATTER, _GATHER, _REDUCE, _ALLREDUCE, _ALLTOALL = range(1, 8)


def _close(d: Any) -> None:
    if isinstance(d, MappedObject):
        try:
            d.close()
        except BufferError:  # still viewed (a user function kept it): the GC frees it
            pass


def _pread(fd: int, n: int, off: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.pread(fd, n - got, off + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


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


class _Collectives:
    """The collectives of :class:`~ziptrail.Group` (a mixin: Group has the
    membership and the point-to-point calls these run over)."""

    client: Client
    rank: int
    size: int
    _msg: Any
    _names: bytes
    _name_lens: tuple[int, int]
    _seq: int
    _coll: threading.Lock

    if TYPE_CHECKING:
        def _check_rank(self, op: str, r: int) -> None: ...

        def _send_payload(self, op: str, to: int, tag: int, payload: Payload, timeout: float | None) -> bool: ...

        def _recv(self, op: str, source: int | None, tag: int | None,
                  timeout: float | None) -> tuple[int, int, Payload]: ...

        def _direct_dests(self, op: str, dests: list[int],
                          timeout: float | None) -> tuple[list[tuple[int, Any]], list[int]]: ...

    _att: Any

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
        if not dests:
            return
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
        if isinstance(payload, Memfd):  # a direct channel's large message
            try:
                return self._unframe_fd(op, payload.fd, payload.size)
            finally:
                payload.close()
        if isinstance(payload, Lent):  # a file the sidecar lent: given back once its data is done with
            if payload.err:
                payload.close()
                raise ZiptrailError(op, payload.err)
            fd, give_back = payload.take()
            try:
                return self._unframe_fd(op, fd, payload.size, give_back)
            finally:
                os.close(fd)
        if isinstance(payload, str):
            path = payload
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise ZiptrailError(op, f"open the message file {path} the sidecar wrote: {e}") from None
            try:
                return self._unframe_fd(op, fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
                _remove(path)
        raw = payload
        typ, hdr, off = self._parse(op, raw[:_FRAME.size], len(raw), lambda n: raw[_FRAME.size:_FRAME.size + n])
        return typ, hdr, InlineObject(raw[off:])

    def _unframe_fd(self, op: str, fd: int, size: int,
                    give_back: Callable[[], None] | None = None) -> tuple[int, bytes, Data]:
        """A collective message of a file: its data mapped when it starts
        at a page boundary, else copied. give_back (a lent file) runs once
        the data no longer uses the file: when the mapping goes, else now."""
        mapped = False
        try:
            typ, hdr, off = self._parse(op, os.pread(fd, _FRAME.size, 0), size,
                                        lambda n: os.pread(fd, n, _FRAME.size))
            n = size - off
            data: Data
            if n == 0:
                data = InlineObject(b"")
            elif off % _PAGE == 0:
                if give_back is not None:
                    data = _lent_object(fd, n, off, give_back)
                else:
                    data = MappedObject(fd, n, prot=mmap.PROT_READ, offset=off)
                mapped = True
            else:
                data = InlineObject(_pread(fd, n, off))
            return typ, hdr, data
        finally:
            if give_back is not None and not mapped:
                give_back()

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
        """Sends one data message to each of dests: into the direct channels
        of same-node dests (one memfd for all when large), else through the
        sidecar (one file, hard-linked)."""
        direct, dests = self._direct_dests(ctx.op, list(dests), ctx.remaining())
        if direct:
            self._send_direct_frame(ctx, direct, fmt.encode(), data)
        payloads = self._frame(_DATA, fmt.encode(), data, len(dests), ctx.op)
        for i, d in enumerate(dests):
            try:
                self._send_payload(ctx.op, d, ctx.tag, payloads[i], ctx.remaining())
            except BaseException:
                for p in payloads[i + 1:]:
                    self.client._discard(p)
                raise

    def _send_direct_frame(self, ctx: _Ctx, dests: list[tuple[int, Any]], hdr: bytes, data: Any) -> None:
        """One data message into each direct channel: inline, or one sealed
        memfd (the data at a page boundary, mapped by the receivers)."""
        mv = _view(data) if data is not None else memoryview(b"")
        base = _FRAME.size + len(hdr)
        if base + mv.nbytes <= INLINE_MAX:
            raw = _FRAME.pack(_VERSION, _DATA, len(hdr), base) + hdr + mv.tobytes()
            for d, sock in dests:
                self._att.send(ctx.op, d, sock, ctx.tag, raw, ctx.remaining())
            return
        off = -(-base // _PAGE) * _PAGE
        fd = sealed_memfd([(0, _FRAME.pack(_VERSION, _DATA, len(hdr), off) + hdr), (off, mv)], off + mv.nbytes)
        try:
            head = header(MEMFD, ctx.tag, off + mv.nbytes)
            for d, sock in dests:
                self._att.send_frame(ctx.op, d, sock, [head], fd, ctx.remaining(), off + mv.nbytes)
        finally:
            os.close(fd)

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
        if self._att is not None:  # receives are local: nothing waits at the sidecar
            self._send_to(ctx, [to], fmt, data)
            return self._recv_from(ctx, source)
        t = ctx.remaining()
        ms = timeout_ms(t)
        pending = messaging_call(self.client, ctx.op, lambda: self._msg.start_recv(
            ctx.op, self._names, self._name_lens, self.rank, source, ctx.tag, 0, ms, slack(t)), source)
        try:
            self._send_to(ctx, [to], fmt, data)
        except BaseException:
            pending.cancel()
            raise
        return self._data(ctx, messaging_call(self.client, ctx.op, pending.result, source)[2])

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
