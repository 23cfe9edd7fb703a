"""The Zipline API: ``put``, ``get``, ``invoke`` and the scatter / gather /
broadcast helpers, over the pod's queue-proxy-zl sidecar.

The sidecar's local API is gRPC on a unix socket (``ZIPTRAIL_SOCKET``);
object bytes do not travel through it unless they are small. A large object
is a file in the pod's shared-memory directory (``ZIPTRAIL_SHM_DIR``): a put
writes the caller's buffer straight into a new file there and hands the
sidecar its path; a get maps the file the sidecar wrote, so the caller reads
the bytes without a copy.

Objects returned by :meth:`Client.get` (:data:`Data`):

* :class:`InlineObject` for small objects (up to the sidecar's inline
  threshold, 64 KiB by default): a ``bytes`` subclass.
* :class:`MappedObject` for large ones: an ``mmap.mmap`` subclass over the
  object's file. The file is removed from the directory as soon as it is
  mapped; its memory is released when the object is closed (``close()``,
  or leaving a ``with`` block) or garbage-collected. ``memoryview(obj)``
  and slices of it are zero-copy; ``bytes(obj)`` and ``obj[a:b]`` copy.
  ``close()`` raises ``BufferError`` while memoryviews of it are alive:
  release those first.

Both support the buffer protocol (``hashlib.sha256(obj)``, ``bytes(obj)``,
``numpy.frombuffer(obj)``), ``len()``, ``.data`` (a memoryview),
``.close()`` and the context manager protocol.

``grpc`` is imported only when a client is created, so function code that
only uses ``serve`` starts without it.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, TypeVar

from ._current import current_invocation
from ._objects import (DEFAULT_INLINE_THRESHOLD, DEFAULT_SHM_DIR, ENV_INLINE_THRESHOLD, ENV_SHM_DIR, ENV_SOCKET,  # noqa: F401 (re-exported)
                       MAX_MESSAGE_BYTES, _WRITE_CHUNK, BytesLike, Data, InlineObject, LentObject, MappedObject, SharedBuffer,
                       _lent_object, _remove, _view)
from .errors import FunctionFailedError, InvalidError, ZiptrailError, ZiptrailTimeoutError, from_reason, from_rpc_error

if TYPE_CHECKING:
    from ._fastmsg import MessageClient
    from ._proto import sidecar_pb2
    from .group import Group

@dataclass(frozen=True)
class Response:
    """A function's answer to :meth:`Client.invoke`."""

    status: int
    content_type: str
    body: bytes
    #: The callee sidecar's error class when it could not resolve the
    #: inputs (status 424), e.g. ``PRODUCER_GONE``; the function never ran.
    error_reason: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)

    def raise_for_status(self, url: str = "") -> Response:
        """Raises FunctionFailedError unless the status is 2xx."""
        if not self.ok:
            snippet = self.body[:512].decode("utf-8", "replace")
            message = f"{url or 'the function'} answered {self.status}: {snippet}"
            if self.error_reason:
                raise from_reason(self.error_reason, "invoke", message)
            raise FunctionFailedError("invoke", message)
        return self


T = TypeVar("T")
R = TypeVar("R")


