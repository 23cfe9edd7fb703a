"""The messaging fast path: Send and Recv on the sidecar's second unix
socket, ``sidecar.msg.sock`` next to the local API's ``sidecar.sock``, with a minimal binary framing
instead of gRPC (internal/dataplane/localapi/fastmsg.go has the server and
the format; fastclient.go is the Go client)::

    request:  u32 n, u8 op (1 send, 2 recv), u8 flags, u16 session length,
              u16 group length, u16 0, u32 rank, u32 peer, i64 tag,
              i64 timeout ms, session, group, payload (send: the bytes, or
              with flags bit 0 the path of a file of the object directory)
    response: u32 n, u8 status (0 ok, 1 error), u8 flags, u16 reason
              length, u32 from, i64 tag, u64 size, reason, payload (recv: the
              bytes, or with flags bit 0 a file's path; error: the message)

Little endian; ``n`` counts the bytes after it. Recv flags: bit 0 any
source, bit 1 any tag. Send response flags: bit 1 mailboxed.

One request at a time per connection. Every thread has its own connection
(made on first use); a connection that fails in any way (an error of the
socket, a timeout, an interrupt) is closed and dropped, which also tells the
sidecar to abandon a receive that was waiting for it. Payloads are ``bytes``
(inline) or ``str`` (the path of a file in the shared-memory directory,
which the sidecar takes over on send, and which the caller maps and removes
on receive).
"""

from __future__ import annotations

import math
import os
import socket
import struct
import tempfile
import threading
import weakref
from typing import Any, Callable, Union

from ._objects import _remove
from .errors import (MessageTimeoutError, PeerGoneError, UnavailableError, ZiptrailError, ZiptrailTimeoutError,
                     from_reason)

#: The fast path's socket name, next to the local API's socket.
SOCKET_SUFFIX = ".msg.sock"

_REQ = struct.Struct("<IBBHHHIIqq")  # n, then the request's 32 fixed bytes
_RESP = struct.Struct("<IBBHIqQ")  # n, then the response's 24 fixed bytes
_REQ_FIXED, _RESP_FIXED = _REQ.size - 4, _RESP.size - 4
_SEND, _RECV = 1, 2
_PATH, _MAILBOXED = 1, 2
# Send: give the file back once sent; response: it was (msgfiles.go).
_GIVE_BACK, _RETURNED = 2, 4
# Files a client keeps for its next large messages.
_KEPT_FILES = 4
_WRITE_CHUNK = 1 << 30  # os.pwrite moves at most ~2 GiB per call
ANY_SOURCE, ANY_TAG = 1, 2
#: The bound on a request's session and group names (bytes each).
MAX_NAMES = 1 << 10
# A connection reads responses up to this size into its own buffer.
_BUF = (64 << 10) + 4096
# Payloads up to this size are joined with the header into one bytes
# object; larger ones go out with sendmsg as they are.
_JOIN_MAX = 16 << 10

#: A payload: inline bytes, or (str) a file's path.
Payload = Union[bytes, str]


def _shm_room(dir: str) -> bool:
    """Whether dir's filesystem has half its space free (or a GiB): only
    then are idle files kept there (as the sidecar's shmRoom)."""
    try:
        st = os.statvfs(dir)
    except OSError:
        return True
    return st.f_blocks == 0 or st.f_bavail * 2 >= st.f_blocks or st.f_bavail * st.f_frsize >= 1 << 30


def socket_path(api_socket: str) -> str:
    """The fast path's socket, named after the API's (sidecar.sock:
    sidecar.msg.sock), as the sidecar names it."""
    base = api_socket[:-len(".sock")] if api_socket.endswith(".sock") else api_socket
    return base + SOCKET_SUFFIX


class _Conn:
    """One connection and its response buffer."""

    __slots__ = ("sock", "buf", "view", "timeout")

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.buf = bytearray(_BUF)
        self.view = memoryview(self.buf)
        self.timeout: float | None = None

    def close(self) -> None:
        self.sock.close()


