"""Typed errors of the ziptrail SDK; every error the SDK raises is a ZiptrailError."""

from __future__ import annotations


class ZiptrailError(Exception):
    """Base class. ``kind`` matches the Go SDK's error kinds."""

    kind = "Error"

    def __init__(self, op: str, message: str) -> None:
        super().__init__(f"ziptrail {op}: {self.kind}: {message}")
        self.op = op
        self.message = message


class BadReferenceError(ZiptrailError):
    """A malformed, tampered, foreign-namespace or unknown-key reference."""

    kind = "BadReference"


class ExpiredError(ZiptrailError):
    """A reference or object past its TTL."""

    kind = "Expired"


class ExhaustedError(ZiptrailError):
    """An object already read as often as it allowed."""

    kind = "Exhausted"


class ProducerGoneError(ZiptrailError):
    """The producing pod is gone and no storage tier holds the object."""

    kind = "ProducerGone"


class NotFoundError(ZiptrailError):
    """An unknown bucket, key, session or workflow."""

    kind = "NotFound"


class TimeoutError_(ZiptrailError):
    """An operation did not finish in time."""

    kind = "Timeout"


class UnavailableError(ZiptrailError):
    """The sidecar or the gateway cannot be reached."""

    kind = "Unavailable"


BY_KIND = {c.kind: c for c in (BadReferenceError, ExpiredError, ExhaustedError, ProducerGoneError,
                              NotFoundError, TimeoutError_, UnavailableError)}


def from_kind(kind: str, op: str, message: str) -> ZiptrailError:
    """Builds the error class named by ``kind`` (as sent by the sidecar)."""
    return BY_KIND.get(kind, ZiptrailError)(op, message)
