"""The approximation registry: what each non-linear function can be computed with, torch-free.

For every function (exp, log, reciprocal, sqrt, rsqrt, sigmoid, tanh, softmax, gelu, silu, erf)
the implementations a plan may name, their knobs with ranges, and the input range (domain) on
which each is accurate and cannot overflow CrypTen's fixed-point ring. The computations are in
`implementations.py`, the error bounds they are held to in `bounds.py`, and their measured
rounds and bytes in `costs.json` (`python -m mpcml.approx.costs`). This module imports neither
torch nor CrypTen: the coordinator checks plans with it.

`crypten` is always CrypTen's own implementation (its default configuration): the same results,
and the same cost, as stock CrypTen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mpcml.errors import MpcmlError

PRODUCT_LIMIT = 2.0**31
"""A product of two fixed-point values (16 fractional bits) at or over this wraps CrypTen's
64-bit ring: 2^63 / 2^32."""

UNBOUNDED = 2.0**15
"""The largest magnitude any implementation takes: its square must stay under PRODUCT_LIMIT."""


class PlanError(MpcmlError, ValueError):
    """An approximation, knob or range a plan may not use; the message names it."""


@dataclass(frozen=True)
class Knob:
    """One setting of an implementation."""

    name: str
    low: float
    high: float
    default: float
    integer: bool = True
    structural: bool = True
    """It changes the rounds and bytes: part of the cost table's key."""
    doc: str = ""


Domain = Callable[[Mapping[str, float]], tuple[float, float]]


@dataclass(frozen=True)
class Spec:
    """One implementation of one function: its knobs and where it holds."""

    function: str
    name: str
    doc: str
    knobs: tuple[Knob, ...] = ()
    domain: Domain = lambda k: (-UNBOUNDED, UNBOUNDED)
    """Inputs on which the stated error holds and nothing overflows, for the given knobs."""
    scale: str = "absolute"
    """How its error is measured: "absolute"; "relative" (to max(|f(x)|, 2^-10): exp,
    reciprocal, sqrt, rsqrt); "relative1" (to max(|f(x)|, 1): gelu, silu, whose output grows
    like x)."""

    def knob(self, name: str) -> Knob:
        """The knob called `name`, or PlanError."""
        for knob in self.knobs:
            if knob.name == name:
                return knob
        known = ", ".join(k.name for k in self.knobs) or "none"
        raise PlanError(f"{self.function} {self.name!r} has no knob {name!r} (knobs: {known})")


def _iterations(default: int, low: int, high: int, doc: str) -> Knob:
    return Knob("iterations", low, high, default, doc=doc)


def _poly_knobs(degree: int, bound: float, high: float = 32.0) -> tuple[Knob, ...]:
    return (
        Knob("degree", 3, 15, degree, doc="odd degree of the polynomial"),
        Knob("bound", 1.0, high, bound, integer=False, structural=False, doc="fitted on [-b, b]"),
        Knob("clip", 0, 1, 1, doc="1: clamp the input to [-b, b] first (two comparisons)"),
    )


def _clipped(k: Mapping[str, float]) -> tuple[float, float]:
    bound = k["bound"]
    return (-UNBOUNDED, UNBOUNDED) if k["clip"] else (-bound, bound)


def _exp_domain(k: Mapping[str, float]) -> tuple[float, float]:
    # (1 + x/2^n)^(2^n): the base must stay positive (x > -2^n); its relative error,
    # about x^2 / 2^(n+1), stays small only for moderate positive x.
    return (-(2.0 ** k.get("iterations", 8)) / 2, 4.0)


def _saturating(k: Mapping[str, float]) -> tuple[float, float]:
    # x (0.5 + p(u)): beyond -b the fit's residual at u = -1 is multiplied by |x|.
    return (-2 * k["bound"] if k["clip"] else -k["bound"], 2.0**14)


SPECS: dict[str, dict[str, Spec]] = {}


def register(spec: Spec) -> Spec:
    """Add an implementation to the registry (names are unique per function)."""
    table = SPECS.setdefault(spec.function, {})
    if spec.name in table:
        raise ValueError(f"{spec.function} already has an implementation {spec.name!r}")
    table[spec.name] = spec
    return spec


