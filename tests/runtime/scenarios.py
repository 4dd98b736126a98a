"""What the party processes of the PRG tests run."""

from __future__ import annotations

from typing import Any

import crypten
import crypten.common.rng as rng
import torch

import mpcml
from mpcml.runtime import prg


def masks_after_reseeding_torch(s: mpcml.Session) -> dict[str, Any]:
    """Seed every torch generator CrypTen keeps, and torch's own, to 0; then share zeros.

    With CrypTen's generators the shares would now be the same in every session; from
    ChaCha20 with fresh keys they are not.
    """
    for per_device in crypten.generators.values():
        for generator in per_device.values():
            generator.manual_seed(0)
    torch.manual_seed(0)
    x = crypten.cryptensor(torch.zeros(64), src=0)
    return {
        "share": x.share.clone(),
        "revealed": x.get_plain_text(),
        "patched": torch.tensor(
            rng.generate_random_ring_element is prg.generate_random_ring_element
        ),
    }


def copies_draw_nothing(s: mpcml.Session) -> dict[str, Any]:
    """Copies of a shared tensor (CrypTen's `MPCTensor([])` shells) and the draws they cost."""
    x = crypten.cryptensor(torch.arange(6, dtype=torch.float32) - 2.5, src=0)
    streams = [prg._STREAMS[id(g)] for g in crypten.generators["prev"].values()]
    streams += [prg._STREAMS[id(g)] for g in crypten.generators["next"].values()]
    before = [st.draws for st in streams]
    copies = [x.shallow_copy(), x.clone(), crypten.mpc.MPCTensor.from_shares(x.share.clone())]
    drawn = sum(st.draws for st in streams) - sum(before)
    return {
        "drawn": torch.tensor(drawn),
        "revealed": torch.stack([c.get_plain_text() for c in copies]),
        "plain": x.get_plain_text(),
    }


GUESS_BATCHES = (("sigmoid", 8), ("sigmoid", 8), ("sigmoid", 8), ("sigmoid", 5), ("relu", 8))
"""Batches of (activation, rows): three alike, a short one, then one that starts alike."""


def guess_inputs() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The weights (party 0's) and each batch's rows (party 1's)."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(4, 3, generator=gen)
    return w, [torch.randn(rows, 4, generator=gen) for _, rows in GUESS_BATCHES]


def guessed_batches(s: mpcml.Session) -> dict[str, Any]:
    """Batches through the dealer as training runs them: each announced to the provider."""
    from mpcml.runtime.provider import DealerProvider, batch_begins

    client = DealerProvider.client
    assert client is not None
    w, xs = guess_inputs()
    weights = crypten.cryptensor(w if s.rank == 0 else torch.zeros_like(w), src=0)
    outputs, tuples, guessed = [], [], []
    for (activation, _), x in zip(GUESS_BATCHES, xs, strict=True):
        batch_begins()
        seq, guesses = client._seq, client.guessed
        rows = crypten.cryptensor(x if s.rank == 1 else torch.zeros_like(x), src=1)
        out = getattr(rows.matmul(weights), activation)() * rows.sum(1, keepdim=True)
        tuples.append(client._seq - seq)
        guessed.append(client.guessed - guesses)
        outputs.append(out.get_plain_text())
    return {
        "outputs": torch.cat(outputs),
        "tuples": torch.tensor(tuples),
        "guessed": torch.tensor(guessed),
    }


BIG = (700, 1000)
"""A product whose correction (5.6 MB) is over the dealer's 4 MiB chunk."""


def chunk_inputs() -> list[torch.Tensor]:
    """Two small and two big tensors, the same in every process."""
    g = torch.Generator().manual_seed(13)
    return [torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)] + [
        torch.randn(*BIG, generator=g) for _ in range(2)
    ]


def chunked_products(s: mpcml.Session) -> dict[str, Any]:
    """Two batches of a small, a big and a small product: the big correction in chunks, asked
    for when needed in the first batch and guessed ahead (alone) in the second."""
    from mpcml.runtime.provider import DealerProvider, batch_begins

    client = DealerProvider.client
    assert client is not None
    a, b, x, y = (crypten.cryptensor(t, src=0) for t in chunk_inputs())
    outputs = []
    for _ in range(2):
        batch_begins()
        outputs.append(
            [(a * b).get_plain_text(), (x * y).get_plain_text(), (b * a).get_plain_text()]
        )
    return {
        "small": torch.stack([o[0] for o in outputs] + [o[2] for o in outputs]),
        "big": torch.stack([o[1] for o in outputs]),
        "chunked": torch.tensor(client.chunked),
        "guessed": torch.tensor(client.guessed),
    }


SGD_SHAPES = [(4, 3), (4,), (2, 4), (2,)]
SGD_SETTINGS = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}


