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
