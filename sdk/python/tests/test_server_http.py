"""The function server's HTTP handling (its own request-line and header
parsing, its one-write responses), from the outside, over raw sockets."""

import json
import socket
import threading

import pytest

import ziptrail

ENV = json.dumps({"function": "f", "session": "s", "invocation": "i", "args": "aGk="}).encode()  # args: b"hi"


@pytest.fixture
def port():
    srv = ziptrail.make_server(lambda inv: inv.args, port=0, host="127.0.0.1")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def request(body: bytes = ENV, *, line: bytes = b"POST / HTTP/1.1", headers: list[bytes] | None = None) -> bytes:
    hs = headers if headers is not None else [b"Host: x", b"Content-Length: %d" % len(body)]
    return line + b"\r\n" + b"".join(h + b"\r\n" for h in hs) + b"\r\n" + body


def responses(port: int, data: bytes, n: int = 1) -> tuple[list[tuple[int, dict, bytes]], bool]:
    """Sends data, reads n responses; also says whether the server closed
    the connection after them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        f = s.makefile("rb")
        out = []
        for _ in range(n):
            status = f.readline()
            assert status.startswith(b"HTTP/1.1 "), status
            headers = {}
            while (line := f.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            out.append((int(status.split()[1]), headers, f.read(int(headers.get("content-length", "0")))))
        s.settimeout(2)
        try:
            closed = f.read(1) == b""
        except TimeoutError:
            closed = False
        return out, closed


def test_keep_alive_pipelined(port):
    got, closed = responses(port, request() * 3, 3)
    assert [(c, b) for c, _, b in got] == [(200, b"hi")] * 3
    assert got[0][1]["content-type"] == "application/octet-stream" and not closed


def test_headers_any_case_first_wins(port):
    got, _ = responses(port, request(headers=[b"content-LENGTH: %d" % len(ENV), b"Content-Length: 1", b"X-Empty:"]))
    assert (got[0][0], got[0][2]) == (200, b"hi")


@pytest.mark.parametrize("version,connection,closes", [
    (b"HTTP/1.1", None, False), (b"HTTP/1.1", b"close", True), (b"HTTP/1.1", b"Keep-Alive", False),
    (b"HTTP/1.0", None, True), (b"HTTP/1.0", b"keep-alive", False),
])
def test_connection(port, version, connection, closes):
    hs = [b"Content-Length: %d" % len(ENV)] + ([b"Connection: " + connection] if connection else [])
    got, closed = responses(port, request(line=b"POST / " + version, headers=hs))
    assert got[0][0] == 200 and closed == closes
    assert (got[0][1].get("connection") == "close") == closes


def test_expect_100_continue(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(ENV))
        f = s.makefile("rb")
        assert f.readline().startswith(b"HTTP/1.1 100")
        while f.readline() not in (b"\r\n", b""):
            pass
        s.sendall(ENV)
        assert f.readline().startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("data,code", [
    (request(headers=[b"Content-Length: %d" % len(ENV), b" folded"]), 400),
    (request(headers=[b"Content-Length: %d" % len(ENV), b"no colon"]), 400),
    (request(headers=[b"Content-Length: %d" % len(ENV), b"Space-Before-Colon : x"]), 400),  # RFC 9112 5.1
    (request(headers=[b"X-%d: y" % i for i in range(101)]), 431),
    (request(headers=[b"X-Long: " + b"y" * 70000]), 431),
    (request(line=b"POST /  x HTTP/1.1"), 400),
    (b"BREW / HTTP/1.1\r\n\r\n", 501),
])
def test_malformed_requests(port, data, code):
    got, closed = responses(port, data)
    assert got[0][0] == code and closed, got


def test_large_response_in_two_writes():
    big = b"z" * (1 << 20)
    srv = ziptrail.make_server(lambda inv: big, port=0, host="127.0.0.1")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        got, _ = responses(srv.server_address[1], request() * 2, 2)
    finally:
        srv.shutdown()
        srv.server_close()
    assert [(c, len(b)) for c, _, b in got] == [(200, len(big))] * 2 and got[0][2] == big
