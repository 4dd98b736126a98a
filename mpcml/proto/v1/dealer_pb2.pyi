from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TupleKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TUPLE_KIND_UNSPECIFIED: _ClassVar[TupleKind]
    ADDITIVE: _ClassVar[TupleKind]
    SQUARE: _ClassVar[TupleKind]
    BINARY: _ClassVar[TupleKind]
    WRAPS: _ClassVar[TupleKind]
    B2A: _ClassVar[TupleKind]
TUPLE_KIND_UNSPECIFIED: TupleKind
ADDITIVE: TupleKind
SQUARE: TupleKind
BINARY: TupleKind
WRAPS: TupleKind
B2A: TupleKind

class OpenRequest(_message.Message):
    __slots__ = ("session_id", "rank", "parties", "job_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rank: int
    parties: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    def __init__(self, session_id: _Optional[str] = ..., rank: _Optional[int] = ..., parties: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ...) -> None: ...

class OpenReply(_message.Message):
    __slots__ = ("key", "tag")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    tag: bytes
    def __init__(self, key: _Optional[bytes] = ..., tag: _Optional[bytes] = ...) -> None: ...

class Ints(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class TupleRequest(_message.Message):
    __slots__ = ("session_id", "seq", "kind", "size0", "size1", "op", "kwargs", "binding")
    class KwargsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Ints
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Ints, _Mapping]] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE0_FIELD_NUMBER: _ClassVar[int]
    SIZE1_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    KWARGS_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    kind: TupleKind
    size0: _containers.RepeatedScalarFieldContainer[int]
    size1: _containers.RepeatedScalarFieldContainer[int]
    op: str
    kwargs: _containers.MessageMap[str, Ints]
    binding: bytes
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., kind: _Optional[_Union[TupleKind, str]] = ..., size0: _Optional[_Iterable[int]] = ..., size1: _Optional[_Iterable[int]] = ..., op: _Optional[str] = ..., kwargs: _Optional[_Mapping[str, Ints]] = ..., binding: _Optional[bytes] = ...) -> None: ...

class TupleReply(_message.Message):
    __slots__ = ("shape", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TupleBatch(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[TupleRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[TupleRequest, _Mapping]]] = ...) -> None: ...

class TupleReplies(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[TupleReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[TupleReply, _Mapping]]] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
