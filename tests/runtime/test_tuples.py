"""The tuple arithmetic the provider and the dealer share: each tuple's randomness is its own,
and the dealer's correction makes every kind of tuple add up to the right value."""

from __future__ import annotations

import os

import pytest
import torch

from mpcml.proto.v1 import dealer_pb2 as pb
from mpcml.runtime import tuples

KEYS = [os.urandom(32) for _ in range(3)]


def _request(
    seq: int, kind: pb.TupleKind, size0: list[int], size1: tuple[int, ...] = (), op: str = ""
) -> pb.TupleRequest:
    return pb.TupleRequest(seq=seq, kind=kind, size0=size0, size1=list(size1), op=op)


def _all_shares(request: pb.TupleRequest) -> list[list[torch.Tensor]]:
    draws = {r: tuples.draw(k, r, request) for r, k in enumerate(KEYS)}
    draws[0] = [*draws[0], tuples.correction(request, draws)]
    return [draws[r] for r in sorted(draws)]


def test_a_tuple_is_drawn_again_the_same_and_no_other_tuple_shares_its_randomness() -> None:
    mul = _request(4, pb.ADDITIVE, [6], (6,), "mul")
    again = tuples.draw(KEYS[1], 1, _request(4, pb.ADDITIVE, [6], (6,), "mul"))
    assert all(torch.equal(x, y) for x, y in zip(tuples.draw(KEYS[1], 1, mul), again, strict=True))
    others = [
        _request(5, pb.ADDITIVE, [6], (6,), "mul"),  # the next number
        _request(4, pb.ADDITIVE, [6], (6,), "matmul"),  # another op
        _request(4, pb.ADDITIVE, [6], (1,), "mul"),  # another size
        _request(4, pb.SQUARE, [6]),  # another kind
    ]
    first = tuples.draw(KEYS[1], 1, mul)[0]
    for other in others:
        assert not torch.equal(tuples.draw(KEYS[1], 1, other)[0][:6].flatten(), first), other
    assert not torch.equal(tuples.draw(KEYS[2], 1, mul)[0], first), "another key"


@pytest.mark.parametrize(
    "request_",
    [
        _request(0, pb.ADDITIVE, [3, 4], (4, 2), "matmul"),
        _request(1, pb.ADDITIVE, [5], (5,), "mul"),
        _request(2, pb.SQUARE, [7]),
    ],
    ids=["matmul", "mul", "square"],
)
def test_arithmetic_tuples_add_up(request_: pb.TupleRequest) -> None:
    shares = _all_shares(request_)
    total = [torch.stack([s[i] for s in shares]).sum(0) for i in range(len(shares[0]))]
    if request_.kind == pb.SQUARE:
        assert torch.equal(total[1], total[0] * total[0])
    else:
        assert torch.equal(total[2], getattr(torch, request_.op)(total[0], total[1]))


def test_binary_tuples_xor_up() -> None:
    shares = _all_shares(_request(0, pb.BINARY, [9], (9,)))
    a, b, c = (shares[0][i] ^ shares[1][i] ^ shares[2][i] for i in range(3))
    assert torch.equal(c, a & b)
