"""Same-node direct channels (docs/messaging.md, "Same-node direct
channels"): the messaging socket's ``attach`` and ``open`` operations
(internal/dataplane/localapi/fastdirect.go) and the framing of one direction
s -> r of a direct channel (internal/dataplane/directmsg/channel.go), byte
for byte as the Go SDK's, so that Go and Python members share channels.

A direct channel is a SOCK_SEQPACKET socketpair the sidecars made; every
frame is one packet, so a descriptor travels with exactly its frame::

    u32 magic "ZTD1", u8 kind (1 inline, 2 memfd, 4 copy), i64 tag,
    u64 size, then for inline the size bytes

little endian. A message larger than INLINE_MAX goes as one memfd sealed
with every seal (write, shrink, grow, seal), attached to a frame without
bytes; the receiver checks the seals and the size and maps it read-only.
A Go sender sends messages of up to COPY_MAX bytes in a memfd it reuses
(kind 4): the receiver copies the bytes out (pread) and credits, after
which the sender may write its next message there. The receiver answers
each memfd frame (kinds 2 and 4) with a credit frame (kind 3, its size),
so that a sender holds at most MAX_INFLIGHT memfd bytes the receiver has
not read (the kernel counts a frame's bytes against the socket's buffer,
not its memfd's).

A direct channel across nodes is a TCP connection the sidecars opened and
authenticated (internal/dataplane/directmsg/stream.go): the same frames on a
byte stream, every message inline (no descriptor crosses TCP), read by
StreamReader (``_directrecv``, with FrameReader). A frame cannot be taken back half written, so the receiver
reads whatever its sender's window allows, inbox full or not, and the
sender starts a frame only while its uncredited frame bytes are under
STREAM_CREDIT_AT or the frame keeps them within MAX_INFLIGHT; the receiver
credits (kind 3, a byte count) once it owes STREAM_CREDIT_AT and its inbox
has room. A send's deadline ends only the wait for credits, before the
frame's first byte.

The peer is not trusted: a frame that is truncated, oversized, of an unknown
kind, announces a size it does not carry, has descriptors it should not
have, or a memfd that is unsealed or of another size is a FrameError (every
received descriptor closed); the caller drops the channel.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import select
import socket
import struct
import threading
import time
from typing import Any

from ._fastmsg import _REQ, _REQ_FIXED, _RESP, _RESP_FIXED
from .errors import (DirectChannelError, MessageTimeoutError, PeerGoneError, UnavailableError, ZiptrailError,
                     from_reason)

MAGIC = 0x3144545A  # b"ZTD1" little endian
_HDR = struct.Struct("<IBqQ")
HEADER = _HDR.size  # 21
#: The largest message sent inside its frame (larger: a sealed memfd).
INLINE_MAX = 128 << 10
#: The largest message in a reused memfd (kind 4, copied out).
COPY_MAX = 4 << 20
#: The largest memfd message (the sidecar path's cap).
MAX_MESSAGE = 1 << 30
#: The memfd bytes a sender may have in a channel, not credited yet.
MAX_INFLIGHT = 16 << 20
INLINE, MEMFD, CREDIT, COPY = 1, 2, 3, 4
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

# Operations and flags of the messaging socket (fastdirect.go).
_ATTACH, _OPEN, _RELEASE = 3, 4, 5
PUSH_MESSAGE, PUSH_VIEW, PUSH_DIRECT = 0, 2, 3
FLAG_PATH, FLAG_MAILBOX, FLAG_DIRECT = 1, 2, 4
# Attach: lend this member the files of large messages; push: the file is
# lent (body: path, NUL, release token). See docs/messaging.md "Reused files".
FLAG_LEND, FLAG_LENT = 4, 8
# Attach and open: this SDK takes direct channels across nodes (TCP).
FLAG_TCP = 16
#: The largest body a stream reader allocates whole when its header comes;
#: a larger one grows as its bytes arrive (a peer cannot make the reader
#: allocate far more than it sent).
STREAM_PREALLOC = 64 << 20
#: A stream sender under this many uncredited bytes may start a frame of
#: any size; a receiver credits once it owes this many.
STREAM_CREDIT_AT = MAX_INFLIGHT // 2
#: How long a closed TCP channel's sending end waits for its receiver to
#: read what was sent and close its end.
CLOSE_LINGER = 30.0
_FD_SPACE = socket.CMSG_SPACE(4 * 4)  # room for a few descriptors: more is a protocol error
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


class FrameError(Exception):
    """A peer's protocol violation on a direct channel."""


