"""The receiving end of a direct channel (docs/messaging.md, "Same-node
direct channels"): FrameReader reads a socketpair's frames (descriptors
checked: sealed, of the announced size), StreamReader a TCP channel's, each
crediting its sender as _direct's docstring describes. The framing, its
limits and the sending end are in ``_direct``.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import struct
import termios
import threading
from typing import Any

from ._direct import (_FD_SPACE, _HDR, _SEND_FLAGS, COPY, COPY_MAX, CREDIT, INLINE, MEMFD, HEADER, INLINE_MAX, MAGIC,
                      MAX_INFLIGHT, MAX_MESSAGE, SEALS, STREAM_CREDIT_AT, STREAM_PREALLOC, FrameError, Memfd, _rights)
from ._objects import InlineObject


class FrameReader:
    """Reads a direct channel's frames (one reader per channel)."""

    __slots__ = ("buf", "view")

    def __init__(self) -> None:
        self.buf = bytearray(HEADER + INLINE_MAX + 1)
        self.view = memoryview(self.buf)

    def read(self, sock: socket.socket) -> tuple[int, Any] | None:
        """The next frame as (tag, bytes or Memfd); None when nothing is
        there (non-blocking); EOFError when the sender closed its end;
        FrameError for a protocol violation."""
        while True:
            try:
                n, anc, flags, _ = sock.recvmsg_into([self.view], _FD_SPACE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
                break
            except (BlockingIOError, InterruptedError):
                return None
            except ConnectionResetError:
                # The sender closed with credits it had not read. Linux
                # reports that once, before the frames still queued (the
                # pending error is taken first): they follow, then the
                # end (0 bytes). Not the end yet.
                continue
        fds = _rights(anc)
        try:
            if n == 0 and not fds:
                raise EOFError
            if flags & socket.MSG_TRUNC:
                raise FrameError(f"a frame over {HEADER + INLINE_MAX} bytes")
            if flags & socket.MSG_CTRUNC:
                raise FrameError("too many descriptors")
            if n < HEADER:
                raise FrameError(f"a frame of {n} bytes")
            magic, kind, tag, size = _HDR.unpack_from(self.buf)
            if magic != MAGIC:
                raise FrameError(f"bad magic {magic:#x}")
            if kind == INLINE:
                if fds or size != n - HEADER:
                    raise FrameError(f"inline frame of {n - HEADER} bytes announcing {size}, {len(fds)} descriptors")
                return tag, InlineObject(self.view[HEADER:n])  # the one copy out of the frame buffer
            if kind == MEMFD:
                if len(fds) != 1 or n != HEADER or not INLINE_MAX < size <= MAX_MESSAGE:
                    raise FrameError(f"memfd frame of {n} bytes announcing {size}, {len(fds)} descriptors")
                check_sealed(fds[0], size)
                m = Memfd(fds.pop(), size)
                _credit(sock, size)
                return tag, m
            if kind == COPY:
                if len(fds) != 1 or n != HEADER or not INLINE_MAX < size <= COPY_MAX:
                    raise FrameError(f"copy frame of {n} bytes announcing {size}, {len(fds)} descriptors")
                data = copy_out(fds[0], size)
                _credit(sock, size)
                return tag, InlineObject(data)
            raise FrameError(f"frame kind {kind}")
        finally:
            for fd in fds:
                os.close(fd)


class StreamReader:
    """Reads a TCP channel's frames (one reader per channel): the same
    frames as FrameReader's, inline only, off a byte stream."""

    __slots__ = ("buf", "view", "start", "end", "body", "got", "size", "tag", "owed", "lock", "counted")

    def __init__(self) -> None:
        self.buf = bytearray(256 << 10)
        self.view = memoryview(self.buf)
        self.start = self.end = 0  # the unparsed bytes in buf
        self.body: bytearray | None = None  # a large message being read
        self.got = self.size = self.tag = 0
        self.owed = 0  # frame bytes read and not credited (under lock)
        self.lock = threading.Lock()
        self.counted = False  # the frame at start is in owed already

    def quiet(self, sock: socket.socket) -> bool:
        """Nothing of a frame read and nothing in the socket (FIONREAD)."""
        if self.body is not None or self.start != self.end:
            return False
        try:
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] == 0
        except OSError:
            return False

    def buffered(self) -> bool:
        """A whole frame is read and waiting: the next read needs no new
        bytes from the socket (whose readiness will not say so). A frame
        begun but not whole waits for the socket (no turn of its own: the
        reader would spin)."""
        have = self.end - self.start
        return self.body is None and have >= HEADER and _HDR.unpack_from(self.buf, self.start)[3] <= have - HEADER

    def credit(self, sock: socket.socket) -> None:
        """Credits the sender what it is owed, once that is
        STREAM_CREDIT_AT or more (the caller knows the inbox has room)."""
        with self.lock:
            if self.owed < STREAM_CREDIT_AT:
                return
            try:
                sock.send(_HDR.pack(MAGIC, CREDIT, 0, self.owed), _SEND_FLAGS)
            except OSError:
                return
            self.owed = 0

    def read(self, sock: socket.socket) -> tuple[int, Any] | None:
        """The next frame as (tag, bytes); None when nothing more is there
        (non-blocking); EOFError when the sender closed its end (or broke
        it inside a frame it had not finished sending); FrameError for a
        protocol violation."""
        while True:
            if self.body is not None:
                if self.got == self.size:
                    body, self.body = self.body, None
                    return self.tag, InlineObject(body)
                if self.got == len(self.body):
                    self.body.extend(bytes(min(len(self.body), self.size - self.got)))  # grows by doubling
                mv = memoryview(self.body)
                sub = mv[self.got:]
                try:
                    n = self._recv(sock, sub)
                finally:
                    sub.release()
                    mv.release()
                if n is None:
                    return None
                self.got += n
                continue
            if self.end - self.start >= HEADER:
                magic, kind, tag, size = _HDR.unpack_from(self.buf, self.start)
                if magic != MAGIC:
                    raise FrameError(f"bad magic {magic:#x}")
                if kind != INLINE:
                    raise FrameError(f"frame kind {kind} on a TCP channel (only inline frames cross nodes)")
                if size > MAX_MESSAGE:
                    raise FrameError(f"a message of {size} bytes (at most {MAX_MESSAGE})")
                if not self.counted:
                    with self.lock:
                        if self.owed >= STREAM_CREDIT_AT and self.owed + HEADER + size > MAX_INFLIGHT:
                            raise FrameError(f"a frame of {size} bytes beyond the sender's window "
                                             f"({self.owed} bytes not credited)")
                        self.owed += HEADER + size
                    self.counted = True
                at = self.start + HEADER
                have = self.end - at
                if size <= have:
                    self.start, self.counted = at + size, False
                    return tag, InlineObject(self.view[at:at + size])
                if HEADER + size > len(self.buf):  # larger than the buffer: a body of its own
                    self.counted = False
                    self.body = bytearray(min(size, STREAM_PREALLOC))
                    self.body[:have] = self.view[at:self.end]
                    self.got, self.size, self.tag = have, size, tag
                    self.start = self.end = 0
                    continue
            if self.start and (self.start == self.end or self.end == len(self.buf)):
                n = self.end - self.start  # the unparsed bytes to the front
                self.buf[:n] = self.view[self.start:self.end]
                self.start, self.end = 0, n
            n = self._recv(sock, self.view[self.end:])
            if n is None:
                return None
            self.end += n

    def _recv(self, sock: socket.socket, into: memoryview) -> int | None:
        """Bytes read into into; None when none are there; EOFError at the
        end (a reset is the end too: the sender exited with unread data)."""
        while True:
            try:
                n = sock.recv_into(into, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return None
            except (ConnectionResetError, TimeoutError):  # a reset, or its node silent past the keepalive
                raise EOFError from None
            if n == 0:
                raise EOFError
            return n


def _credit(sock: socket.socket, size: int) -> None:
    """Credits the sender (never blocks: few credits are ever outstanding)."""
    try:
        sock.send(_HDR.pack(MAGIC, CREDIT, 0, size), _SEND_FLAGS)
    except OSError:
        pass


def copy_out(fd: int, size: int) -> bytearray:
    """The first size bytes of a memfd the sender keeps writing to (a copy
    frame): a memfd only (a pipe, socket or FUSE file could hold the read
    forever), holding at least size bytes."""
    try:
        fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:
        raise FrameError(f"the descriptor of a copy frame is not a memfd: {e}") from None
    buf = bytearray(size)
    view = memoryview(buf)
    done = 0
    while done < size:
        n = os.preadv(fd, [view[done:]], done)
        if n <= 0:
            raise FrameError(f"a copy frame's memfd holds {done} of its {size} bytes")
        done += n
    return buf


def check_sealed(fd: int, size: int) -> None:
    """fd must be a regular memfd of size bytes with every seal."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:
        raise FrameError(f"the descriptor is not a sealable memfd: {e}") from None
    if seals & SEALS != SEALS:
        raise FrameError(f"memfd seals {seals:#x} lack {SEALS & ~seals:#x}")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        raise FrameError(f"memfd of {st.st_size} bytes, announced {size}")
