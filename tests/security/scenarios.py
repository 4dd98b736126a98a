"""What the party processes of the attack tests run."""

from __future__ import annotations

from typing import Any

import crypten
import torch
from crypten.mpc.primitives import ArithmeticSharedTensor

import mpcml
from mpcml.proto.v1 import dealer_pb2 as dpb
from mpcml.runtime import prg, tuples
from mpcml.runtime.provider import DealerProvider

SIZE = 64
DRAWS_TRIED = 8
"""How many draws of each stream the attacker tries from where the stream stood."""


def secret_input(seed: int) -> torch.Tensor:
    """Party 1's private input (the test knows it; party 0 must not learn it)."""
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(seed)) * 10


def _held_streams() -> dict[str, prg.ChaChaStream]:
    """Copies of every ChaCha20 stream this process holds, where each stands now."""
    held: dict[str, prg.ChaChaStream] = {}
    for name, per_device in crypten.generators.items():
        stream = prg._STREAMS.get(id(per_device[torch.device("cpu")]))
        if stream is not None:
            held[f"crypten-{name}"] = stream
    client = DealerProvider.client
    if client is not None:  # its own draws for the tuple the multiplication will ask for
        mul = dpb.TupleRequest(kind=dpb.ADDITIVE, op="mul", size0=[SIZE], size1=[SIZE])
        key = tuples.tuple_key(client.key, client._seq, tuples.describe(mul))
        held["dealer"] = prg.ChaChaStream(key)
    copies = {}
    for name, stream in held.items():
        copy = prg.ChaChaStream(stream._key)
        copy.draws = stream.draws
        copies[name] = copy
    return copies


def replay_attack(s: mpcml.Session, seed: int) -> dict[str, Any]:
    """Multiply party 1's secret by party 0's input; party 0 then tries to recover the secret.

    Under TFP party 0 draws the Beaver triple's `a` in the clear from its local generator, so
    `epsilon + a = x` for the opened `epsilon = x - a`. Party 0 replays every stream it holds
    from where it stood before the multiplication, for several draws, and keeps each candidate.
    """
    x = crypten.cryptensor(secret_input(seed) if s.rank == 1 else torch.zeros(SIZE), src=1)
    y = crypten.cryptensor(torch.linspace(-2, 2, SIZE) if s.rank == 0 else torch.zeros(SIZE), src=0)
    held = _held_streams() if s.rank == 0 else {}
    opened: list[torch.Tensor] = []
    reveal_batch = ArithmeticSharedTensor.reveal_batch

    def recording(tensors: Any, dst: Any = None) -> Any:
        values = reveal_batch(tensors, dst)
        opened.extend(v.clone() for v in values)
        return values

    ArithmeticSharedTensor.reveal_batch = staticmethod(recording)
    try:
        z = (x * y).get_plain_text()
    finally:
        ArithmeticSharedTensor.reveal_batch = staticmethod(reveal_batch)
    candidates = []
    scale = float(x.encoder.scale)
    for stream in held.values():
        for _ in range(DRAWS_TRIED):
            mask = stream.ring((SIZE,))
            for value in opened:
                if value.size() == mask.size():
                    candidates.append((value + mask).double() / scale)
                    candidates.append((value - mask).double() / scale)
    return {
        "product": z,
        "candidates": torch.stack(candidates) if candidates else torch.empty(0, SIZE),
        "streams": torch.tensor(len(held)),
        "opened": torch.tensor(len(opened)),
    }


def _key_of(key: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(key), dtype=torch.uint8).clone()


def secrets_of_a_session(s: mpcml.Session) -> dict[str, Any]:
    """Run every kind of tuple (mul, matmul, relu's binary, wrap and B2A randomness) on private
    inputs; return every key, share and input this party holds, for the test to look for in
    the logs."""
    # Values of several digits (so a match in a log is no coincidence), but not thousands: a
    # product of two thousands is about 2^52 before its truncation, and CrypTen's truncation
    # then fails with probability about 2^-12 per element (|x| / 2^64), one run in twenty here.
    mine = torch.randn(8, 8, generator=torch.Generator().manual_seed(1000 + s.rank)) * 100
    inputs = [crypten.cryptensor(mine if s.rank == r else torch.zeros(8, 8), src=r) for r in (0, 1)]
    x, y = inputs
    product, matmul, relu = x * y, x.matmul(y), (x - y).relu()
    revealed = [t.get_plain_text() for t in (product, matmul, relu)]
    keys = [st._key for st in {id(st): st for st in prg._STREAMS.values()}.values()]
    if DealerProvider.client is not None:
        keys.append(DealerProvider.client.key)
    return {
        "input": mine,
        "keys": torch.stack([_key_of(k) for k in keys]),
        "shares": torch.stack([t.share.clone() for t in (x, y, product, matmul, relu)]),
        "revealed": torch.stack(revealed),
    }
