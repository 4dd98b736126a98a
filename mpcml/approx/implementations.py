"""The registry's implementations, written once for CrypTen's tensors and for `Fixed`.

Each is a small function of the input and its knobs that uses only what both offer (products,
sums, public constants, comparisons through `hardtanh`, and CrypTen's own approximations), so
that the tuner's emulation and the parties' MPC compute the same thing. To add one: write it
here, register its `Spec` (knobs, domain) in `registry.py`, and run
`python -m mpcml.approx.costs` to measure its rounds and bytes; `bounds.py` derives its error
bound and `tests/approx/` checks it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import crypten
import torch

from mpcml.approx import registry
from mpcml.approx.fixed import Fixed

Compute = Callable[[Any, Mapping[str, float], int], Any]
"""(input, filled-in knobs, dim for softmax) -> output."""


def _phi(x: torch.Tensor) -> torch.Tensor:
    """The standard normal's distribution function."""
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


REFERENCES: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "exp": lambda x, d: torch.exp(x),
    "log": lambda x, d: torch.log(x),
    "reciprocal": lambda x, d: 1 / x,
    "sqrt": lambda x, d: torch.sqrt(x),
    "rsqrt": lambda x, d: torch.rsqrt(x),
    "sigmoid": lambda x, d: torch.sigmoid(x),
    "tanh": lambda x, d: torch.tanh(x),
    "softmax": lambda x, d: torch.softmax(x, d),
    "gelu": lambda x, d: x * _phi(x),
    "silu": lambda x, d: x * torch.sigmoid(x),
    "erf": lambda x, d: torch.erf(x),
}
"""What each function is, in float64 plaintext."""

_ODD_TARGETS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": lambda x: torch.sigmoid(x) - 0.5,
    "silu": lambda x: torch.sigmoid(x) - 0.5,
    "tanh": torch.tanh,
    "erf": torch.erf,
    "gelu": lambda x: _phi(x) - 0.5,
}
"""The odd function each `poly` implementation fits (sigmoid, gelu and silu around 0.5)."""


@functools.cache
def odd_fit(function: str, degree: int, bound: float) -> tuple[float, ...]:
    """Coefficients c_1, c_3, ..., c_degree of an odd polynomial in u = x / b.

    The least-squares fit of the target on [-b, b], over 256 Chebyshev nodes.
    """
    nodes = torch.cos(torch.pi * (torch.arange(256, dtype=torch.float64) + 0.5) / 256)
    powers = torch.stack([nodes**k for k in range(1, degree + 1, 2)], dim=1)
    target = _ODD_TARGETS[function](nodes * bound)
    solution = torch.linalg.lstsq(powers, target.unsqueeze(1)).solution.squeeze(1)
    return tuple(float(c) for c in solution)


def _odd_poly(u: Any, coefficients: tuple[float, ...]) -> Any:
    """c_1 u + c_3 u^3 + ...: u times a polynomial of u^2 (half the products of u's)."""
    if len(coefficients) == 1:
        return u.mul(coefficients[0])
    inner = u.square().polynomial(list(coefficients[1:])).add(coefficients[0])
    return u.mul(inner)


def _scaled(x: Any, k: Mapping[str, float]) -> Any:
    clipped = x.hardtanh(-k["bound"], k["bound"]) if k["clip"] else x
    return clipped.div(k["bound"])


def _poly(function: str) -> Compute:
    def compute(x: Any, k: Mapping[str, float], dim: int) -> Any:
        fit = odd_fit(function, int(k["degree"]), float(k["bound"]))
        value = _odd_poly(_scaled(x, k), fit)
        if function in ("gelu", "silu"):
            return x.mul(value.add(0.5))
        return value.add(0.5) if function == "sigmoid" else value

    return compute


def _with(overrides: Callable[[Mapping[str, float]], dict[str, Any]], method: str) -> Compute:
    """CrypTen's own method under other settings (fewer iterations, known-positive inputs)."""

    def compute(x: Any, k: Mapping[str, float], dim: int) -> Any:
        with crypten.cfg.temp_override(overrides(k)):
            return getattr(x, method)()

    return compute


_reciprocal_positive = _with(
    lambda k: {
        "functions.reciprocal_all_pos": True,
        "functions.reciprocal_nr_iters": int(k["iterations"]),
    },
    "reciprocal",
)


_rsqrt_newton = _with(lambda k: {"functions.sqrt_nr_iters": int(k["iterations"])}, "inv_sqrt")


def linear_guess(low: float, high: float) -> tuple[float, float]:
    """(c0, c1) of the guess c0 - c1 x for 1/x on [low, high] with the least relative error.

    x (c0 - c1 x) equioscillates at low, high and the vertex (low + high) / 2, so the relative
    error 1 - x y is largest there, (high - low)^2 / (low^2 + 6 low high + high^2), and each
    Newton-Raphson iteration squares it.
    """
    c1 = 2.0 / (low * high + (low + high) ** 2 / 4)
    return c1 * (low + high), c1


