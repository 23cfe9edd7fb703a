"""The function server for the user container: ``serve(handler)``."""

from __future__ import annotations

import base64
import ipaddress
import json
import mmap
import os
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from ._current import _current, current_invocation  # noqa: F401 (the API's)
from ._idempotency import Answer, Record, Records
from .errors import InvalidError, ZiptrailError
from .invocation import MAX_ENVELOPE_BYTES, Invocation, _open_inputs, _parse, _shm_dir

Handler = Callable[[Invocation], bytes | bytearray | memoryview | str | None]

OUTPUTS_CONTENT_TYPE = "application/vnd.ziptrail.outputs+json"

#: On an answer replayed from the function server's record: the handler did
#: not run again (Go: invocation.HeaderReplayed; the sidecar's replays say
#: the same).
HEADER_REPLAYED = "Ziptrail-Idempotent-Replay"


class _BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


#: Limits of a request's header lines, as http.client's.
_MAX_LINE, _MAX_HEADERS = 65536, 100

#: Bodies up to this size go out in one write with their headers.
_ONE_WRITE = 64 << 10


class _Headers(dict):
    """A request's headers, by lower-cased name (the first of repeated
    ones, as ``email.message.Message.get``)."""

    def get(self, name: str, default=None):  # type: ignore[override]
        return dict.get(self, name.lower(), default)


def _read_headers(rfile) -> _Headers:
    """Header lines up to the blank line: what ``http.client.parse_headers``
    reads, without the email package's parser (its ~25 µs were the largest
    share of a trivial invocation's time in this server)."""
    headers = _Headers()
    for _ in range(_MAX_HEADERS + 1):
        line = rfile.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise _BadRequest(431, "Line too long")
        if line in (b"\r\n", b"\n", b""):
            return headers
        if line[:1] in (b" ", b"\t"):  # obsolete line folding (RFC 9112 5.2: may be refused)
            raise _BadRequest(400, "folded header line")
        name, sep, value = line.decode("iso-8859-1").partition(":")
        name = name.lower()
        if not sep or not name or name != name.strip():
            raise _BadRequest(400, f"malformed header line {line[:40]!r}")
        headers.setdefault(name, value.strip())
    raise _BadRequest(431, f"more than {_MAX_HEADERS} headers")


def send_object(bucket: str, key: str, data: bytes | bytearray | memoryview | str,
                metadata: dict[str, str] | None = None) -> None:
    """Sends an object with the invocation's response (Pheromone's send_object).

    Called inside a handler; the object becomes ready when the handler
    returns, and the bucket's triggers decide what it invokes. ``metadata``
    carries e.g. the DynamicGroup group or a DynamicJoin's expected set.
    ``ziptrail.send_object`` (ziptrail.bucket) is the general form; this one
    always uses the response.
    """
    if not _in_invocation():
        raise ZiptrailError("send_object", "called outside a function invocation")
    _append_output(bucket, key, data, metadata)


def _in_invocation() -> bool:
    return getattr(_current, "outputs", None) is not None


