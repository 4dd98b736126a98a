from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT16: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]

class FrameKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FRAME_KIND_UNSPECIFIED: _ClassVar[FrameKind]
    FRAME_KIND_TENSOR: _ClassVar[FrameKind]
    FRAME_KIND_OBJECT: _ClassVar[FrameKind]
    FRAME_KIND_CLOSE: _ClassVar[FrameKind]
    FRAME_KIND_ABORT: _ClassVar[FrameKind]

class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_UNSPECIFIED: _ClassVar[Op]
    OP_SEND: _ClassVar[Op]
    OP_BROADCAST: _ClassVar[Op]
    OP_ALL_REDUCE: _ClassVar[Op]
    OP_REDUCE: _ClassVar[Op]
    OP_GATHER: _ClassVar[Op]
    OP_ALL_GATHER: _ClassVar[Op]
    OP_SCATTER: _ClassVar[Op]
    OP_BARRIER: _ClassVar[Op]
    OP_OBJECT: _ClassVar[Op]
DTYPE_UNSPECIFIED: DType
DTYPE_INT64: DType
DTYPE_INT32: DType
DTYPE_INT16: DType
DTYPE_INT8: DType
DTYPE_UINT8: DType
DTYPE_BOOL: DType
DTYPE_FLOAT64: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
FRAME_KIND_UNSPECIFIED: FrameKind
FRAME_KIND_TENSOR: FrameKind
FRAME_KIND_OBJECT: FrameKind
FRAME_KIND_CLOSE: FrameKind
FRAME_KIND_ABORT: FrameKind
OP_UNSPECIFIED: Op
OP_SEND: Op
OP_BROADCAST: Op
OP_ALL_REDUCE: Op
OP_REDUCE: Op
OP_GATHER: Op
OP_ALL_GATHER: Op
OP_SCATTER: Op
OP_BARRIER: Op
OP_OBJECT: Op

class HelloRequest(_message.Message):
    __slots__ = ("session_id", "rank", "world_size")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rank: int
    world_size: int
    def __init__(self, session_id: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("session_id", "rank", "world_size")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rank: int
    world_size: int
    def __init__(self, session_id: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("dtype", "shape", "nbytes")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("none", "bool_value", "int_value", "float_value", "str_value", "bytes_value", "list_value", "tuple_value", "map_value", "size_value", "tensor_value")
    NONE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STR_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    TUPLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    MAP_VALUE_FIELD_NUMBER: _ClassVar[int]
    SIZE_VALUE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_VALUE_FIELD_NUMBER: _ClassVar[int]
    none: bool
    bool_value: bool
    int_value: int
    float_value: float
    str_value: str
    bytes_value: bytes
    list_value: ValueList
    tuple_value: ValueList
    map_value: ValueMap
    size_value: Shape
    tensor_value: InlineTensor
    def __init__(self, none: _Optional[bool] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., str_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., list_value: _Optional[_Union[ValueList, _Mapping]] = ..., tuple_value: _Optional[_Union[ValueList, _Mapping]] = ..., map_value: _Optional[_Union[ValueMap, _Mapping]] = ..., size_value: _Optional[_Union[Shape, _Mapping]] = ..., tensor_value: _Optional[_Union[InlineTensor, _Mapping]] = ...) -> None: ...

class ValueList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ValueMap(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ValueMapEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[ValueMapEntry, _Mapping]]] = ...) -> None: ...

class ValueMapEntry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: Value
    value: Value
    def __init__(self, key: _Optional[_Union[Value, _Mapping]] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Shape(_message.Message):
    __slots__ = ("dims",)
    DIMS_FIELD_NUMBER: _ClassVar[int]
    dims: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dims: _Optional[_Iterable[int]] = ...) -> None: ...

class InlineTensor(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: TensorHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[TensorHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("kind", "seq", "op", "chunk", "chunks", "header", "value", "reason", "data")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    kind: FrameKind
    seq: int
    op: Op
    chunk: int
    chunks: int
    header: TensorHeader
    value: Value
    reason: str
    data: bytes
    def __init__(self, kind: _Optional[_Union[FrameKind, str]] = ..., seq: _Optional[int] = ..., op: _Optional[_Union[Op, str]] = ..., chunk: _Optional[int] = ..., chunks: _Optional[int] = ..., header: _Optional[_Union[TensorHeader, _Mapping]] = ..., value: _Optional[_Union[Value, _Mapping]] = ..., reason: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class StreamSummary(_message.Message):
    __slots__ = ("messages", "bytes")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    messages: int
    bytes: int
    def __init__(self, messages: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...
