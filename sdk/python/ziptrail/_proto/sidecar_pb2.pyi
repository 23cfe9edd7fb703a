from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