class _Thread:
    """A thread's connections: ``main`` for its calls, ``aux`` for the
    receive a send-while-receiving keeps waiting meanwhile. Closed when the
    thread ends (its thread-local data goes)."""

    __slots__ = ("owner", "main", "aux", "__weakref__")

    def __init__(self, owner: MessageClient) -> None:
        self.owner = owner
        self.main: _Conn | None = None
        self.aux: _Conn | None = None

    def __del__(self) -> None:
        for c in (self.main, self.aux):
            if c is not None:
                self.owner._forget(c)


class MessageClient:
    """A client of one sidecar's fast path (``path``: its messaging socket).
    Safe to share between threads (each uses its own connection)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._conns: set[_Conn] = set()  # every open connection, for close()
        self._lock = threading.RLock()  # _Thread.__del__ may run anywhere
        self._closed = False
        # Files sends got back (send_file), to write the next large message
        # into: their pages are there already (docs/messaging.md "Reused
        # files"). Most recent last.
        self._files: list[str] = []
        _clients.add(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's connections are not this
        process's to use (their answers go to whoever reads first)."""
        self._local = threading.local()
        self._lock = threading.RLock()
        conns, self._conns = self._conns, set()
        for c in conns:
            c.close()  # the child's copies only
        self._files = []  # the parent's to reuse, not the child's

    def close(self) -> None:
        """Closes every connection (of every thread) and removes the files
        kept for reuse."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, set()
            files, self._files = self._files, []
        for f in files:
            _remove(f)
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it
            except OSError:
                pass
            c.close()

    # --- connections ---------------------------------------------------------

    def _thread(self) -> _Thread:
        try:
            return self._local.t
        except AttributeError:
            t = self._local.t = _Thread(self)
            return t

    def _conn(self, op: str, aux: bool = False) -> _Conn:
        t = self._thread()
        c = t.aux if aux else t.main
        if c is not None:
            return c
        if self._closed:
            raise ZiptrailError(op, "the client is closed")
        try:
            c = _Conn(self.path)
        except OSError as e:
            raise UnavailableError(op, f"cannot reach the sidecar's messaging socket {self.path} "
                                   f"(is queue-proxy-zl running?): {e}") from None
        with self._lock:
            self._conns.add(c)
        if aux:
            t.aux = c
        else:
            t.main = c
        return c

    def _forget(self, c: _Conn) -> None:
        with self._lock:
            self._conns.discard(c)
        c.close()

    def _drop(self, c: _Conn) -> None:
        """Closes a connection that failed (its state is unknown)."""
        t = self._thread()
        if t.main is c:
            t.main = None
        if t.aux is c:
            t.aux = None
        self._forget(c)

    # --- calls -----------------------------------------------------------------

    def send(self, op: str, names: bytes, name_lens: tuple[int, int], rank: int, to: int, tag: int,
             payload: Payload, timeout_ms: int, sock_timeout: float | None) -> bool:
        """Sends payload from rank to ``to``; True when mailboxed."""
        c = self._conn(op)
        try:
            _request(c, _SEND, 0, names, name_lens, rank, to, tag, payload, timeout_ms, sock_timeout)
            st, flags, _, _, body = _response(c, op)
        except BaseException as e:
            self._drop(c)
            raise _failed(op, e, sock_timeout) from None
        if st:
            raise body
        return bool(flags & _MAILBOXED)

    def send_file(self, op: str, names: bytes, name_lens: tuple[int, int], rank: int, to: int, tag: int,
                  path: str, timeout_ms: int, sock_timeout: float | None) -> bool:
        """Sends the file at path (see message_file) and asks for it back
        once sent: kept for the next message, else removed (by the sidecar
        too). True when mailboxed."""
        c = self._conn(op)
        try:
            _request(c, _SEND, _GIVE_BACK, names, name_lens, rank, to, tag, path, timeout_ms, sock_timeout)
            st, flags, _, _, body = _response(c, op)
        except BaseException as e:
            self._drop(c)
            _remove(path)
            raise _failed(op, e, sock_timeout) from None
        if st:
            _remove(path)
            raise body
        if flags & _RETURNED:
            self._keep(path)
        else:
            _remove(path)
        return bool(flags & _MAILBOXED)

    def message_file(self, dir: str, data: memoryview) -> str:
        """A file of dir holding data: one a send gave back when there is
        one (written in place, no new pages), else a new one."""
        n = data.nbytes
        with self._lock:
            path = self._files.pop() if self._files else None
        if path is not None:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                path = None
        if path is None:
            fd, path = tempfile.mkstemp(prefix="put-", dir=dir)
        try:
            os.ftruncate(fd, n)  # a reused file may be larger: nothing past the end
            off = 0
            while off < n:
                off += os.pwrite(fd, data[off:off + _WRITE_CHUNK], off)
        except BaseException:
            os.close(fd)
            _remove(path)
            raise
        os.close(fd)
        return path

    def _keep(self, path: str) -> None:
        """Keeps a file a send got back, while the directory has room (a
        pod's /dev/shm is small) and at most _KEPT_FILES of them."""
        drop: list[str] = []
        with self._lock:
            if self._closed or not _shm_room(os.path.dirname(path)):
                drop.append(path)
            else:
                self._files.append(path)
                while len(self._files) > _KEPT_FILES:
                    drop.append(self._files.pop(0))
        for f in drop:
            _remove(f)

    def recv(self, op: str, names: bytes, name_lens: tuple[int, int], rank: int, source: int, tag: int, flags: int,
             timeout_ms: int, sock_timeout: float | None) -> tuple[int, int, Payload]:
        """The oldest matching message for rank: (from, tag, payload)."""
        c = self._conn(op)
        try:
            _request(c, _RECV, flags, names, name_lens, rank, source, tag, b"", timeout_ms, sock_timeout)
            resp = _response(c, op)
        except BaseException as e:
            self._drop(c)
            raise _failed(op, e, sock_timeout) from None
        return _received(resp)

    def start_recv(self, op: str, names: bytes, name_lens: tuple[int, int], rank: int, source: int, tag: int,
                   flags: int, timeout_ms: int, sock_timeout: float | None) -> PendingRecv:
        """Starts a receive on this thread's second connection without
        waiting for its answer (so that the thread can send meanwhile)."""
        c = self._conn(op, aux=True)
        try:
            _request(c, _RECV, flags, names, name_lens, rank, source, tag, b"", timeout_ms, sock_timeout)
        except BaseException as e:
            self._drop(c)
            raise _failed(op, e, sock_timeout) from None
        return PendingRecv(self, c, op, sock_timeout)


class PendingRecv:
    """A receive started by :meth:`MessageClient.start_recv`: ``result()``
    waits for it, ``cancel()`` abandons it."""

    __slots__ = ("_client", "_conn", "_op", "_timeout")

    def __init__(self, client: MessageClient, conn: _Conn | None, op: str, sock_timeout: float | None) -> None:
        self._client, self._conn, self._op, self._timeout = client, conn, op, sock_timeout

    def result(self) -> tuple[int, int, Payload]:
        c = self._conn
        if c is None:
            raise ZiptrailError(self._op, "the receive was cancelled")
        self._conn = None
        try:
            resp = _response(c, self._op)
        except BaseException as e:
            self._client._drop(c)
            raise _failed(self._op, e, self._timeout) from None
        return _received(resp)

    def cancel(self) -> None:
        """Abandons the receive: its connection closes, so the sidecar ends
        it without taking a message for nobody."""
        c, self._conn = self._conn, None
        if c is not None:
            self._client._drop(c)


_clients: weakref.WeakSet[MessageClient] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for c in list(_clients):
        c._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


# --- framing -------------------------------------------------------------------

def _request(c: _Conn, opcode: int, flags: int, names: bytes, name_lens: tuple[int, int], rank: int, peer: int,
             tag: int, payload: Payload, timeout_ms: int, sock_timeout: float | None) -> None:
    if isinstance(payload, str):
        payload, flags = os.fsencode(payload), flags | _PATH
    if c.timeout != sock_timeout:
        c.sock.settimeout(sock_timeout)
        c.timeout = sock_timeout
    head = _REQ.pack(_REQ_FIXED + len(names) + len(payload), opcode, flags, name_lens[0], name_lens[1], 0,
                     rank, peer, tag, timeout_ms)
    if len(payload) <= _JOIN_MAX:
        c.sock.sendall(head + names + payload)
        return
    parts = (head, names, payload)
    sent = c.sock.sendmsg(parts)
    for p in parts:  # the socket's buffer filled: the rest
        if sent >= len(p):
            sent -= len(p)
            continue
        c.sock.sendall(memoryview(p)[sent:])
        sent = 0


def _response(c: _Conn, op: str) -> tuple[int, int, int, int, Any]:
    """(status, flags, from, tag, body): body is the payload's bytes, or
    for an error (status 1) the ZiptrailError to raise."""
    sock, view = c.sock, c.view
    got = 0
    while got < _RESP.size:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the sidecar closed the messaging connection")
        got += k
    n, st, flags, rl, frm, tag, _ = _RESP.unpack_from(c.buf)
    end = 4 + n
    if n < _RESP_FIXED or _RESP.size + rl > end:
        raise ConnectionError(f"a malformed response ({n} bytes, reason of {rl})")
    whole: Any = view
    if end > _BUF:  # larger than the buffer: read it into its own
        whole = memoryview(bytearray(end))
        whole[:got] = view[:got]
    while got < end:
        k = sock.recv_into(whole[got:end])
        if k == 0:
            raise ConnectionError("the sidecar closed the messaging connection")
        got += k
    off = _RESP.size + rl
    if st:
        reason = bytes(whole[_RESP.size:off]).decode("utf-8", "replace")
        message = bytes(whole[off:end]).decode("utf-8", "replace")
        return st, flags, frm, tag, from_reason(reason, op, message)
    return st, flags, frm, tag, whole[off:end].tobytes()


def _received(resp: tuple[int, int, int, int, Any]) -> tuple[int, int, Payload]:
    st, flags, frm, tag, body = resp
    if st:
        raise body
    if flags & _PATH:
        return frm, tag, os.fsdecode(body)
    return frm, tag, body


def _failed(op: str, e: BaseException, sock_timeout: float | None) -> BaseException:
    """What a call that broke its connection raises."""
    if isinstance(e, TimeoutError):
        return MessageTimeoutError(op, f"no answer from the sidecar within {sock_timeout:g}s", "MSG_TIMEOUT")
    if isinstance(e, OSError):
        return UnavailableError(op, f"messaging socket: {e}")
    return e


# --- timeouts and errors of messaging calls ----------------------------------------

#: Extra seconds a call's gRPC deadline (or socket timeout) gets over the
#: timeout it sends the sidecar, so that the sidecar's answer (MSG_TIMEOUT)
#: arrives first.
SLACK = 5.0


def timeout_ms(timeout: float | None) -> int:
    """A timeout in seconds (None: none) as the sidecar's milliseconds (0: none)."""
    if timeout is None:
        return 0
    if timeout <= 0:
        raise MessageTimeoutError("messaging", "the timeout passed")
    return max(1, math.ceil(timeout * 1000))


def slack(timeout: float | None) -> float | None:
    """The gRPC deadline or socket timeout of a call that sends the sidecar ``timeout``."""
    return None if timeout is None else timeout + SLACK


def messaging_call(client: Any, op: str, call: Callable[[], Any], peer: int | None = None) -> Any:
    """Runs a messaging call: a deadline the call hit is a message timeout,
    and a gone peer is named."""
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
