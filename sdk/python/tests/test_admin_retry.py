"""The session client's retries, against a stdlib HTTP gateway that comes
up late, answers 503, loses a start's answer and breaks a result's
transfer (no cluster needed)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from typing import Any

import pytest

import ziptrail
from conftest import free_port
from ziptrail.admin import Sessions

RESULT = bytes(range(256)) * 4000  # 1 MB


def test_session_calls_retry_through_an_unavailable_gateway():
    """The gateway refuses connections until the client retried three times
    (its listener starts then), answers 503 with Retry-After: 1 three times,
    closes the connection without answering the first start it carries out,
    and breaks the result's connection halfway: run() returns the whole
    result of the one session started (its retries carry one idempotency
    key) and acknowledges it."""
    state: dict[str, Any] = {"unavailable": 3, "keys": [], "lost": False, "cut": False, "acks": []}
    lock = threading.Lock()

    class Gateway(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def refuse(self) -> bool:
            with lock:
                if state["unavailable"] <= 0:
                    return False
                state["unavailable"] -= 1
            body = json.dumps({"error": "the session inputs are using all the memory reserved for them"}).encode()
            self.send_response(503)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return True

        def answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.refuse():
                return
            with lock:
                state["keys"].append(self.headers.get("Idempotency-Key"))
                lose = not state["lost"]
                state["lost"] = True
            if lose:  # started, but the answer is lost with the connection
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.answer(201, json.dumps({"id": "w-1", "namespace": "default", "workflow": "w", "state": "Running"}).encode())

        def do_GET(self) -> None:  # noqa: N802
            if self.refuse():
                return
            with lock:
                cut = not state["cut"]
                state["cut"] = True
            self.send_response(200)
            self.send_header("Content-Length", str(len(RESULT)))
            self.end_headers()
            if cut:
                self.wfile.write(RESULT[: len(RESULT) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(RESULT)

        def do_DELETE(self) -> None:  # noqa: N802
            with lock:
                state["acks"].append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    servers: list[http.server.ThreadingHTTPServer] = []
    retries: list[tuple[str, str, float]] = []

    def on_retry(op: str, why: str, pause: float) -> None:
        retries.append((op, why, pause))
        if len(retries) == 3:  # the gateway comes up
            assert all("unreachable" in w for _, w, _ in retries), retries
            srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Gateway)
            servers.append(srv)
            threading.Thread(target=srv.serve_forever, daemon=True).start()

    try:
        s = Sessions(f"http://127.0.0.1:{port}", token="t", on_retry=on_retry)
        assert s.run("w", b"in", timeout=60) == RESULT
    finally:
        for srv in servers:
            srv.shutdown()
    whys = [w for _, w, _ in retries]
    assert sum("unavailable (503)" in w for w in whys) == 3, whys
    assert all(p >= 1.0 for _, w, p in retries if "503" in w), retries  # Retry-After honoured
    assert any("cut off the result after" in w for w in whys), whys
    assert len(state["keys"]) == 2 and state["keys"][0] == state["keys"][1] and len(state["keys"][0]) == 32, state["keys"]
    assert state["acks"] == ["/v1/namespaces/default/sessions/w-1/result"], state["acks"]


def test_retries_are_bounded():
    """A gateway that stays away is reported once retry_for has passed;
    retry_for=0 reports it at once."""
    port = free_port()
    seen: list[float] = []
    with pytest.raises(ziptrail.UnavailableError, match="cannot reach the gateway"):
        Sessions(f"http://127.0.0.1:{port}", token="t", retry_for=0.5, on_retry=lambda op, why, p: seen.append(p)).start("w")
    assert seen and sum(seen) <= 0.5 + 1e-6, seen
    seen.clear()
    with pytest.raises(ziptrail.UnavailableError):
        Sessions(f"http://127.0.0.1:{port}", token="t", retry_for=0, on_retry=lambda op, why, p: seen.append(p)).start("w")
    assert not seen
