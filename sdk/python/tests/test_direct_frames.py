"""The direct channel's framing at the receiver (ziptrail._direct), over a
real SOCK_SEQPACKET socketpair: the copy frames (kind 4) a Go sender uses
for messages of up to COPY_MAX bytes, well formed and hostile."""

from __future__ import annotations

import array
import os
import socket
import struct

import pytest

import ziptrail
from ziptrail import _direct, _directrecv

H = struct.Struct("<IBqQ")
M = _direct.MAGIC


def memfd(data: bytes, size: int | None = None) -> int:
    fd = os.memfd_create("x", os.MFD_CLOEXEC)
    os.ftruncate(fd, len(data) if size is None else size)
    os.pwrite(fd, data, 0)
    return fd


def send(s: socket.socket, parts: list[bytes], *fds: int) -> None:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    s.sendmsg(parts, anc)
    for fd in fds:
        os.close(fd)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_copy_frame_is_copied_out_and_credited():
    """The sender's memfd (unsealed, bigger than the message, as a reused
    one is) is read for the announced size; the receiver holds a copy (the
    sender writing the memfd afterwards changes nothing) and credits it."""
    s, r = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with s, r:
        data = os.urandom(1 << 20)
        fd = memfd(data, size=_direct.COPY_MAX)
        keep = os.dup(fd)
        send(s, [H.pack(M, _direct.COPY, 7, len(data))], fd)
        base = open_fds()
        tag, got = _directrecv.FrameReader().read(r)
        assert tag == 7 and bytes(got) == data
        os.pwrite(keep, b"\0" * len(data), 0)  # the sender reuses its memfd
        os.close(keep)
        assert bytes(got) == data
        assert H.unpack(s.recv(64)) == (M, _direct.CREDIT, 0, len(data))
        assert open_fds() <= base


def test_sender_closed_with_credits_unread():
    """A sender that closes with credits it has not read resets its
    receiver, and Linux reports that reset once, before the frames still
    queued: the receiver reads every frame sent before the close, then
    the end (EOFError). The reset is not the end (a Go member's last
    echoes were lost this way when it exited before the Python member had
    read them)."""
    s, r = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with r:
        sent = [os.urandom(1 << 20), os.urandom(1 << 20), b"last"]
        for i, data in enumerate(sent[:2]):
            send(s, [H.pack(M, _direct.COPY, i, len(data))], memfd(data, size=_direct.COPY_MAX))
        send(s, [H.pack(M, _direct.INLINE, 2, len(sent[2])), sent[2]])
        fr = _directrecv.FrameReader()
        tag, got = fr.read(r)  # its credit waits, unread, in the sender's socket
        assert tag == 0 and bytes(got) == sent[0]
        s.close()
        for i in (1, 2):
            got_frame = fr.read(r)
            assert got_frame is not None, f"frame {i}"
            tag, got = got_frame
            assert tag == i and bytes(got) == sent[i]
        with pytest.raises(EOFError):
            fr.read(r)


@pytest.mark.parametrize("name", ["pipe", "regular file", "short memfd", "no descriptor", "over COPY_MAX",
                                  "small enough for inline", "two memfds"])
def test_hostile_copy_frames(name: str, tmp_path):
    """A frame error, no credit, every descriptor closed, never a hang."""
    s, r = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    size = 1 << 20
    pr, pw = os.pipe()
    try:
        with s, r:
            base = open_fds()
            hdr = H.pack(M, _direct.COPY, 0, size)
            if name == "pipe":
                send(s, [hdr], os.dup(pr))
            elif name == "regular file":
                p = tmp_path / "f"
                p.write_bytes(b"x" * size)
                send(s, [hdr], os.open(p, os.O_RDONLY))
            elif name == "short memfd":
                send(s, [hdr], memfd(b"x" * (size - 1)))
            elif name == "no descriptor":
                send(s, [hdr])
            elif name == "over COPY_MAX":
                big = _direct.COPY_MAX + 1
                send(s, [H.pack(M, _direct.COPY, 0, big)], memfd(b"", size=big))
            elif name == "small enough for inline":
                send(s, [H.pack(M, _direct.COPY, 0, 10)], memfd(b"x" * 10))
            elif name == "two memfds":
                send(s, [hdr], memfd(b"x" * size), memfd(b"x" * size))
            with pytest.raises(_direct.FrameError):
                _directrecv.FrameReader().read(r)
            assert open_fds() <= base | {str(s.fileno()), str(r.fileno())}
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(64)  # no credit
    finally:
        os.close(pr)
        os.close(pw)


# --- TCP channels across nodes (byte streams) ---------------------------------------------

