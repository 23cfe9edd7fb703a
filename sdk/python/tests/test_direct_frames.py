"""The direct channel's framing at the receiver (ziptrail._direct), over a
real SOCK_SEQPACKET socketpair: the copy frames (kind 4) a Go sender uses
for messages of up to COPY_MAX bytes, well formed and hostile."""

from __future__ import annotations

import array
import os
import socket
import struct

import pytest

from ziptrail import _direct

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
        tag, got = _direct.FrameReader().read(r)
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
        fr = _direct.FrameReader()
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
                _direct.FrameReader().read(r)
            assert open_fds() <= base | {str(s.fileno()), str(r.fileno())}
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(64)  # no credit
    finally:
        os.close(pr)
        os.close(pw)