for _spec in (
    Spec("exp", "crypten", "CrypTen's limit (1 + x/256)^256", domain=_exp_domain, scale="relative"),
    Spec(
        "exp",
        "limit",
        "(1 + x/2^n)^(2^n): n squarings, so n rounds; fewer is cheaper and less accurate",
        (_iterations(8, 4, 12, "n"),),
        domain=_exp_domain,
        scale="relative",
    ),
    Spec(
        "log",
        "crypten",
        "CrypTen's Householder iterations (2, order 8) from a closed-form guess",
        domain=lambda k: (1e-3, 200.0),
    ),
    Spec(
        "log",
        "householder",
        "Householder iterations of order 8 from CrypTen's guess; each costs an exp",
        (_iterations(2, 1, 3, "iterations"),),
        domain=lambda k: (1e-3, 200.0),
    ),
    Spec(
        "reciprocal",
        "crypten",
        "CrypTen's Newton-Raphson (10 iterations) on |x|, times the sign (a comparison); at 16 "
        "fractional bits the reciprocal of x above 16 has few significant bits left",
        domain=lambda k: (1e-2, 16.0),
        scale="relative",
    ),
    Spec(
        "reciprocal",
        "positive",
        "Newton-Raphson from CrypTen's guess, for inputs known to be positive: no comparison",
        (_iterations(10, 4, 12, "Newton-Raphson iterations"),),
        domain=lambda k: (0.05 if k["iterations"] < 8 else 1e-2, 16.0),
        scale="relative",
    ),
    Spec(
        "reciprocal",
        "range",
        "Newton-Raphson from the best linear guess for inputs known to lie in [a, b] (a "
        "softmax's sum of exps lies in [1, columns]): no exp for the guess, no comparison; the "
        "guess's relative error, (b - a)^2 / (a^2 + 6ab + b^2), squares at each iteration",
        (
            _iterations(3, 1, 12, "Newton-Raphson iterations"),
            Knob("low", 0.01, 1024.0, 1.0, integer=False, structural=False, doc="a"),
            Knob("high", 0.01, 1024.0, 16.0, integer=False, structural=False, doc="b"),
        ),
        domain=lambda k: (k["low"], k["high"]),
        scale="relative",
    ),
    Spec(
        "sqrt",
        "crypten",
        "x times CrypTen's inverse square root (3 Newton-Raphson iterations)",
        domain=lambda k: (0.1, 200.0),
        scale="relative",
    ),
    Spec(
        "sqrt",
        "newton",
        "x times the inverse square root by n Newton-Raphson iterations from CrypTen's guess",
        (_iterations(3, 2, 6, "n"),),
        domain=lambda k: (0.1, 200.0),
        scale="relative",
    ),
    Spec(
        "rsqrt",
        "crypten",
        "CrypTen's inverse square root (3 Newton-Raphson iterations)",
        domain=lambda k: (0.1, 200.0),
        scale="relative",
    ),
    Spec(
        "rsqrt",
        "newton",
        "n Newton-Raphson iterations from CrypTen's guess",
        (_iterations(3, 2, 6, "n"),),
        domain=lambda k: (0.1, 200.0),
        scale="relative",
    ),
    Spec(
        "rsqrt",
        "scaled",
        "2^(s/2) times n Newton-Raphson iterations on x 2^s: a public power of two moves the "
        "input into CrypTen's domain (a LayerNorm's variance is often below 0.1)",
        (
            _iterations(3, 2, 6, "n"),
            Knob("shift", -12, 12, 0, structural=False, doc="s, even"),
        ),
        domain=lambda k: (0.1 * 2.0 ** -k["shift"], 200.0 * 2.0 ** -k["shift"]),
        scale="relative",
    ),
    Spec(
        "rsqrt",
        "range",
        "Newton-Raphson from the best linear guess for inputs known to lie in [a, b] (a "
        "LayerNorm's variance, from calibration): no exp for the guess; each iteration in two "
        "rounds of products (x y and y^2 together, then their product), the relative error "
        "going from e to about 1.5 e^2",
        (
            _iterations(2, 0, 4, "Newton-Raphson iterations"),
            Knob("low", 1e-4, 1e4, 0.5, integer=False, structural=False, doc="a"),
            Knob("high", 1e-4, 1e4, 2.0, integer=False, structural=False, doc="b"),
        ),
        domain=lambda k: (k["low"], k["high"]),
        scale="relative",
    ),
    Spec(
        "sigmoid",
        "crypten",
        "CrypTen's 1 / (1 + e^-|x|) with the sign folded back (exp, reciprocal, a comparison)",
        domain=lambda k: (-64.0, 64.0),
    ),
    Spec(
        "sigmoid",
        "range",
        "CrypTen's 1 / (1 + e^-|x|) with the sign folded back, the sum, which lies in [1, 2], "
        "inverted by Newton-Raphson from the linear guess for that range (2 iterations in 3 "
        "rounds of products) instead of CrypTen's 3 iterations from 0.75",
        (_iterations(9, 6, 10, "exp's squarings"),),
        domain=lambda k: (-64.0, 64.0),
    ),
    Spec(
        "sigmoid",
        "poly",
        "0.5 + an odd least-squares polynomial of x/b, fitted on [-b, b] at Chebyshev nodes",
        _poly_knobs(7, 8.0),
        domain=_clipped,
    ),
    Spec(
        "sigmoid",
        "seg3",
        "SPU's SEG3: 0.5 + x/8 clamped to [0, 1] (two comparisons, no multiplication)",
        domain=lambda k: (-UNBOUNDED, UNBOUNDED),
    ),
    Spec("tanh", "crypten", "CrypTen's 2 sigmoid(2x) - 1", domain=lambda k: (-32.0, 32.0)),
    Spec(
        "tanh",
        "poly",
        "an odd least-squares polynomial of x/b, fitted on [-b, b] at Chebyshev nodes",
        _poly_knobs(9, 4.0),
        domain=_clipped,
    ),
    Spec(
        "softmax",
        "crypten",
        "CrypTen's: exp(x - max) / sum, the max by a tree of comparisons",
        domain=lambda k: (-64.0, 64.0),
    ),
    Spec(
        "softmax",
        "bounded",
        "exp(x - s) / sum with a public shift s >= every input (from calibration): no max; "
        "each row's largest input must be within 4 of s, and the others may lie as far below "
        "it as half exp's 2^n (masked positions, at -16, count for nothing)",
        (
            Knob("shift", -64.0, 64.0, 8.0, integer=False, structural=False, doc="s"),
            Knob("iterations", 6, 10, 8, doc="exp's squarings"),
            Knob("reciprocal_iterations", 6, 12, 10, doc="Newton-Raphson iterations"),
        ),
        # exp's base 1 + (x - s) / 2^n stays at least 1/2; entries that far below a row's
        # largest count for e^-4 of it at most, so only those near s need exp's accuracy.
        domain=lambda k: (k["shift"] - 2.0 ** k["iterations"] / 2, k["shift"]),
    ),
    Spec(
        "softmax",
        "treemax",
        "exp(x - max) / sum, the max by a tree of pairwise max(a, b) = a + relu(b - a) (one "
        "comparison a level, no argmax), exp and the sum's reciprocal with fewer iterations",
        (
            Knob("iterations", 6, 10, 8, doc="exp's squarings"),
            Knob("reciprocal_iterations", 6, 12, 10, doc="Newton-Raphson iterations"),
        ),
        # x - max >= -(max - min) must stay above -2^n for exp's base to stay positive.
        domain=lambda k: (-(2.0 ** k["iterations"]) / 4, 2.0 ** k["iterations"] / 4),
    ),
    Spec(
        "softmax",
        "rowmax",
        "exp(x - max) / sum: the row's largest value from one comparison of every pair of "
        "columns (up to 16; a tree of pairwise maxima beyond), exp by squarings, and the sum, "
        "which lies in [1, columns], inverted by Newton-Raphson from the linear guess for that "
        "range, as many iterations as the columns need for 2^-12 relative error (4 for 10)",
        (Knob("iterations", 6, 10, 8, doc="exp's squarings"),),
        domain=lambda k: (-(2.0 ** k["iterations"]) / 4, 2.0 ** k["iterations"] / 4),
    ),
    Spec(
        "gelu",
        "crypten",
        "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) with CrypTen's tanh (CrypTen has no "
        "GELU, and its erf is wrong away from 0: see erf); tanh's argument stays within its domain",
        # tanh(u) is 2 sigmoid(2u) - 1, whose exp(-2|u|) keeps a positive base while
        # 2|u| < 256: up to |x| = 16 (u = 159); beyond it the base goes negative.
        domain=lambda k: (-16.0, 16.0),
        scale="relative1",
    ),
    Spec(
        "gelu",
        "poly",
        "x (0.5 + p(x/b)), p an odd polynomial fitted to Phi(x) - 0.5 on [-b, b], clamped",
        _poly_knobs(7, 5.0),
        domain=_saturating,
        scale="relative1",
    ),
    Spec(
        "gelu",
        "relu",
        "ReLU(x) - h(|x|), h(t) = t Phi(-t) as a Chebyshev series of 2^d terms on [0, b]: "
        "one comparison (the ReLU's), |x| = 2 ReLU(x) - x, and d rounds of products; no exp, no "
        "reciprocal",
        (
            Knob("depth", 2, 4, 3, doc="d: 2^d terms, one product round each doubling"),
            Knob("bound", 2.0, 64.0, 8.0, integer=False, structural=False, doc="b"),
        ),
        domain=lambda k: (-k["bound"], k["bound"]),
        scale="relative1",
    ),
    Spec(
        "silu",
        "crypten",
        "x sigmoid(x) with CrypTen's sigmoid",
        domain=lambda k: (-64.0, 64.0),
        scale="relative1",
    ),
    Spec(
        "silu",
        "poly",
        "x (0.5 + p(x/b)), p an odd polynomial fitted to sigmoid(x) - 0.5 on [-b, b], clamped",
        _poly_knobs(7, 8.0),
        domain=_saturating,
        scale="relative1",
    ),
    Spec(
        "erf",
        "crypten",
        "CrypTen's Taylor series (8 terms); its odd powers come from CrypTen 0.4.1's `pow`, "
        "which computes (x^3)^((p-1)/2) for odd p, so it holds only near 0",
        domain=lambda k: (-0.5, 0.5),
    ),
    Spec(
        "erf",
        "poly",
        "an odd least-squares polynomial of x/b, fitted on [-b, b] at Chebyshev nodes",
        _poly_knobs(9, 3.0),
        domain=_clipped,
    ),
):
    register(_spec)

