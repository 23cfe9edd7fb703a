"""What a member channel carries besides frames (docs/messaging.md): the
group's views, as the sidecar encodes them (internal/dataplane/messaging),
and the files the sidecar lends for sidecar-path messages.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, Callable

from . import _direct

_VIEW_HEAD = struct.Struct("<QIBI")


@dataclass(frozen=True)
class View:
    epoch: int
    size: int
    mailbox: bool
    live: tuple[int, ...]
    gone: tuple[int, ...]


def parse_view(b: bytes) -> View:
    if len(b) < _VIEW_HEAD.size:
        raise ValueError(f"a view of {len(b)} bytes")
    epoch, size, mbox, nlive = _VIEW_HEAD.unpack_from(b)
    off = _VIEW_HEAD.size
    live = struct.unpack_from(f"<{nlive}I", b, off)
    off += 4 * nlive
    (ngone,) = struct.unpack_from("<I", b, off)
    gone = struct.unpack_from(f"<{ngone}I", b, off + 4)
    return View(epoch, size, bool(mbox), live, gone)


class Lent:
    """A sidecar-path message in a file the sidecar lent (docs/messaging.md,
    "Reused files"): opened at its push, so the file stays whole even if the
    sidecar forgets the lending; give_back, once, after its last use."""

    __slots__ = ("fd", "size", "err", "_give_back")

    def __init__(self, path: str, size: int, give_back: Callable[[], None]) -> None:
        self.fd, self.size, self.err = -1, size, ""
        self._give_back: Callable[[], None] | None = give_back
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self.err = f"open the message file {path} the sidecar lent: {e}"

    def take(self) -> tuple[int, Callable[[], None]]:
        """(the open descriptor, what gives the file back): the caller's
        now, to close and to call."""
        fd, give_back = self.fd, self._give_back or (lambda: None)
        self.fd, self._give_back = -1, None
        return fd, give_back

    def close(self) -> None:
        """Unread: closed and given back."""
        fd, give_back = self.take()
        if fd >= 0:
            os.close(fd)
        give_back()

    def __del__(self) -> None:
        self.close()


def release(payload: Any) -> None:
    """Frees a message nobody will take: a memfd, a lent file, or a
    sidecar-path file."""
    if isinstance(payload, (_direct.Memfd, Lent)):
        payload.close()
    elif isinstance(payload, str):
        try:
            os.unlink(payload)
        except OSError:
            pass