def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A real loopback TCP connection: (the sender's end, the receiver's)."""
    with socket.create_server(("127.0.0.1", 0)) as ln:
        s = socket.create_connection(ln.getsockname())
        r, _ = ln.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    r.setblocking(False)
    return s, r


def read_all(reader: _directrecv.StreamReader, r: socket.socket, n: int, timeout: float = 60) -> list[tuple[int, bytes]]:
    """n frames off r (waiting for them with poll, as the reader thread)."""
    import select
    out = []
    p = select.poll()
    p.register(r, select.POLLIN)
    while len(out) < n:
        got = reader.read(r)
        if got is None:
            assert p.poll(int(timeout * 1000)), "no frame in time"
            continue
        out.append((got[0], bytes(got[1])))
    return out


def test_stream_reader_takes_frames_of_every_size():
    """Frames smaller and larger than the reader's buffer, and than what it
    allocates up front, split anywhere by TCP, arrive whole and in order;
    the sender's end is EOFError."""
    import threading
    s, r = tcp_pair()
    sizes = [0, 1, 100, 200_000, 300_000, 5 << 20, _direct.STREAM_PREALLOC + 1]
    bodies = [bytes([i + 1]) * n for i, n in enumerate(sizes)]
    reader = _directrecv.StreamReader()

    def write() -> None:
        for i, b in enumerate(bodies):
            s.sendall(_direct.header(_direct.INLINE, i, len(b)) + b[:7])
            s.sendall(b[7:])
            reader.credit(r)  # what the receiving member does while its inbox has room
        _direct.Sender(s).close()  # the FIN after the last frame, whatever credits come meanwhile

    t = threading.Thread(target=write)
    t.start()
    got = read_all(reader, r, len(sizes))
    t.join()
    assert [(tag, len(b)) for tag, b in got] == [(i, n) for i, n in enumerate(sizes)]
    assert [b for _, b in got] == bodies
    with pytest.raises(EOFError):
        read_all(reader, r, 1)
    r.close()


@pytest.mark.parametrize("name", ["memfd", "copy", "credit", "magic", "over the limit", "past the window"])
def test_stream_reader_refuses_hostile_frames(name: str):
    s, r = tcp_pair()
    frames = {
        "memfd": H.pack(M, _direct.MEMFD, 1, 1 << 20),
        "copy": H.pack(M, _direct.COPY, 1, 1 << 20),
        "credit": H.pack(M, _direct.CREDIT, 0, 10),
        "magic": H.pack(0x58585858, _direct.INLINE, 1, 0),
        "over the limit": H.pack(M, _direct.INLINE, 1, _direct.MAX_MESSAGE + 1),
        "past the window": H.pack(M, _direct.INLINE, 1, _direct.STREAM_CREDIT_AT) + bytes(_direct.STREAM_CREDIT_AT)
        + H.pack(M, _direct.INLINE, 2, _direct.MAX_INFLIGHT),
    }
    import threading
    t = threading.Thread(target=lambda: s.sendall(frames[name]))
    t.start()
    reader = _directrecv.StreamReader()  # credits nothing: the window is the sender's to keep
    with pytest.raises(_direct.FrameError):
        read_all(reader, r, 2)
    t.join()
    s.close()
    r.close()


def test_stream_cut_frame_is_the_end():
    s, r = tcp_pair()
    s.sendall(H.pack(M, _direct.INLINE, 1, 100) + b"short")
    s.close()
    with pytest.raises(EOFError):
        read_all(_directrecv.StreamReader(), r, 1)
    r.close()


def test_stream_sender_keeps_its_window():
    """A receiver that does not credit (its inbox is full) holds its sender
    at the window: the send that would pass it times out before a byte of
    its frame is written, and the stream stays whole; a credit lets it go
    on."""
    s, r = tcp_pair()
    sender = _direct.Sender(s)
    assert sender.stream
    reader = _directrecv.StreamReader()
    size = 1 << 20
    sent = 0
    import queue
    import threading
    frames: queue.Queue[tuple[int, bytes]] = queue.Queue()
    stop = threading.Event()

    def drain() -> None:  # reads what arrives (it always reads), credits nothing
        import select
        p = select.poll()
        p.register(r, select.POLLIN)
        while not stop.is_set():
            if p.poll(50):
                while (f := reader.read(r)) is not None:
                    frames.put((f[0], bytes(f[1])))

    t = threading.Thread(target=drain)
    t.start()
    import time
    while sent < 100:
        try:
            sender.send(0, "send", [_direct.header(_direct.INLINE, sent, size), bytes([sent]) * size], -1, 0,
                        time.monotonic() + 0.3)
        except ziptrail.MessageTimeoutError:
            break
        sent += 1
    frame = size + _direct.HEADER
    assert _direct.STREAM_CREDIT_AT // frame <= sent <= (_direct.MAX_INFLIGHT + size) // frame
    reader.credit(r)  # the inbox has room again
    sender.send(0, "send", [_direct.header(_direct.INLINE, sent, 3), b"end"], -1, 0, time.monotonic() + 30)
    got = [frames.get(timeout=60) for _ in range(sent + 1)]  # a bound against hangs
    stop.set()
    t.join()
    assert [tag for tag, _ in got] == list(range(sent + 1))
    assert all(b == bytes([i]) * size for i, (_, b) in enumerate(got[:sent])) and got[-1][1] == b"end"
    s.close()
    r.close()


def test_stream_reader_waits_for_the_rest_of_a_frame():
    """A frame begun but not whole is not 'buffered': the reader thread
    would otherwise wake itself in a loop until its bytes come."""
    s, r = tcp_pair()
    reader = _directrecv.StreamReader()
    s.sendall(H.pack(M, _direct.INLINE, 1, 3) + b"abc" + H.pack(M, _direct.INLINE, 2, 1000) + b"x" * 10)
    got = read_all(reader, r, 1)
    assert got == [(1, b"abc")]
    import select
    p = select.poll()
    p.register(r, select.POLLIN)
    while reader.end - reader.start < _direct.HEADER + 10:  # the second frame's first bytes, all of them
        assert reader.read(r) is None
        if reader.end - reader.start < _direct.HEADER + 10:
            assert p.poll(60_000), "the frame's first bytes did not come"
    assert not reader.buffered(), "a frame begun but not whole counted as buffered"
    s.sendall(b"x" * 990)
    assert read_all(reader, r, 1) == [(2, b"x" * 1000)]
    s.close()
    r.close()