class Client:
    """A connection to the pod's sidecar.

    ``socket`` and ``shm_dir`` default to ``$ZIPTRAIL_SOCKET`` and
    ``$ZIPTRAIL_SHM_DIR`` (else the sidecar's own defaults in a pod);
    objects up to ``inline_threshold`` bytes travel inside the request
    (``$ZIPTRAIL_INLINE_THRESHOLD``, default 64 KiB); ``timeout`` (seconds)
    bounds every call, None waits as long as the sidecar works on it.
    Clients are safe to share between threads.
    """

    def __init__(self, socket: str | None = None, shm_dir: str | None = None, *,
                 inline_threshold: int | None = None, timeout: float | None = None) -> None:
        import grpc

        from ._proto import sidecar_pb2, sidecar_pb2_grpc

        self.shm_dir = os.path.abspath(shm_dir or os.environ.get(ENV_SHM_DIR) or DEFAULT_SHM_DIR)
        self.socket = os.path.abspath(socket or os.environ.get(ENV_SOCKET) or os.path.join(os.path.dirname(self.shm_dir), "sidecar.sock"))
        if inline_threshold is None:
            env = os.environ.get(ENV_INLINE_THRESHOLD, "")
            inline_threshold = int(env) if env.isdigit() else DEFAULT_INLINE_THRESHOLD
        self.inline_threshold = inline_threshold
        self.timeout = timeout
        self._pb = sidecar_pb2
        self._channel = grpc.insecure_channel("unix://" + self.socket, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ])
        self._stub = sidecar_pb2_grpc.SidecarStub(self._channel)
        self._msg: MessageClient | None = None
        self._msg_lock = threading.Lock()

    # --- plumbing -----------------------------------------------------------

    def close(self) -> None:
        self._channel.close()
        if self._msg is not None:
            self._msg.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, op: str, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        import grpc

        timeout = timeout if timeout is not None else self.timeout
        start = time.monotonic()
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            err = from_rpc_error(op, e, self.socket)
            # The sidecar also tracks the deadline and, when it fires there
            # first, resets the stream: gRPC then reports CANCELLED or
            # INTERNAL ("Stream removed"), not DEADLINE_EXCEEDED. As the gRPC
            # protocol advises, a failure after the deadline is a timeout.
            if (timeout is not None and time.monotonic() - start >= timeout
                    and getattr(e, "code", lambda: None)() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL)):
                err = ZiptrailTimeoutError(op, f"deadline of {timeout:g}s exceeded ({err})")
            raise err from None

    def allocate(self, size: int) -> SharedBuffer:
        """A writable buffer of ``size`` bytes in the shared-memory
        directory, for objects built in place (no copy at all on put)."""
        if size < 0:
            raise InvalidError("allocate", f"size must not be negative, got {size}")
        fd, path = self._mkstemp("put-")
        os.close(fd)
        try:
            return SharedBuffer(path, size)
        except BaseException:
            _remove(path)
            raise

    def _mkstemp(self, prefix: str) -> tuple[int, str]:
        try:
            return tempfile.mkstemp(prefix=prefix, dir=self.shm_dir)
        except OSError as e:
            raise ZiptrailError("put", f"cannot create an object file in the shared-memory directory {self.shm_dir}: {e}") from None

    def _payload(self, obj: Any, op: str, links: int = 1) -> list[sidecar_pb2.Payload]:
        """``links`` protobuf payloads for obj (see :meth:`_raw_payloads`)."""
        pb = self._pb
        return [pb.Payload(path=p) if isinstance(p, str) else pb.Payload(inline=p)
                for p in self._raw_payloads(obj, op, links)]

    def _raw_payloads(self, obj: Any, op: str, links: int = 1) -> list[bytes | str]:
        """``links`` payloads for obj: the bytes when small, else (a str)
        the path of one file in the shared-memory directory written once
        (plus hard links to it, one per extra request: each request's file
        is taken over by the sidecar)."""
        if isinstance(obj, SharedBuffer):
            if obj.size <= self.inline_threshold:
                data = bytes(obj.data)
                obj.discard()
                return [data] * links
            path = obj._take()
        else:
            if type(obj) is bytes and len(obj) <= self.inline_threshold:
                return [obj] * links
            mv = _view(obj)
            if mv.nbytes <= self.inline_threshold:
                return [mv.tobytes()] * links
            fd, path = self._mkstemp("put-")
            try:
                off, n = 0, mv.nbytes
                while off < n:
                    off += os.write(fd, mv[off:off + _WRITE_CHUNK])
            except BaseException as e:
                os.close(fd)
                _remove(path)
                if isinstance(e, OSError):
                    raise ZiptrailError(op, f"write the object into {self.shm_dir}: {e}") from None
                raise
            os.close(fd)
        paths: list[bytes | str] = [path]
        try:
            for i in range(1, links):
                paths.append(f"{path}.{i}")
                os.link(path, paths[-1])
        except OSError as e:
            for p in paths:
                _remove(str(p))
            raise ZiptrailError(op, f"link the object file for {links} requests: {e}") from None
        return paths

    @staticmethod
    def _discard(payload: sidecar_pb2.Payload | bytes | str) -> None:
        """Removes a payload file the sidecar refused before taking it."""
        if isinstance(payload, str):
            _remove(payload)
        elif not isinstance(payload, bytes) and payload.WhichOneof("source") == "path":
            _remove(payload.path)

    def _open(self, op: str, payload: sidecar_pb2.Payload, source: str) -> Data:
        which = payload.WhichOneof("source")
        if which is None:
            raise ZiptrailError(op, "the sidecar answered without an object")
        return self._data(op, payload.inline if which == "inline" else payload.path, source)

    def _data(self, op: str, payload: bytes | str, source: str) -> Data:
        """The object of a payload: inline bytes, or (a str) the path of a
        file the sidecar wrote, mapped and then removed."""
        out: Data
        if not isinstance(payload, str):
            out = InlineObject(payload)
        else:
            path = payload
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise ZiptrailError(op, f"open the object file {path} the sidecar wrote: {e}") from None
            try:
                size = os.fstat(fd).st_size
                out = MappedObject(fd, size, prot=mmap.PROT_READ) if size else InlineObject(b"")
            finally:
                os.close(fd)
                _remove(path)  # the mapping keeps the pages; nothing leaks if we crash
        out.source = source
        return out

    def _messages(self) -> MessageClient:
        """The messaging fast path's client (made on first use)."""
        m = self._msg
        if m is None:
            with self._msg_lock:
                if self._msg is None:
                    from ._fastmsg import MessageClient, socket_path
                    self._msg = MessageClient(socket_path(self.socket))
                m = self._msg
        return m

    # --- the Zipline API ------------------------------------------------------

    def put(self, obj: BytesLike, n: int = 1, ttl: float | None = None, *, session: str = "",
            timeout: float | None = None) -> str:
        """Buffers ``obj`` in this pod for ``n`` reads and returns its
        reference. ``ttl`` (seconds) overrides the sidecar's default object
        lifetime; ``session`` frees the object with that session."""
        if not 1 <= n <= 0xFFFFFFFF:
            raise InvalidError("put", f"n (allowed reads) must be between 1 and 2^32-1, got {n}")
        if ttl is not None and ttl <= 0:
            raise InvalidError("put", f"ttl must be positive, got {ttl}")
        (payload,) = self._payload(obj, "put")
        req = self._pb.PutRequest(object=payload, reads=n, ttl_ms=0 if ttl is None else max(1, round(ttl * 1000)), session=session)
        try:
            return self._call("put", self._stub.Put, req, timeout).ref
        except BaseException:
            self._discard(payload)
            raise

    def get(self, ref: str, *, timeout: float | None = None) -> Data:
        """Retrieves a referenced object (see the module doc for its type
        and lifetime). Each call spends one of the reference's reads."""
        if not isinstance(ref, str) or not ref:
            raise InvalidError("get", "a reference must be a non-empty string")
        resp = self._call("get", self._stub.Get, self._pb.GetRequest(ref=ref), timeout)
        return self._open("get", resp.object, resp.source)

    def invoke(self, url: str, obj: BytesLike = b"", *, function: str = "", session: str = "", bucket: str = "",
               key: str = "", args: bytes = b"", timeout: float | None = None) -> Response:
        """Calls the function at ``url`` with ``obj`` as its input object and
        returns its response. A large object stays in this pod until the
        callee's sidecar pulled it (one read); a small one travels inline.
        The callee sees it as ``inv.objects[0]`` (bucket ``input`` unless
        given). A non-2xx answer is returned, not raised: see
        :meth:`Response.raise_for_status`."""
        return self._invoke_all([url], obj, function=function, session=session, bucket=bucket, key=key, args=args, timeout=timeout)[0]

    def _invoke_all(self, urls: Sequence[str], obj: BytesLike, *, max_workers: int | None = None, **kw: Any) -> list[Response]:
        for url in urls:
            if not url:
                raise InvalidError("invoke", "a function URL is required")
        if not urls:
            return []
        payloads = self._payload(obj, "invoke", links=len(urls))
        timeout = kw.pop("timeout", None)

        def one(i: int) -> Response:
            req = self._pb.InvokeRequest(url=urls[i], object=payloads[i], **kw)
            try:
                r = self._call("invoke", self._stub.Invoke, req, timeout)
            except BaseException:
                self._discard(payloads[i])
                raise
            return Response(status=r.status, content_type=r.content_type, body=r.body, error_reason=r.error_reason)

        return _parallel(one, range(len(urls)), max_workers)

    def scatter(self, url: str, objs: Iterable[BytesLike], *, max_workers: int | None = None, **kw: Any) -> list[Response]:
        """Invokes ``url`` once per object, concurrently (each invocation
        gets a different object); responses in the order of ``objs``."""
        return _parallel(lambda o: self.invoke(url, o, **kw), list(objs), max_workers)

    def broadcast(self, urls: Sequence[str], obj: BytesLike, *, max_workers: int | None = None, **kw: Any) -> list[Response]:
        """Invokes every URL with the same object, concurrently. The SDK
        writes a large object once (one shared-memory file, hard-linked
        per request); responses in the order of ``urls``."""
        return self._invoke_all(list(urls), obj, max_workers=max_workers, **kw)

    def gather(self, refs: Iterable[str], *, max_workers: int | None = None, timeout: float | None = None) -> list[Data]:
        """Retrieves many references concurrently (the fan-in side);
        results in the order of ``refs``. On an error the objects already
        retrieved are closed and the first error is raised."""
        return _parallel(lambda r: self.get(r, timeout=timeout), list(refs), max_workers, cleanup=lambda d: d.close())

    # --- direct messages (ziptrail.group) --------------------------------------

    def join(self, session: str, group: str, rank: int, size: int, *, mailbox: bool = False,
             invocation_id: str | None = None, wait_all: bool = False, timeout: float | None = None) -> Group:
        """Joins ``group`` of ``session`` as ``rank`` of ``size`` and returns
        the membership (send, recv, collectives: see :mod:`ziptrail.group`).
        ``invocation_id`` (default: the handler's invocation when called in
        one for this session, else none) ends the membership with that
        invocation; without one, call :meth:`Group.leave`. ``mailbox`` keeps
        messages for ranks not running; ``wait_all`` returns once every rank
        joined (up to ``timeout`` seconds)."""
        from .group import Group
        return Group._join(self, session, group, rank, size, mailbox=mailbox, invocation_id=invocation_id,
                           wait_all=wait_all, timeout=timeout)

    # --- the Pheromone calls (see ziptrail.bucket for the user library) -----

    def send_object(self, bucket: str, key: str, obj: BytesLike, *, session: str = "", persist: bool = False,
                    metadata: dict[str, str] | None = None, invocation_id: str = "",
                    timeout: float | None = None) -> sidecar_pb2.SendObjectResponse:
        """SendObject through the sidecar: buffered in this pod, reported to
        the operator's trigger engine, and with ``persist`` also written to
        the slow tier."""
        (payload,) = self._payload(obj, "send_object")
        req = self._pb.SendObjectRequest(session=session, bucket=bucket, key=key, object=payload, persist=persist,
                                         metadata=metadata or {}, invocation_id=invocation_id)
        try:
            return self._call("send_object", self._stub.SendObject, req, timeout)
        except BaseException:
            self._discard(payload)
            raise

    def get_object(self, bucket: str, key: str, *, session: str = "", timeout: float | None = None) -> Data:
        """GetObject through the sidecar: an object this pod sent, else a
        persisted one."""
        resp = self._call("get_object", self._stub.GetObject,
                          self._pb.GetObjectRequest(session=session, bucket=bucket, key=key), timeout)
        return self._open("get_object", resp.object, resp.source)

    # --- shuffle storage (ziptrail.shuffle) -----------------------------------

    def _tier(self, op: str, tier: str | int) -> int:
        t = {"fast": self._pb.TIER_FAST, "redis": self._pb.TIER_FAST, "slow": self._pb.TIER_SLOW,
             "s3": self._pb.TIER_SLOW}.get(tier) if isinstance(tier, str) else tier
        if t not in (self._pb.TIER_FAST, self._pb.TIER_SLOW):
            raise InvalidError(op, f"tier must be 'fast' (Redis) or 'slow' (S3), got {tier!r}")
        return t

    def tier_put(self, tier: str, session: str, key: str, obj: BytesLike, *, ttl: float | None = None,
                 timeout: float | None = None) -> int:
        """TierPut: writes ``obj`` under ``key`` in the fast (``"fast"``,
        Redis) or slow (``"slow"``, S3) tier through the sidecar, scoped to
        the pod's namespace and ``session``; ``ttl`` (seconds, fast tier
        only) overrides the sidecar's object lifetime. Returns the size."""
        t = self._tier("tier_put", tier)
        if ttl is not None and ttl <= 0:
            raise InvalidError("tier_put", f"ttl must be positive, got {ttl}")
        (payload,) = self._payload(obj, "tier_put")
        req = self._pb.TierPutRequest(tier=t, session=session, key=key, object=payload,
                                      ttl_ms=0 if ttl is None else max(1, round(ttl * 1000)))
        try:
            return self._call("tier_put", self._stub.TierPut, req, timeout).size
        except BaseException:
            self._discard(payload)
            raise

    def tier_get(self, tier: str, session: str, key: str, *, timeout: float | None = None) -> Data:
        """TierGet: reads ``key`` of ``session`` from a tier (see
        :meth:`tier_put`); a missing key raises :class:`NotFoundError`."""
        req = self._pb.TierGetRequest(tier=self._tier("tier_get", tier), session=session, key=key)
        resp = self._call("tier_get", self._stub.TierGet, req, timeout)
        return self._open("tier_get", resp.object, resp.source)

    def tier_delete(self, tier: str, session: str, keys: Iterable[str], *, timeout: float | None = None) -> None:
        """TierDelete: removes ``keys`` of ``session`` from a tier (missing
        keys are not an error)."""
        req = self._pb.TierDeleteRequest(tier=self._tier("tier_delete", tier), session=session, keys=list(keys))
        self._call("tier_delete", self._stub.TierDelete, req, timeout)


