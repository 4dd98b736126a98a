"""Tensors and objects as `mpcml.v1.Frame`s: chunking, reassembly and the object schema.

A tensor message is encoded once, eagerly, when it is sent (so the caller may reuse its tensor
at once, as with gloo) into frames of at most `chunk_bytes` of data. The data field is appended
to the protobuf-encoded rest of the frame by hand, which is valid protobuf and saves a copy of
every payload.

Objects travel as `mpcml.v1.Value`: None, bools, ints, floats, strings, bytes, lists, tuples,
mappings, torch.Size and small tensors. Anything else is refused at the sender; nothing is ever
unpickled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from google.protobuf.message import DecodeError

from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.transport.errors import ProtocolError, TransportError

_DTYPES: dict[torch.dtype, pb.DType] = {
    torch.int64: pb.DTYPE_INT64,
    torch.int32: pb.DTYPE_INT32,
    torch.int16: pb.DTYPE_INT16,
    torch.int8: pb.DTYPE_INT8,
    torch.uint8: pb.DTYPE_UINT8,
    torch.bool: pb.DTYPE_BOOL,
    torch.float64: pb.DTYPE_FLOAT64,
    torch.float32: pb.DTYPE_FLOAT32,
    torch.float16: pb.DTYPE_FLOAT16,
    torch.bfloat16: pb.DTYPE_BFLOAT16,
}
_TORCH_DTYPES = {wire: dtype for dtype, wire in _DTYPES.items()}
_DATA_TAG = bytes([(15 << 3) | 2])  # Frame.data: field 15, length-delimited
MAX_VALUE_DEPTH = 32
MAX_TENSOR_BYTES = 1 << 36
"""Largest tensor a peer may announce (64 GiB): a bound against absurd headers, not a quota."""
MAX_TENSOR_DIMS = 64
"""Most dimensions a peer may announce: more would cost minutes of arithmetic on the sizes."""


@dataclass(frozen=True)
class Message:
    """One complete message received from a peer."""

    seq: int
    op: pb.Op
    tensor: torch.Tensor | None = None
    value: Any = None

    def tensor_or_raise(self) -> torch.Tensor:
        """The tensor of a tensor message; an object where a tensor belongs is a desync."""
        if self.tensor is None:
            raise ProtocolError(
                f"message {self.seq} carries an object where a tensor was "
                "expected: the parties' computations diverged"
            )
        return self.tensor


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tensor_header(tensor: torch.Tensor) -> pb.TensorHeader:
    """Wire header of `tensor`; an unsupported dtype raises TransportError."""
    try:
        dtype = _DTYPES[tensor.dtype]
    except KeyError:
        raise TransportError(f"tensors of dtype {tensor.dtype} cannot be sent") from None
    return pb.TensorHeader(
        dtype=dtype, shape=list(tensor.shape), nbytes=tensor.numel() * tensor.element_size()
    )


def _host_bytes(tensor: torch.Tensor) -> memoryview:
    # CUDA shares move through host memory (docs/architecture.md). `reshape` copies only what
    # cannot be viewed flat; a view whose step is not 1 (a column of a share, or one element of
    # an expanded or unbound one, which `contiguous()` leaves alone because a size-1 dimension
    # does not count) is copied once so that its bytes are in logical order.
    flat = tensor.detach().to("cpu").reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    if flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return memoryview(flat.view(torch.uint8).numpy().data)


def tensor_frames(seq: int, op: pb.Op, tensor: torch.Tensor, chunk_bytes: int) -> list[bytes]:
    """The encoded frames of one tensor message."""
    header = tensor_header(tensor)
    data = _host_bytes(tensor)
    chunks = max(1, math.ceil(len(data) / chunk_bytes))
    frames = []
    for i in range(chunks):
        frame = pb.Frame(kind=pb.FRAME_KIND_TENSOR, seq=seq, op=op, chunk=i, chunks=chunks)
        if i == 0:
            frame.header.CopyFrom(header)
        piece = data[i * chunk_bytes : (i + 1) * chunk_bytes]
        prefix = frame.SerializeToString()
        if len(piece):
            frames.append(b"".join((prefix, _DATA_TAG, _varint(len(piece)), piece)))
        else:
            frames.append(prefix)
    return frames


def object_frame(seq: int, op: pb.Op, obj: Any) -> bytes:
    """The encoded frame of one object message."""
    frame = pb.Frame(kind=pb.FRAME_KIND_OBJECT, seq=seq, op=op, chunk=0, chunks=1)
    frame.value.CopyFrom(to_value(obj))
    return frame.SerializeToString()


def control_frame(seq: int, kind: pb.FrameKind, reason: str = "") -> bytes:
    """A CLOSE or ABORT frame."""
    return pb.Frame(kind=kind, seq=seq, reason=reason).SerializeToString()


def to_value(obj: Any, depth: int = 0) -> pb.Value:
    """Schema'd encoding of a small Python object; refuses anything outside the schema."""
    if depth > MAX_VALUE_DEPTH:
        raise TransportError(f"object nested deeper than {MAX_VALUE_DEPTH} levels")
    v = pb.Value()
    if obj is None:
        v.none = True
    elif isinstance(obj, bool):
        v.bool_value = obj
    elif isinstance(obj, int):
        if not -(1 << 63) <= obj < (1 << 63):
            raise TransportError(f"integer {obj} does not fit in 64 bits")
        v.int_value = obj
    elif isinstance(obj, float):
        v.float_value = obj
    elif isinstance(obj, str):
        v.str_value = obj
    elif isinstance(obj, bytes):
        v.bytes_value = obj
    elif isinstance(obj, torch.Size):
        v.size_value.dims.extend(obj)
    elif isinstance(obj, list | tuple):
        items = v.tuple_value if isinstance(obj, tuple) else v.list_value
        items.SetInParent()
        for item in obj:
            items.items.append(to_value(item, depth + 1))
    elif isinstance(obj, dict):
        v.map_value.SetInParent()
        for key, value in obj.items():
            entry = v.map_value.entries.add()
            entry.key.CopyFrom(to_value(key, depth + 1))
            entry.value.CopyFrom(to_value(value, depth + 1))
    elif isinstance(obj, torch.Tensor):
        v.tensor_value.header.CopyFrom(tensor_header(obj))
        v.tensor_value.data = bytes(_host_bytes(obj))
    else:
        raise TransportError(
            f"objects of type {type(obj).__name__} cannot be sent: the data plane carries only "
            "None, bool, int, float, str, bytes, list, tuple, dict, torch.Size and tensors"
        )
    return v


