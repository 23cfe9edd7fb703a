"""ziptrail: data-centric serverless workflows on Knative.

Function side: ``serve(handler)``; inputs arrive as ``Invocation.objects``
(zero-copy ``memoryview`` over shared memory for large objects).
"""

from .errors import (BadReferenceError, ExhaustedError, ExpiredError, NotFoundError, ProducerGoneError,
                     UnavailableError, ZiptrailError)
from .invocation import Invocation, Object, decode
from .server import current_invocation, make_server, send_object, serve

__all__ = [
    "BadReferenceError", "ExhaustedError", "ExpiredError", "NotFoundError", "ProducerGoneError",
    "UnavailableError", "ZiptrailError", "Invocation", "Object", "decode", "current_invocation",
    "make_server", "send_object", "serve",
]
