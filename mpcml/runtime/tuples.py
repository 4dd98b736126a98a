"""What each party draws for a tuple, and the dealer's correcting share, in one place.

Shared by the party's provider (`mpcml.runtime.provider`) and the dealer daemon
(`mpcml.dealer.server`), so that both sides of the protocol compute from one definition.

Every party derives its shares of a tuple from its own key; ranks other than 0 draw every
share, rank 0 all but the last, which the dealer computes so that the shares add up (or XOR up)
to a correct tuple. A tuple's draws come from a ChaCha20 stream keyed by the party's key, the
tuple's number in the session and what it is (`tuple_key`), not from a position shared with the
tuples before it: so rank 0 can ask the dealer for a tuple before CrypTen asks for it (the
provider guesses a batch's tuples from the last batch's), and a wrong guess names another tuple,
with other randomness; no randomness ever serves two tuples.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mpcml.errors import MpcmlError
from mpcml.proto.v1 import dealer_pb2 as pb
from mpcml.runtime.prg import ChaChaStream

MAX_MESSAGE_BYTES = 512 * 2**20
"""The largest message between a party and the dealer, either way."""
CHUNK_BYTES = 4 * 2**20
"""A correction larger than this comes from the dealer in chunks of this size (as the data
plane's tensors: `transport.options.CHUNK_BYTES`)."""
OPS = frozenset({"mul", "matmul", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d"})
CONV_ARGUMENTS = frozenset({"stride", "padding", "dilation", "groups", "output_padding"})


class TupleError(MpcmlError, ValueError):
    """A tuple request the dealer cannot serve; the message says why."""


def kwargs_of(request: pb.TupleRequest) -> dict[str, Any]:
    """The op's arguments as CrypTen passed them (ints, or tuples of ints)."""
    out: dict[str, Any] = {}
    for key, ints in request.kwargs.items():
        if key not in CONV_ARGUMENTS:
            raise TupleError(f"argument {key!r} is not one of {sorted(CONV_ARGUMENTS)}")
        values = tuple(int(v) for v in ints.values)
        out[key] = values[0] if len(values) == 1 else values
    return out


def result_size(request: pb.TupleRequest) -> torch.Size:
    """The size of the tuple's last element (sizes checked by the caller against its limit)."""
    kwargs = tuple(sorted(kwargs_of(request).items()))
    return _result_size(
        request.kind, request.op, tuple(request.size0), tuple(request.size1), kwargs
    )


@functools.lru_cache(maxsize=4096)
def _result_size(
    kind: int,
    op: str,
    size0: tuple[int, ...],
    size1: tuple[int, ...],
    kwargs: tuple[tuple[str, Any], ...],
) -> torch.Size:
    # Cached: a job asks for the same few shapes every batch, and torch's shape inference on
    # meta tensors costs about half a millisecond a call (and imports torch._dynamo once).
    if any(d < 0 for d in (*size0, *size1)):
        raise TupleError(f"negative size in {list(size0)} or {list(size1)}")
    if kind == pb.ADDITIVE:
        if op not in OPS:
            raise TupleError(f"op {op!r} is not one of {sorted(OPS)}")
        try:
            a, b = torch.empty(size0, device="meta"), torch.empty(size1, device="meta")
            return getattr(torch, op)(a, b, **dict(kwargs)).size()  # type: ignore[no-any-return]
        except (RuntimeError, TypeError, ValueError) as exc:
            raise TupleError(f"{op} of {list(size0)} and {list(size1)}: {exc}") from None
    if kind == pb.BINARY:
        try:
            return torch.Size(torch.broadcast_shapes(size0, size1))  # type: ignore[no-untyped-call]
        except RuntimeError as exc:
            raise TupleError(f"sizes {list(size0)} and {list(size1)}: {exc}") from None
    if kind in (pb.SQUARE, pb.WRAPS, pb.B2A):
        return torch.Size(size0)
    raise TupleError(f"unknown tuple kind {kind}")


def warm() -> None:
    """Pay for torch's shape inference's one-time import (about 1 s) now, not in a job."""
    result_size(pb.TupleRequest(kind=pb.ADDITIVE, op="mul", size0=[1], size1=[1]))


def describe(request: pb.TupleRequest) -> bytes:
    """What the tuple is, as bytes: its kind, op, sizes and arguments (no session, no seq)."""
    kwargs = sorted((k, tuple(v.values)) for k, v in request.kwargs.items())
    text = f"{request.kind}|{request.op}|{list(request.size0)}|{list(request.size1)}|{kwargs}"
    return text.encode()


def tuple_key(key: bytes, seq: int, description: bytes) -> bytes:
    """The ChaCha20 key of one tuple's draws: keyed BLAKE2b of its number and description."""
    data = seq.to_bytes(8, "little") + description
    return hashlib.blake2b(data, key=key, digest_size=32, person=b"mpcml-tuple").digest()


def bound_key(key: bytes, binding: bytes) -> bytes:
    """A party's session key bound to its run's agreed `binding` (the key itself when empty)."""
    if not binding:
        return key
    return hashlib.blake2b(binding, key=key, digest_size=32, person=b"mpcml-bind").digest()


def job_key(secret: bytes, job_id: str, parties: Sequence[str], rank: int) -> bytes:
    """The dealer's key for `rank` of a job: the same for every run of the job."""
    data = "\x00".join([job_id, *parties, str(rank)]).encode()
    return hashlib.blake2b(data, key=secret, digest_size=32, person=b"mpcml-jobkey").digest()


def secret_tag(secret: bytes) -> bytes:
    """What a secret may show of itself: a digest that changes when it does."""
    return hashlib.blake2b(secret, digest_size=32, person=b"mpcml-tag").digest()


def draw(key: bytes, rank: int, request: pb.TupleRequest, device: Any = None) -> list[torch.Tensor]:
    """The shares `rank` draws from its session `key` for `request` (rank 0 lacks the last)."""
    stream = ChaChaStream(tuple_key(key, request.seq, describe(request)))
    size0, size1 = torch.Size(request.size0), torch.Size(request.size1)
    last = [] if rank == 0 else [stream.ring(result_size(request), device=device)]
    if request.kind in (pb.ADDITIVE, pb.BINARY):
        return [stream.ring(size0, device=device), stream.ring(size1, device=device), *last]
    if request.kind in (pb.SQUARE, pb.WRAPS):
        return [stream.ring(size0, device=device), *last]
    if request.kind == pb.B2A:
        return [stream.ring(size0, bitlength=1, device=device), *last]
    raise TupleError(f"unknown tuple kind {request.kind}")


def _count_wraps(shares: Sequence[torch.Tensor]) -> torch.Tensor:
    # How often the sum of the int64 shares wraps around 2^64 (CrypTen's count_wraps).
    result = torch.zeros_like(shares[0])
    prev = shares[0]
    for cur in shares[1:]:
        total = cur + prev
        result -= ((prev < 0) & (cur < 0) & (total > 0)).long()
        result += ((prev > 0) & (cur > 0) & (total < 0)).long()
        prev = total
    return result


def correction(request: pb.TupleRequest, draws: Mapping[int, list[torch.Tensor]]) -> torch.Tensor:
    """Rank 0's last share, from every rank's draws (on the dealer)."""
    ranks = sorted(draws)
    others = [draws[r][-1] for r in ranks if r != 0]

    def add(i: int) -> torch.Tensor:
        return torch.stack([draws[r][i] for r in ranks]).sum(0)

    def xor(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        out = torch.zeros_like(tensors[0])
        for t in tensors:
            out ^= t
        return out

    if request.kind == pb.ADDITIVE:
        value: torch.Tensor = getattr(torch, request.op)(add(0), add(1), **kwargs_of(request))
        return value - sum(others, torch.zeros_like(value))
    if request.kind == pb.SQUARE:
        r = add(0)
        return r * r - sum(others, torch.zeros_like(r))
    if request.kind == pb.BINARY:
        a, b = xor([draws[r][0] for r in ranks]), xor([draws[r][1] for r in ranks])
        return (a & b) ^ xor([torch.zeros_like(a & b), *others])
    if request.kind == pb.WRAPS:
        theta = _count_wraps([draws[r][0] for r in ranks])
        return theta - sum(others, torch.zeros_like(theta))
    if request.kind == pb.B2A:
        bit = xor([draws[r][0] for r in ranks])
        return bit - sum(others, torch.zeros_like(bit))
    raise TupleError(f"unknown tuple kind {request.kind}")
