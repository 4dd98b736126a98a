from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Graph(_message.Message):
    __slots__ = ("version", "inputs", "nodes", "output", "op_table", "input_shape", "output_shape", "token_vocab")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    OP_TABLE_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VOCAB_FIELD_NUMBER: _ClassVar[int]
    version: int
    inputs: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    output: str
    op_table: int
    input_shape: _containers.RepeatedScalarFieldContainer[int]
    output_shape: _containers.RepeatedScalarFieldContainer[int]
    token_vocab: int
    def __init__(self, version: _Optional[int] = ..., inputs: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., output: _Optional[str] = ..., op_table: _Optional[int] = ..., input_shape: _Optional[_Iterable[int]] = ..., output_shape: _Optional[_Iterable[int]] = ..., token_vocab: _Optional[int] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "op", "inputs", "attrs", "module", "parameters")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Attr
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Attr, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    attrs: _containers.MessageMap[str, Attr]
    module: str
    parameters: _containers.RepeatedCompositeFieldContainer[ParameterSpec]
    def __init__(self, name: _Optional[str] = ..., op: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Mapping[str, Attr]] = ..., module: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[ParameterSpec, _Mapping]]] = ...) -> None: ...

class Attr(_message.Message):
    __slots__ = ("i", "f", "s", "b", "ints", "floats")
    I_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    INTS_FIELD_NUMBER: _ClassVar[int]
    FLOATS_FIELD_NUMBER: _ClassVar[int]
    i: int
    f: float
    s: str
    b: bool
    ints: IntList
    floats: FloatList
    def __init__(self, i: _Optional[int] = ..., f: _Optional[float] = ..., s: _Optional[str] = ..., b: _Optional[bool] = ..., ints: _Optional[_Union[IntList, _Mapping]] = ..., floats: _Optional[_Union[FloatList, _Mapping]] = ...) -> None: ...

class IntList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class FloatList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class ParameterSpec(_message.Message):
    __slots__ = ("name", "shape", "buffer")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    buffer: bool
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., buffer: _Optional[bool] = ...) -> None: ...
