"""Typed errors of the ziptrail SDK; every error the SDK raises is a ZiptrailError.

The classes and their ``kind`` match the Go SDK's error kinds. The sidecar's
finer class travels as ``reason`` (a ``google.rpc.ErrorInfo`` reason of the
domain ``ziptrail.dev``), e.g. ``REF_TAMPERED`` or ``REF_FOREIGN_NAMESPACE``
for a :class:`BadReferenceError`::

    try:
        data = ziptrail.get(ref)
    except ziptrail.ExhaustedError:
        ...                      # already read as often as the reference allows
    except ziptrail.BadReferenceError as e:
        log.warning("refused reference (%s): %s", e.reason, e)
"""

from __future__ import annotations

import builtins
from typing import Any

#: The ``google.rpc.ErrorInfo`` domain of the sidecar's error reasons.
ERROR_DOMAIN = "ziptrail.dev"


class ZiptrailError(Exception):
    """Base class of every SDK error.

    ``op`` is the SDK call ("get", "put", "invoke", ...), ``kind`` the error
    class shared with the Go SDK, ``reason`` the sidecar's finer class when
    it gave one, ``message`` the human-readable cause.
    """

    kind = "Internal"

    def __init__(self, op: str, message: str, reason: str = "") -> None:
        head = f"ziptrail {op}: {self.kind}" + (f" ({reason})" if reason else "")
        super().__init__(f"{head}: {message}")
        self.op = op
        self.message = message
        self.reason = reason
        #: The sidecar's ErrorInfo metadata, when it sent some.
        self.metadata: dict[str, str] = {}


class BadReferenceError(ZiptrailError):
    """A malformed, tampered, foreign-namespace or unknown-key reference.

    ``reason`` tells which: REF_MALFORMED, REF_TAMPERED, REF_UNKNOWN_KEY or
    REF_FOREIGN_NAMESPACE."""

    kind = "BadReference"


class ExpiredError(ZiptrailError):
    """A reference or object past its TTL (or a session that expired)."""

    kind = "Expired"


class ExhaustedError(ZiptrailError):
    """An object already read as often as its reference allowed."""

    kind = "Exhausted"


class ProducerGoneError(ZiptrailError):
    """The producing pod is gone and no storage tier holds the object."""

    kind = "ProducerGone"


class NotFoundError(ZiptrailError):
    """An unknown object, bucket key, session or workflow."""

    kind = "NotFound"


class ZiptrailTimeoutError(ZiptrailError, builtins.TimeoutError):
    """An operation did not finish in time (also a builtin ``TimeoutError``)."""

    kind = "Timeout"


#: The name this class had first; kept for existing callers.
TimeoutError_ = ZiptrailTimeoutError


class UnavailableError(ZiptrailError):
    """The sidecar or the gateway cannot be reached, or is not ready yet."""

    kind = "Unavailable"


class StoreFullError(ZiptrailError):
    """The pod's object store stayed full for the whole put timeout."""

    kind = "StoreFull"


class TooLargeError(ZiptrailError):
    """The object is larger than the pod's store can ever hold."""

    kind = "TooLarge"


class InvalidError(ZiptrailError, ValueError):
    """A request the sidecar or the API server refuses as invalid (missing
    bucket or key, persist without a slow tier, a rejected resource, ...)."""

    kind = "Invalid"


class ConflictError(ZiptrailError):
    """A resource that already exists, or was changed concurrently."""

    kind = "Conflict"


class FunctionFailedError(ZiptrailError):
    """An invoked function, or a workflow session, failed."""

    kind = "FunctionFailed"


# --- direct messaging (ziptrail.group) ---------------------------------------

class PeerGoneError(ZiptrailError):
    """The peer of a message ended: its instance left the group, its
    invocation ended or its pod died (reason PEER_GONE). Raised as soon as
    the directory knows, not after a timeout. ``rank`` is the peer's rank
    when known (a collective always names it), else None."""

    kind = "PeerGone"

    def __init__(self, op: str, message: str, reason: str = "", rank: int | None = None) -> None:
        super().__init__(op, message, reason)
        self.rank = rank


class MessageTimeoutError(ZiptrailTimeoutError):
    """A send, receive, join or collective did not finish within its
    timeout (reason MSG_TIMEOUT); also a ZiptrailTimeoutError and a builtin
    ``TimeoutError``."""


class ForeignError(ZiptrailError):
    """The peer's sidecar is not of this namespace (reason MSG_FOREIGN)."""

    kind = "Foreign"


class ClosedError(ZiptrailError):
    """This instance is not, or no longer, a member of the group (reason
    GROUP_CLOSED)."""

    kind = "Closed"


class GroupConflictError(ConflictError):
    """The rank is taken, or the size (or mailbox setting) differs from the
    group's (reason GROUP_CONFLICT); also a ConflictError."""


