"""The error bound each implementation is held to, derived the same way for every one.

On 2001 points spread over its domain (an unbounded domain is sampled on [-32, 32]; softmax
on rows of 8 whose largest entry spans the domain), the implementation runs three times: in
exact float64, in CrypTen's fixed point (`Fixed`), and in fixed point with every truncation
off by a random unit in the last place, as the parties' probabilistic truncation is. The bound
is 1.5 times the largest error of the three, plus 2^-8 for the MPC noise the emulation does not
reproduce. `tests/approx/` checks it in emulation and in 2- and 3-party MPC.

Errors are measured as the implementation's `Spec.scale` says: absolute, relative to
max(|f(x)|, 2^-10), or relative to max(|f(x)|, 1).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from mpcml.approx import registry
from mpcml.approx.fixed import Fixed
from mpcml.approx.implementations import REFERENCES, apply

POINTS = 2001
SAMPLE_LIMIT = 32.0
"""An unbounded domain is sampled on [-SAMPLE_LIMIT, SAMPLE_LIMIT]."""
ROW = 8
"""Softmax is checked on rows of this many entries."""
MARGIN = 2.0**-8
FACTOR = 1.5


def sample(function: str, name: str, settings: Mapping[str, float]) -> torch.Tensor:
    """Inputs spread over the implementation's domain (softmax: rows, dim -1)."""
    lo, hi = registry.domain(function, name, settings)
    lo, hi = max(lo, -SAMPLE_LIMIT), min(hi, SAMPLE_LIMIT)
    x = torch.linspace(lo, hi, POINTS, dtype=torch.float64)
    if function != "softmax":
        return x
    # Each row: its largest entry is a point of the domain (within 4 of the shift for the
    # bounded one); the others up to 8 below it (the bounded one: down to its domain's floor).
    if name == "bounded":
        x = torch.linspace(hi - 4.0, hi, POINTS, dtype=torch.float64)
    top = x[: (POINTS // ROW) * ROW : ROW].unsqueeze(1)
    reach = hi - lo if name == "bounded" else min(8.0, hi - lo)  # bounded: down to the floor
    spread = torch.linspace(0, -reach, ROW, dtype=torch.float64)
    return (top + spread).clamp(min=lo)


def errors(
    function: str, name: str, settings: Mapping[str, float], out: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """Each output's error against the float64 truth, measured as the spec says."""
    truth = REFERENCES[function](x, -1)
    err = (out - truth).abs()
    scale = registry.spec(function, name).scale
    if scale == "relative":
        return err / truth.abs().clamp(min=2.0**-10)
    if scale == "relative1":
        return err / truth.abs().clamp(min=1.0)
    return err


def measured(function: str, name: str, settings: Mapping[str, float]) -> float:
    """The largest error over the sample, exact, in fixed point, and with truncation noise."""
    x = sample(function, name, settings)
    worst = 0.0
    for bits, noise in ((None, None), (16, None), (16, torch.Generator().manual_seed(0))):
        out = apply(function, name, Fixed(x, bits, noise=noise), settings).v
        worst = max(worst, float(errors(function, name, settings, out, x).max()))
    return worst


@functools.cache
def _bound(function: str, name: str, frozen: tuple[tuple[str, float], ...]) -> float:
    return FACTOR * measured(function, name, dict(frozen)) + MARGIN


def error_bound(function: str, name: str, knobs: Mapping[str, float]) -> float:
    """The bound the implementation (with these knobs) is held to over its domain."""
    settings = registry.knobs(function, name, knobs)
    return _bound(function, name, tuple(sorted(settings.items())))
