from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_FAST: _ClassVar[Tier]
    TIER_SLOW: _ClassVar[Tier]
TIER_UNSPECIFIED: Tier
TIER_FAST: Tier
TIER_SLOW: Tier

class TierPutRequest(_message.Message):
    __slots__ = ("tier", "session", "key", "object", "ttl_ms")
    TIER_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    session: str
    key: str
    object: Payload
    ttl_ms: int
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., session: _Optional[str] = ..., key: _Optional[str] = ..., object: _Optional[_Union[Payload, _Mapping]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class TierPutResponse(_message.Message):
    __slots__ = ("size",)
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...

class TierGetRequest(_message.Message):
    __slots__ = ("tier", "session", "key")
    TIER_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    session: str
    key: str
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., session: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class TierDeleteRequest(_message.Message):
    __slots__ = ("tier", "session", "keys")
    TIER_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    session: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., session: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class TierDeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("session", "group", "rank", "size", "mailbox", "invocation_id", "wait_all", "timeout_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAILBOX_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_ALL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    group: str
    rank: int
    size: int
    mailbox: bool
    invocation_id: str
    wait_all: bool
    timeout_ms: int
    def __init__(self, session: _Optional[str] = ..., group: _Optional[str] = ..., rank: _Optional[int] = ..., size: _Optional[int] = ..., mailbox: _Optional[bool] = ..., invocation_id: _Optional[str] = ..., wait_all: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("session", "group", "rank")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    session: str
    group: str
    rank: int
    def __init__(self, session: _Optional[str] = ..., group: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("session", "group", "to", "tag", "data", "timeout_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    group: str
    to: int
    tag: int
    data: Payload
    timeout_ms: int
    def __init__(self, session: _Optional[str] = ..., group: _Optional[str] = ..., to: _Optional[int] = ..., tag: _Optional[int] = ..., data: _Optional[_Union[Payload, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., **kwargs) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("mailboxed",)
    MAILBOXED_FIELD_NUMBER: _ClassVar[int]
    mailboxed: bool
    def __init__(self, mailboxed: _Optional[bool] = ...) -> None: ...

class RecvRequest(_message.Message):
    __slots__ = ("session", "group", "rank", "any_source", "any_tag", "tag", "timeout_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ANY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    ANY_TAG_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    group: str
    rank: int
    any_source: bool
    any_tag: bool
    tag: int
    timeout_ms: int
    def __init__(self, session: _Optional[str] = ..., group: _Optional[str] = ..., rank: _Optional[int] = ..., any_source: _Optional[bool] = ..., any_tag: _Optional[bool] = ..., tag: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., **kwargs) -> None: ...

class RecvResponse(_message.Message):
    __slots__ = ("tag", "data", "size")
    FROM_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    tag: int
    data: Payload
    size: int
    def __init__(self, tag: _Optional[int] = ..., data: _Optional[_Union[Payload, _Mapping]] = ..., size: _Optional[int] = ..., **kwargs) -> None: ...

class MembersRequest(_message.Message):
    __slots__ = ("session", "group", "after_epoch", "timeout_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    AFTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    group: str
    after_epoch: int
    timeout_ms: int
    def __init__(self, session: _Optional[str] = ..., group: _Optional[str] = ..., after_epoch: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class MembersResponse(_message.Message):
    __slots__ = ("size", "live", "gone", "epoch", "mailbox")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAILBOX_FIELD_NUMBER: _ClassVar[int]
    size: int
    live: _containers.RepeatedScalarFieldContainer[int]
    gone: _containers.RepeatedScalarFieldContainer[int]
    epoch: int
    mailbox: bool
    def __init__(self, size: _Optional[int] = ..., live: _Optional[_Iterable[int]] = ..., gone: _Optional[_Iterable[int]] = ..., epoch: _Optional[int] = ..., mailbox: _Optional[bool] = ...) -> None: ...

class Payload(_message.Message):
    __slots__ = ("inline", "path")
    INLINE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    inline: bytes
    path: str
    def __init__(self, inline: _Optional[bytes] = ..., path: _Optional[str] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("object", "reads", "ttl_ms", "session")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    READS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    object: Payload
    reads: int
    ttl_ms: int
    session: str
    def __init__(self, object: _Optional[_Union[Payload, _Mapping]] = ..., reads: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., session: _Optional[str] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("ref", "size")
    REF_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ref: str
    size: int
    def __init__(self, ref: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: str
    def __init__(self, ref: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("object", "size", "source")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    object: Payload
    size: int
    source: str
    def __init__(self, object: _Optional[_Union[Payload, _Mapping]] = ..., size: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class SendObjectRequest(_message.Message):
    __slots__ = ("session", "bucket", "key", "object", "persist", "metadata", "invocation_id")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    session: str
    bucket: str
    key: str
    object: Payload
    persist: bool
    metadata: _containers.ScalarMap[str, str]
    invocation_id: str
    def __init__(self, session: _Optional[str] = ..., bucket: _Optional[str] = ..., key: _Optional[str] = ..., object: _Optional[_Union[Payload, _Mapping]] = ..., persist: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ..., invocation_id: _Optional[str] = ...) -> None: ...

class SendObjectResponse(_message.Message):
    __slots__ = ("ref", "size", "persisted")
    REF_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_FIELD_NUMBER: _ClassVar[int]
    ref: str
    size: int
    persisted: bool
    def __init__(self, ref: _Optional[str] = ..., size: _Optional[int] = ..., persisted: _Optional[bool] = ...) -> None: ...

class GetObjectRequest(_message.Message):
    __slots__ = ("session", "bucket", "key")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    session: str
    bucket: str
    key: str
    def __init__(self, session: _Optional[str] = ..., bucket: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class InvokeRequest(_message.Message):
    __slots__ = ("url", "function", "session", "bucket", "key", "object", "args")
    URL_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    url: str
    function: str
    session: str
    bucket: str
    key: str
    object: Payload
    args: bytes
    def __init__(self, url: _Optional[str] = ..., function: _Optional[str] = ..., session: _Optional[str] = ..., bucket: _Optional[str] = ..., key: _Optional[str] = ..., object: _Optional[_Union[Payload, _Mapping]] = ..., args: _Optional[bytes] = ...) -> None: ...

class InvokeResponse(_message.Message):
    __slots__ = ("status", "content_type", "body", "error_reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    status: int
    content_type: str
    body: bytes
    error_reason: str
    def __init__(self, status: _Optional[int] = ..., content_type: _Optional[str] = ..., body: _Optional[bytes] = ..., error_reason: _Optional[str] = ...) -> None: ...
