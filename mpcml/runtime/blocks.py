"""Exact int64 (mod 2^64) matmul and convolutions from float64 products of k-bit blocks.

A GPU has no int64 GEMM or convolution, but float64 ones (cuBLAS, cuDNN) are exact while every
sum they form is an integer below 2^53. So each int64 operand is split into blocks of k bits,
the blocks are multiplied in float64, and the products are shifted and summed in int64, where
overflow wraps mod 2^64 as the ring wants. Only block pairs (i, j) with (i + j) * k < 64 matter:
the others are multiples of 2^64.

The split is chosen from the real bound: a product sums `inner` terms (for a convolution,
in_channels / groups * kernel elements), each below (2^k - 1)^2, so `inner * (2^k - 1)^2` must
stay below 2^53. The fewest blocks that satisfy it are used; past `max_blocks` blocks the inner
dimension is cut into chunks that do, and the chunks' results are summed in int64. CrypTen's
`CUDALongTensor` instead always takes 3 blocks of 22 bits (4 of 16 for a matmul of inner
dimension 256 or more, or a kernel of 256 elements or more), which is wrong for a 3x3
convolution over 256 channels (CrypTen issue #307), and it refuses groups != 1 (issue #386).

All pairs go into one float64 call: a batched matmul, or a convolution with a group per pair
(`dense=True`: one convolution over all blocks x all blocks, which copies nothing but computes
the pairs of no weight too; which is faster on cuDNN is for bench/gpu.py to show). On CPU
tensors the same code is the emulation of the GPU path; with `device="cuda:N"` the float64
products run there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

RING_BITS = 64
EXACT = 1 << 53
"""float64 holds every integer below this exactly."""
MAX_BLOCKS = 4
"""Blocks tried before the inner dimension is chunked: 4 blocks of 16 bits take up to about
2^21 terms per product, more than any layer has; 5 would cost 15 products instead of 10."""

Device = str | torch.device | None


@dataclass(frozen=True)
class Plan:
    """How one product is computed: `blocks` blocks of `bits` bits, `chunk` terms at a time."""

    blocks: int
    bits: int
    chunk: int
    """Most terms of the inner dimension summed in one float64 product (a multiple of the
    unit the caller gave, e.g. the kernel elements of one channel)."""

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The block pairs (i, j) whose product has weight below 2^64."""
        return [
            (i, j)
            for i in range(self.blocks)
            for j in range(self.blocks)
            if (i + j) * self.bits < RING_BITS
        ]


def terms_limit(bits: int) -> int:
    """The most terms of (2^bits - 1)^2 whose sum stays below 2^53."""
    return (EXACT - 1) // ((1 << bits) - 1) ** 2


