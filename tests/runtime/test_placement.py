"""Where a session's shares live and how they cross to the host: the code a GPU party runs for
its checkpoints and kept models, checked here on the CPU through the emulated CUDA wrapper
(CrypTen's `CUDALongTensor` with its data on the CPU), and on CUDA where there is one."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from mpcml.runtime import devices, prg
from mpcml.runtime.devices import Placement, PlacementError
from tests.runtime import scenarios
from tests.runtime.test_blocks import ref_conv
from tests.support.parties import party_specs, run_specs_on_dealer

NO_CUDA = "no CUDA device on this machine: the GPU path is checked only where one is present"
PLACEMENTS = [
    pytest.param(("cpu", False), id="cpu"),
    pytest.param(("cuda:0", True), id="cuda-emulated"),
    pytest.param(
        ("cuda:0", False),
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA),
    ),
]


def _placement(configured: str, emulate: bool) -> Placement:
    return Placement.of(configured, "alice", emulate)


def _ring(*shape: int) -> torch.Tensor:
    return torch.randint(-(2**63), 2**63 - 1, shape, dtype=torch.int64)


def test_the_placements_say_where_they_compute() -> None:
    cpu = _placement("cpu", False)
    assert (cpu.device, cpu.wrapped, cpu.name) == (torch.device("cpu"), False, "cpu")
    emulated = _placement("cuda:0", True)
    assert emulated.device == torch.device("cpu") and emulated.wrapped
    assert emulated.name == "cuda:0 (emulated on the CPU)"
    assert Placement.of(None, "alice") == cpu


@pytest.mark.parametrize("where", PLACEMENTS)
def test_a_share_crosses_to_a_checkpoint_and_back_unchanged(where: tuple[str, bool]) -> None:
    placement = _placement(*where)
    value = _ring(3, 5)
    with devices.emulation(where[1]):
        share = placement.share(value)
        placement.check("the share", share)
        assert isinstance(share, devices.wrapper()) == placement.wrapped
        saved = placement.host(share)
        assert type(saved) is torch.Tensor and saved.device.type == "cpu"
        buffer = io.BytesIO()
        torch.save({"w": saved}, buffer)  # what a checkpoint holds: plain CPU tensors
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)["w"]
        back = placement.share(loaded)
        placement.check("the share read back", back)
        data = back.tensor() if placement.wrapped else back
        assert data.device == placement.device and torch.equal(data.cpu(), value)


@pytest.mark.parametrize("where", PLACEMENTS)
def test_the_host_copy_is_a_copy(where: tuple[str, bool]) -> None:
    placement = _placement(*where)
    with devices.emulation(where[1]):
        share = placement.share(torch.zeros(4, dtype=torch.int64))
        saved = placement.host(share)
        saved += 7  # a checkpoint written later must not see the share change, nor this
        data = share.tensor() if placement.wrapped else share
        assert int(data.sum()) == 0


def test_a_share_held_off_the_partys_device_is_refused_by_name() -> None:
    emulated, cpu = _placement("cuda:0", True), _placement("cpu", False)
    with devices.emulation():
        wrapped = emulated.share(_ring(2))
        with pytest.raises(
            PlacementError,
            match=r"parameter 'fc.weight' is a Tensor on cpu; this party computes on cuda:0 "
            r"\(emulated on the CPU\)",
        ):
            emulated.check("parameter 'fc.weight'", _ring(2))
        with pytest.raises(PlacementError, match="the features is a EmulatedCudaLongTensor"):
            cpu.check("the features", wrapped)


def test_emulation_wraps_what_is_drawn_and_ends_with_its_block() -> None:
    from crypten.common import rng
    from crypten.cuda import cuda_tensor
    from crypten.mpc.primitives import arithmetic

    stock = cuda_tensor.CUDALongTensor
    plain = torch.zeros(3, dtype=torch.int64)
    assert prg.wrap(plain) is plain
    with devices.emulation():
        assert devices.emulating()
        wrapped: Any = prg.wrap(plain)
        assert isinstance(wrapped, stock) and wrapped.is_cuda and wrapped.device.type == "cpu"
        assert arithmetic.CUDALongTensor is rng.CUDALongTensor is cuda_tensor.CUDALongTensor
        assert cuda_tensor.CUDALongTensor is not stock
        # CrypTen's own arithmetic on the wrapper gives the wrapper back, exactly
        product = torch.matmul(wrapped.__class__(_ring(2, 3)), wrapped.__class__(_ring(3, 2)))
        assert isinstance(product, cuda_tensor.CUDALongTensor)
    assert not devices.emulating()
    assert cuda_tensor.CUDALongTensor is stock and arithmetic.CUDALongTensor is stock
    assert prg.wrap(plain) is plain


def test_emulated_shares_take_the_block_products_not_cryptens_split() -> None:
    # CrypTen's fixed split is wrong in every output of a 3x3 convolution over 256 channels
    # (tests/runtime/test_blocks.py); the emulated wrapper must reach mpcml's blocks.
    x, w = _ring(1, 256, 3, 3), _ring(2, 256, 3, 3)
    a, b = _ring(4, 300), _ring(300, 5)
    with devices.emulation():
        cls = devices.wrapper()
        convolved: Any = torch.conv2d(cls(x), cls(w))
        product: Any = torch.matmul(cls(a), cls(b))
    convolved, product = convolved.tensor(), product.tensor()
    assert torch.equal(convolved, ref_conv(x, w))
    assert torch.equal(product, a @ b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_a_module_moves_to_the_gpu_with_cuda_before_it_is_encrypted() -> None:
    import crypten.nn

    placement = _placement("cuda:0", False)
    net = crypten.nn.from_pytorch(torch.nn.Linear(3, 2), torch.zeros(1, 3))
    placement.module(net)
    assert all(p.is_cuda for p in net.parameters())


@pytest.mark.system
@pytest.mark.parametrize("where", PLACEMENTS[1:])
def test_a_gpu_party_and_a_cpu_party_compute_together_on_the_dealer(
    tmp_path: Path, where: tuple[str, bool]
) -> None:
    """Rank 0 on the GPU path, rank 1 on the CPU: tuples and results where each computes."""
    specs = party_specs(tmp_path, 2, "tests.runtime.scenarios:mixed_devices")
    device, emulate = where
    specs[0].kwargs = {
        **specs[0].kwargs,
        "session": {"device": device, "cuda_emulation": emulate},
    }
    results = run_specs_on_dealer(tmp_path, specs, timeout=240)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.traceback}"
    gpu, cpu = (r.value for r in results)
    wrapped = "EmulatedCudaLongTensor" if emulate else "CUDALongTensor"
    assert gpu["device"] == ("cuda:0 (emulated on the CPU)" if emulate else "cuda:0")
    assert gpu["tuples"] == [wrapped] and gpu["held"] == [wrapped], gpu
    assert cpu["tuples"] == ["Tensor"] and cpu["held"] == ["Tensor"] and cpu["device"] == "cpu"
    given = scenarios.mixed_inputs()
    w = given["w"].clone().requires_grad_()
    product = given["x"] @ given["w"]
    torch.autograd.backward((given["x"] @ w - 1).square().mean())
    expected = {
        "product": product,
        "activated": product.relu() * product,
        "convolved": torch.nn.functional.conv2d(given["image"], given["kernel"], padding=1),
        "grad": w.grad,
    }
    for r in results:
        for key, value in expected.items():
            error = float((r.value[key] - value).abs().max())
            assert error < 0.01, f"rank {r.rank}: {key} off by {error}"
