"""The function server for the user container: ``serve(handler)``."""

from __future__ import annotations

import base64
import json
import mmap
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .errors import ZiptrailError
from .invocation import Invocation, decode

Handler = Callable[[Invocation], bytes | bytearray | memoryview | str | None]

OUTPUTS_CONTENT_TYPE = "application/vnd.ziptrail.outputs+json"

_current = threading.local()


def current_invocation() -> Invocation | None:
    """The invocation the calling thread is handling (used to tag outputs)."""
    return getattr(_current, "inv", None)


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
    raw = data.encode() if isinstance(data, str) else bytes(data)
    obj = {"bucket": bucket, "key": key, "size": len(raw), "inline": base64.b64encode(raw).decode()}
    if metadata:
        obj["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    outputs.append(obj)
    return len(raw)


def make_server(handler: Handler, port: int | None = None, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Builds (without starting) the HTTP server behind queue-proxy-zl."""

    class _H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as separate writes; with Nagle's algorithm
        # the body waits for the peer's delayed ACK (~40 ms per invocation).
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            try:
                inv = decode(body)
            except ZiptrailError as e:
                return self._reply(400, str(e).encode())
            _current.inv = inv
            _current.outputs = []
            try:
                out = handler(inv)
                outputs = _current.outputs
            except Exception as e:  # the function's failure is reported, not fatal
                return self._reply(500, f"{type(e).__name__}: {e}".encode())
            finally:
                _current.inv = None
                _current.outputs = None
                inv.close()
            if out is None:
                out = b""
            if isinstance(out, str):
                out = out.encode()
            if not outputs:
                return self._reply(200, bytes(out))
            body = json.dumps({"objects": outputs, "return": base64.b64encode(bytes(out)).decode()}).encode()
            self._reply(200, body, OUTPUTS_CONTENT_TYPE)

        def _reply(self, code: int, body: bytes, content_type: str = "application/octet-stream") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return ThreadingHTTPServer((host, port if port is not None else int(os.environ.get("PORT", "8080"))), _H)


def serve(handler: Handler, port: int | None = None) -> None:
    """Runs ``handler`` for every invocation until the process is stopped."""
    srv = make_server(handler, port)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