def _parallel(fn: Callable[[T], R], items: Sequence[T], max_workers: int | None,
              cleanup: Callable[[R], None] | None = None) -> list[R]:
    if not items:
        return []
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(max_workers=max_workers or min(32, len(items))) as ex:
        futures = [ex.submit(fn, it) for it in items]
        results: list[R] = []
        first: BaseException | None = None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as e:  # noqa: BLE001 - re-raised below
                first = first or e
    if first is not None:
        if cleanup is not None:
            for r in results:
                cleanup(r)
        raise first
    return results


# --- module-level API over a lazily created default client ---------------

_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client configured from the environment."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def join(group: str, rank: int, size: int, *, session: str | None = None, mailbox: bool = False, wait_all: bool = False,
         timeout: float | None = None, client: Client | None = None, invocation_id: str | None = None) -> Group:
    """Joins ``group`` as ``rank`` of ``size`` from inside a handler: the
    session and the invocation (whose end ends the membership) are the
    handler's. Outside a handler pass ``session`` (and leave the group)."""
    inv = current_invocation()
    if session is None:
        if inv is None:
            raise InvalidError("join", "called outside a function invocation: pass session= (or use Client.join)")
        session = inv.session
    return (client or default_client()).join(session, group, rank, size, mailbox=mailbox, invocation_id=invocation_id,
                                             wait_all=wait_all, timeout=timeout)


