"""The invocation the calling thread handles, a leaf of the package: the
function server sets it around a handler (``server``), and the modules that
tag what a handler does with it (outputs, group memberships) read it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .invocation import Invocation

_current = threading.local()


def current_invocation() -> Invocation | None:
    """The invocation the calling thread is handling (used to tag outputs)."""
    return getattr(_current, "inv", None)