class CollectiveAbortedError(ZiptrailError):
    """Another member aborted the collective this one was in, for a reason
    other than a gone peer (that is a PeerGoneError); ``rank`` is that
    member's."""

    kind = "Aborted"

    def __init__(self, op: str, message: str, reason: str = "", rank: int | None = None) -> None:
        super().__init__(op, message, reason)
        self.rank = rank


class DirectChannelError(ZiptrailError):
    """A same-node peer broke the protocol of its direct channel to this
    member (a malformed or oversized frame, an unsealed or wrong-size
    memfd, descriptors it should not send): the channel was dropped, with
    every descriptor that came on it. ``rank`` is that peer's."""

    kind = "Internal"

    def __init__(self, op: str, message: str, reason: str = "", rank: int | None = None) -> None:
        super().__init__(op, message, reason)
        self.rank = rank


#: Short names of the messaging errors.
PeerGone = PeerGoneError
MessageTimeout = MessageTimeoutError
Foreign = ForeignError
Closed = ClosedError
Conflict = GroupConflictError


BY_KIND: dict[str, type[ZiptrailError]] = {c.kind: c for c in (
    BadReferenceError, ExpiredError, ExhaustedError, ProducerGoneError, NotFoundError, ZiptrailTimeoutError,
    UnavailableError, StoreFullError, TooLargeError, InvalidError, ConflictError, FunctionFailedError, PeerGoneError,
    ForeignError, ClosedError, CollectiveAbortedError)}

#: The sidecar's ErrorInfo reasons and the class each one raises.
BY_REASON: dict[str, type[ZiptrailError]] = {
    "REF_MALFORMED": BadReferenceError,
    "REF_TAMPERED": BadReferenceError,
    "REF_UNKNOWN_KEY": BadReferenceError,
    "REF_FOREIGN_NAMESPACE": BadReferenceError,
    "OBJECT_EXPIRED": ExpiredError,
    "OBJECT_EXHAUSTED": ExhaustedError,
    "OBJECT_NOT_FOUND": NotFoundError,
    "PRODUCER_GONE": ProducerGoneError,
    "OBJECT_TOO_LARGE": TooLargeError,
    "STORE_FULL": StoreFullError,
    "BAD_PAYLOAD": InvalidError,
    "KEYS_NOT_READY": UnavailableError,
    "PEER_GONE": PeerGoneError,
    "MSG_TIMEOUT": MessageTimeoutError,
    "MSG_FOREIGN": ForeignError,
    "GROUP_CLOSED": ClosedError,
    "GROUP_CONFLICT": GroupConflictError,
    "PEER_UNREACHABLE": UnavailableError,
    "TIER_UNAVAILABLE": UnavailableError,
}

_HINTS = {
    "REF_MALFORMED": "the string is not a ziptrail reference",
    "REF_TAMPERED": "the reference was altered or sealed with another key",
    "REF_UNKNOWN_KEY": "the reference was sealed with a key this namespace does not know (rotated out?)",
    "REF_FOREIGN_NAMESPACE": "the reference belongs to another namespace",
}


def from_kind(kind: str, op: str, message: str, reason: str = "") -> ZiptrailError:
    """Builds the error class named by ``kind`` (as the Go SDK names them)."""
    return BY_KIND.get(kind, ZiptrailError)(op, message, reason)


def from_reason(reason: str, op: str, message: str, metadata: dict[str, str] | None = None) -> ZiptrailError:
    """Builds the error class of a sidecar ErrorInfo reason; ``metadata``
    (the ErrorInfo's) is kept as the error's ``metadata``, and its "rank"
    becomes a PeerGoneError's ``rank``."""
    hint = _HINTS.get(reason)
    if hint and hint not in message:
        message = f"{hint}: {message}"
    err = BY_REASON.get(reason, ZiptrailError)(op, message, reason)
    err.metadata = dict(metadata or {})
    if isinstance(err, PeerGoneError) and err.metadata.get("rank", "").isdigit():
        err.rank = int(err.metadata["rank"])
    return err


def from_rpc_error(op: str, err: Any, target: str = "") -> ZiptrailError:
    """Translates a ``grpc.RpcError`` of the sidecar's local API.

    The class comes from the ``google.rpc.ErrorInfo`` detail of the status
    (domain ``ziptrail.dev``) when there is one, else from the gRPC code.
    """
    import grpc
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    message = err.details() if hasattr(err, "details") else str(err)
    message = message or str(err)
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # inconsistent status and details: use the code
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == ERROR_DOMAIN and info.reason:
                    return from_reason(info.reason, op, message, dict(info.metadata))
    code = err.code() if hasattr(err, "code") else None
    where = f" at {target}" if target else ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ZiptrailTimeoutError(op, f"deadline exceeded: {message}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(op, f"cannot reach the sidecar{where} (is queue-proxy-zl running?): {message}")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(op, message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidError(op, message)
    return ZiptrailError(op, f"{code.name if code is not None else 'error'}: {message}")
