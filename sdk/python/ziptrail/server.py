"""The function server for the user container: ``serve(handler)``."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .errors import ZiptrailError
from .invocation import Invocation, decode

Handler = Callable[[Invocation], bytes | bytearray | memoryview | str | None]

_current = threading.local()


def current_invocation() -> Invocation | None:
    """The invocation the calling thread is handling (used to tag outputs)."""
    return getattr(_current, "inv", None)


def make_server(handler: Handler, port: int | None = None, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Builds (without starting) the HTTP server behind queue-proxy-zl."""

    class _H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            try:
                inv = decode(body)
            except ZiptrailError as e:
                return self._reply(400, str(e).encode())
            _current.inv = inv
            try:
                out = handler(inv)
            except Exception as e:  # the function's failure is reported, not fatal
                return self._reply(500, f"{type(e).__name__}: {e}".encode())
            finally:
                _current.inv = None
                inv.close()
            if out is None:
                out = b""
            if isinstance(out, str):
                out = out.encode()
            self._reply(200, bytes(out))

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
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