def sgd_inputs() -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Initial weights and three steps' gradients, the same in every process."""
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(*shape, generator=g) for shape in SGD_SHAPES]
    grads = [[torch.randn(*shape, generator=g) for shape in SGD_SHAPES] for _ in range(3)]
    return weights, grads


def sgd_steps(s: mpcml.Session) -> dict[str, Any]:
    """Three steps of CrypTen's SGD and of mpcml's BatchedSGD on the same secret weights."""
    from mpcml.party.training import BatchedSGD

    crypten.cfg.communicator.verbose = True
    weights, grads = sgd_inputs()
    out: dict[str, Any] = {}
    for name, optimizer in (("crypten", crypten.optim.SGD), ("batched", BatchedSGD)):
        params = [crypten.cryptensor(w, src=0, requires_grad=True) for w in weights]
        opt = optimizer(params, **SGD_SETTINGS)
        steps = [[crypten.cryptensor(g, src=0) for g in step] for step in grads]
        s.reset_communication_stats()
        for step in steps:
            for p, g in zip(params, step, strict=True):
                p.grad = g
            opt.step()
        out[f"{name}_rounds"] = torch.tensor([float(s.communication_stats()["rounds"])])
        out[name] = torch.cat([p.get_plain_text().flatten() for p in params])
    x = crypten.cryptensor(torch.ones(8), src=0)
    s.reset_communication_stats()
    x.mul(0.5)
    out["truncation_rounds"] = torch.tensor([float(s.communication_stats()["rounds"])])
    return out


def mixed_inputs() -> dict[str, torch.Tensor]:
    """Rank 0's weights and kernel, rank 1's rows and image (a mixed-device session's)."""
    gen = torch.Generator().manual_seed(5)
    return {
        "w": torch.randn(6, 3, generator=gen),
        "x": torch.randn(4, 6, generator=gen),
        "kernel": torch.randn(2, 3, 3, 3, generator=gen),
        "image": torch.randn(1, 3, 5, 5, generator=gen),
    }


def mixed_devices(s: mpcml.Session) -> dict[str, Any]:
    """Products, a convolution, comparisons and a gradient step, each party on its placement.

    Records the type of every share the dealer's tuples give this party, and of the results.
    """
    from mpcml.runtime.provider import DealerProvider, Pending

    kinds: set[str] = set()
    draw = DealerProvider._shares

    def recording(self: Any, request: Any, device: Any) -> list[Any]:
        shares = draw(self, request, device)
        for t in shares:  # rank 0's correction, as it will be held once the dealer's arrives
            kinds.add(type(prg.wrap(t.result()) if isinstance(t, Pending) else t).__name__)
        return shares

    DealerProvider._shares = recording  # type: ignore[method-assign]
    try:
        place = s.placement.plain
        given = mixed_inputs()
        w = crypten.cryptensor(place(given["w"]), src=0)
        x = crypten.cryptensor(place(given["x"]), src=1)
        kernel = crypten.cryptensor(place(given["kernel"]), src=0)
        image = crypten.cryptensor(place(given["image"]), src=1)
        product = x.matmul(w)
        activated = product.relu() * product
        convolved = image.conv2d(kernel, padding=1)
        w.requires_grad = True
        loss = (x.matmul(w) - 1).square().mean()
        loss.backward()
        held = {type(t.share).__name__ for t in (w, x, product, activated, convolved, w.grad)}
        return {
            "product": product.get_plain_text().cpu(),
            "activated": activated.get_plain_text().cpu(),
            "convolved": convolved.get_plain_text().cpu(),
            "grad": w.grad.get_plain_text().cpu(),
            "tuples": sorted(kinds),
            "held": sorted(held),
            "device": s.placement.name,
        }
    finally:
        DealerProvider._shares = draw  # type: ignore[method-assign]