def _append_output(bucket: str, key: str, data: bytes | bytearray | memoryview | mmap.mmap | str,
                   metadata: dict[str, str] | None) -> int:
    """Adds an object to the current invocation's outputs; returns its size."""
    outputs = getattr(_current, "outputs", None)
    if outputs is None:
        raise ZiptrailError("send_object", "called outside a function invocation")
    if not bucket or not key:
        raise ZiptrailError("send_object", "bucket and key are required")
    if isinstance(data, str):
        data = data.encode()
    size = memoryview(data).nbytes
    ref = _put_by_reference(data, size)
    if ref:
        obj = {"bucket": bucket, "key": key, "size": size, "ref": ref}
    else:
        obj = {"bucket": bucket, "key": key, "size": size, "inline": base64.b64encode(bytes(data)).decode()}
    if metadata:
        obj["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    outputs.append(obj)
    return size


#: Objects a handler sends larger than this go into the pod's shared memory
#: through the sidecar (a put) and travel in the response as a reference:
#: no base64 copy in the response, and no cap but the pod's object store
#: (the response's is 64 MiB). Go: byReference in sdk/go/bucket.go.
BY_REFERENCE = 1 << 20


def _put_by_reference(data, size: int) -> str:
    """Puts a large output into the pod's object store for the session and
    returns its reference, or "" to send it inline (small, or no sidecar:
    a handler served without one, as in a unit test). The object is freed
    with its session or its TTL, as the sidecar's own copies of outputs."""
    if size <= BY_REFERENCE:
        return ""
    from . import client as _client  # the server runs without a client until a handler needs one
    c = _client._default
    if c is None:
        sock = os.environ.get(_client.ENV_SOCKET, "")
        if not sock or not os.path.exists(sock):
            return ""
        c = _client.default_client()
    inv = getattr(_current, "inv", None)
    return c.put(data, n=0xFFFFFFFF, session=inv.session if inv is not None else "")


def _call(handler: Handler, inv: Invocation) -> Answer:
    """Runs the handler on an invocation whose inputs are open, and closes
    them: the answer (status, content type, body)."""
    _current.inv = inv
    _current.outputs = []
    try:
        out = handler(inv)
        outputs = _current.outputs
        # Made into bytes while the inputs are still mapped: the handler may
        # return a view of one (inv.objects[0].data), which closing them
        # releases. The answer (and its record) is a copy.
        out = b"" if out is None else out.encode() if isinstance(out, str) else bytes(out)
    except Exception as e:  # the function's failure is reported, not fatal
        # ...and logged with its traceback: the container's log is
        # where an operator looks first (kubectl logs).
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        return 500, "application/octet-stream", f"{type(e).__name__}: {e}".encode()
    finally:
        _current.inv = None
        _current.outputs = None
        inv.close()
    if not outputs:
        return 200, "application/octet-stream", out
    # Objects sent with send_object travel inline in the answer: it holds
    # everything the sidecar needs, nothing that ends with the request.
    body = json.dumps({"objects": outputs, "return": base64.b64encode(out).decode()}).encode()
    return 200, OUTPUTS_CONTENT_TYPE, body


def _loopback(host: str) -> bool:
    """Whether a peer address is the loopback interface: the pod's sidecar
    (queue-proxy-zl reaches the user container at 127.0.0.1, as Knative's
    queue-proxy does), not a caller elsewhere in the cluster."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def make_server(handler: Handler, port: int | None = None, host: str = "0.0.0.0",
                shm_dir: str | None = None) -> ThreadingHTTPServer:
    """Builds (without starting) the HTTP server behind queue-proxy-zl.

    Inputs the sidecar pulled are read from the pod's object directory
    ``shm_dir`` (default ``$ZIPTRAIL_SHM_DIR``), and only those: see
    :func:`ziptrail.decode`. A malformed envelope gets 400 with the reason.

    **Idempotency records.** An invocation (a POST; probes are not) whose
    envelope carries the idempotency key the pod's sidecar sets
    (``idempotencyKey``) runs the handler at most once per server: a
    delivery of a key that already ran gets that run's answer — status,
    content type and body, plus ``Ziptrail-Idempotent-Replay: 1`` —
    without calling the handler, and one that arrives while the key runs
    waits for that run. The answer is recorded before it is written, so a
    caller that died (a sidecar SIGKILLed mid-call) does not lose it: the
    dispatcher's resend through the restarted sidecar gets it. A failure
    (500) is an answer like any other. Records are bounded — 4,096 keys,
    64 MiB of answers, oldest out first, each kept 10 minutes — and an
    answer over 16 MiB is not recorded (a resend of its key runs again).
    A request without that key, or from anywhere but the loopback interface
    (straight to the pod's IP, not through the sidecar), is never recorded
    and never answered from a record. The records live in this process: a new
    process (the function container restarted) runs a resent key again,
    which is why delivery is at least once (docs/guarantees.md)."""
    directory = shm_dir if shm_dir is not None else _shm_dir()
    records = Records()

    class _H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as separate writes; with Nagle's algorithm
        # the body waits for the peer's delayed ACK (~40 ms per invocation).
        disable_nagle_algorithm = True

        def parse_request(self) -> bool:
            """BaseHTTPRequestHandler.parse_request for the requests the
            sidecar sends (``<method> <path> HTTP/1.x``) with a cheaper
            header parser; any other request line gets the standard one."""
            words = self.raw_requestline.split()
            if len(words) != 3 or words[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
                return super().parse_request()
            self.command, self.path, self.request_version = (w.decode("iso-8859-1") for w in words)
            self.requestline = self.raw_requestline.decode("iso-8859-1").rstrip("\r\n")
            if self.path.startswith("//"):
                self.path = "/" + self.path.lstrip("/")
            try:
                self.headers = _read_headers(self.rfile)
            except _BadRequest as e:
                self.close_connection = True
                self.send_error(e.code, str(e))
                return False
            conn = self.headers.get("connection", "").lower()
            if self.request_version == "HTTP/1.1":
                self.close_connection = conn == "close"
                if self.headers.get("expect", "").lower() == "100-continue":
                    return self.handle_expect_100()
            else:
                self.close_connection = conn != "keep-alive"
            return True

        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            try:
                body = self._body()
            except _BadRequest as e:
                self.close_connection = True  # the body was not (all) read
                return self._reply(e.code, str(e).encode())
            try:
                inv, specs, key = _parse(body)
            except InvalidError as e:
                return self._reply(400, str(e).encode())
            except ZiptrailError as e:
                return self._reply(500, str(e).encode())
            if not key or not _loopback(self.client_address[0]):
                # Not through the pod's sidecar: not recorded, and no record
                # answers it (a caller straight to the pod's IP may not read
                # another invocation's answer by its key).
                return self._run(inv, specs, None)
            while True:
                rec, mine = records.begin(key)
                if mine:
                    return self._run(inv, specs, rec)
                answer = rec.wait()  # the inputs are not opened for a replay
                if answer is not None:
                    return self._reply(answer[0], answer[2], answer[1], replayed=True)
                # That run ended without an answer: this delivery runs it.

        def _run(self, inv: Invocation, specs: list, rec: Record | None) -> None:
            """Opens the inputs, runs the handler, records its answer under
            the key (rec), then writes it."""
            recorded = False
            try:
                try:
                    _open_inputs(inv, specs, directory)
                except InvalidError as e:
                    return self._reply(400, str(e).encode())
                except ZiptrailError as e:
                    return self._reply(500, str(e).encode())
                answer = _call(handler, inv)
                if rec is not None:
                    # Before the answer is written: a caller gone by now
                    # (its sidecar killed) would otherwise cost the key a
                    # second run when it is resent.
                    records.finish(rec, answer)
                    recorded = True
                self._reply(answer[0], answer[2], answer[1])
            finally:
                if rec is not None and not recorded:
                    records.abandon(rec)  # the handler did not answer: a later delivery runs it

        def _body(self) -> bytes:
            """The request body (Content-Length or chunked), at most
            MAX_ENVELOPE_BYTES."""
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                return self._chunked()
            raw = (self.headers.get("Content-Length") or "0").strip()
            if not raw.isdigit():
                raise _BadRequest(400, f"invalid Content-Length {raw!r:.40}")
            length = int(raw)
            if length > MAX_ENVELOPE_BYTES:
                raise _BadRequest(413, f"envelope exceeds {MAX_ENVELOPE_BYTES} bytes; send large objects by reference")
            body = self.rfile.read(length)
            if len(body) != length:
                raise _BadRequest(400, f"body ended after {len(body)} of {length} bytes (Content-Length)")
            return body

        def _chunked(self) -> bytes:
            parts, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise _BadRequest(400, "malformed chunked body") from None
                if size < 0:
                    raise _BadRequest(400, "malformed chunked body")
                if size == 0:
                    break
                total += size
                if total > MAX_ENVELOPE_BYTES:
                    raise _BadRequest(413, f"envelope exceeds {MAX_ENVELOPE_BYTES} bytes; send large objects by reference")
                chunk = self.rfile.read(size)
                if len(chunk) != size or self.rfile.readline(1024) not in (b"\r\n", b"\n"):
                    raise _BadRequest(400, "malformed chunked body")
                parts.append(chunk)
            while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)

        def _reply(self, code: int, body: bytes, content_type: str = "application/octet-stream",
                   replayed: bool = False) -> None:
            # Status line, headers and a small body in one write: one
            # segment for the caller to read instead of two.
            head = "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
                code, self.responses.get(code, ("",))[0], content_type, len(body),
                HEADER_REPLAYED + ": 1\r\n" if replayed else "",
                "Connection: close\r\n" if self.close_connection else "")
            if len(body) <= _ONE_WRITE:
                self.wfile.write(head.encode("latin-1") + body)
            else:
                self.wfile.write(head.encode("latin-1"))
                self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return ThreadingHTTPServer((host, port if port is not None else int(os.environ.get("PORT", "8080"))), _H)


def serve(handler: Handler, port: int | None = None, shm_dir: str | None = None) -> None:
    """Runs ``handler`` for every invocation until the process is stopped;
    an invocation's idempotency key runs at most once in this process (see
    :func:`make_server`)."""
    srv = make_server(handler, port, shm_dir=shm_dir)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
