"""Computations the party processes of the transport tests run inside `mpcml.session`."""

from __future__ import annotations

from typing import Any

import mpcml  # noqa: I001  (first: its import hook lets crypten load)
import crypten
import torch


def smoke(s: mpcml.Session) -> dict[str, Any]:
    x = crypten.cryptensor(torch.arange(6, dtype=torch.float32).reshape(2, 3), src=0)
    y = crypten.cryptensor(torch.ones(2, 3), src=1)
    return {"sum": (x + y).get_plain_text(), "prod": (x * y).get_plain_text()}
