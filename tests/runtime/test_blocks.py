"""Block arithmetic (`mpcml.runtime.blocks`) against int64 references, on both sides of each bound.

The references wrap mod 2^64 as the ring does: torch's int64 matmul, and for convolutions a
sum over kernel offsets of int64 products (`ref_conv`, `ref_conv_transpose`), itself checked
against float64 convolutions of small integers and against torch's own int64 convolution.
CrypTen's `CUDALongTensor` arithmetic runs here on CPU, unedited, through a subclass that keeps
its tensors on the CPU, to show where its fixed split goes wrong. Every test also runs on
"cuda", skipped without a CUDA device.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from mpcml.runtime import blocks

NO_CUDA = "no CUDA device on this machine: the GPU path is checked only where one is present"
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)),
]
LOW, HIGH = -(2**63), 2**63 - 1


def ring(*shape: int, seed: int = 0) -> torch.Tensor:
    """Uniform int64 ring elements, reproducibly."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(LOW, HIGH, shape, dtype=torch.int64, generator=generator)


# -- int64 references --------------------------------------------------------------------------


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (value[0], value[1])


def ref_conv(
    x: torch.Tensor, w: torch.Tensor, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1,
) -> torch.Tensor:  # fmt: skip
    """conv2d (or conv1d on 3-D inputs) as a sum over kernel offsets of int64 products."""
    if x.dim() == 3:
        out = ref_conv(x.unsqueeze(2), w.unsqueeze(2), (1, stride), (0, padding), (1, dilation),
                       groups)  # fmt: skip
        return out.squeeze(2)
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    xp = F.pad(x, (pw, pw, ph, ph))
    batch, _, height, width = xp.shape
    out_channels, per_group, kh, kw = w.shape
    oh = (height - dh * (kh - 1) - 1) // sh + 1
    ow = (width - dw * (kw - 1) - 1) // sw + 1
    wg = w.view(groups, out_channels // groups, per_group, kh, kw)
    out = torch.zeros(batch, groups, out_channels // groups, oh, ow, dtype=torch.int64)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            patch = xp[:, :, rows, cols].reshape(batch, groups, per_group, oh * ow)
            out += torch.matmul(wg[:, :, :, i, j], patch).view(out.shape)
    return out.view(batch, out_channels, oh, ow)


def ref_conv_transpose(
    x: torch.Tensor, w: torch.Tensor, stride: Any = 1, padding: Any = 0,
    output_padding: Any = 0, groups: int = 1, dilation: Any = 1,
) -> torch.Tensor:  # fmt: skip
    """conv_transpose2d (or 1d on 3-D inputs): each input pixel scatters its kernel products."""
    if x.dim() == 3:
        out = ref_conv_transpose(x.unsqueeze(2), w.unsqueeze(2), (1, stride), (0, padding),
                                 (0, output_padding), groups, (1, dilation))  # fmt: skip
        return out.squeeze(2)
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    oph, opw = _pair(output_padding)
    batch, channels, height, width = x.shape
    _, per_group_out, kh, kw = w.shape
    per_group = channels // groups
    full_h = (height - 1) * sh + dh * (kh - 1) + 1 + oph
    full_w = (width - 1) * sw + dw * (kw - 1) + 1 + opw
    full = torch.zeros(batch, groups, per_group_out, full_h, full_w, dtype=torch.int64)
    xg = x.reshape(batch, groups, per_group, height * width)
    wg = w.view(groups, per_group, per_group_out, kh, kw)
    for i in range(kh):
        for j in range(kw):
            part = torch.matmul(wg[:, :, :, i, j].transpose(1, 2), xg)
            rows = slice(i * dh, i * dh + sh * (height - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (width - 1) + 1, sw)
            full[:, :, :, rows, cols] += part.view(batch, groups, per_group_out, height, width)
    out = full.view(batch, groups * per_group_out, full_h, full_w)
    return out[:, :, ph : full_h - ph, pw : full_w - pw]


def small(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-50, 50, shape, dtype=torch.int64, generator=generator)


REF_CASES = [
    ((2, 4, 9, 8), (6, 2, 3, 2), {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}),
    ((1, 3, 7, 7), (5, 3, 3, 3), {"stride": (1, 2), "padding": (2, 0), "dilation": 1}),
    ((2, 4, 11), (4, 1, 3), {"stride": 2, "padding": 1, "dilation": 3, "groups": 4}),
]


@pytest.mark.parametrize(("xs", "ws", "kw"), REF_CASES)
def test_the_references_agree_with_float_and_with_torch_int64(
    xs: tuple[int, ...], ws: tuple[int, ...], kw: dict[str, Any]
) -> None:
    x, w = small(*xs), small(*ws, seed=1)
    op = F.conv2d if x.dim() == 4 else F.conv1d
    assert torch.equal(ref_conv(x, w, **kw), op(x.double(), w.double(), **kw).long())
    big_x, big_w = ring(*xs), ring(*ws, seed=1)
    assert torch.equal(ref_conv(big_x, big_w, **kw), op(big_x, big_w, **kw))
    top = F.conv_transpose2d if x.dim() == 4 else F.conv_transpose1d
    groups = kw.get("groups", 1)
    wt = small(xs[1], 3, *ws[2:], seed=2)
    tkw = {"stride": kw["stride"], "padding": kw["padding"], "groups": groups,
           "dilation": kw["dilation"]}  # fmt: skip
    assert torch.equal(ref_conv_transpose(x, wt, **tkw), top(x.double(), wt.double(), **tkw).long())


# -- the plan ----------------------------------------------------------------------------------


def test_the_plan_takes_the_fewest_blocks_the_bound_allows() -> None:
    limit22 = blocks.terms_limit(22)
    assert limit22 * (2**22 - 1) ** 2 < 2**53 <= (limit22 + 1) * (2**22 - 1) ** 2
    assert limit22 == 512
    assert blocks.plan(512) == blocks.Plan(3, 22, 512)
    assert blocks.plan(513) == blocks.Plan(4, 16, 513)
    assert blocks.plan(2304, 9) == blocks.Plan(4, 16, 2304)  # 3x3 over 256 channels
    assert blocks.plan(blocks.terms_limit(16)).blocks == 4
    # Past max_blocks, chunks of whole runs of `unit` terms.
    assert blocks.plan(blocks.terms_limit(16) + 1) == blocks.Plan(4, 16, blocks.terms_limit(16))
    assert blocks.plan(2304, 9, max_blocks=3) == blocks.Plan(3, 22, 504)
    assert blocks.plan(4096, 1, max_blocks=3) == blocks.Plan(3, 22, 512)
    # A run longer than one chunk may hold: more blocks, not a split kernel.
    assert blocks.plan(600 * 4, 600, max_blocks=3) == blocks.Plan(4, 16, 2400)
    assert len(blocks.Plan(3, 22, 1).pairs) == 6 and len(blocks.Plan(4, 16, 1).pairs) == 10
    with pytest.raises(ValueError, match="multiple"):
        blocks.plan(10, 3)


def test_split_blocks_recombine_to_the_value() -> None:
    x = torch.tensor([LOW, HIGH, -1, 0, 1, 12345678901234])
    for nb in (3, 4, 5):
        p = blocks.plan(1, 1, nb) if nb == 3 else blocks.Plan(nb, math.ceil(64 / nb), 1)
        parts = blocks.split(x, p).long()
        assert int(parts.max()) < 2**p.bits and int(parts.min()) >= 0
        back = torch.zeros_like(x)
        for i in range(p.blocks):
            back += parts[i] << (i * p.bits)
        assert torch.equal(back, x)


# -- matmul ------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inner", [255, 256, 512, 513, 4096, 65536])
@pytest.mark.parametrize("max_blocks", [blocks.MAX_BLOCKS, 3])
def test_matmul_is_exact(device: str, inner: int, max_blocks: int) -> None:
    x, y = ring(2, inner), ring(inner, 3, seed=1)
    got = blocks.matmul(x, y, device=device, max_blocks=max_blocks)
    assert got.device.type == device
    assert torch.equal(got.cpu(), x @ y)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_worst_case_operands_at_the_bound(device: str) -> None:
    # Every block all ones: each block product is (2^k - 1)^2, the bound's own term.
    for inner in (512, 513):
        x, y = torch.full((1, inner), -1), torch.full((inner, 2), -1)
        got = blocks.matmul(x, y, device=device, max_blocks=3).cpu()
        assert torch.equal(got, x @ y)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_broadcasts_and_takes_vectors(device: str) -> None:
    a, b = ring(3, 1, 4, 300), ring(5, 300, 2, seed=1)
    assert torch.equal(blocks.matmul(a, b, device=device).cpu(), torch.matmul(a, b))
    v = ring(300, seed=2)
    assert torch.equal(blocks.matmul(v, b, device=device).cpu(), torch.matmul(v, b))
    assert torch.equal(blocks.matmul(a, v, device=device).cpu(), torch.matmul(a, v))
    assert torch.equal(blocks.matmul(v, v, device=device).cpu(), torch.matmul(v, v))
    with pytest.raises(TypeError, match="int64"):
        blocks.matmul(a.double(), b)


# -- convolutions ------------------------------------------------------------------------------

GROUPS = ["1", "2", "depthwise"]


def _conv_case(channels: int, kernel: int, groups: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    g = channels if groups == "depthwise" else int(groups)
    out_channels = channels if groups == "depthwise" else 2 * g
    size = max(kernel, 3)
    x = ring(1, channels, size, size)
    w = ring(out_channels, channels // g, kernel, kernel, seed=1)
    return x, w, g


LAYOUTS = [pytest.param(False, id="pairs"), pytest.param(True, id="dense")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dense", LAYOUTS)
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("kernel", [1, 3, 7])
@pytest.mark.parametrize("channels", [128, 256, 512, 1024])
def test_conv2d_is_exact(device: str, channels: int, kernel: int, groups: str, dense: bool) -> None:
    x, w, g = _conv_case(channels, kernel, groups)
    got = blocks.conv2d(x, w, padding=kernel // 2, groups=g, device=device, dense=dense)
    assert got.device.type == device
    assert torch.equal(got.cpu(), ref_conv(x, w, padding=kernel // 2, groups=g))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dense", LAYOUTS)
@pytest.mark.parametrize("channels", [256, 1024])
def test_conv2d_chunks_the_channels_past_max_blocks(
    device: str, channels: int, dense: bool
) -> None:
    x, w, g = _conv_case(channels, 3, "2")
    got = blocks.conv2d(x, w, padding=1, groups=g, device=device, max_blocks=3, dense=dense)
    assert torch.equal(got.cpu(), ref_conv(x, w, padding=1, groups=g))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dense", LAYOUTS)
def test_conv_stride_padding_dilation_and_1d(device: str, dense: bool) -> None:
    x, w = ring(2, 6, 13, 11), ring(4, 3, 3, 5, seed=1)
    kw: dict[str, Any] = {"stride": (2, 1), "padding": (2, 3), "dilation": (1, 2), "groups": 2}
    got = blocks.conv2d(x, w, device=device, dense=dense, **kw).cpu()
    assert torch.equal(got, ref_conv(x, w, **kw))
    x1, w1 = ring(2, 600, 9), ring(3, 600, 3, seed=1)
    kw1: dict[str, Any] = {"stride": 2, "padding": 1, "dilation": 2}
    got1 = blocks.conv1d(x1, w1, device=device, dense=dense, **kw1).cpu()
    assert torch.equal(got1, ref_conv(x1, w1, **kw1))
    # Unbatched input, and a bias added in the ring.
    bias = ring(4, seed=3)
    got = blocks.conv2d(x[0], w, bias, device=device, dense=dense, **kw).cpu()
    assert torch.equal(got, ref_conv(x[:1], w, **kw)[0] + bias.view(-1, 1, 1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dense", LAYOUTS)
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("channels", [16, 512])
def test_conv_transpose_is_exact(device: str, channels: int, groups: int, dense: bool) -> None:
    x, w = ring(2, channels, 5, 4), ring(channels, 3, 3, 3, seed=1)
    kw: dict[str, Any] = {"stride": 2, "padding": 1, "output_padding": 1, "groups": groups}
    got = blocks.conv_transpose2d(x, w, device=device, dense=dense, **kw).cpu()
    assert torch.equal(got, ref_conv_transpose(x, w, **kw))
    x1, w1 = ring(1, channels, 7), ring(channels, 2, 5, seed=1)
    kw1: dict[str, Any] = {"stride": 3, "padding": 2, "groups": groups, "dilation": 2}
    got1 = blocks.conv_transpose1d(x1, w1, device=device, dense=dense, **kw1).cpu()
    assert torch.equal(got1, ref_conv_transpose(x1, w1, **kw1))


# -- CrypTen's fixed split, run unedited on the CPU --------------------------------------------


@contextmanager
def crypten_on_cpu() -> Iterator[tuple[Any, Any]]:
    """CrypTen's `CUDALongTensor` class, and a subclass whose tensors stay on the CPU.

    While the block runs, the subclass stands in for the class in CrypTen's module, where
    CrypTen's code (and mpcml's shim) look it up: its float64 products then run on the CPU.
    """
    from crypten.cuda import cuda_tensor

    stock = cuda_tensor.CUDALongTensor

    class CpuLongTensor(stock):  # type: ignore[misc,valid-type]
        def __init__(self, data: Any = None, device: Any = None) -> None:
            self._tensor = None if data is None else torch.as_tensor(data).long()

    cuda_tensor.CUDALongTensor = CpuLongTensor
    try:
        yield stock, CpuLongTensor
    finally:
        cuda_tensor.CUDALongTensor = stock


def crypten_conv2d(x: torch.Tensor, w: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """CrypTen's own conv2d on CUDA shares (its private `__patched_conv_ops`), on the CPU."""
    with crypten_on_cpu() as (stock, _):
        out = stock._CUDALongTensor__patched_conv_ops("conv2d", x, w, **kwargs)
        return out.tensor()  # type: ignore[no-any-return]


@pytest.mark.parametrize(("channels", "crypten_exact"), [(128, True), (256, False), (512, False)])
def test_crypten_fixed_split_is_wrong_where_the_bound_says(
    channels: int, crypten_exact: bool
) -> None:
    # 3x3 over 256 channels sums 2304 terms: 3 blocks of 22 bits hold 512 at worst, and random
    # blocks (mean product 2^42) overflow 2^53 past about 2048. CrypTen takes 3 blocks for any
    # kernel under 256 elements.
    x, w = ring(1, channels, 4, 4), ring(2, channels, 3, 3, seed=1)
    expected = ref_conv(x, w)  # no padding: every output sums all 9 * channels terms
    theirs = crypten_conv2d(x, w)
    assert torch.equal(theirs, expected) is crypten_exact
    if not crypten_exact:
        assert bool((theirs != expected).all()), "wrong in every output, as issue #307 reports"
    assert blocks.plan(channels * 9, 9).blocks == 4
    assert torch.equal(blocks.conv2d(x, w), expected)


def test_crypten_fixed_split_fails_at_one_term_past_the_bound() -> None:
    # All-ones blocks: 512 terms of (2^22 - 1)^2 stay below 2^53, 513 do not.
    for channels, crypten_exact in ((512, True), (513, False)):
        x, w = torch.full((1, channels, 1, 1), -1), torch.full((1, channels, 1, 1), -1)
        expected = ref_conv(x, w)
        assert torch.equal(crypten_conv2d(x, w), expected) is crypten_exact
        assert torch.equal(blocks.conv2d(x, w), expected)
        assert torch.equal(blocks.conv2d(x, w, max_blocks=3), expected)


def test_crypten_refuses_groups_ours_computes_them() -> None:
    x, w = ring(1, 4, 5, 5), ring(4, 1, 3, 3, seed=1)
    with pytest.raises(AssertionError, match="group"):
        crypten_conv2d(x, w, groups=4)
    assert torch.equal(blocks.conv2d(x, w, groups=4), ref_conv(x, w, groups=4))


def test_cuda_shares_dispatch_to_the_blocks() -> None:
    # What CrypTen's arithmetic calls on CUDA shares (`getattr(torch, op)(share, other, ...)`)
    # reaches mpcml's blocks through the table compat.apply() patched: exact where CrypTen's
    # split is wrong (3x3 over 256 channels), with groups, transposed, and for matmul.
    from mpcml.runtime import compat

    compat.apply()
    x, w = ring(1, 256, 4, 4), ring(4, 128, 3, 3, seed=1)
    a, b = ring(3, 600), ring(600, 2, seed=2)
    wt = ring(256, 2, 3, 3, seed=3)
    with crypten_on_cpu() as (_, cpu_long), warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning on a plain-method __torch_function__
        conv: Any = torch.conv2d(
            cpu_long(x), cpu_long(w), stride=1, padding=1, dilation=1, groups=2
        )
        prod: Any = torch.matmul(cpu_long(a), b)
        up: Any = torch.conv_transpose2d(cpu_long(x), cpu_long(wt), stride=2, groups=2)
        assert all(isinstance(t, cpu_long) for t in (conv, prod, up))
    assert torch.equal(conv.tensor(), ref_conv(x, w, padding=1, groups=2))
    assert torch.equal(prod.tensor(), a @ b)
    assert torch.equal(up.tensor(), ref_conv_transpose(x, wt, stride=2, groups=2))
