"""ziptrail: data-centric serverless workflows on Knative.

* Zipline API (``ziptrail.client``): ``put(obj, n) -> ref``, ``get(ref)``,
  ``invoke(url, obj)``, ``scatter``/``gather``/``broadcast``, over the pod's
  queue-proxy-zl sidecar (``ZIPTRAIL_SOCKET``, ``ZIPTRAIL_SHM_DIR``); large
  objects go through shared-memory files without a copy.
* Pheromone user library (``ziptrail.bucket``): ``create_object``,
  ``send_object``, ``get_object``.
* Function side: ``serve(handler)``; inputs arrive as ``Invocation.objects``
  (zero-copy ``memoryview`` over shared memory for large objects).
* Direct messages between instances (``ziptrail.group``): ``join(group,
  rank, size)`` in a handler (or ``Client.join``), then ``send``/``recv`` and
  the collectives ``barrier``, ``broadcast``, ``scatter``, ``gather``,
  ``reduce``, ``allreduce``, ``alltoall``.
* Shuffle library (``ziptrail.shuffle``): MapReduce-style shuffles over
  DynamicGroup through pod memory, Redis, S3 or Locus's multi-round hybrid
  (``shuffle.Job``, ``shuffle.Writer``, ``shuffle.read_inputs``, ...).
* Admin client (``ziptrail.admin``, needs the ``kubernetes`` package):
  Buckets, Triggers, Workflows, and sessions through the gateway.

Importing ``ziptrail`` loads neither grpc nor kubernetes: a function that
only serves starts fast.
"""

from .bucket import (META_DECLARE_ONLY, META_EXPECTED_COUNT, META_EXPECTED_KEYS, META_GROUP, BucketObject, Sent,
                     create_object, get_object, send_object)
from .client import (BytesLike, Client, Data, InlineObject, MappedObject, Response, SharedBuffer, allocate, broadcast,
                     default_client, gather, get, invoke, join, put, scatter, set_default_client)
from .errors import (BadReferenceError, Closed, ClosedError, CollectiveAbortedError, Conflict, ConflictError,
                     DirectChannelError, ExhaustedError, ExpiredError, Foreign, ForeignError, FunctionFailedError, GroupConflictError,
                     InvalidError, MessageTimeout, MessageTimeoutError, NotFoundError, PeerGone, PeerGoneError,
                     ProducerGoneError, StoreFullError, TimeoutError_, TooLargeError, UnavailableError, ZiptrailError,
                     ZiptrailTimeoutError)
from .group import ANY, MAX, MIN, SUM, Group, Members, Message, Op
from .invocation import Invocation, Object, decode
from .server import current_invocation, make_server, serve
from . import shuffle  # noqa: E402 (after the modules it builds on)

__all__ = [
    # Zipline
    "Client", "put", "get", "invoke", "scatter", "gather", "broadcast", "allocate", "default_client",
    "set_default_client", "Response", "Data", "InlineObject", "MappedObject", "SharedBuffer", "BytesLike",
    # Pheromone
    "create_object", "send_object", "get_object", "BucketObject", "Sent", "META_GROUP", "META_EXPECTED_KEYS",
    "META_EXPECTED_COUNT", "META_DECLARE_ONLY",
    # direct messages
    "join", "Group", "Message", "Members", "Op", "ANY", "SUM", "MIN", "MAX",
    # shuffle
    "shuffle",
    # function server
    "serve", "make_server", "current_invocation", "Invocation", "Object", "decode",
    # errors
    "ZiptrailError", "BadReferenceError", "ExpiredError", "ExhaustedError", "ProducerGoneError", "NotFoundError",
    "ZiptrailTimeoutError", "TimeoutError_", "UnavailableError", "StoreFullError", "TooLargeError", "InvalidError",
    "ConflictError", "FunctionFailedError", "PeerGoneError", "MessageTimeoutError", "ForeignError", "ClosedError",
    "GroupConflictError", "CollectiveAbortedError", "DirectChannelError", "PeerGone", "MessageTimeout", "Foreign", "Closed", "Conflict",
]
