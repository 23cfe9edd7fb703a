"""Inputs of a function invocation, decoded from the envelope that the pod's
queue-proxy-zl sidecar hands to the function after resolving references."""

from __future__ import annotations

import base64
import json
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import NotFoundError, ZiptrailError

CONTENT_TYPE = "application/vnd.ziptrail.invocation+json"
MAX_ENVELOPE_BYTES = 64 << 20


@dataclass
class Object:
    """One input object. ``data`` is a zero-copy ``memoryview`` over the
    object's file in the pod's shared memory (large objects) or over the
    inline bytes (small ones). It stays valid until the handler returns."""

    bucket: str
    key: str
    size: int
    metadata: dict[str, str] = field(default_factory=dict)
    data: memoryview = field(default_factory=lambda: memoryview(b""))
    _map: mmap.mmap | None = None

    def bytes(self) -> bytes:
        """A copy of the contents, for data that must outlive the handler."""
        return bytes(self.data)

    def close(self) -> None:
        if self._map is not None:
            self.data.release()
            self._map.close()
            self._map = None


@dataclass
class Invocation:
    namespace: str
    function: str
    session: str
    id: str
    attempt: int = 0
    workflow: str = ""
    trigger: str = ""
    group: str = ""
    args: bytes = b""
    objects: list[Object] = field(default_factory=list)

    def object(self, bucket: str, key: str) -> Object | None:
        for o in self.objects:
            if o.bucket == bucket and o.key == key:
                return o
        return None

    def close(self) -> None:
        for o in self.objects:
            o.close()


def _b64(v: Any) -> bytes:
    return base64.b64decode(v) if v else b""


def decode(body: bytes) -> Invocation:
    """Parses and validates an envelope; raises ZiptrailError on bad input."""
    if len(body) > MAX_ENVELOPE_BYTES:
        raise ZiptrailError("decode", f"envelope exceeds {MAX_ENVELOPE_BYTES} bytes")
    try:
        env = json.loads(body)
    except ValueError as e:
        raise ZiptrailError("decode", f"malformed envelope: {e}") from None
    if not isinstance(env, dict) or not env.get("session") or not env.get("function") or not env.get("invocation"):
        raise ZiptrailError("decode", "session, function and invocation id are required")
    inv = Invocation(namespace=env.get("namespace", ""), function=env["function"], session=env["session"],
                     id=env["invocation"], attempt=int(env.get("attempt", 0)), workflow=env.get("workflow", ""),
                     trigger=env.get("trigger", ""), group=env.get("group", ""), args=_b64(env.get("args")))
    try:
        for o in env.get("objects") or []:
            inv.objects.append(_open(o))
    except BaseException:
        inv.close()
        raise
    return inv


def _open(o: dict) -> Object:
    bucket, key = o.get("bucket", ""), o.get("key", "")
    if not bucket or not key:
        raise ZiptrailError("decode", "every object needs a bucket and a key")
    obj = Object(bucket=bucket, key=key, size=int(o.get("size", 0)), metadata=o.get("metadata") or {})
    path = o.get("path")
    if not path:
        if o.get("ref") and not o.get("inline"):
            raise ZiptrailError("decode", f"object {bucket}/{key} arrived unresolved (reference only): is the pod's sidecar queue-proxy-zl?")
        obj.data = memoryview(_b64(o.get("inline")))
        obj.size = len(obj.data)
        return obj
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise NotFoundError("open input", f"{bucket}/{key}: {path} does not exist") from None
    try:
        size = os.fstat(fd).st_size
        if size:
            obj._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            obj.data = memoryview(obj._map)
        obj.size = size
    finally:
        os.close(fd)
    return obj
