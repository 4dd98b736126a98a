"""A party's compute device: `cpu`, `cuda` or `cuda:N`, checked where it is used.

The syntax is checked when a config is read (no torch needed). Whether CUDA is there is checked
only in the job worker, when its session starts: asking torch in the party daemon or in the
workers' fork server would initialise CUDA there, and a process forked from one that did cannot
use CUDA (docs/architecture.md).

A session's `Placement` says where its tensors live and how shares cross to the host and back
(checkpoints, kept models, revealed outputs): every tensor a job worker makes goes through it.
With `emulate` (a party's `cuda_emulation = true`), a CUDA device runs the CUDA path's code with
its data on the CPU: shares in CrypTen's `CUDALongTensor`, products in float64 blocks. It checks
the GPU plumbing on a machine without a GPU; it is slower than `device = "cpu"`, never faster.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mpcml.errors import MpcmlError

_SYNTAX = re.compile(r"cpu|cuda(:(0|[1-9][0-9]*))?")


class DeviceError(MpcmlError, ValueError):
    """A party's device is malformed, or absent on its machine."""


def check(device: str, party: str) -> str:
    """`device` if it reads `cpu`, `cuda` or `cuda:N`; a DeviceError naming the party if not."""
    if not _SYNTAX.fullmatch(device):
        raise DeviceError(
            f"party {party!r}: device {device!r} is not 'cpu', 'cuda' or 'cuda:N' (N >= 0)"
        )
    return device


def resolve(device: Any, party: str, emulate: bool = False) -> Any:
    """The `torch.device` a session computes on, once CUDA is known to hold it.

    None and "cpu" are the CPU. A CUDA device must exist on this machine: otherwise a
    DeviceError says which party asked for which device and what the machine has. The device
    becomes the current CUDA device, so CrypTen's bare "cuda" means it too. With `emulate`, a
    CUDA device is the CPU (see `Placement`), and CUDA is not asked about.
    """
    import torch

    if device is None:
        return torch.device("cpu")
    text = str(device)
    check(text, party)
    chosen = torch.device(text)
    if chosen.type == "cpu" or emulate:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        built = "without CUDA" if torch.version.cuda is None else f"with CUDA {torch.version.cuda}"
        raise DeviceError(
            f"party {party!r} is configured for device {text!r}, but this machine has no "
            f"usable CUDA device (torch {torch.__version__}, built {built}); "
            'set device = "cpu" in its party config or run it on a machine with a GPU'
        )
    count = torch.cuda.device_count()
    index = chosen.index if chosen.index is not None else torch.cuda.current_device()
    if index >= count:
        raise DeviceError(
            f"party {party!r} is configured for device {text!r}, but this machine has "
            f"{count} CUDA device(s): cuda:0..cuda:{count - 1}"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


class PlacementError(MpcmlError, RuntimeError):
    """A share is not where the session's device says: a defect of the worker's code."""


@dataclass(frozen=True)
class Placement:
    """Where a session's tensors live, and how shares cross to the host and back."""

    device: Any
    """The `torch.device` that holds the data: the CPU for "cpu" and for an emulated GPU."""
    wrapped: bool
    """Shares are CrypTen's `CUDALongTensor` (a CUDA device, real or emulated)."""
    name: str
    """As configured, e.g. "cuda:0", with " (emulated on the CPU)" when it is."""

    @property
    def emulated(self) -> bool:
        """A CUDA device's code with its data on the CPU (`emulation`)."""
        return self.wrapped and self.device.type == "cpu"

    @classmethod
    def of(cls, configured: Any, party: str, emulate: bool = False) -> Placement:
        """The placement of `configured` ("cpu", "cuda", "cuda:N" or None) on this machine."""
        device = resolve(configured, party, emulate)
        text = "cpu" if configured is None else str(configured)
        if text == "cpu":
            return cls(device, False, "cpu")
        if device.type == "cpu":
            return cls(device, True, f"{text} (emulated on the CPU)")
        return cls(device, True, str(device))

    def plain(self, tensor: Any) -> Any:
        """A plaintext tensor (an input, a weight) where shares of it will be made."""
        return tensor.to(self.device)

    def module(self, net: Any) -> Any:
        """A plaintext crypten module moved to the device before it is encrypted.

        `.cuda()`, not `.to()`: CrypTen wraps a share in `CUDALongTensor` only on `.cuda()`.
        """
        if self.device.type == "cuda":
            net.cuda(self.device)
        return net

    def host(self, share: Any) -> Any:
        """A copy of a share as a plain int64 tensor on the CPU (to save, or to send)."""
        return _data(share).detach().to("cpu", copy=True)

    def share(self, host: Any) -> Any:
        """A share read back from the host, as the session holds its shares."""
        data = host.to(self.device)
        return wrapper()(data) if self.wrapped else data

    def check(self, what: str, share: Any) -> None:
        """Raise PlacementError unless `share` is held as this placement's shares are."""
        data = _data(share)
        if (data is not share) != self.wrapped or data.device != self.device:
            held = f"{type(share).__name__} on {data.device}"
            raise PlacementError(f"{what} is a {held}; this party computes on {self.name}")


def wrapper() -> Any:
    """CrypTen's `CUDALongTensor` class, or its CPU stand-in while emulating."""
    from crypten.cuda import cuda_tensor

    return cuda_tensor.CUDALongTensor


def _data(share: Any) -> Any:
    """A share's int64 tensor: the wrapper's, or the share itself."""
    return share.tensor() if isinstance(share, wrapper()) else share


_emulating = False


def emulating() -> bool:
    """Whether shares drawn now are to be wrapped although their data is on the CPU."""
    return _emulating


_CRYPTEN_USERS = (
    "crypten.cuda.cuda_tensor",
    "crypten.common.rng",
    "crypten.common.tensor_types",
    "crypten.common.util",
    "crypten.mpc.mpc",
    "crypten.mpc.primitives.arithmetic",
    "crypten.mpc.primitives.binary",
)
"""The CrypTen modules that bind `CUDALongTensor` by name."""


@contextmanager
def emulation(on: bool = True) -> Iterator[None]:
    """While it runs, CrypTen's `CUDALongTensor` keeps its data on the CPU and calls it CUDA.

    Every module of CrypTen that names the class gets the stand-in, so the shares CrypTen makes
    (and those mpcml draws, `prg.wrap`) are wrapped as on a GPU: the same dispatch, the same
    block products (`mpcml.runtime.compat`), the same host copies in the transport.
    """
    global _emulating
    if not on:
        yield
        return
    import importlib

    from mpcml.runtime import compat

    compat.apply()  # the block products a GPU runs, not CrypTen's fixed split
    stock = wrapper()

    class EmulatedCudaLongTensor(stock):  # type: ignore[misc,valid-type]
        """CrypTen's `CUDALongTensor` with its int64 data on the CPU."""

        def __init__(self, data: Any = None, device: Any = None) -> None:
            import torch

            if isinstance(data, stock):
                data = data._tensor
            self._tensor = None if data is None else torch.as_tensor(data).long()

        @property
        def is_cuda(self) -> bool:
            return True

    modules = [importlib.import_module(m) for m in _CRYPTEN_USERS]
    for m in modules:
        m.CUDALongTensor = EmulatedCudaLongTensor  # type: ignore[attr-defined]
    _emulating = True
    try:
        yield
    finally:
        _emulating = False
        for m in modules:
            m.CUDALongTensor = stock  # type: ignore[attr-defined]
