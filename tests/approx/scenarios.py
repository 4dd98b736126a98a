"""What the party processes of the approximation tests compute inside `mpcml.session`.

The harness imports mpcml before this module, so crypten imports on current torch.
"""

from __future__ import annotations

from typing import Any

import crypten
import torch

from mpcml.approx import registry
from mpcml.approx.bounds import sample
from mpcml.approx.implementations import apply

VARIANTS: dict[tuple[str, str], list[dict[str, float]]] = {
    ("exp", "limit"): [{"iterations": 6}],
    ("reciprocal", "positive"): [{"iterations": 6}],
    ("sigmoid", "poly"): [{"degree": 9, "bound": 6, "clip": 0}, {"degree": 5, "clip": 1}],
    ("tanh", "poly"): [{"degree": 7, "bound": 3, "clip": 0}],
    ("softmax", "bounded"): [{"shift": 4.0, "iterations": 7}],
}
"""Settings checked besides every implementation's defaults."""


def cases() -> list[tuple[str, str, dict[str, float]]]:
    """Every implementation at its defaults, and the variants."""
    out = []
    for function, table in registry.SPECS.items():
        for name in table:
            for given in [{}, *VARIANTS.get((function, name), [])]:
                out.append((function, name, registry.knobs(function, name, given)))
    return out


def every_implementation(session: Any) -> list[dict[str, Any]]:
    """Run each case on its sample of the domain (party 0's input); every party reveals."""
    results = []
    for function, name, knobs in cases():
        x = sample(function, name, knobs).to(torch.float32)
        shared = crypten.cryptensor(x, src=0)
        out = apply(function, name, shared, knobs).get_plain_text()
        results.append({"function": function, "name": name, "knobs": knobs, "out": out})
    return results
