"""Computations the party processes of the transport tests run inside `mpcml.session`.

The harness imports mpcml before this module, so crypten imports on current torch.

Inputs come from `inputs()`, seeded, so that the test process computes the plaintext PyTorch
reference on exactly the same tensors.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import crypten
import crypten.communicator as comm
import torch
from crypten.mpc.primitives import BinarySharedTensor

import mpcml

LOGREG_STEPS = 5
LOGREG_LR = 0.5
BIG_ELEMENTS = 64 * 1024 * 1024 // 8 + 12345  # a little over 64 MiB of int64


def inputs(world_size: int, seed: int = 1234) -> dict[str, torch.Tensor]:
    """The plaintext inputs of `ops`, identical in every process."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.tensor([0.01 * i for i in range(-1000, 1001)])
    data = {
        "x": torch.randn(8, 8, generator=g),
        "y": torch.randn(8, 8, generator=g),
        "z": torch.randn(8, 8, generator=g),
        "image": torch.randn(1, 2, 6, 6, generator=g),
        "kernel": torch.randn(3, 2, 3, 3, generator=g),
        "grid": grid,
        "nonzero": torch.where(grid == 0, torch.ones_like(grid), grid),
        "positive": grid[1001:],
        "logits": torch.randn(4, 8, generator=g) / 5,
        "features": torch.randn(32, 5, generator=g),
        "weight": torch.randn(1, 5, generator=g) * 0.1,
        "bias": torch.zeros(1),
    }
    data["labels"] = (data["features"] @ torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0]) > 0).float()
    del world_size
    return data


# CrypTen's multiprocess tests check with tolerance 0.5 (test/multiprocess_test_case.py); we hold
# every op to CrypTen's stricter single-process 0.05 except these approximations, whose error on
# CrypTen's own test ranges exceeds 0.05 over stock gloo too: exp(10) with 8 iterations is 18151,
# sqrt(0.01) 0.06, and with 3 parties reciprocal(-0.5) comes out as -3 and log(0.92) 7% off in
# some runs (seen over gloo in 2 of 4 runs of these same inputs).
TOLERANCE = {"exp": 0.5, "sqrt": 0.5, "reciprocal": 0.5, "log": 0.5}


def reference(world_size: int) -> dict[str, torch.Tensor]:
    """The plaintext PyTorch result of every secure computation in `ops`."""
    d = inputs(world_size)
    x, y, z = d["x"], d["y"], d["z"]
    out = {
        "add": x + y + (z if world_size > 2 else 0),
        "mul": x * y,
        "matmul": x @ y,
        "conv2d": torch.nn.functional.conv2d(d["image"], d["kernel"], padding=1),
        "truncation": (x * 100) * (y * 100) / 7,
        "gt": (x > y).float(),
        "lt": (x < y).float(),
        "ge": (x >= y).float(),
        "eq": (x == x).float(),
        "relu": x.relu(),
        "max": x.max(),
        "max_dim": x.max(dim=1).values,
        "argmax_dim": torch.nn.functional.one_hot(x.argmax(dim=1), 8).float(),
        "exp": d["grid"].exp(),
        "reciprocal": d["nonzero"].reciprocal(),
        "sqrt": d["positive"].sqrt(),
        "log": d["positive"].log(),
        "sigmoid": d["grid"].sigmoid(),
        "softmax": d["logits"].softmax(dim=1),
        "a2b2a": x.clone(),
        "binary_xor": (x * 2**16).long().bitwise_xor((y * 2**16).long()).double(),
        **_strided(x, y),
        **_empty(x, y),
    }
    out.update(_plain_logreg(d))
    return out