FUNCTIONS = tuple(SPECS)
"""The non-linear functions the registry covers."""

OP_FUNCTIONS = {
    "aten.sigmoid.default": "sigmoid",
    "aten.tanh.default": "tanh",
    "aten.gelu.default": "gelu",
    "aten._softmax.default": "softmax",
    "aten._safe_softmax.default": "softmax",
    "aten.rsqrt.default": "rsqrt",
    "aten.native_layer_norm.default": "rsqrt",
}
"""The core ATen ops of a graph (`mpcml.graph.aten`) computed by one of the registry's
functions (a layer norm's is inside it: the inverse square root of its
variance)."""


OP_NAMES = {
    "aten.sigmoid.default": "Sigmoid",
    "aten.tanh.default": "Tanh",
    "aten.gelu.default": "GELU",
    "aten._softmax.default": "Softmax",
    "aten._safe_softmax.default": "Softmax",
    "aten.native_layer_norm.default": "LayerNorm",
}
"""The op a plan's `ops.NAME` entry names for a core ATen op: `ops.Softmax` also covers a
captured model's softmax."""


def spec(function: str, name: str) -> Spec:
    """The implementation `name` of `function`, or PlanError naming the choices."""
    table = SPECS.get(function)
    if table is None:
        raise PlanError(f"no approximations for {function!r} (functions: {', '.join(SPECS)})")
    found = table.get(name)
    if found is None:
        raise PlanError(
            f"{function} has no implementation {name!r} (implementations: {', '.join(table)})"
        )
    return found