def from_value(v: pb.Value, depth: int = 0) -> Any:
    """Inverse of `to_value`; malformed input raises ProtocolError."""
    if depth > MAX_VALUE_DEPTH:
        raise ProtocolError(f"object nested deeper than {MAX_VALUE_DEPTH} levels")
    kind = v.WhichOneof("kind")
    if kind == "none":
        return None
    if kind in ("bool_value", "int_value", "float_value", "str_value", "bytes_value"):
        return getattr(v, kind)
    if kind == "size_value":
        return torch.Size(v.size_value.dims)
    if kind == "list_value":
        return [from_value(item, depth + 1) for item in v.list_value.items]
    if kind == "tuple_value":
        return tuple(from_value(item, depth + 1) for item in v.tuple_value.items)
    if kind == "map_value":
        out = {}
        for entry in v.map_value.entries:
            key = from_value(entry.key, depth + 1)
            try:
                out[key] = from_value(entry.value, depth + 1)
            except TypeError as exc:
                raise ProtocolError(f"unusable mapping key: {exc}") from None
        return out
    if kind == "tensor_value":
        tensor = empty_tensor(v.tensor_value.header)
        data = v.tensor_value.data
        if len(data) != v.tensor_value.header.nbytes:
            raise ProtocolError(
                f"inline tensor has {len(data)} bytes, its header says "
                f"{v.tensor_value.header.nbytes}"
            )
        if data:
            _copy_bytes(_byte_view(tensor), data)
        return tensor
    raise ProtocolError("object value has no kind")


