"""ChaCha20 for share randomness: RFC 8439's vector, the `cryptography` implementation, the same
stream on CPU and CUDA, and CrypTen really drawing from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mpcml.runtime import prg
from mpcml.runtime.prg import ChaChaStream, keystream_openssl, keystream_torch
from tests.support.parties import run_session

# RFC 8439, 2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, block counter 1.
RFC_KEY = bytes(range(32))
RFC_NONCE = bytes.fromhex("000000090000004a00000000")
RFC_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)


def test_rfc8439_block_vector() -> None:
    assert keystream_torch(RFC_KEY, RFC_NONCE, 64, counter=1).numpy().tobytes() == RFC_BLOCK
    assert keystream_openssl(RFC_KEY, RFC_NONCE, 64, counter=1) == RFC_BLOCK


@pytest.mark.parametrize("nbytes", [1, 63, 64, 65, 4096 + 7, 1 << 20])
def test_torch_kernel_matches_the_cryptography_package(nbytes: int) -> None:
    key, nonce = os.urandom(32), os.urandom(12)
    counter = int.from_bytes(os.urandom(2), "little")
    expected = keystream_openssl(key, nonce, nbytes, counter)
    assert keystream_torch(key, nonce, nbytes, counter).numpy().tobytes() == expected


def test_a_stream_is_its_key_and_its_draw_count() -> None:
    key = os.urandom(32)
    a, b = ChaChaStream(key), ChaChaStream(key)
    first = [a.ring((3, 5)) for _ in range(3)]
    assert all(torch.equal(x, b.ring((3, 5))) for x in first)
    assert not torch.equal(first[0], first[1])
    assert a.draws == 3 and key.hex() not in repr(a)
    bits = ChaChaStream(key).ring((10_000,), bitlength=1)
    assert set(bits.tolist()) == {0, 1}
    assert not torch.equal(ChaChaStream(os.urandom(32)).ring((4,)), ChaChaStream(key).ring((4,)))


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device on this machine: the GPU keystream is checked only where one is present",
)
def test_cuda_gives_the_same_stream_as_cpu() -> None:
    key = os.urandom(32)
    cpu, gpu = ChaChaStream(key), ChaChaStream(key)
    for shape in [(1,), (1000, 7), (1 << 18,)]:
        assert torch.equal(cpu.ring(shape), gpu.ring(shape, device="cuda").cpu())
    # Odd byte counts, single bits, and an explicit device index draw the same too.
    for nbytes in [1, 63, 65, 4096 + 7]:
        got = gpu.random_bytes(nbytes, device="cuda:0")
        assert got.device.type == "cuda" and torch.equal(cpu.random_bytes(nbytes), got.cpu())
    assert torch.equal(cpu.ring((999,), bitlength=1), gpu.ring((999,), 1, "cuda").cpu())


def test_a_device_draw_runs_the_torch_kernel_there_with_the_cpu_streams_bytes() -> None:
    # What a CUDA device computes is keystream_torch on that device, on the draw's nonce: on
    # the CPU the same kernel gives the CPU stream's bytes, and "meta" shows the device is used.
    key = os.urandom(32)
    stream = ChaChaStream(key)
    for draw, nbytes in enumerate([8, 1000, 4096 + 5]):
        expected = stream.random_bytes(nbytes)
        assert torch.equal(keystream_torch(key, prg._nonce(draw), nbytes, device="cpu"), expected)
    meta = ChaChaStream(key).random_bytes(100, device="meta")
    assert meta.device.type == "meta" and meta.shape == (100,) and meta.dtype == torch.uint8
    assert ChaChaStream(key).ring((3, 4), device="meta").device.type == "meta"


@pytest.mark.system
def test_crypten_draws_its_masks_from_chacha_not_from_torch(tmp_path: Path) -> None:
    scenario = "tests.runtime.scenarios:masks_after_reseeding_torch"
    first = run_session(tmp_path / "a", 2, scenario)
    second = run_session(tmp_path / "b", 2, scenario)
    for a, b in zip(first, second, strict=True):
        assert a.ok and b.ok, a.traceback or b.traceback
        assert bool(a.value["patched"])
        assert torch.equal(a.value["revealed"], torch.zeros(64))
        # Same torch seeds in both sessions, yet other masks: torch's generators are unused.
        assert not torch.equal(a.value["share"], b.value["share"])
        assert bool((a.value["share"] != 0).any())


@pytest.mark.system
def test_copies_of_a_share_draw_no_randomness_and_keep_its_value(tmp_path: Path) -> None:
    # CrypTen builds each copy as MPCTensor([]), which drew a zero sharing of nothing (two
    # ChaCha20 key set-ups) until mpcml.runtime.compat made it an empty shell.
    results = run_session(tmp_path, 2, "tests.runtime.scenarios:copies_draw_nothing")
    for r in results:
        assert r.ok, r.traceback
        assert int(r.value["drawn"]) == 0
        expected = torch.arange(6, dtype=torch.float32) - 2.5
        assert torch.equal(r.value["plain"], expected)
        for copy in r.value["revealed"]:
            assert torch.equal(copy, expected)


def test_a_round_draws_the_same_whatever_came_before_it() -> None:
    key = bytes(range(32))
    fresh, busy = ChaChaStream(key), ChaChaStream(key)
    for _ in range(5):
        busy.random_bytes(64)
    busy.start_round(3)
    fresh.start_round(3)
    assert torch.equal(busy.random_bytes(64), fresh.random_bytes(64))
    other = ChaChaStream(key)
    other.start_round(4)
    assert not torch.equal(other.random_bytes(64), ChaChaStream(key).random_bytes(64))
    # round 0 is the stream as it always was: nonce = the draw count
    assert bytes(ChaChaStream(key).random_bytes(64).numpy()) == keystream_openssl(
        key, (0).to_bytes(12, "little"), 64
    )
    with pytest.raises(ValueError, match="a round is a number from 0 to 2"):
        other.start_round(-1)
