"""A party's device: malformed or missing devices are refused, naming the party and the device,
before a session connects to anyone; CUDA is asked about only then (never at import)."""

from __future__ import annotations

import time

import pytest
import torch

import mpcml
from mpcml.runtime import devices
from mpcml.runtime.devices import DeviceError

NO_CUDA = "no CUDA device on this machine: the GPU path is checked only where one is present"
PEERS = ["127.0.0.1:1", "127.0.0.1:2"]


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cpu:0", "cuda:-1", ""])
def test_a_malformed_device_names_the_party(device: str) -> None:
    with pytest.raises(DeviceError, match=rf"party 'bob': device '{device}' is not"):
        devices.resolve(device, "bob")


def test_the_cpu_and_none_are_the_cpu() -> None:
    assert devices.resolve(None, "bob") == torch.device("cpu")
    assert devices.resolve("cpu", "bob") == torch.device("cpu")
    assert devices.resolve(torch.device("cpu"), "bob") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda_names_the_party_and_the_device(device: str) -> None:
    with pytest.raises(DeviceError, match=rf"party 'bob' is configured for device '{device}'.*no"):
        devices.resolve(device, "bob")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_session_without_its_gpu_fails_at_once_with_the_reason() -> None:
    began = time.monotonic()
    with (
        pytest.raises(DeviceError, match="party 'party0' is configured for device 'cuda:0'"),
        mpcml.session(0, 2, PEERS, insecure=True, device="cuda:0", connect_timeout=30),
    ):
        pass
    assert time.monotonic() - began < 5, "it waited for peers before checking its device"


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_a_cuda_index_beyond_the_machine_names_what_it_has() -> None:
    count = torch.cuda.device_count()
    with pytest.raises(DeviceError, match=rf"{count} CUDA device\(s\)"):
        devices.resolve(f"cuda:{count}", "bob")
    assert devices.resolve("cuda:0", "bob") == torch.device("cuda", 0)
