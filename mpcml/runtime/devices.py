"""A party's compute device: `cpu`, `cuda` or `cuda:N`, checked where it is used.

The syntax is checked when a config is read (no torch needed). Whether CUDA is there is checked
only in the job worker, when its session starts: asking torch in the party daemon or in the
workers' fork server would initialise CUDA there, and a process forked from one that did cannot
use CUDA (docs/architecture.md).
"""

from __future__ import annotations

import re
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


def resolve(device: Any, party: str) -> Any:
    """The `torch.device` a session computes on, once CUDA is known to hold it.

    None and "cpu" are the CPU. A CUDA device must exist on this machine: otherwise a
    DeviceError says which party asked for which device and what the machine has. The device
    becomes the current CUDA device, so CrypTen's bare "cuda" means it too.
    """
    import torch

    if device is None:
        return torch.device("cpu")
    text = str(device)
    check(text, party)
    chosen = torch.device(text)
    if chosen.type == "cpu":
        return chosen
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
