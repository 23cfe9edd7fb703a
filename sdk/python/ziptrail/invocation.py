"""Inputs of a function invocation, decoded from the envelope that the pod's
queue-proxy-zl sidecar hands to the function after resolving references."""

from __future__ import annotations

import base64
import binascii
import errno
import json
import mmap
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from ._objects import DEFAULT_SHM_DIR, ENV_SHM_DIR
from .errors import InvalidError, ZiptrailError

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
    #: This execution's idempotency key, ``"<session>/<invocation>/<attempt>"``
    #: (Go: ``Invocation.IdempotencyKey``). Every delivery of the execution
    #: carries the same key — ziptrail delivers invocations at least once,
    #: and the pod's sidecar and the function server answer a duplicate
    #: that reaches them from their records — and a re-execution has a new
    #: one: use it to make side effects outside ziptrail (a database write,
    #: a payment) happen once (a key still runs again in a restarted
    #: function process or another pod).
    idempotency_key: str = ""

    def __post_init__(self) -> None:
        if not self.idempotency_key:
            self.idempotency_key = idempotency_key(self.session, self.id, self.attempt)

    def object(self, bucket: str, key: str) -> Object | None:
        for o in self.objects:
            if o.bucket == bucket and o.key == key:
                return o
        return None

    def close(self) -> None:
        for o in self.objects:
            o.close()


def idempotency_key(session: str, invocation: str, attempt: int) -> str:
    """The idempotency key of one execution of an invocation (Go:
    ``invocation.IdempotencyKey``)."""
    return f"{session}/{invocation}/{attempt}"


#: Names the sidecar gives the inputs it pulls into the object directory:
#: 128 random bits, so a request that did not pass through the pod's own
#: sidecar cannot name one (Go: invocation.NewInputName).
_INPUT_NAME = re.compile(r"in-[0-9a-f]{32}")

_INT64 = (-(1 << 63), (1 << 63) - 1)


def _bad(message: str) -> InvalidError:
    return InvalidError("decode", message)


def _str(d: dict, name: str, where: str = "", required: bool = False) -> str:
    v = d.get(name)
    if v is None:
        v = ""
    if not isinstance(v, str):
        raise _bad(f"{where}{name} must be a string, not {type(v).__name__}")
    if required and not v:
        raise _bad(f"{where}{name} is required")
    return v


def _int(d: dict, name: str, where: str = "") -> int:
    v = d.get(name)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not _INT64[0] <= v <= _INT64[1]:
        raise _bad(f"{where}{name} must be a 64-bit integer, not {v!r:.40}")
    return v


def _b64(d: dict, name: str, where: str = "") -> bytes | None:
    """Base64 bytes (as Go encodes []byte); None when absent or null."""
    v = d.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise _bad(f"{where}{name} must be a base64 string, not {type(v).__name__}")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _bad(f"{where}{name} is not valid base64: {e}") from None


def _shm_dir() -> str:
    return os.environ.get(ENV_SHM_DIR) or DEFAULT_SHM_DIR


def decode(body: bytes, shm_dir: str | None = None) -> Invocation:
    """Parses and validates an envelope and opens its inputs. A malformed
    envelope raises :class:`InvalidError` naming the cause.

    Inputs arrive inline or, when the pod's sidecar pulled them, as files it
    placed in the object directory ``shm_dir`` (default
    ``$ZIPTRAIL_SHM_DIR``). Only such files are opened: a bare name of the
    form the sidecar gives, directly inside that directory, a regular file,
    not a symlink; an envelope naming any other path is refused (it did not
    come through the sidecar)."""
    inv, specs, _ = _parse(body)
    _open_inputs(inv, specs, shm_dir)
    return inv


