"""The dealer provider's local checks: refusals by name, and correcting shares of any size."""

from __future__ import annotations

import pytest
import torch

from mpcml.proto.v1 import dealer_pb2 as pb
from mpcml.runtime.provider import DealerError, DealerProvider, Pending


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("trace", ()),
        ("trace", (False,)),
        ("trace_once", ()),
        ("fill_cache", ()),
        ("save_cache", ("/tmp/x",)),
        ("load_cache", ()),
    ],
)
def test_tuple_cache_calls_are_refused_by_name(call: str, args: tuple[object, ...]) -> None:
    with pytest.raises(DealerError, match="keeps no tuple cache"):
        getattr(DealerProvider(), call)(*args)


def _pending(shape: list[int], data: bytes) -> Pending:
    pending = Pending(device=None)
    pending.set(pb.TupleReply(shape=shape, data=data))
    return pending


@pytest.mark.parametrize("shape", [[0], [3, 0], [0, 4, 2]])
def test_an_empty_correcting_share_is_an_empty_tensor(shape: list[int]) -> None:
    result = _pending(shape, b"").result()
    assert result.shape == torch.Size(shape) and result.dtype == torch.int64


def test_a_correcting_share_of_the_wrong_length_is_a_dealer_error() -> None:
    assert torch.equal(
        _pending([2], torch.tensor([5, -7]).numpy().tobytes()).result(), torch.tensor([5, -7])
    )
    with pytest.raises(DealerError, match="holds 8 bytes for shape \\(2,\\), not 16"):
        _pending([2], b"\x00" * 8).result()