SEEDED_TOLERANCE = 2.0**-12


def seeded_iterations(low: float, high: float) -> int:
    """Newton-Raphson iterations from `linear_guess` to SEEDED_TOLERANCE relative error."""
    _, c1 = linear_guess(low, high)
    error = 1 - c1 * low * high  # the guess's relative error at `low`, its largest
    if error <= SEEDED_TOLERANCE:
        return 0
    return math.ceil(math.log2(math.log(SEEDED_TOLERANCE) / math.log(error)))


def rsqrt_guess(low: float, high: float) -> tuple[float, float]:
    """(c0, c1) of the guess c0 - c1 x for 1/sqrt(x) on [low, high], least relative error.

    sqrt(x) (c0 - c1 x) is equal at low and high, and as far above 1 at its peak, c0 / (3 c1),
    as it is below 1 at the ends.
    """
    k = low + math.sqrt(low * high) + high
    c1 = 2.0 / (math.sqrt(low) * (math.sqrt(low * high) + high) + (2 * k / 3) * math.sqrt(k / 3))
    return c1 * k, c1


def _rsqrt_range(x: Any, k: Mapping[str, float], dim: int) -> Any:
    c0, c1 = rsqrt_guess(k["low"], k["high"])
    y = x.mul(-c1).add(c0)
    for _ in range(int(k["iterations"])):  # y (3 - x y^2) / 2 = 1.5 y - 0.5 (x y) y^2
        xy, yy = products([x, y], [y, y])
        y = y.mul(1.5).sub(xy.mul(yy).mul(0.5))
    return y


def _reciprocal_range(x: Any, k: Mapping[str, float], dim: int) -> Any:
    return _over_range(None, x, k)


def _over_range(numerator: Any, x: Any, k: Mapping[str, float]) -> Any:
    """The numerator over x (1 / x without one) for x in [low, high], by Newton-Raphson.

    From the linear guess y, with e = 1 - x y, n iterations give
    y (1 + e)(1 + e^2)(1 + e^4)...(1 + e^(2^(n-1))), which is (1 - e^(2^n)) / x. Each factor's
    power of e and the running product are independent, so they are taken as one product: n + 1
    rounds of products instead of 2n. A numerator (broadcast along x's size-1 dimensions)
    starts the running product, numerator y beside x y: its product comes free.
    """
    c0, c1 = linear_guess(k["low"], k["high"])
    y = x.mul(-c1).add(c0)
    n = int(k["iterations"])
    if n == 0:
        return y if numerator is None else numerator.mul(y)
    if numerator is None:
        z, xy = y, y.mul(x)
    else:
        z, xy = products([numerator, x], [y.expand(numerator.size()), y])
    e = xy.neg().add(1)
    for _ in range(n - 1):
        z, e = products([z, e], [e.add(1).expand(z.size()), e])
    return z.mul(e.add(1).expand(z.size()))


def _sigmoid_range(x: Any, k: Mapping[str, float], dim: int) -> Any:
    negative = x._ltz()  # 0 or 1, on scale 1: products with it need no truncation
    exps = _exp_limit(x.mul(negative.mul(2).sub(1)), k, dim)  # e^-|x|
    p = _over_range(
        None, exps.add(1), {"low": 1.0, "high": 2.0, "iterations": seeded_iterations(1.0, 2.0)}
    )
    return p.add(negative.mul(p.mul(-2).add(1)))  # 1 - p where x < 0


def products(lefts: list[Any], rights: list[Any]) -> list[Any]:
    """The elementwise products of pairs of same-sized tensors, as one product (one round)."""
    flat = _cat([t.flatten() for t in lefts], 0).mul(_cat([t.flatten() for t in rights], 0))
    out, start = [], 0
    for t in lefts:
        out.append(flat.narrow(0, start, t.nelement()).reshape(t.size()))
        start += t.nelement()
    return out


def _exp_limit(x: Any, k: Mapping[str, float], dim: int) -> Any:
    n = int(k["iterations"])
    result = x.div(2**n).add(1)
    for _ in range(n):
        result = result.square()
    return result


def _normalised(numerator: Any, k: Mapping[str, float], dim: int) -> Any:
    """Divide by the sum along `dim`: positive, so its reciprocal is the registry's "positive"."""
    total = numerator.sum(dim, keepdim=True)
    return numerator.mul(
        _reciprocal_positive(total, {"iterations": k["reciprocal_iterations"]}, dim)
    )


def _softmax_bounded(x: Any, k: Mapping[str, float], dim: int) -> Any:
    return _normalised(_exp_limit(x.sub(k["shift"]), k, dim), k, dim)


