"""An attached member (docs/messaging.md, "Same-node direct channels"): the
sidecar pushes this member's sidecar-path messages, the group's views and
the direct channels of same-node senders on one connection (its member
channel), and the SDK receives locally. One background thread reads the
member channel and every direct channel (a selector) into one inbox under a
Condition; ``recv`` filters it. The inbox is bounded like the sidecar's
queue (64 MiB): past it the thread stops reading its sockets, so the
senders wait (back-pressure). Sends to a same-node rank go straight into a
direct channel; the first send to a rank decides its path for the group's
lifetime (``_direct.open_direct``).
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import threading
import time
from typing import Any, Callable

from . import _direct, _directrecv
from ._fastmsg import _RESP, _RESP_FIXED
from ._membermsgs import Lent, View, parse_view, release
from .errors import (ClosedError, DirectChannelError, InvalidError, MessageTimeoutError, PeerGoneError,
                     ZiptrailError)

#: The inbox's bound in bytes, as the sidecar's queue for a member.
INBOX_CAP = 64 << 20
#: How long a TCP channel whose sender the view says is gone may take to
#: end by itself (its FIN follows the sender's last frames) before the
#: reader, once the channel is quiet, takes it for ended: a sender whose
#: node went away sends no FIN (the Go SDK's goneGrace).
GONE_GRACE = 0.1
# Frames read off one direct channel before the others get their turn.
_BATCH = 64
_CHUNK = 256 << 10
_MEMBER_FDS = socket.CMSG_SPACE(4 * 64)


class _In:
    """A direct channel from a same-node sender."""

    __slots__ = ("sock", "reader", "stream", "eof", "err", "reported")

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock
        # A TCP channel across nodes is a byte stream; a same-node one a
        # socketpair of packets.
        self.stream = sock.type == socket.SOCK_STREAM
        self.reader: Any = _directrecv.StreamReader() if self.stream else _directrecv.FrameReader()
        self.eof = False
        self.err: DirectChannelError | None = None
        self.reported = False


class _Out:
    """This member's path to one receiver, decided at the first send (sock
    None: through the sidecars)."""

    __slots__ = ("lock", "decided", "sock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decided = False
        self.sock: _direct.Sender | None = None


class Attached:
    """The local receiving side and the direct sending side of one member."""

    def __init__(self, msg_path: str, session: str, name: str, rank: int, mailbox: bool, sock: socket.socket) -> None:
        self.msg_path, self.session, self.name, self.rank, self.mailbox = msg_path, session, name, rank, mailbox
        self.cond = threading.Condition(threading.Lock())
        self.inbox: list[tuple[int, int, Any, int]] = []  # (from, tag, payload, size)
        self.bytes = 0
        self.view: View | None = None
        self.ins: dict[int, _In] = {}
        self.ended: str | None = None  # why the member channel ended
        self.closed = False
        self._outs: dict[int, _Out] = {}
        self._olock = threading.Lock()
        self._member = sock
        # Releases are written from any thread (a collected message too, so
        # reentrant); the reader closes the channel under it.
        self._rlock = threading.RLock()
        self._pending = bytearray()
        self._chunk = memoryview(bytearray(_CHUNK))
        self._fds: list[int] = []
        self._sel = selectors.DefaultSelector()
        # TCP channels only: what the reader reads while the inbox is over
        # its cap (their senders' windows bound it; their credits wait).
        self._ssel = selectors.DefaultSelector()
        self._streams = 0
        # TCP channels of senders the view says are gone: when to look
        # whether they are quiet (the reader thread's own).
        self._ending: dict[int, float] = {}
        # TCP channels whose reader holds whole frames already read off the
        # socket, whose readiness will not say so: read again next turn
        # (the reader thread's own; not a wake byte, which the same turn
        # could drain).
        self._again: dict[int, tuple[_In, Callable[[selectors.SelectorKey | None], None]]] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._ssel.register(self._wake_r, selectors.EVENT_READ, None)
        self._sel.register(sock, selectors.EVENT_READ, self._read_member)
        self._thread = threading.Thread(target=self._run, name=f"ziptrail-{name}-{rank}", daemon=True)
        self._thread.start()

    # --- the reader thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while self.bytes > INBOX_CAP and not self.closed and not self._streams:
                        self.cond.wait()  # back-pressure: the senders wait
                    if self.closed:
                        return
                    over = self.bytes > INBOX_CAP
                timeout = max(0.0, min(self._ending.values()) - time.monotonic()) if self._ending else None
                again, self._again = self._again, {}
                for key, _ in (self._ssel if over else self._sel).select(0 if again else timeout):
                    if key.data is None:
                        try:
                            self._wake_r.recv(64)
                        except BlockingIOError:
                            pass
                    else:
                        key.data(key)
                for ic, read in again.values():
                    if ic.sock is not None:  # not dropped meanwhile
                        read(None)
                if self._ending:
                    self._end_gone()
        except _Stop:
            pass
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        """The reader's end: every socket closed (the senders see it)."""
        with self.cond:
            ins = list(self.ins.values())
            if self.ended is None:
                self.ended = "the member's channel was closed"
            self.cond.notify_all()
        for ic in ins:
            if ic.sock is not None:
                ic.sock.close()
                ic.sock = None
        with self._rlock:
            self._member.close()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._sel.close()
        self._ssel.close()
        self._wake_r.close()
        self._close_outs(shut=True)

    def _add(self, items: list[tuple[int, int, Any, int]], then: Callable[[], None] | None = None) -> None:
        """Queues items, then (in the same hold of cond, so that no receive
        sees a channel's end before its last messages) runs then."""
        with self.cond:
            if then is not None:
                then()
                self.cond.notify_all()
            if self.closed:
                for it in items:
                    release(it[2])
                return
            self.inbox += items
            for it in items:
                self.bytes += it[3]
            self.cond.notify_all()

    def _read_member(self, key: selectors.SelectorKey) -> None:
        try:
            got, anc, _, _ = self._member.recvmsg_into([self._chunk], _MEMBER_FDS, socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            return self._member_ended(f"the member channel broke: {e}")
        self._fds += _direct._rights(anc)
        if not got:
            return self._member_ended("the sidecar ended the member (it left, its invocation ended, or the sidecar stopped)")
        buf = self._pending
        buf += self._chunk[:got]
        items: list[tuple[int, int, Any, int]] = []
        off = 0
        try:
            while len(buf) - off >= _RESP.size:
                n, st, flags, rl, frm, tag, size = _RESP.unpack_from(buf, off)
                end = off + 4 + n
                if n < _RESP_FIXED or _RESP_FIXED + rl > n:
                    raise ValueError(f"a malformed push ({n} bytes)")
                if len(buf) < end:
                    break
                body = bytes(buf[off + _RESP.size + rl:end])
                if st == _direct.PUSH_MESSAGE:
                    payload: Any = os.fsdecode(body) if flags & _direct.FLAG_PATH else body
                    if flags & _direct.FLAG_PATH and flags & _direct.FLAG_LENT:
                        path, _, token = body.partition(b"\0")
                        if not token:
                            raise ValueError("a lent file without its token")
                        payload = Lent(os.fsdecode(path), size, self._giver(token))
                    items.append((frm, tag, payload, size if flags & _direct.FLAG_PATH else len(body)))
                elif st == _direct.PUSH_VIEW:
                    self._add(items)
                    items = []
                    self._set_view(parse_view(body))
                elif st == _direct.PUSH_DIRECT:
                    if not self._fds:
                        raise ValueError("a direct channel push without its descriptor")
                    self._add_in(frm, self._fds.pop(0))
                elif st == 1:
                    reason = bytes(buf[off + _RESP.size:off + _RESP.size + rl]).decode("utf-8", "replace")
                    raise ValueError(f"{reason}: {body.decode('utf-8', 'replace')}")
                else:
                    raise ValueError(f"push kind {st}")
                off = end
        except (ValueError, struct.error) as e:
            self._add(items)
            return self._member_ended(f"the member channel broke: {e}")
        del buf[:off]
        self._add(items)

    def _giver(self, token: bytes) -> Callable[[], None]:
        """What gives a lent file back: a release on the member channel (no
        response; a channel that ended drops it, and the sidecar forgets
        the lending after a while)."""
        frame = _direct.release_request(token)

        def give_back() -> None:
            # Also run from __del__ and finalizers, at interpreter exit too:
            # nothing may escape.
            try:
                with self._rlock:
                    if self._member.fileno() >= 0:
                        self._member.send(frame, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except Exception:  # noqa: BLE001 - a channel that ended drops it
                pass
        return give_back

    def _set_view(self, v: View) -> None:
        with self.cond:
            if self.view is None or v.epoch > self.view.epoch:
                self.view = v
                for r in v.gone:
                    ic = self.ins.get(r)
                    if ic is not None and ic.stream and ic.sock is not None and r not in self._ending:
                        self._ending[r] = time.monotonic() + GONE_GRACE
            self.cond.notify_all()

    def _end_gone(self) -> None:
        """Ends the quiet TCP channels of senders the view says are gone,
        once their grace passed (the reader thread: no frame is being read
        meanwhile); a channel still bringing bytes is looked at again
        later (a node gone inside a frame: the keepalive ends it)."""
        now = time.monotonic()
        for r, at in list(self._ending.items()):
            ic = self.ins.get(r)
            if ic is None or ic.sock is None or ic.eof or ic.err is not None:
                del self._ending[r]
            elif at <= now:
                if ic.reader.quiet(ic.sock):
                    del self._ending[r]
                    self._drop_in(ic)
                    self._add([], lambda ic=ic: setattr(ic, "eof", True))
                else:
                    self._ending[r] = now + GONE_GRACE

    def _add_in(self, frm: int, fd: int) -> None:
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            return
        s.setblocking(False)
        ic = _In(s)
        with self.cond:
            old = self.ins.get(frm)
            self.ins[frm] = ic
            self.cond.notify_all()
        if old is not None and old.sock is not None:  # a sender opens once: a second one replaces it
            self._drop_in(old)
        read = self._reader(frm, ic)
        self._sel.register(s, selectors.EVENT_READ, read)
        if ic.stream:
            self._ssel.register(s, selectors.EVENT_READ, read)
            self._streams += 1

    def _reader(self, frm: int, ic: _In) -> Callable[[selectors.SelectorKey | None], None]:
        def read(key: selectors.SelectorKey | None) -> None:
            items: list[tuple[int, int, Any, int]] = []
            room = INBOX_CAP - self.bytes  # read without the lock: the reader is the only one to add
            if ic.stream:
                room = 1 << 62  # a TCP channel is read whatever the inbox holds: its credits wait
            try:
                assert ic.sock is not None
                for _ in range(_BATCH):
                    got = ic.reader.read(ic.sock)
                    if got is None:
                        break
                    tag, payload = got
                    size = payload.size if isinstance(payload, _direct.Memfd) else len(payload)
                    items.append((frm, tag, payload, size))
                    room -= size
                    if room < 0:
                        break  # the inbox is full: the loop waits for receives
            except EOFError:  # its end, after its last frame (a reset first is read past: FrameReader)
                self._drop_in(ic)
                self._add(items, lambda: setattr(ic, "eof", True))
                return
            except (_direct.FrameError, OSError) as e:
                self._drop_in(ic)
                err = DirectChannelError("recv", f"rank {frm} broke its direct channel, which was dropped: {e}", rank=frm)
                self._add(items, lambda: setattr(ic, "err", err))
                return
            self._add(items)
            if ic.stream and ic.sock is not None:
                if self.bytes <= INBOX_CAP:
                    ic.reader.credit(ic.sock)
                if ic.reader.buffered():  # frames already read off the socket: another turn soon
                    self._again[frm] = (ic, read)
        return read

    def _drop_in(self, ic: _In) -> None:
        s, ic.sock = ic.sock, None
        if s is not None:
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            if ic.stream:
                try:
                    self._ssel.unregister(s)
                except (KeyError, ValueError):
                    pass
                self._streams -= 1
            s.close()

    def _member_ended(self, why: str) -> None:
        """The member channel ended: the member is over (left, its
        invocation ended, its sidecar died). Its direct channels close, so
        its peers see it gone; what is queued stays receivable."""
        with self.cond:
            if self.ended is None:
                self.ended = why
        raise _Stop

    # --- receiving ------------------------------------------------------------------

    def _gone(self, r: int) -> bool:
        """The view says r left or died, and its direct channel (if any)
        ended with nothing left in it (under cond)."""
        v = self.view
        if v is None or r not in v.gone or r in v.live:
            return False
        ic = self.ins.get(r)
        return ic is None or ic.eof or ic.err is not None

    def _failed(self, op: str, source: int | None) -> ZiptrailError | None:
        """Why a receive that found nothing cannot wait (under cond)."""
        if source is not None:
            ic = self.ins.get(source)
            if ic is not None and ic.err is not None:
                ic.reported = True
                return DirectChannelError(op, ic.err.message, rank=source)
            if self._gone(source):
                return PeerGoneError(op, f"rank {source} left or died (group {self.name})", "PEER_GONE", rank=source)
        else:
            for r, ic in self.ins.items():
                if ic.err is not None and not ic.reported:
                    ic.reported = True
                    return DirectChannelError(op, ic.err.message, rank=r)
            v = self.view
            if v is not None and v.size > 1 and all(self._gone(r) for r in range(v.size) if r != self.rank):
                return PeerGoneError(op, f"every other rank left or died (group {self.name})", "PEER_GONE")
        if self.closed:
            return ClosedError(op, f"rank {self.rank} of group {self.name} left", "GROUP_CLOSED")
        if self.ended is not None:
            return ClosedError(op, f"rank {self.rank} of group {self.name}: {self.ended}", "GROUP_CLOSED")
        return None

    def recv(self, op: str, source: int | None, tag: int | None, timeout: float | None) -> tuple[int, int, Any]:
        """(from, tag, payload) of the oldest queued message from source
        (None: any) with tag (None: any tag >= 0)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                for i, (frm, t, payload, size) in enumerate(self.inbox):
                    if (source is None or frm == source) and (t == tag if tag is not None else t >= 0):
                        del self.inbox[i]
                        over = self.bytes > INBOX_CAP
                        self.bytes -= size
                        if over and self.bytes <= INBOX_CAP:
                            self.cond.notify_all()  # the reader reads its sockets again
                            self._room()
                        return frm, t, payload
                err = self._failed(op, source)
                if err is not None:
                    raise err
                if deadline is None:
                    self.cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MessageTimeoutError(op, f"nothing matching within {timeout:g}s (rank {self.rank} of group "
                                              f"{self.name})", "MSG_TIMEOUT")
                self.cond.wait(left)

    def _room(self) -> None:
        """The inbox is under its cap again (under cond): the TCP channels'
        credits held meanwhile go out, and a reader waiting on those
        channels alone reads every socket again."""
        for ic in self.ins.values():
            if ic.stream and ic.sock is not None:
                ic.reader.credit(ic.sock)
        try:
            self._wake_w.send(b"x", socket.MSG_DONTWAIT)
        except OSError:
            pass

    def wait_view(self, op: str, done: Callable[[View], bool], timeout: float | None) -> View:
        """Waits for a view done accepts."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                if self.view is not None and done(self.view):
                    return self.view
                if self.ended is not None or self.closed:
                    raise ClosedError(op, f"rank {self.rank} of group {self.name}: {self.ended}", "GROUP_CLOSED")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise MessageTimeoutError(op, f"waiting for the membership of group {self.name}", "MSG_TIMEOUT")
                self.cond.wait(left)

    # --- sending ---------------------------------------------------------------------

    def path(self, op: str, to: int, timeout: float | None) -> _direct.Sender | None:
        """The direct channel to rank ``to``, or None for the sidecar path;
        the first call decides. Waits for ``to`` to be listed (a rank not
        joined yet), as a send through the sidecar does."""
        if self.mailbox:
            return None
        with self._olock:
            out = self._outs.get(to)
            if out is None:
                out = self._outs[to] = _Out()
        if out.decided:
            return out.sock
        with out.lock:
            if out.decided:
                return out.sock
            try:
                self.wait_view(op, lambda v: to in v.live or to in v.gone, timeout)
            except ClosedError:
                return None  # the sidecar path says why
            from ._fastmsg import slack
            out.sock = _direct.open_direct(self.msg_path, self.session, self.name, self.rank, to, op, slack(timeout))
            with self._olock:
                if self.closed or self.ended is not None:
                    if out.sock is not None:
                        out.sock.close()
                        out.sock = None
                    raise ClosedError(op, f"rank {self.rank} of group {self.name} ended", "GROUP_CLOSED")
                out.decided = True
            return out.sock

    def send(self, op: str, to: int, sock: _direct.Sender, tag: int, data: Any, timeout: float | None) -> None:
        """Writes one message (a buffer) into the direct channel to ``to``:
        inline, or as a sealed memfd when larger than INLINE_MAX (on a TCP
        channel, always inline)."""
        if type(data) is bytes and (len(data) <= _direct.INLINE_MAX or sock.stream):
            self.send_frame(op, to, sock, [_direct.header(_direct.INLINE, tag, len(data)), data], -1, timeout)
            return
        mv = memoryview(data).cast("B")
        try:
            n = mv.nbytes
            if n > _direct.MAX_MESSAGE:
                raise InvalidError(op, f"a message of {n} bytes: at most {_direct.MAX_MESSAGE}")
            if n <= _direct.INLINE_MAX or sock.stream:
                self.send_frame(op, to, sock, [_direct.header(_direct.INLINE, tag, n), mv], -1, timeout)
                return
            fd = _direct.sealed_memfd([(0, mv)], n)
        finally:
            mv.release()
        try:
            self.send_frame(op, to, sock, [_direct.header(_direct.MEMFD, tag, n)], fd, timeout, n)
        finally:
            os.close(fd)

    def send_frame(self, op: str, to: int, sock: _direct.Sender, parts: list[Any], fd: int = -1,
                   timeout: float | None = None, size: int = 0) -> None:
        """Writes one frame (with fd, a memfd of size bytes) into the
        direct channel to ``to``; to a rank the view says is gone it fails
        with PeerGoneError (a peer whose node went away still takes bytes
        into its socket), as a send through the sidecars does."""
        v = self.view
        if v is not None and to in v.gone and to not in v.live:
            raise PeerGoneError(op, f"rank {to} left or died (group {self.name})", "PEER_GONE", rank=to)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            sock.send(to, op, parts, fd, size, deadline)
        except ZiptrailError:
            if self.closed or self.ended is not None:
                raise ClosedError(op, f"rank {self.rank} of group {self.name} ended: {self.ended or 'left'}",
                                  "GROUP_CLOSED") from None
            raise

    def _close_outs(self, shut: bool) -> None:
        """Shuts the direct channels this member sends on (shut: the
        receivers see the end, a send under way fails with EPIPE), or
        closes them (nobody sends any more)."""
        with self._olock:
            outs = list(self._outs.values())
        for out in outs:
            if out.sock is not None:
                out.sock.close(shut)

    # --- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """Ends every channel and drops what is queued (leave)."""
        with self.cond:
            if self.closed:
                return
            self.closed = True
            inbox, self.inbox, self.bytes = self.inbox, [], 0
            self.cond.notify_all()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self._wake_w.close()
        self._close_outs(shut=False)
        for it in inbox:
            release(it[2])


class _Stop(Exception):
    """Ends the reader thread (the member channel ended)."""