def knobs(function: str, name: str, given: Mapping[str, float]) -> dict[str, float]:
    """`given` with the defaults filled in, each checked against its range, or PlanError."""
    found = spec(function, name)
    for key in given:
        found.knob(key)
    out: dict[str, float] = {}
    for knob in found.knobs:
        value = float(given.get(knob.name, knob.default))
        if not math.isfinite(value) or not knob.low <= value <= knob.high:
            raise PlanError(
                f"{function} {name!r}: knob {knob.name} = {value:g} is outside "
                f"[{knob.low:g}, {knob.high:g}]"
            )
        if knob.integer and value != int(value):
            raise PlanError(f"{function} {name!r}: knob {knob.name} must be a whole number")
        if knob.name == "shift" and function == "rsqrt" and int(value) % 2:
            raise PlanError(f"rsqrt {name!r}: knob shift must be even, got {value:g}")
        if knob.name == "degree" and int(value) % 2 == 0:
            raise PlanError(f"{function} {name!r}: knob degree must be odd, got {value:g}")
        out[knob.name] = value
    return out


def domain(function: str, name: str, settings: Mapping[str, float]) -> tuple[float, float]:
    """Where the implementation with these (filled-in) knobs is accurate and cannot overflow."""
    return spec(function, name).domain(settings)


def cost_key(function: str, name: str, settings: Mapping[str, float]) -> str:
    """The cost table's key: the function, the implementation and its structural knobs."""
    found = spec(function, name)
    parts = [f"{k.name}={int(settings[k.name])}" for k in found.knobs if k.structural]
    return f"{function}/{name}" + (f"/{','.join(parts)}" if parts else "")