def _cat(parts: list[Any], dim: int) -> Any:
    return Fixed.cat(parts, dim) if isinstance(parts[0], Fixed) else crypten.cat(parts, dim)


def _max_along(x: Any, dim: int) -> Any:
    """The largest entry along `dim` (kept as size 1), by a tree of max(a, b) = a + relu(b - a)."""
    n = x.size(dim)
    while n > 1:
        half = n // 2
        a, b = x.narrow(dim, 0, half), x.narrow(dim, half, half)
        pairs = a.add(b.sub(a).relu())
        x = _cat([pairs, x.narrow(dim, 2 * half, 1)], dim) if n % 2 else pairs
        n = half + n % 2
    return x


TOURNAMENT_COLUMNS = 16
"""Up to this many columns, `_max_by_tournament` compares every pair at once (120 pairs)."""


def _max_by_tournament(x: Any, dim: int) -> Any:
    """The largest entry along `dim` (kept as size 1), from one comparison of every pair.

    Column k is the winner when it is at least every later column and above every earlier
    one (so exactly one column wins, ties included): the product of its n - 1 pair bits, taken
    for all columns at once in a tree of log2(n - 1) products of bits, then the winner's value
    by one product. 8 + 4 + 1 rounds for 10 columns at 2 parties where the tree of pairwise
    maxima takes 4 levels of 9; it compares n (n - 1) / 2 pairs instead of n - 1. Wider rows
    take the pairwise tree.
    """
    n = x.size(dim)
    if n == 1:
        return x
    if n > TOURNAMENT_COLUMNS:
        return _max_along(x, dim)
    column = [x.narrow(dim, k, 1) for k in range(n)]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    first = _cat([column[i] for i, _ in pairs], dim)
    second = _cat([column[j] for _, j in pairs], dim)
    later_wins = first.sub(second)._ltz()  # 1 where column i < column j
    earlier_wins = later_wins.neg().add(1)
    bit = {}
    for p, (i, j) in enumerate(pairs):
        bit[(i, j)] = earlier_wins.narrow(dim, p, 1)  # i beats j
        bit[(j, i)] = later_wins.narrow(dim, p, 1)  # j beats i
    # planes[m] holds, for every column k, its bit against its m-th other column.
    others = [[o for o in range(n) if o != k] for k in range(n)]
    planes = [_cat([bit[(k, others[k][m])] for k in range(n)], dim) for m in range(n - 1)]
    while len(planes) > 1:
        half = len(planes) // 2
        left = _cat(planes[:half], dim)
        right = _cat(planes[half : 2 * half], dim)
        products = left.mul(right)
        planes = [products.narrow(dim, m * n, n) for m in range(half)] + planes[2 * half :]
    return x.mul(planes[0]).sum(dim, keepdim=True)


def _softmax_treemax(x: Any, k: Mapping[str, float], dim: int) -> Any:
    return _normalised(_exp_limit(x.sub(_max_along(x, dim)), k, dim), k, dim)


def _softmax_rowmax(x: Any, k: Mapping[str, float], dim: int) -> Any:
    numerator = _exp_limit(x.sub(_max_by_tournament(x, dim)), k, dim)
    total = numerator.sum(dim, keepdim=True)
    columns = float(x.size(dim))
    seeded = {"iterations": seeded_iterations(1.0, columns), "low": 1.0, "high": columns}
    return _over_range(numerator, total, seeded)


def _gelu_crypten(x: Any, k: Mapping[str, float], dim: int) -> Any:
    # The tanh form with CrypTen's tanh: CrypTen has no GELU, and its erf is wrong away from 0.
    s = math.sqrt(2 / math.pi)
    inner = x.mul(x.square().mul(0.044715 * s).add(s))
    return x.mul(inner.tanh().add(1)).div(2)


@functools.cache
def chebyshev_fit(function: str, terms: int, bound: float) -> tuple[float, ...]:
    """Coefficients c_0..c_terms of sum c_k T_k(v) closest to `function`'s tail on [0, b].

    v = 2 t / b - 1 maps [0, b] onto [-1, 1]. Chebyshev polynomials stay within [-1, 1] there,
    so in fixed point their coefficients stay small where a power series' would grow by orders
    of magnitude (and its truncation errors with them).
    """
    nodes = torch.cos(torch.pi * (torch.arange(512, dtype=torch.float64) + 0.5) / 512)
    basis = torch.stack([torch.cos(k * torch.arccos(nodes)) for k in range(terms + 1)], dim=1)
    target = _TAILS[function]((nodes + 1) * bound / 2)
    solution = torch.linalg.lstsq(basis, target.unsqueeze(1)).solution.squeeze(1)
    return tuple(float(c) for c in solution)