def plan(inner: int, unit: int = 1, max_blocks: int = MAX_BLOCKS) -> Plan:
    """The split for a product summing `inner` terms, which come in runs of `unit` terms.

    The fewest blocks (up to `max_blocks`) whose bound holds for all `inner` terms; otherwise
    `max_blocks` blocks (more only if even one run of `unit` terms exceeds their bound) over
    chunks of whole runs.
    """
    if inner < 1 or unit < 1 or inner % unit:
        raise ValueError(f"inner dimension {inner} is not a positive multiple of {unit}")
    if max_blocks < 2:
        raise ValueError(f"max_blocks must be at least 2, got {max_blocks}")
    for blocks in range(2, max_blocks + 1):
        bits = math.ceil(RING_BITS / blocks)
        if inner <= terms_limit(bits):
            return Plan(blocks, bits, inner)
    blocks = max_blocks
    while terms_limit(math.ceil(RING_BITS / blocks)) < unit:
        blocks += 1
    bits = math.ceil(RING_BITS / blocks)
    return Plan(blocks, bits, min(inner, terms_limit(bits) // unit * unit))


def split(x: torch.Tensor, p: Plan) -> torch.Tensor:
    """The blocks of `x` (int64) as float64, stacked on a new first dimension, lowest first.

    Each block is masked to its own width, so the top one (narrower when 64 is not a multiple
    of `bits`) carries no sign-extension bits.
    """
    parts = []
    for i in range(p.blocks):
        shift = i * p.bits
        width = min(p.bits, RING_BITS - shift)
        parts.append(((x >> shift) & ((1 << width) - 1)).to(torch.float64))
    return torch.stack(parts)


def _recombine(z: torch.Tensor, p: Plan) -> torch.Tensor:
    """Sum the pairs' products (first dimension) in int64, each shifted by its weight."""
    shifts = torch.tensor([(i + j) * p.bits for i, j in p.pairs], device=z.device)
    ints = z.to(torch.int64) << shifts.view(-1, *([1] * (z.dim() - 1)))
    return ints.sum(0)


def _indices(p: Plan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = p.pairs
    left = torch.tensor([i for i, _ in pairs], device=device)
    right = torch.tensor([j for _, j in pairs], device=device)
    return left, right


def _on(x: torch.Tensor, device: Device) -> torch.Tensor:
    if x.dtype != torch.int64:
        raise TypeError(f"expected an int64 tensor, got {x.dtype}")
    return x if device is None else x.to(device)


# -- matmul ------------------------------------------------------------------------------------


def matmul(
    x: torch.Tensor, y: torch.Tensor, *, device: Device = None, max_blocks: int = MAX_BLOCKS
) -> torch.Tensor:
    """`torch.matmul(x, y)` on int64 tensors, mod 2^64 (broadcasting and 1-D operands too)."""
    x, y = _on(x, device), _on(y, device)
    squeeze_x, squeeze_y = x.dim() == 1, y.dim() == 1
    if squeeze_x:
        x = x.unsqueeze(0)
    if squeeze_y:
        y = y.unsqueeze(-1)
    inner = x.shape[-1]
    if y.shape[-2] != inner:
        raise ValueError(f"matmul shapes {tuple(x.shape)} and {tuple(y.shape)} do not match")
    p = plan(inner, 1, max_blocks)
    total: torch.Tensor | None = None
    for start in range(0, inner, p.chunk):
        part = _matmul_chunk(x[..., start : start + p.chunk], y[..., start : start + p.chunk, :], p)
        total = part if total is None else total + part
    assert total is not None
    if squeeze_x:
        total = total.squeeze(-2)
    if squeeze_y:
        total = total.squeeze(-1)
    return total


def _matmul_chunk(x: torch.Tensor, y: torch.Tensor, p: Plan) -> torch.Tensor:
    left, right = _indices(p, x.device)
    xs, ys = split(x, p)[left], split(y, p)[right]
    # One batched float64 product for every pair; the pair dimension leads on both sides.
    while xs.dim() < ys.dim():
        xs = xs.unsqueeze(1)
    while ys.dim() < xs.dim():
        ys = ys.unsqueeze(1)
    return _recombine(torch.matmul(xs, ys), p)


# -- convolutions ------------------------------------------------------------------------------

ConvOp = Callable[..., torch.Tensor]


def _conv(
    op: ConvOp,
    transpose: bool,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    groups: int,
    device: Device,
    max_blocks: int,
    dense: bool,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    x, weight = _on(x, device), _on(weight, device)
    unbatched = x.dim() == weight.dim() - 1
    if unbatched:
        x = x.unsqueeze(0)
    channels = x.shape[1]
    if groups < 1 or channels % groups:
        raise ValueError(f"{channels} input channels do not split into {groups} groups")
    per_group = channels // groups
    kernel = math.prod(weight.shape[2:])
    p = plan(per_group * kernel, kernel, max_blocks)
    step = p.chunk // kernel
    total: torch.Tensor | None = None
    for start in range(0, per_group, step):
        stop = min(start + step, per_group)
        xc = x.reshape(x.shape[0], groups, per_group, *x.shape[2:])[:, :, start:stop].flatten(1, 2)
        if transpose:  # weight: (in_channels, out_channels / groups, *kernel)
            wc = weight.reshape(groups, per_group, *weight.shape[1:])[:, start:stop].flatten(0, 1)
        else:  # weight: (out_channels, in_channels / groups, *kernel)
            wc = weight[:, start:stop]
        chunk = _conv_dense if dense else _conv_chunk
        part = chunk(op, transpose, xc, wc, groups, p, kwargs)
        total = part if total is None else total + part
    assert total is not None
    if bias is not None:
        total = total + bias.to(total.device).view(-1, *([1] * (total.dim() - 2)))
    return total.squeeze(0) if unbatched else total


def _conv_chunk(
    op: ConvOp,
    transpose: bool,
    x: torch.Tensor,
    weight: torch.Tensor,
    groups: int,
    p: Plan,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    left, right = _indices(p, x.device)
    npairs = len(left)
    batch, channels = x.shape[:2]
    # Every pair in one float64 convolution: pair q's copy of the input meets pair q's copy of
    # the weight as groups q * groups .. (q + 1) * groups - 1 of a convolution with
    # npairs * groups groups; its output channels come out in pair order.
    xs = split(x, p)[left].transpose(0, 1).reshape(batch, npairs * channels, *x.shape[2:])
    ws = split(weight, p)[right].flatten(0, 1)
    z = op(xs, ws, None, groups=npairs * groups, **kwargs)
    z = z.reshape(batch, npairs, z.shape[1] // npairs, *z.shape[2:]).transpose(0, 1)
    return _recombine(z, p)


def _conv_dense(
    op: ConvOp,
    transpose: bool,
    x: torch.Tensor,
    weight: torch.Tensor,
    groups: int,
    p: Plan,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """The other layout: all blocks x all blocks in one convolution with the caller's groups.

    The input's blocks are stacked on the batch, the weight's on the output channels (inside
    each group), so no pair copies the input, at the price of computing the pairs that carry no
    weight below 2^64 too (16 products instead of 10 for 4 blocks).
    """
    nb = p.blocks
    batch = x.shape[0]
    xs = split(x, p).flatten(0, 1)
    wb = split(weight, p)
    if transpose:  # (nb, in, out/g, *k) -> (in, nb * out/g, *k): block j's outputs after j-1's
        ws = wb.permute(1, 0, *range(2, wb.dim())).reshape(
            weight.shape[0], nb * weight.shape[1], *weight.shape[2:]
        )
    else:  # (nb, out, in/g, *k) -> (g * nb * out/g, in/g, *k), the nb copies inside each group
        ws = (
            wb.reshape(nb, groups, weight.shape[0] // groups, *weight.shape[1:])
            .transpose(0, 1)
            .reshape(nb * weight.shape[0], *weight.shape[1:])
        )
    z = op(xs, ws, None, groups=groups, **kwargs)
    per_group = z.shape[1] // (groups * nb)
    z = z.reshape(nb, batch, groups, nb, per_group, *z.shape[2:])
    left, right = _indices(p, x.device)
    pairs = z[left, :, :, right]  # (pairs, batch, groups, out/g, ...)
    return _recombine(pairs.reshape(len(left), batch, groups * per_group, *z.shape[5:]), p)


def conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    *,
    device: Device = None,
    max_blocks: int = MAX_BLOCKS,
    dense: bool = False,
) -> torch.Tensor:
    """`torch.conv1d` on int64 tensors, mod 2^64."""
    kwargs = {"stride": stride, "padding": padding, "dilation": dilation}
    return _conv(F.conv1d, False, x, weight, bias, groups, device, max_blocks, dense, kwargs)


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    *,
    device: Device = None,
    max_blocks: int = MAX_BLOCKS,
    dense: bool = False,
) -> torch.Tensor:
    """`torch.conv2d` on int64 tensors, mod 2^64."""
    kwargs = {"stride": stride, "padding": padding, "dilation": dilation}
    return _conv(F.conv2d, False, x, weight, bias, groups, device, max_blocks, dense, kwargs)


def conv_transpose1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
    *,
    device: Device = None,
    max_blocks: int = MAX_BLOCKS,
    dense: bool = False,
) -> torch.Tensor:
    """`torch.conv_transpose1d` on int64 tensors, mod 2^64."""
    kwargs = {
        "stride": stride,
        "padding": padding,
        "output_padding": output_padding,
        "dilation": dilation,
    }
    return _conv(
        F.conv_transpose1d, True, x, weight, bias, groups, device, max_blocks, dense, kwargs
    )


def conv_transpose2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
    *,
    device: Device = None,
    max_blocks: int = MAX_BLOCKS,
    dense: bool = False,
) -> torch.Tensor:
    """`torch.conv_transpose2d` on int64 tensors, mod 2^64."""
    kwargs = {
        "stride": stride,
        "padding": padding,
        "output_padding": output_padding,
        "dilation": dilation,
    }
    return _conv(
        F.conv_transpose2d, True, x, weight, bias, groups, device, max_blocks, dense, kwargs
    )
