"""Frames on the wire: chunking, reassembly, the object schema, and malformed input."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.transport import framing
from mpcml.transport.errors import ProtocolError, TransportError

DTYPES = [
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
]


def _tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


def _reassemble(frames: list[bytes]) -> list[framing.Message]:
    assembler = framing.Assembler()
    out = []
    for raw in frames:
        message = assembler.feed(pb.Frame.FromString(raw))
        if message is not None:
            out.append(message)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5, 11)], ids=str)
def test_tensor_round_trips_exactly_through_small_chunks(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    tensor = _tensor(dtype, shape)
    frames = framing.tensor_frames(0, pb.OP_SEND, tensor, chunk_bytes=16)
    [message] = _reassemble(frames)
    assert message.tensor is not None
    assert message.tensor.dtype == dtype and message.tensor.shape == tensor.shape
    assert torch.equal(message.tensor, tensor)


def test_hand_appended_data_field_is_the_protobuf_encoding() -> None:
    tensor = torch.arange(1000, dtype=torch.int64)
    [raw] = framing.tensor_frames(5, pb.OP_BROADCAST, tensor, chunk_bytes=1 << 20)
    frame = pb.Frame.FromString(raw)
    assert raw == frame.SerializeToString()
    assert frame.seq == 5 and frame.op == pb.OP_BROADCAST and frame.chunks == 1
    assert frame.data == tensor.numpy().tobytes()


STRIDED = {
    "transposed": torch.arange(12).reshape(3, 4).t(),
    "column": torch.arange(12).reshape(3, 4)[:, 1],
    "broadcast": torch.arange(4).expand(3, 4),
    "broadcast one element": torch.tensor(7).expand(1),
    "expanded one element": torch.tensor([[5]]).expand(1, 1),
    "unbound one element": torch.arange(10).reshape(2, 5)[:1].unbind(1)[2],
    "sliced one element": torch.arange(10).reshape(2, 5)[:, 3][1:],
    "step slice": torch.arange(20)[::3],
    "offset view": torch.arange(20).reshape(4, 5)[2:, 1:4],
}


@pytest.mark.parametrize("tensor", STRIDED.values(), ids=STRIDED.keys())
def test_tensor_of_any_strides_is_sent_in_logical_order(tensor: torch.Tensor) -> None:
    """gloo sends such tensors, and CrypTen hands them over (issue 35: a one-element view whose
    stride is not 1 crashed the sender)."""
    for obj in (False, True):
        if obj:
            frames = [framing.object_frame(0, pb.OP_OBJECT, tensor)]
        else:
            frames = framing.tensor_frames(0, pb.OP_SEND, tensor, 8)
        [message] = _reassemble(frames)
        received = message.value if obj else message.tensor_or_raise()
        assert received.shape == tensor.shape and torch.equal(received, tensor)


def test_contiguous_tensor_is_not_copied_to_be_sent() -> None:
    tensor = torch.arange(1000, dtype=torch.int64)
    data = framing._host_bytes(tensor)
    tensor[0] = 42  # the bytes to send are the tensor's own memory
    assert int.from_bytes(data[:8], "little", signed=True) == 42


OBJECTS: list[Any] = [
    None,
    True,
    -(2**63),
    2**63 - 1,
    1.5,
    "ü",
    b"\x00\xff",
    [1, [2, (3, None)]],
    {"a": 1, 2: "b", (1, 2): [3]},
    torch.Size([2, 3]),
]


@pytest.mark.parametrize("obj", OBJECTS, ids=repr)
def test_objects_round_trip_through_the_schema(obj: Any) -> None:
    raw = framing.object_frame(0, pb.OP_OBJECT, obj)
    [message] = _reassemble([raw])
    assert message.value == obj and type(message.value) is type(obj)


def test_tensor_inside_an_object_round_trips() -> None:
    [message] = _reassemble([framing.object_frame(0, pb.OP_OBJECT, {"t": torch.eye(3)})])
    assert torch.equal(message.value["t"], torch.eye(3))


@pytest.mark.parametrize(
    "obj",
    [object(), {1, 2}, 2**64, torch.nn.Linear(1, 1)],
    ids=["object", "set", "bigint", "module"],
)
def test_objects_outside_the_schema_are_refused_at_the_sender(obj: Any) -> None:
    with pytest.raises(TransportError, match=r"cannot be sent|does not fit"):
        framing.object_frame(0, pb.OP_OBJECT, obj)


def test_deeply_nested_object_is_refused() -> None:
    obj: Any = []
    for _ in range(framing.MAX_VALUE_DEPTH + 2):
        obj = [obj]
    with pytest.raises(TransportError, match="nested deeper"):
        framing.object_frame(0, pb.OP_OBJECT, obj)


def _frame(**fields: Any) -> pb.Frame:
    return pb.Frame(kind=pb.FRAME_KIND_TENSOR, op=pb.OP_SEND, chunks=1, **fields)


@pytest.mark.parametrize(
    "frame, message",
    [
        (
            _frame(
                seq=1,
                header=pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[1], nbytes=8),
                data=b"\0" * 8,
            ),
            "expected message 0",
        ),
        (_frame(seq=0, chunk=1), "no header"),
        (
            _frame(seq=0, header=pb.TensorHeader(dtype=cast(pb.DType, 99), shape=[1], nbytes=8)),
            "unknown tensor dtype",
        ),
        (
            _frame(seq=0, header=pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[-1], nbytes=8)),
            "negative dimension",
        ),
        (
            _frame(seq=0, header=pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[2], nbytes=8)),
            "needs 16",
        ),
        (
            _frame(
                seq=0,
                header=pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[1], nbytes=8),
                data=b"\0" * 9,
            ),
            "more data",
        ),
        (
            _frame(
                seq=0,
                header=pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[2], nbytes=16),
                data=b"\0" * 8,
            ),
            "ended after 8 of 16",
        ),
        (
            _frame(
                seq=0,
                header=pb.TensorHeader(
                    dtype=pb.DTYPE_INT64, shape=[1 << 40, 1 << 20], nbytes=(1 << 63)
                ),
            ),
            "exceeds the limit",
        ),
        (pb.Frame(kind=pb.FRAME_KIND_OBJECT, seq=0), "no kind"),
        (pb.Frame(kind=cast(pb.FrameKind, 42), seq=0), "unexpected frame kind"),
    ],
    ids=[
        "seq-gap",
        "no-header",
        "dtype",
        "negative",
        "nbytes",
        "overflow",
        "short",
        "huge",
        "empty-object",
        "kind",
    ],
)
def test_malformed_frames_raise_protocol_errors(frame: pb.Frame, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        framing.Assembler().feed(frame)


def test_chunks_out_of_order_are_refused() -> None:
    frames = framing.tensor_frames(0, pb.OP_SEND, torch.arange(8), chunk_bytes=16)
    assembler = framing.Assembler()
    assembler.feed(pb.Frame.FromString(frames[0]))
    with pytest.raises(ProtocolError, match="expected chunk 1"):
        assembler.feed(pb.Frame.FromString(frames[2]))
