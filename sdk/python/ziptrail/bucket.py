"""The Pheromone user library: ``create_object``, ``send_object``,
``get_object``.

An object is named by a bucket and a key; the bucket's triggers decide what
it invokes. Object metadata drives two primitives (the keys are the ones the
trigger engine reads, internal/engine):

* DynamicGroup: the group the object belongs to, under the trigger's
  ``groupMetadataKey`` (default ``group``): :meth:`BucketObject.set_group`.
* DynamicJoin: the expected set, declared at run time by a producer:
  ``ziptrail.expected-keys`` (comma-separated keys,
  :meth:`BucketObject.expect_keys`) or ``ziptrail.expected-count``
  (:meth:`BucketObject.expect_count`); ``ziptrail.declare-only`` marks an
  object that only declares the set (:meth:`BucketObject.declare_only`).

Which transport ``send_object`` uses:

* Inside a handler (``serve``), without ``persist``: the object goes back
  with the invocation's response. It becomes ready when the handler
  returns, in the order sent and before the function counts as finished
  (DynamicGroup relies on that); a large object stays in this pod: one
  over ``server.BY_REFERENCE`` (1 MiB) is put into the pod's store at once
  and only its reference goes with the response (no cap but the store's),
  a smaller one the sidecar turns into a reference as the response passes
  when it is over the bucket's inline threshold.
* With ``persist=True``, or outside a handler (a client program, a thread
  the handler started): the sidecar's SendObject call over the local API.
  The sidecar buffers the object in this pod, writes it to the slow tier
  when ``persist`` is set, and reports it to the operator over its control
  stream as soon as the call returns. Never both: an object is reported once.

``get_object`` reads through the sidecar's GetObject: an object this pod
sent through the sidecar, else a persisted one. An invocation's inputs are
``inv.objects`` (mapped without a copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from . import server
from ._objects import DEFAULT_SHM_DIR, ENV_SHM_DIR, ENV_SOCKET
from .client import BytesLike, Client, Data, SharedBuffer, default_client
from .errors import InvalidError

#: Metadata keys the trigger engine reads (internal/engine/types.go).
META_GROUP = "group"
META_EXPECTED_KEYS = "ziptrail.expected-keys"
META_EXPECTED_COUNT = "ziptrail.expected-count"
META_DECLARE_ONLY = "ziptrail.declare-only"


@dataclass
class BucketObject:
    """An object to send to a bucket (Pheromone's EpheObject)."""

    bucket: str
    key: str
    metadata: dict[str, str] = field(default_factory=dict)
    value: BytesLike | None = None

    def set_value(self, value: BytesLike) -> BucketObject:
        self.value = value
        return self

    def set_group(self, group: str, metadata_key: str = META_GROUP) -> BucketObject:
        """Names the DynamicGroup group (``metadata_key`` is the trigger's
        ``groupMetadataKey``)."""
        if not group:
            raise InvalidError("create_object", "a group name must not be empty")
        self.metadata[metadata_key] = group
        return self

    def expect_keys(self, keys: Iterable[str]) -> BucketObject:
        """Declares, for DynamicJoin, the keys whose objects complete the join."""
        keys = list(keys)
        for k in keys:
            if not k or "," in k or k != k.strip():
                raise InvalidError("create_object", f"expected key {k!r}: keys must be non-empty, without commas or surrounding spaces")
        self.metadata[META_EXPECTED_KEYS] = ",".join(keys)
        return self

    def expect_count(self, n: int) -> BucketObject:
        """Declares, for DynamicJoin, how many objects complete the join."""
        if n < 1:
            raise InvalidError("create_object", f"expected count must be at least 1, got {n}")
        self.metadata[META_EXPECTED_COUNT] = str(n)
        return self

    def declare_only(self, flag: bool = True) -> BucketObject:
        """Marks the object as a declaration only, not itself a member of the join."""
        if flag:
            self.metadata[META_DECLARE_ONLY] = "true"
        else:
            self.metadata.pop(META_DECLARE_ONLY, None)
        return self


@dataclass(frozen=True)
class Sent:
    """What ``send_object`` did: ``transport`` is "response" or "sidecar";
    ``ref`` is the object's reference when the sidecar gave one (large
    objects sent through it)."""

    bucket: str
    key: str
    size: int
    transport: str
    ref: str = ""
    persisted: bool = False


def create_object(bucket: str, key: str, metadata: Mapping[str, str] | None = None, *, value: BytesLike | None = None,
                  group: str | None = None, expected_keys: Iterable[str] | None = None,
                  expected_count: int | None = None, declare_only: bool = False) -> BucketObject:
    """Creates an object of a bucket; fill it with ``set_value`` (or
    ``value=``) and send it with ``send_object``."""
    if not bucket or not key:
        raise InvalidError("create_object", "bucket and key are required")
    obj = BucketObject(bucket, key, {str(k): str(v) for k, v in (metadata or {}).items()}, value)
    if group is not None:
        obj.set_group(group)
    if expected_keys is not None:
        obj.expect_keys(expected_keys)
    if expected_count is not None:
        obj.expect_count(expected_count)
    if declare_only:
        obj.declare_only()
    return obj


def send_object(obj: BucketObject | str, key: str | None = None, data: BytesLike | None = None,
                metadata: Mapping[str, str] | None = None, *, persist: bool = False, session: str | None = None,
                client: Client | None = None) -> Sent:
    """Sends an object to its bucket: ``send_object(create_object(...))``
    or ``send_object(bucket, key, data, metadata=...)``. See the module doc
    for the transport; ``session`` defaults to the current invocation's."""
    if isinstance(obj, BucketObject):
        if key is not None or data is not None:
            raise InvalidError("send_object", "pass either an object from create_object or bucket, key and data")
        bucket, key, value = obj.bucket, obj.key, obj.value
        meta = dict(obj.metadata)
        if metadata:
            meta.update({str(k): str(v) for k, v in metadata.items()})
    else:
        bucket, value = obj, data
        meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if not bucket or not key:
        raise InvalidError("send_object", "bucket and key are required")
    if value is None:
        value = b""
    inv = server.current_invocation()
    if inv is not None and server._in_invocation() and not persist and client is None and session is None:
        if isinstance(value, SharedBuffer):
            with value:
                size = server._append_output(bucket, key, value.data, meta)
        else:
            size = server._append_output(bucket, key, value, meta)
        return Sent(bucket, key, size, "response")
    if client is None and inv is None:
        _require_socket()
    c = client or default_client()
    if session is None:
        session = inv.session if inv is not None else ""
    resp = c.send_object(bucket, key, value, session=session, persist=persist, metadata=meta,
                         invocation_id=inv.id if inv is not None else "")
    return Sent(bucket, key, resp.size, "sidecar", resp.ref, resp.persisted)


def _require_socket() -> None:
    """Outside a handler the sidecar is the only transport: say so clearly
    when there is none, instead of a connection error."""
    import os

    from .errors import UnavailableError

    shm = os.environ.get(ENV_SHM_DIR) or DEFAULT_SHM_DIR
    sock = os.environ.get(ENV_SOCKET) or os.path.join(os.path.dirname(shm), "sidecar.sock")
    if not os.path.exists(sock):
        raise UnavailableError("send_object", f"called outside a function invocation, and there is no sidecar socket at {sock} "
                               f"(set {ENV_SOCKET}, or call it inside a handler)")


def get_object(bucket: str, key: str, *, session: str | None = None, client: Client | None = None) -> Data:
    """Reads an object of a bucket by key through the sidecar: one this pod
    sent through it, else a persisted one. ``session`` defaults to the
    current invocation's."""
    if not bucket or not key:
        raise InvalidError("get_object", "bucket and key are required")
    if session is None:
        inv = server.current_invocation()
        session = inv.session if inv is not None else ""
    return (client or default_client()).get_object(bucket, key, session=session)