def _parse(body: bytes) -> tuple[Invocation, list[tuple[Object, bytes | None, str, str]], str]:
    """Parses and validates an envelope without opening its inputs: the
    invocation (no objects yet), its checked object entries, and the
    envelope's own idempotency key ("" when it carries none: the key the
    pod's sidecar sets; ``inv.idempotency_key`` is then derived)."""
    if len(body) > MAX_ENVELOPE_BYTES:
        raise _bad(f"envelope exceeds {MAX_ENVELOPE_BYTES} bytes; send large objects by reference")
    try:
        env = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting too deep
        raise _bad(f"malformed envelope: {type(e).__name__}: {e}"[:300]) from None
    if not isinstance(env, dict):
        raise _bad(f"malformed envelope: a JSON object is required, not {type(env).__name__}")
    fields = {n: _str(env, n) for n in ("namespace", "workflow", "trigger", "group")}
    if not all(isinstance(env.get(n), str) and env.get(n) for n in ("session", "function", "invocation")):
        raise _bad("session, function and invocation id are required (non-empty strings)")
    objects = env.get("objects")
    if objects is None:
        objects = []
    if not isinstance(objects, list):
        raise _bad(f"objects must be a list, not {type(objects).__name__}")
    key = _str(env, "idempotencyKey")
    inv = Invocation(function=env["function"], session=env["session"], id=env["invocation"], attempt=_int(env, "attempt"),
                     args=_b64(env, "args") or b"", idempotency_key=key, **fields)
    return inv, [_check(i, o) for i, o in enumerate(objects)], key


def _open_inputs(inv: Invocation, specs: list[tuple[Object, bytes | None, str, str]], shm_dir: str | None) -> None:
    """Opens the checked inputs into ``inv.objects`` (all or none)."""
    try:
        directory = shm_dir if shm_dir is not None else _shm_dir()
        for spec in specs:
            inv.objects.append(_open(spec, directory))
    except BaseException:
        inv.close()
        raise


def _check(i: int, o: Any) -> tuple[Object, bytes | None, str, str]:
    """Validates one object entry: (object, inline bytes, path, ref)."""
    if not isinstance(o, dict):
        raise _bad(f"object {i} must be a JSON object, not {type(o).__name__}")
    where = f"object {i}: "
    bucket, key = _str(o, "bucket", where), _str(o, "key", where)
    if not bucket or not key:
        raise _bad(f"object {i}: bucket and key are required")
    where = f"object {bucket}/{key}: "
    size = _int(o, "size", where)
    ref, path, inline = _str(o, "ref", where), _str(o, "path", where), _b64(o, "inline", where)
    metadata = o.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad(f"{where}metadata must be a JSON object of strings")
    if not ref and inline is None and not path:
        raise _bad(f"{where}object has neither a reference nor inline bytes")
    if path and inline is not None:
        raise _bad(f"{where}object has both inline bytes and a path")
    if path and not _INPUT_NAME.fullmatch(path):
        raise _bad(f"{where}path {path!r:.80} is not a name the pod's sidecar gives its inputs")
    return Object(bucket=bucket, key=key, size=size, metadata=dict(metadata)), inline, path, ref


def _open(spec: tuple[Object, bytes | None, str, str], shm_dir: str) -> Object:
    obj, inline, path, ref = spec
    where = f"{obj.bucket}/{obj.key}"
    if inline is not None:  # inline bytes come first
        obj.data, obj.size = memoryview(inline), len(inline)
        return obj
    if not path:
        raise _bad(f"object {where} arrived unresolved (reference only): is the pod's sidecar queue-proxy-zl?")
    try:
        fd = os.open(os.path.join(shm_dir, path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        reason = "is a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise _bad(f"object {where}: {path} in the object directory {shm_dir}: {reason}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _bad(f"object {where}: {path} is not a regular file")
        if st.st_size:
            try:
                obj._map = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
            except (OSError, ValueError) as e:
                raise ZiptrailError("open input", f"{where}: map {path}: {e}") from None
            obj.data = memoryview(obj._map)
        obj.size = st.st_size
    finally:
        os.close(fd)
    return obj