_TAILS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": lambda t: t * (1 - _phi(t)),
}
"""GELU(x) = ReLU(x) - h(|x|) with h(t) = t Phi(-t): smooth in |x| (GELU's kink is all in the
ReLU) and decaying to 0, so a low-degree series fits it."""


def _chebyshev(v: Any, coefficients: tuple[float, ...]) -> Any:
    """The series sum c_k T_k(v) in one product round per doubling of the degree.

    T_{a+b} = 2 T_a T_b - T_{a-b}: from T_1..T_top, one round of products gives T_top+1..T_2top.
    """
    reached = {1: v}
    top = 1
    while top < len(coefficients) - 1:
        lower = list(range(1, top + 1))
        doubled = products([reached[top]] * top, [reached[b] for b in lower])
        for b, product in zip(lower, doubled, strict=True):
            rest = reached[top - b] if top - b else 1.0
            reached[top + b] = product.mul(2).sub(rest)
        top *= 2
    # The sum in whole units of 2^-16 and one division: a product by a public integer is
    # exact and local, where each product by a fraction would be a truncation (a round of
    # messages among three or more parties).
    total = v.mul(round(coefficients[1] * SERIES_UNITS))
    for k in range(2, len(coefficients)):
        total = total.add(reached[k].mul(round(coefficients[k] * SERIES_UNITS)))
    return total.div(SERIES_UNITS).add(coefficients[0])


SERIES_UNITS = 2**16
"""A series' coefficients are rounded to multiples of 1 / SERIES_UNITS."""


def _gelu_relu(x: Any, k: Mapping[str, float], dim: int) -> Any:
    """ReLU(x) - h(|x|): one comparison (in the ReLU), |x| = 2 ReLU(x) - x, h by Chebyshev."""
    b = float(k["bound"])
    relu = x.relu()
    v = relu.mul(2).sub(x).mul(2 / b).sub(1)  # |x| mapped from [0, b] onto [-1, 1]
    return relu.sub(_chebyshev(v, chebyshev_fit("gelu", 2 ** int(k["depth"]), b)))


IMPLEMENTATIONS: dict[tuple[str, str], Compute] = {
    ("exp", "crypten"): lambda x, k, d: x.exp(),
    ("exp", "limit"): _exp_limit,
    ("log", "crypten"): lambda x, k, d: x.log(),
    ("log", "householder"): _with(
        lambda k: {"functions.log_iterations": int(k["iterations"])}, "log"
    ),
    ("reciprocal", "crypten"): lambda x, k, d: x.reciprocal(),
    ("reciprocal", "positive"): _reciprocal_positive,
    ("reciprocal", "range"): _reciprocal_range,
    ("sqrt", "crypten"): lambda x, k, d: x.sqrt(),
    ("sqrt", "newton"): _with(lambda k: {"functions.sqrt_nr_iters": int(k["iterations"])}, "sqrt"),
    ("rsqrt", "crypten"): lambda x, k, d: x.inv_sqrt(),
    ("rsqrt", "newton"): _rsqrt_newton,
    ("rsqrt", "scaled"): lambda x, k, d: _rsqrt_newton(x.mul(2.0 ** k["shift"]), k, d).mul(
        2.0 ** (k["shift"] / 2)
    ),
    ("rsqrt", "range"): _rsqrt_range,
    ("sigmoid", "crypten"): lambda x, k, d: x.sigmoid(),
    ("sigmoid", "poly"): _poly("sigmoid"),
    ("sigmoid", "seg3"): lambda x, k, d: x.div(8).add(0.5).hardtanh(0, 1),
    ("sigmoid", "range"): _sigmoid_range,
    ("tanh", "crypten"): lambda x, k, d: x.tanh(),
    ("tanh", "poly"): _poly("tanh"),
    ("softmax", "crypten"): lambda x, k, d: x.softmax(d),
    ("softmax", "bounded"): _softmax_bounded,
    ("softmax", "treemax"): _softmax_treemax,
    ("softmax", "rowmax"): _softmax_rowmax,
    ("gelu", "crypten"): _gelu_crypten,
    ("gelu", "poly"): _poly("gelu"),
    ("gelu", "relu"): _gelu_relu,
    ("silu", "crypten"): lambda x, k, d: x.mul(x.sigmoid()),
    ("silu", "poly"): _poly("silu"),
    ("erf", "crypten"): lambda x, k, d: x.erf(),
    ("erf", "poly"): _poly("erf"),
}

assert set(IMPLEMENTATIONS) == {(f, n) for f, t in registry.SPECS.items() for n in t}


def apply(function: str, name: str, x: Any, knobs: Mapping[str, float], dim: int = -1) -> Any:
    """`function` of `x` (a CrypTensor or a `Fixed`) by implementation `name` with `knobs`."""
    settings = registry.knobs(function, name, knobs)
    return IMPLEMENTATIONS[(function, name)](x, settings, dim)