class NoAttach(Exception):
    """The sidecar has no member channels (an older one): join through gRPC."""


class Memfd:
    """A received memfd message: its checked descriptor (owned) and size."""

    __slots__ = ("fd", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


def header(kind: int, tag: int, size: int) -> bytes:
    return _HDR.pack(MAGIC, kind, tag, size)


# --- sending ----------------------------------------------------------------------

def add_seals(fd: int, seals: int, attempts: int = 5) -> None:
    """Adds seals to a memfd. F_SEAL_WRITE fails with EBUSY while a page has
    a transient extra reference (one the kernel is migrating) that outlasts
    the kernel's own ~150 ms wait; with no writable mapping that passes, so
    it is asked again (as the Go side's samenode.AddSeals)."""
    for attempt in range(attempts):
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            return
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == attempts - 1:
                raise


def sealed_memfd(parts: list[tuple[int, Any]], size: int) -> int:
    """A new memfd of ``size`` bytes with each (offset, buffer) of parts
    written at its offset, sealed read-only. One copy of the bytes."""
    fd = os.memfd_create("ziptrail-msg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        for off, buf in parts:
            mv = memoryview(buf).cast("B")
            done = 0
            while done < mv.nbytes:
                done += os.pwrite(fd, mv[done:done + (1 << 30)], off + done)
        add_seals(fd, SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def send_frame(sock: socket.socket, rank: int, op: str, parts: list[Any], fd: int, deadline: float | None) -> None:
    """Writes one frame (parts: its bytes; fd: a memfd to attach, or -1),
    waiting while the receiver's socket is full (back-pressure) until the
    deadline (time.monotonic). A closed channel is the receiver gone."""
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd >= 0 else []
    while True:
        try:
            sock.sendmsg(parts, anc, _SEND_FLAGS)
            return
        except BlockingIOError:
            pass
        except OSError as e:
            raise _send_failed(sock, rank, op, e) from None
        _wait_writable(sock, rank, op, deadline)


def _send_failed(sock: socket.socket, rank: int, op: str, e: OSError) -> ZiptrailError:
    """The error of a send into a direct channel that failed: the receiver
    gone, the channel closed under the send (the member ended), or other."""
    if isinstance(e, (BrokenPipeError, ConnectionResetError, TimeoutError)):
        return PeerGoneError(op, f"rank {rank}'s direct channel closed: {e}", "PEER_GONE", rank=rank)
    if sock.fileno() < 0:
        return ZiptrailError(op, f"the direct channel to rank {rank} was closed (the member ended)")
    return ZiptrailError(op, f"sending to rank {rank}: {e}")


def _wait_writable(sock: socket.socket, rank: int, op: str, deadline: float | None) -> None:
    """Waits until the channel takes bytes again, or the deadline."""
    wait = -1 if deadline is None else int((deadline - time.monotonic()) * 1000)
    if deadline is not None and wait <= 0:
        raise MessageTimeoutError(op, f"rank {rank} did not take the message in time (its inbox is full)",
                                  "MSG_TIMEOUT")
    p = select.poll()
    try:
        p.register(sock, select.POLLOUT)
    except (ValueError, OSError):
        raise ZiptrailError(op, f"the direct channel to rank {rank} was closed (the member ended)") from None
    p.poll(wait)


def send_stream(sock: socket.socket, rank: int, op: str, parts: list[Any], fd: int, size: int,
                deadline: float | None) -> None:
    """Writes parts, then size bytes of the memfd fd (-1: none), into a TCP
    channel, waiting while it is full until the deadline. The caller holds
    the channel's lock: a frame's bytes are never interleaved."""
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if v.nbytes]
    off = 0
    while views or (fd >= 0 and off < size):
        try:
            if views:
                n = sock.sendmsg(views, [], _SEND_FLAGS)
                while n and views:
                    if n >= views[0].nbytes:
                        n -= views[0].nbytes
                        views.pop(0)
                    else:
                        views[0] = views[0][n:]
                        n = 0
                continue
            n = os.sendfile(sock.fileno(), fd, off, size - off)
            if n == 0:
                raise ZiptrailError(op, f"the memfd for rank {rank} holds {off} of its {size} bytes")
            off += n
            continue
        except BlockingIOError:
            pass
        except OSError as e:
            raise _send_failed(sock, rank, op, e) from None
        _wait_writable(sock, rank, op, deadline)


class Sender:
    """A direct channel's sending end, with its memfd credits; or, across
    nodes (stream), a TCP channel."""

    __slots__ = ("sock", "lock", "inflight", "stream", "cbuf")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        # memfd bytes (a stream: frame bytes) sent and not credited (under lock)
        self.inflight = 0
        self.stream = sock.type == socket.SOCK_STREAM
        self.cbuf = bytearray()  # a stream's credit bytes read (under lock)

    def send(self, rank: int, op: str, parts: list[Any], fd: int, size: int, deadline: float | None) -> None:
        """Writes one frame; a memfd one waits for credits first while the
        receiver has not read MAX_INFLIGHT bytes of memfds. On a TCP
        channel a memfd frame goes inline: its header, then the memfd's
        bytes."""
        if self.stream:
            if fd >= 0:
                _, _, tag, _ = _HDR.unpack(bytes(parts[0]))
                parts = [header(INLINE, tag, size)]
                n = HEADER + size
            else:
                n = sum(memoryview(p).nbytes for p in parts)
            if not self.lock.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
                raise MessageTimeoutError(op, f"rank {rank} did not take the message in time", "MSG_TIMEOUT")
            try:
                self._window(rank, op, n, deadline)
                self.inflight += n
                send_stream(self.sock, rank, op, parts, fd, size, None)  # whole: its receiver reads it
            finally:
                self.lock.release()
            return
        if fd < 0:
            send_frame(self.sock, rank, op, parts, -1, deadline)
            return
        if not self.lock.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
            raise MessageTimeoutError(op, f"rank {rank} did not take the message in time", "MSG_TIMEOUT")
        try:
            while self.inflight > 0 and self.inflight + size > MAX_INFLIGHT:
                self.inflight -= min(self._credit(rank, op, deadline), self.inflight)
            send_frame(self.sock, rank, op, parts, fd, deadline)
            self.inflight += size
        finally:
            self.lock.release()

    def _window(self, rank: int, op: str, n: int, deadline: float | None) -> None:
        """Waits until a stream frame of n bytes may start, reading the
        receiver's credits (under lock). Under STREAM_CREDIT_AT uncredited
        bytes none can be on its way: nothing is read."""
        while self.inflight >= STREAM_CREDIT_AT:
            try:
                got = self.sock.recv(64 * HEADER, socket.MSG_DONTWAIT)
            except BlockingIOError:
                got = None
            except (ConnectionResetError, BrokenPipeError) as e:
                raise PeerGoneError(op, f"rank {rank}'s direct channel closed: {e}", "PEER_GONE", rank=rank) from None
            except OSError as e:
                raise ZiptrailError(op, f"the direct channel to rank {rank}: {e}") from None
            if got == b"":
                raise PeerGoneError(op, f"rank {rank}'s direct channel closed", "PEER_GONE", rank=rank)
            if got:
                self.cbuf += got
                while len(self.cbuf) >= HEADER:
                    magic, kind, _, credit = _HDR.unpack_from(self.cbuf)
                    if magic != MAGIC or kind != CREDIT or credit > self.inflight:
                        raise DirectChannelError(op, f"rank {rank} sent a bad credit on its direct channel", rank=rank)
                    self.inflight -= credit
                    del self.cbuf[:HEADER]
                continue
            if self.inflight + n <= MAX_INFLIGHT:
                return
            wait_ms = -1 if deadline is None else int((deadline - time.monotonic()) * 1000)
            if deadline is not None and wait_ms <= 0:
                raise MessageTimeoutError(op, f"rank {rank} did not take the message in time (its inbox is full)",
                                          "MSG_TIMEOUT")
            p = select.poll()
            p.register(self.sock, select.POLLIN)
            p.poll(wait_ms)

    def _credit(self, rank: int, op: str, deadline: float | None) -> int:
        """Reads one credit frame of the receiver (under lock)."""
        while True:
            try:
                b, anc, _, _ = self.sock.recvmsg(HEADER + 1, _FD_SPACE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                b = None
            except (ConnectionResetError, BrokenPipeError) as e:
                raise PeerGoneError(op, f"rank {rank}'s direct channel closed: {e}", "PEER_GONE", rank=rank) from None
            except OSError as e:
                raise ZiptrailError(op, f"the direct channel to rank {rank}: {e}") from None
            if b is not None:
                fds = _rights(anc)
                for fd in fds:
                    os.close(fd)
                if not b and not fds:
                    raise PeerGoneError(op, f"rank {rank}'s direct channel closed", "PEER_GONE", rank=rank)
                if fds or len(b) != HEADER or _HDR.unpack(b)[:2] != (MAGIC, CREDIT):
                    raise DirectChannelError(op, f"rank {rank} answered on its direct channel with a bad credit frame",
                                             rank=rank)
                return _HDR.unpack(b)[3]
            wait = -1 if deadline is None else int((deadline - time.monotonic()) * 1000)
            if deadline is not None and wait <= 0:
                raise MessageTimeoutError(op, f"rank {rank} did not read its messages in time", "MSG_TIMEOUT")
            p = select.poll()
            p.register(self.sock, select.POLLIN)
            p.poll(wait)

    def close(self, shut: bool = False) -> None:
        """Shuts the channel (shut: a send under way fails), or closes it
        after reading the credits queued for it: a socket closed with
        unread data resets its peer, whose last reads would fail."""
        if shut:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if self.stream:
            # A TCP socket closed with a credit unread resets the connection,
            # and the kernel drops the frames it had not sent yet: send the
            # FIN after them, and read the credits until the receiver closes
            # its end (at most CLOSE_LINGER), then close.
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self.sock.close()
                return
            threading.Thread(target=self._linger, name="ziptrail-close", daemon=True).start()
            return
        try:
            while self.sock.recv(HEADER + 1, socket.MSG_DONTWAIT):
                pass
        except OSError:
            pass
        self.sock.close()

    def _linger(self) -> None:
        try:
            self.sock.settimeout(CLOSE_LINGER)
            while self.sock.recv(64 << 10):
                pass
        except OSError:
            pass
        finally:
            self.sock.close()


def _rights(anc: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[:len(data) - len(data) % a.itemsize])
            fds.extend(a)
    return fds


# --- the messaging socket's attach and open ------------------------------------------

def _request(op: int, flags: int, session: bytes, group: bytes, rank: int, peer: int, timeout_ms: int,
             payload: bytes = b"") -> bytes:
    return _REQ.pack(_REQ_FIXED + len(session) + len(group) + len(payload), op, flags, len(session), len(group), 0,
                     rank, peer, 0, timeout_ms) + session + group + payload


def release_request(token: bytes) -> bytes:
    """A member channel's release of a lent file (no response)."""
    return _request(_RELEASE, 0, b"", b"", 0, 0, 0, token)


def _dial(path: str, op: str, sock_timeout: float | None) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(sock_timeout)
        s.connect(path)
    except OSError as e:
        s.close()
        raise UnavailableError(op, f"cannot reach the sidecar's messaging socket {path}: {e}") from None
    return s


def _recv_exact(s: socket.socket, n: int, fds: list[int]) -> bytearray:
    """Exactly n bytes (not one more: pushes may follow), keeping the
    descriptors that come with them."""
    out = bytearray()
    while len(out) < n:
        chunk, anc, _, _ = s.recvmsg(n - len(out), _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
        fds += _rights(anc)
        if not chunk:
            raise ConnectionError("the sidecar closed the messaging connection")
        out += chunk
    return out


def read_response(s: socket.socket) -> tuple[int, int, bytes, bytes, list[int]]:
    """One response of a blocking socket: (status, flags, reason, body,
    the descriptors that came with it)."""
    fds: list[int] = []
    try:
        head = _recv_exact(s, _RESP.size, fds)
        n, st, flags, rl, _, _, _ = _RESP.unpack_from(head)
        if n < _RESP_FIXED or _RESP_FIXED + rl > n:
            raise ConnectionError(f"a malformed response ({n} bytes, reason of {rl})")
        rest = _recv_exact(s, n - _RESP_FIXED, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return st, flags, bytes(rest[:rl]), bytes(rest[rl:]), fds


def attach(path: str, session: str, group: str, rank: int, size: int, mailbox: bool, invocation: str,
           timeout_ms: int, sock_timeout: float | None) -> tuple[socket.socket, bool]:
    """Joins rank with its member channel attached: (the channel, whether
    the group keeps mailboxes). NoAttach: an older sidecar."""
    s = _dial(path, "join", sock_timeout)
    try:
        flags = (1 if mailbox else 0) | FLAG_LEND | FLAG_TCP
        s.sendall(_request(_ATTACH, flags, session.encode(), group.encode(), rank, size, timeout_ms,
                           invocation.encode()))
        st, flags, reason, body, fds = read_response(s)
        for fd in fds:
            os.close(fd)
    except TimeoutError:
        s.close()
        raise MessageTimeoutError("join", "no answer from the sidecar in time", "MSG_TIMEOUT") from None
    except OSError as e:
        s.close()
        raise UnavailableError("join", f"messaging socket: {e}") from None
    if st:
        s.close()
        msg = body.decode("utf-8", "replace")
        if reason == b"BAD_PAYLOAD" and "unknown operation" in msg:
            raise NoAttach(msg)
        raise from_reason(reason.decode("utf-8", "replace"), "join", msg)
    s.settimeout(None)
    s.setblocking(False)
    return s, bool(flags & FLAG_MAILBOX)


def open_direct(path: str, session: str, group: str, frm: int, to: int, op: str,
                sock_timeout: float | None) -> Sender | None:
    """A direct channel's sending end for frm -> to, or None (nodirect: the
    pair goes through the sidecars for the group's lifetime)."""
    s = _dial(path, op, sock_timeout)
    fds: list[int] = []
    try:
        s.sendall(_request(_OPEN, FLAG_TCP, session.encode(), group.encode(), frm, to, 0))
        st, flags, reason, body, fds = read_response(s)
    except TimeoutError:
        raise MessageTimeoutError(op, "no answer from the sidecar in time", "MSG_TIMEOUT") from None
    except OSError as e:
        raise UnavailableError(op, f"messaging socket: {e}") from None
    finally:
        s.close()
    try:
        if st:
            err = from_reason(reason.decode("utf-8", "replace"), op, body.decode("utf-8", "replace"))
            if isinstance(err, PeerGoneError) and err.rank is None:
                err.rank = to
            raise err
        if not flags & FLAG_DIRECT:
            return None
        if len(fds) != 1:
            raise ZiptrailError(op, f"the sidecar answered direct with {len(fds)} descriptors")
        c = socket.socket(fileno=fds.pop())
        c.setblocking(True)
        return Sender(c)
    finally:
        for fd in fds:
            os.close(fd)