def set_default_client(client: Client | None) -> None:
    """Replaces (or, with None, forgets) the default client."""
    global _default
    with _default_lock:
        _default = client


def put(obj: BytesLike, n: int = 1, ttl: float | None = None, *, session: str = "") -> str:
    """Zipline's ``put(obj, N)``: buffers obj in this pod for n reads and
    returns its reference (see :meth:`Client.put`)."""
    return default_client().put(obj, n, ttl, session=session)


def get(ref: str) -> Data:
    """Zipline's ``get(ref)``: the referenced object, mapped without a copy
    when large (see :meth:`Client.get`)."""
    return default_client().get(ref)


def invoke(url: str, obj: BytesLike = b"", **kw: Any) -> Response:
    """Zipline's ``invoke(url, obj)`` (see :meth:`Client.invoke`)."""
    return default_client().invoke(url, obj, **kw)


def allocate(size: int) -> SharedBuffer:
    """A buffer in shared memory for a zero-copy put (see :meth:`Client.allocate`)."""
    return default_client().allocate(size)


def scatter(url: str, objs: Iterable[BytesLike], **kw: Any) -> list[Response]:
    """See :meth:`Client.scatter`."""
    return default_client().scatter(url, objs, **kw)


def broadcast(urls: Sequence[str], obj: BytesLike, **kw: Any) -> list[Response]:
    """See :meth:`Client.broadcast`."""
    return default_client().broadcast(urls, obj, **kw)


def gather(refs: Iterable[str], **kw: Any) -> list[Data]:
    """See :meth:`Client.gather`."""
    return default_client().gather(refs, **kw)
