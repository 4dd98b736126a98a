"""Hypothesis strategies and verdicts shared by the fuzz tests of every gRPC door.

`MPCML_FUZZ_CASES` sets how many cases each fuzzed method gets (default 300).
"""

from __future__ import annotations

import os
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

CASES = int(os.environ.get("MPCML_FUZZ_CASES", "300"))
PROPER = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
}
"""What a daemon may answer to a request it cannot serve."""
UNDECODABLE = "Exception deserializing request!"
"""gRPC-python's own INTERNAL reply to bytes that are not the method's message: the handler
never runs, so no daemon code can answer otherwise."""


def mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    """`data` with the bytes at `edits` (position modulo its length, new value) replaced and
    cut to its first `cut` bytes."""
    out = bytearray(data)
    for position, value in edits:
        if out:
            out[position % len(out)] = value
    return bytes(out[:cut] if cut is not None else out)


MUTATIONS = st.tuples(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.one_of(st.none(), st.integers(0, 64)),
)
"""Arguments of `mutate` after the data."""

_F = FieldDescriptor
SCALARS: dict[int, st.SearchStrategy[Any]] = {
    _F.TYPE_STRING: st.text(max_size=40),
    _F.TYPE_BYTES: st.binary(max_size=40),
    _F.TYPE_BOOL: st.booleans(),
    _F.TYPE_ENUM: st.integers(-5, 2**31 - 1),  # unknown values included
    _F.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    _F.TYPE_UINT64: st.integers(0, 2**64 - 1),
    _F.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    _F.TYPE_UINT32: st.integers(0, 2**32 - 1),
    _F.TYPE_DOUBLE: st.floats(allow_nan=True),
}
"""Values of every range, per protobuf field type."""


@st.composite
def well_formed(draw: st.DrawFn, seed: Any) -> bytes:
    """The seed message with random values (huge, negative, unknown enums) in its scalar and
    repeated scalar fields: requests that decode, so the daemon's own checks answer."""
    message = type(seed)()
    message.CopyFrom(seed)
    for field in seed.DESCRIPTOR.fields:
        strategy = SCALARS.get(field.type)
        if strategy is None or not draw(st.booleans()):
            continue
        if field.is_repeated:
            getattr(message, field.name)[:] = draw(st.lists(strategy, max_size=6))
        else:
            setattr(message, field.name, draw(strategy))
    return bytes(message.SerializeToString())


def payloads(seed: Any) -> st.SearchStrategy[Any]:
    """Random bytes, `MUTATIONS` of the seed's encoding (to apply with `mutate`), or
    `well_formed` variants of the seed."""
    return st.one_of(st.binary(max_size=256), MUTATIONS, well_formed(seed), well_formed(seed))