def empty_tensor(header: pb.TensorHeader) -> torch.Tensor:
    """Allocate the tensor a header announces, after checking the header is consistent."""
    dtype = _TORCH_DTYPES.get(header.dtype)
    if dtype is None:
        raise ProtocolError(f"unknown tensor dtype {header.dtype}")
    if len(header.shape) > MAX_TENSOR_DIMS:
        raise ProtocolError(
            f"tensor of {len(header.shape)} dimensions exceeds the limit of {MAX_TENSOR_DIMS}"
        )
    if any(d < 0 for d in header.shape):
        raise ProtocolError(f"negative dimension in shape {list(header.shape)}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(header.shape) * itemsize
    if nbytes != header.nbytes:
        raise ProtocolError(
            f"tensor header says {header.nbytes} bytes, shape "
            f"{list(header.shape)} of {dtype} needs {nbytes}"
        )
    if nbytes > MAX_TENSOR_BYTES:
        raise ProtocolError(f"tensor of {nbytes} bytes exceeds the limit of {MAX_TENSOR_BYTES}")
    try:
        return torch.empty(tuple(header.shape), dtype=dtype)
    except RuntimeError as exc:  # never a RuntimeError out of the transport (docs/architecture.md)
        # Dimensions whose strides overflow int64 (next to a 0), or more memory than there is.
        raise ProtocolError(
            f"cannot allocate a tensor of shape {list(header.shape)} and {dtype}: {exc}"
        ) from None


def _byte_view(tensor: torch.Tensor) -> np.ndarray:
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _copy_bytes(target: np.ndarray, data: bytes | memoryview) -> None:
    target[:] = np.frombuffer(data, dtype=np.uint8)


@dataclass(frozen=True)
class WireFrame:
    """A received frame: its fields, and its data as a view into the received buffer."""

    frame: pb.Frame
    data: memoryview
    error: str = ""
    """Why the frame could not be parsed; the other fields are then empty."""


def _varint_at(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("truncated frame")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtocolError("malformed varint in frame")


def _split_data(raw: bytes) -> tuple[bytes, memoryview]:
    # Walk the top-level fields to find `data` (field 15) and leave it in place.
    view = memoryview(raw)
    pos, head, data = 0, [], view[0:0]
    kept_from = 0
    while pos < len(raw):
        field_at = pos
        key, pos = _varint_at(raw, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint_at(raw, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint_at(raw, pos)
            if key >> 3 == 15:
                if pos + length > len(raw):
                    raise ProtocolError("truncated frame data")
                head.append(view[kept_from:field_at])
                data = view[pos : pos + length]
                kept_from = pos + length
            pos += length
        else:
            raise ProtocolError(f"unsupported protobuf wire type {wire} in frame")
        if pos > len(raw):
            raise ProtocolError("truncated frame")
    head.append(view[kept_from:])
    return b"".join(head), data


def parse_frame(raw: bytes) -> WireFrame:
    """GRPC request deserializer of `Stream`: parses a Frame without copying its data.

    Never raises, so that a malformed frame reaches the servicer and fails the session with
    a ProtocolError naming the sender, instead of a bare INTERNAL status.
    """
    try:
        head, data = _split_data(raw)
        return WireFrame(pb.Frame.FromString(head), data)
    except (ProtocolError, DecodeError) as exc:
        return WireFrame(pb.Frame(), memoryview(b""), error=f"malformed frame: {exc}")


class Assembler:
    """Turns the frames of one stream back into messages, checking order and sizes."""

    def __init__(self) -> None:
        self.next_seq = 0
        self.bytes_received = 0
        self._tensor: torch.Tensor | None = None
        self._view: np.ndarray | None = None
        self._offset = 0
        self._op = pb.OP_UNSPECIFIED
        self._chunks = 0
        self._chunk = 0

    def finish(self) -> None:
        """The sender closed its stream: a tensor message still missing chunks was cut short."""
        if self._tensor is not None:
            raise ProtocolError(
                f"the stream was closed inside message {self.next_seq}, after {self._chunk} "
                f"of its {self._chunks} chunks"
            )

    def feed(self, frame: pb.Frame, data: bytes | memoryview | None = None) -> Message | None:
        """Take one TENSOR or OBJECT frame; returns a message when one is complete.

        `data` is the frame's data when it was split off by `parse_frame`.
        """
        if data is None:
            data = frame.data
        if frame.seq != self.next_seq:
            raise ProtocolError(
                f"frame for message {frame.seq} arrived, expected message {self.next_seq}"
            )
        if frame.kind == pb.FRAME_KIND_OBJECT:
            if self._tensor is not None:
                raise ProtocolError("object frame inside an unfinished tensor message")
            self.next_seq += 1
            return Message(frame.seq, frame.op, value=from_value(frame.value))
        if frame.kind != pb.FRAME_KIND_TENSOR:
            raise ProtocolError(f"unexpected frame kind {frame.kind}")
        if self._tensor is None:
            if frame.chunk != 0 or not frame.HasField("header"):
                raise ProtocolError(
                    f"message {frame.seq} starts with chunk {frame.chunk} and no header"
                )
            if frame.chunks < 1:
                raise ProtocolError(f"message {frame.seq} announces {frame.chunks} chunks")
            self._tensor = empty_tensor(frame.header)
            self._view = _byte_view(self._tensor) if self._tensor.numel() else None
            self._offset, self._op = 0, frame.op
            self._chunks, self._chunk = frame.chunks, 0
        elif frame.chunk != self._chunk or frame.op != self._op:
            raise ProtocolError(
                f"chunk {frame.chunk} of message {frame.seq} arrived, expected chunk {self._chunk}"
            )
        n = len(data)
        total = 0 if self._view is None else len(self._view)
        if self._offset + n > total:
            raise ProtocolError(
                f"message {frame.seq} carries more data than its header's {total} bytes"
            )
        if n:
            assert self._view is not None
            _copy_bytes(self._view[self._offset : self._offset + n], data)
        self._offset += n
        self._chunk += 1
        if self._chunk < self._chunks:
            return None
        if self._offset != total:
            raise ProtocolError(f"message {frame.seq} ended after {self._offset} of {total} bytes")
        tensor, self._tensor, self._view = self._tensor, None, None
        self.bytes_received += total
        self.next_seq += 1
        return Message(frame.seq, self._op, tensor=tensor)