def _plain_logreg(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = torch.nn.Linear(5, 1)
    with torch.no_grad():
        model.weight.copy_(d["weight"])
        model.bias.copy_(d["bias"])
    optimizer = torch.optim.SGD(model.parameters(), lr=LOGREG_LR)
    losses = []
    for _ in range(LOGREG_STEPS):
        out = model(d["features"]).sigmoid().squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy(out, d["labels"])
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
        losses.append(loss.detach())
    return {
        "logreg_weight": model.weight.detach().clone(),
        "logreg_bias": model.bias.detach().clone(),
        "logreg_loss": torch.stack(losses),
    }


def _secure_logreg(d: dict[str, torch.Tensor], world_size: int) -> dict[str, torch.Tensor]:
    plain = torch.nn.Linear(5, 1)
    with torch.no_grad():
        plain.weight.copy_(d["weight"])
        plain.bias.copy_(d["bias"])
    model = crypten.nn.from_pytorch(plain, torch.empty(1, 5))
    model.encrypt(src=0)
    model.train()
    features = crypten.cryptensor(d["features"], src=0)
    labels = crypten.cryptensor(d["labels"], src=world_size - 1)
    loss_fn = crypten.nn.BCELoss()
    losses = []
    for _ in range(LOGREG_STEPS):
        out = model(features).sigmoid().squeeze(1)
        loss = loss_fn(out, labels)
        model.zero_grad()
        loss.backward()
        model.update_parameters(LOGREG_LR)
        losses.append(loss.get_plain_text())
    params = {name.split(".")[0]: p.get_plain_text() for name, p in model.named_parameters()}
    weight, bias = params["weight"], params["bias"]
    return {
        "logreg_weight": weight.reshape(1, 5),
        "logreg_bias": bias.reshape(1),
        "logreg_loss": torch.stack(losses),
    }


def _strided(x: Any, y: Any) -> dict[str, Any]:
    """Shares that are views with odd strides, revealed and multiplied (issue 35): `x` and `y`
    are 8x8, secret or plaintext; the same code gives the secure result and its reference."""
    column = x[:, 2]
    return {
        "transposed_mul": x.t() * y.t(),
        "column_mul": column * y[:, 5],
        "unbound_one": x[:1].unbind(1)[3],
        "unbound_one_mul": x[:1].unbind(1)[3] * y[:1].unbind(1)[4],
        "expanded_mul": x[:1, :1].expand(4, 3) * y[:4, :3],
        "broadcast_mul": x[:1] * y,
        "sliced_one": column[6:7],
        "sliced_one_matmul": x[:1, 4:5].matmul(y[6:7, :]),
    }


def _empty(x: Any, y: Any) -> dict[str, Any]:
    """Products of tensors with no elements (issue 35: the dealer's empty correcting share
    crashed rank 0), and a product over an empty inner dimension; truncation at 3 parties asks
    the provider for wraps."""
    return {
        "empty_mul": x[:0] * y[:0],
        "empty_truncation": (x[:, :0] * 100) * (y[:, :0] * 100) / 7,
        "empty_inner_matmul": x[:, :0].matmul(y[:0, :]),
    }


def ops(s: mpcml.Session) -> dict[str, torch.Tensor]:
    """Every operation the tests compare with plaintext PyTorch."""
    n = s.world_size
    d = inputs(n)
    x = crypten.cryptensor(d["x"], src=0)
    y = crypten.cryptensor(d["y"], src=1)
    total = x + y
    if n > 2:
        total = total + crypten.cryptensor(d["z"], src=2)
    image = crypten.cryptensor(d["image"], src=0)
    kernel = crypten.cryptensor(d["kernel"], src=n - 1)
    grid = crypten.cryptensor(d["grid"], src=0)
    binary = x.to(crypten.mpc.binary)
    xb = BinarySharedTensor((d["x"] * 2**16).long(), src=0)
    yb = BinarySharedTensor((d["y"] * 2**16).long(), src=1)
    out = {
        "add": total,
        "mul": x * y,
        "matmul": x.matmul(y),
        "conv2d": image.conv2d(kernel, padding=1),
        "truncation": (x * 100) * (y * 100) / 7,
        "gt": x > y,
        "lt": x < y,
        "ge": x >= y,
        "eq": x == x,
        "relu": x.relu(),
        "max": x.max(),
        "max_dim": x.max(dim=1)[0],
        "argmax_dim": x.argmax(dim=1),
        "exp": grid.exp(),
        "reciprocal": crypten.cryptensor(d["nonzero"], src=0).reciprocal(),
        "sqrt": crypten.cryptensor(d["positive"], src=1).sqrt(),
        "log": crypten.cryptensor(d["positive"], src=1).log(),
        "sigmoid": grid.sigmoid(),
        "softmax": crypten.cryptensor(d["logits"], src=0).softmax(dim=1),
        "a2b2a": binary.to(crypten.mpc.arithmetic),
    }
    out.update(_strided(x, y))
    out.update(_empty(x, y))
    result = {name: t.get_plain_text() for name, t in out.items()}
    # Binary shares of integers: XOR, revealed (CrypTen's BXOR reduce).
    result["binary_xor"] = (xb ^ yb).reveal().double()
    result.update(_secure_logreg(d, n))
    return result


def comm_stats(s: mpcml.Session) -> dict[str, Any]:
    """CrypTen's communication counters for a 64x64 matmul and relu (docs/architecture.md)."""
    crypten.cfg.communicator.verbose = True
    a = crypten.cryptensor(torch.randn(64, 64), src=0)
    b = crypten.cryptensor(torch.randn(64, 64), src=1)
    out: dict[str, Any] = {}
    for name in ("matmul", "relu"):
        s.reset_communication_stats()
        a.matmul(b) if name == "matmul" else a.relu()
        stats = s.communication_stats()
        out[name] = torch.tensor([stats["rounds"], stats["bytes"]], dtype=torch.float64)
    return out


def big_tensor(s: mpcml.Session) -> dict[str, Any]:
    """Rank 0 sends a tensor of just over 64 MiB to every other rank; they return its digest."""
    c = comm.get()
    if s.rank == 0:
        tensor = torch.randint(
            -(2**62), 2**62, (BIG_ELEMENTS,), generator=torch.Generator().manual_seed(7)
        )
        for dst in range(1, s.world_size):
            c.send(tensor, dst)
        return {"digest": hashlib.sha256(tensor.numpy().tobytes()).hexdigest()}
    received = c.recv(torch.empty(BIG_ELEMENTS, dtype=torch.long), 0)
    return {
        "digest": hashlib.sha256(received.numpy().tobytes()).hexdigest(),
        "numel": received.numel(),
    }


def objects(s: mpcml.Session) -> dict[str, Any]:
    """Schema'd objects through CrypTen's _obj calls; an unpicklable-by-design type is refused."""
    c = comm.get()
    payload = {
        "size": torch.Size([3, 4]),
        "nested": [1, 2.5, "x", None, (True, b"\x00")],
        7: torch.arange(3),
    }
    got = c.broadcast_obj(payload if s.rank == 0 else None, 0)
    refused = ""
    if s.rank == 0:
        try:
            c.send_obj(object(), 1)
        except mpcml.TransportError as exc:
            refused = str(exc)
    c.barrier()
    return {
        "size": list(got["size"]),
        "nested": repr(got["nested"]),
        "tensor": got[7],
        "refused": refused,
    }


def loop_until_killed(s: mpcml.Session, ready: str) -> dict[str, Any]:
    """Multiply in a loop; rank 0 marks `ready` after the first round, then all run on."""
    x = crypten.cryptensor(torch.randn(16, 16), src=0)
    y = crypten.cryptensor(torch.randn(16, 16), src=1)
    deadline = time.monotonic() + 120
    first = True
    while time.monotonic() < deadline:
        (x * y).get_plain_text()
        if first and s.rank == 0:
            Path(ready).write_text(str(os.getpid()))
        first = False
    return {"finished": True}


def smoke(s: mpcml.Session) -> dict[str, Any]:
    """A tiny computation that needs every party."""
    x = crypten.cryptensor(torch.arange(6, dtype=torch.float32).reshape(2, 3), src=0)
    y = crypten.cryptensor(torch.ones(2, 3), src=s.world_size - 1)
    return {"sum": (x + y).get_plain_text(), "prod": (x * y).get_plain_text()}


def rank_tensors(world_size: int, shape: tuple[int, ...] = (3, 4)) -> list[torch.Tensor]:
    """A distinct int64 tensor per rank, identical in every process."""
    g = torch.Generator().manual_seed(99)
    return [torch.randint(-(2**40), 2**40, shape, generator=g) for _ in range(world_size)]


BIG_SHAPE = (201, 200)
"""Large enough for the reduce-scatter all_reduce, and not divisible by 3."""


def collectives(s: mpcml.Session) -> dict[str, Any]:
    """Every collective of the communicator, called directly as CrypTen calls them."""
    from torch.distributed import ReduceOp

    c = comm.get()
    mine = rank_tensors(s.world_size)[s.rank]
    other = mine * 3 + 1
    big = rank_tensors(s.world_size, BIG_SHAPE)[s.rank]
    out: dict[str, Any] = {
        "all_reduce_sum": c.all_reduce(mine),
        "all_reduce_big_sum": c.all_reduce(big),
        "all_reduce_big_bxor_batched": c.all_reduce([big, mine], op=ReduceOp.BXOR, batched=True),
        "all_reduce_bxor_batched": c.all_reduce([mine, other], op=ReduceOp.BXOR, batched=True),
        "all_gather": c.all_gather(mine),
        "broadcast_batched": c.broadcast([mine.clone(), other.clone()], 1, batched=True),
    }
    reduced = c.reduce([mine, other], 0, batched=True)
    gathered = c.gather(mine, s.world_size - 1)
    scattered = c.scatter([t + 7 for t in rank_tensors(s.world_size)], 0, size=mine.size())
    if s.rank == 0:
        out["reduce_batched"] = reduced
    if s.rank == s.world_size - 1:
        out["gather"] = gathered
    out["scatter"] = scattered
    # irecv posted in one order and waited in the other still gets the right messages.
    nxt, prv = (s.rank + 1) % s.world_size, (s.rank - 1) % s.world_size
    first, second = torch.empty(3, 4, dtype=torch.long), torch.empty(3, 4, dtype=torch.long)
    c.isend(mine, nxt).wait()
    c.isend(other, nxt).wait()
    r1, r2 = c.irecv(first, prv), c.irecv(second, prv)
    r2.wait()
    r1.wait()
    out["irecv_first"], out["irecv_second"] = first, second
    return out


def cuda_ops(s: mpcml.Session) -> dict[str, Any]:
    """Shares on the GPU: CUDALongTensor shares cross the data plane through host memory."""
    d = inputs(s.world_size)
    x = crypten.cryptensor(d["x"].cuda(), src=0)
    y = crypten.cryptensor(d["y"].cuda(), src=1)
    out = {"add": x + y, "mul": x * y, "matmul": x.matmul(y), "relu": x.relu(), "gt": x > y}
    return {name: t.get_plain_text().cpu() for name, t in out.items()}


def timed_exchanges(s: mpcml.Session, exchanges: int, elements: int) -> dict[str, Any]:
    """`exchanges` all-reduces of `elements` int64s in a row, timed; and their (checked) sum."""
    c = comm.get()
    c.barrier()
    began = time.perf_counter()
    total = torch.zeros(elements, dtype=torch.long)
    for i in range(exchanges):
        total += c.all_reduce(torch.full((elements,), s.rank + i, dtype=torch.long))
    return {"seconds": time.perf_counter() - began, "total": total}
