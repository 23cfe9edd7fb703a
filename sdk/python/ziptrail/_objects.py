"""The SDK's shared pieces, a leaf every other module may import: the
environment's names and the sidecar's defaults, the objects ``get``
returns and ``put`` takes, and the byte helpers. It imports nothing of the
package but ``errors`` (``tests/test_imports.py`` keeps the modules'
imports free of cycles)."""

from __future__ import annotations

import mmap
import os
import weakref
from typing import Any, Callable, Union

from .errors import ZiptrailError

ENV_SOCKET = "ZIPTRAIL_SOCKET"
ENV_SHM_DIR = "ZIPTRAIL_SHM_DIR"
ENV_INLINE_THRESHOLD = "ZIPTRAIL_INLINE_THRESHOLD"
#: The sidecar's defaults in a pod (see internal/dataplane/sidecar).
DEFAULT_SHM_DIR = "/dev/shm/ziptrail/objects"
DEFAULT_INLINE_THRESHOLD = 64 << 10
#: Invoke returns the callee's response inline, up to the envelope limit.
MAX_MESSAGE_BYTES = (64 << 20) + (1 << 20)
_WRITE_CHUNK = 1 << 30  # os.write moves at most ~2 GiB per call


class InlineObject(bytes):
    """A small object, returned inline by the sidecar (a ``bytes``)."""

    source: str = ""

    @property
    def data(self) -> memoryview:
        return memoryview(self)

    def close(self) -> None:
        """Nothing to release; present so every object can be closed."""

    def __enter__(self) -> InlineObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MappedObject(mmap.mmap):
    """A large object: a read-only mapping of its shared-memory file.

    ``source`` says where the sidecar found it: "local" (this pod),
    "remote" (pulled from the producer pod), "redis" or "s3" (a tier).
    """

    source: str = ""

    @property
    def data(self) -> memoryview:
        """A zero-copy view; release it (or let it go) before ``close()``."""
        return memoryview(self)


class LentObject(MappedObject):
    """A large message mapped from a file the sidecar lent: closing it (or
    its garbage collection) gives the file back, to hold a later message."""

    def close(self) -> None:
        super().close()
        give_back = self.__dict__.pop("_give_back", None)
        if give_back is not None:
            give_back()


def _lent_object(fd: int, size: int, offset: int, give_back: Callable[[], None]) -> LentObject:
    """Maps size bytes of a lent file at offset; give_back runs once, at
    close or when the mapping is collected."""
    obj = LentObject(fd, size, prot=mmap.PROT_READ, offset=offset)
    fin = weakref.finalize(obj, give_back)
    fin.atexit = False
    obj._give_back = fin
    return obj


#: What ``get`` and ``get_object`` return.
Data = Union[InlineObject, MappedObject]
#: What ``put``, ``invoke`` and ``send_object`` accept.
BytesLike = Union[bytes, bytearray, memoryview, mmap.mmap, str, "SharedBuffer"]


class SharedBuffer:
    """A writable buffer allocated directly in the shared-memory directory
    (:meth:`Client.allocate`). Fill ``data``, then pass the buffer to
    ``put``, ``invoke`` or ``send_object``: the sidecar takes the file over
    and the bytes are never copied by the SDK. A buffer can be handed over
    once; release memoryviews of ``data`` before handing it over."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self._map: mmap.mmap | None = None
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, size)
            if size:
                self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._view = memoryview(self._map) if self._map is not None else memoryview(bytearray())

    @property
    def data(self) -> memoryview:
        if self.path == "":
            raise ZiptrailError("buffer", "the buffer was already handed to the sidecar or discarded")
        return self._view

    def __len__(self) -> int:
        return self.size

    def _take(self) -> str:
        """Unmaps the buffer and returns its file for a request."""
        if self.path == "":
            raise ZiptrailError("buffer", "the buffer was already handed to the sidecar or discarded")
        self._view.release()
        if self._map is not None:
            self._map.close()  # BufferError while the caller holds views
            self._map = None
        path, self.path = self.path, ""
        return path

    def discard(self) -> None:
        """Frees a buffer that will not be sent."""
        if self.path:
            path = self._take()
            _remove(path)

    def __enter__(self) -> SharedBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _view(obj: Any) -> memoryview:
    """A flat byte view of obj, without a copy when obj allows it."""
    if isinstance(obj, str):
        return memoryview(obj.encode())
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"ziptrail: objects must be bytes-like (bytes, bytearray, memoryview, mmap) or str, not {type(obj).__name__}") from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
