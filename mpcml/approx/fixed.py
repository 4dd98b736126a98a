"""Plaintext fixed-point emulation of CrypTen's arithmetic, for the tuner and the error bounds.

`Fixed` holds plaintext values on CrypTen's grid (16 fractional bits) and offers the methods
CrypTen's tensors offer to its approximations: every product is rounded to the grid as
CrypTen's truncation does, comparisons are exact, and CrypTen's own approximation functions run
on it unchanged, so the `crypten` implementations are emulated by CrypTen's own code. A product
whose magnitude reaches `PRODUCT_LIMIT` would wrap CrypTen's 64-bit ring: it is recorded in
`overflowed`. With `bits=None` the arithmetic is exact float64 (what an implementation computes
before any rounding).

What it does not emulate: the probabilistic truncation of more than two parties, which can be
off by one unit in the last place (and, rarely, by much more) in real MPC.
"""

from __future__ import annotations

from typing import Any

import crypten.common.functions.approximations as cf
import torch

from mpcml.approx.registry import PRODUCT_LIMIT

BITS = 16
"""CrypTen's default precision: `crypten.cfg.encoder.precision_bits`."""


class Fixed:
    """A plaintext tensor with CrypTen's fixed-point arithmetic."""

    def __init__(
        self,
        value: Any,
        bits: int | None = BITS,
        flags: dict[str, bool] | None = None,
        noise: torch.Generator | None = None,
    ) -> None:
        self.bits = bits
        self.flags = flags if flags is not None else {"overflowed": False}
        self.noise = noise
        """With a generator, every truncation is also off by -1, 0 or +1 unit in the last
        place at random, as the parties' probabilistic truncation is."""
        self.v = self._round(torch.as_tensor(value, dtype=torch.float64), truncated=False)

    # --- the grid ---------------------------------------------------------------------------

    def _round(self, v: torch.Tensor, truncated: bool = True) -> torch.Tensor:
        if self.bits is None:
            return v
        scale = float(2**self.bits)
        units = torch.round(v * scale)
        if truncated and self.noise is not None:
            units = units + torch.randint(-1, 2, units.shape, generator=self.noise)
        return units / scale

    def _new(self, v: torch.Tensor) -> Fixed:
        out = Fixed.__new__(Fixed)
        out.bits, out.flags, out.noise, out.v = self.bits, self.flags, self.noise, v
        return out

    def _product(self, a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
        product = a * b
        if bool((product.abs() >= PRODUCT_LIMIT).any()):
            self.flags["overflowed"] = True
        return self._round(product)

    def _public(self, other: Any) -> torch.Tensor | float:
        if isinstance(other, Fixed):
            return other.v
        if isinstance(other, int | bool):
            return float(other)
        return self._round(torch.as_tensor(other, dtype=torch.float64), truncated=False)

    @property
    def overflowed(self) -> bool:
        """Whether any product so far would have wrapped CrypTen's ring."""
        return self.flags["overflowed"]

    @property
    def data(self) -> torch.Tensor:
        """The values (CrypTen's `.data` is the share; here it is the value itself)."""
        return self.v

    @property
    def device(self) -> torch.device:
        """Where the values are."""
        return self.v.device

    def new(self, value: Any) -> Fixed:
        """A tensor of `value` (CrypTen's `new` encrypts a public one)."""
        return self._new(self._round(torch.as_tensor(value, dtype=torch.float64), False))

    def get_plain_text(self) -> torch.Tensor:
        """The values, as CrypTen's decryption gives them."""
        return self.v.clone()

    # --- arithmetic -------------------------------------------------------------------------

    def add(self, other: Any) -> Fixed:
        """Exact on the grid."""
        return self._new(self.v + self._public(other))

    def sub(self, other: Any) -> Fixed:
        """Exact on the grid."""
        return self._new(self.v - self._public(other))

    def mul(self, other: Any) -> Fixed:
        """A product, rounded to the grid; by a public integer, exact."""
        if isinstance(other, int | bool) and not isinstance(other, float):
            return self._new(self.v * float(other))
        return self._new(self._product(self.v, self._public(other)))

    def div(self, other: Any) -> Fixed:
        """By a public value (rounded), or by a tensor through its reciprocal."""
        if isinstance(other, Fixed):
            return self.mul(other.reciprocal())
        if isinstance(other, int) and not isinstance(other, bool):
            return self._new(self._round(self.v / other))  # CrypTen truncates by the integer
        return self.mul(1.0 / float(other) if not torch.is_tensor(other) else 1.0 / other)

    def neg(self) -> Fixed:
        """Exact."""
        return self._new(-self.v)

    def square(self) -> Fixed:
        """Its own product."""
        return self.mul(self)

    def pow(self, p: int) -> Fixed:
        """A whole power, by CrypTen 0.4.1's own recursion.

        That recursion is wrong for odd p > 3: it computes (x^3)^((p-1)/2), so x^5 is x^6.
        CrypTen's erf (and everything built on it) inherits the error; so does this
        emulation, which must compute what the parties compute.
        """
        if p == 1:
            return self.clone()
        if p == 2:
            return self.square()
        if p % 2 == 0:
            return self.square().pow(p // 2)
        return self.square().mul(self).pow((p - 1) // 2)

    def pos_pow(self, p: int) -> Fixed:
        """As CrypTen's: a whole power through `pow`."""
        return self.pow(p)

    def polynomial(self, coeffs: Any) -> Fixed:
        """sum_k c_k x^k for k = 1..len(coeffs) (no constant), powers by CrypTen's tree."""
        coefficients = [float(c) for c in torch.as_tensor(coeffs).reshape(-1)]
        terms = [self, self.square()]
        while len(terms) < len(coefficients):
            highest = terms[-1]
            terms += [t.mul(highest) for t in terms]
        total = terms[0].mul(coefficients[0])
        for term, c in zip(terms[1 : len(coefficients)], coefficients[1:], strict=True):
            total = total.add(term.mul(c))
        return total

    __add__ = add
    __radd__ = add
    __sub__ = sub
    __mul__ = mul
    __rmul__ = mul
    __truediv__ = div
    __neg__ = neg

    def __rsub__(self, other: Any) -> Fixed:
        return self.neg().add(other)

    def add_(self, other: Any) -> Fixed:
        """In place (CrypTen's approximations use the return value)."""
        self.v = self.add(other).v
        return self

    def sub_(self, other: Any) -> Fixed:
        """In place."""
        self.v = self.sub(other).v
        return self

    def mul_(self, other: Any) -> Fixed:
        """In place."""
        self.v = self.mul(other).v
        return self

    def div_(self, other: Any) -> Fixed:
        """In place."""
        self.v = self.div(other).v
        return self

    # --- comparisons: exact 0/1 -------------------------------------------------------------

    def _ltz(self) -> Fixed:
        return self._new((self.v < 0).to(torch.float64))

    def sign(self) -> Fixed:
        """-1 or 1 (1 at zero, as CrypTen's)."""
        return self._new(1 - 2 * (self.v < 0).to(torch.float64))

    def where(self, condition: Any, other: Any) -> Fixed:
        """`self` where `condition` (0/1) is 1, else `other`, by products as CrypTen's."""
        c = condition if isinstance(condition, Fixed) else self.new(condition)
        return self.mul(c).add(c.neg().add(1).mul(other))

    def relu(self) -> Fixed:
        """max(x, 0)."""
        return self._new(self.v.clamp(min=0))

    def abs(self) -> Fixed:
        """|x|."""
        return self._new(self.v.abs())

    def hardtanh(self, min_value: float = -1.0, max_value: float = 1.0) -> Fixed:
        """X clamped to [min, max] (exact, as CrypTen's from two ReLUs)."""
        return self._new(self.v.clamp(float(min_value), float(max_value)))

    # --- shape --------------------------------------------------------------------------------

    def size(self, dim: int | None = None) -> Any:
        """As a tensor's."""
        return self.v.size() if dim is None else self.v.size(dim)

    def dim(self) -> int:
        """As a tensor's."""
        return self.v.dim()

    def nelement(self) -> int:
        """As a tensor's."""
        return self.v.nelement()

    def narrow(self, dim: int, start: int, length: int) -> Fixed:
        """As a tensor's."""
        return self._new(self.v.narrow(dim, start, length))

    def flatten(self) -> Fixed:
        """As a tensor's."""
        return self._new(self.v.flatten())

    def reshape(self, *shape: Any) -> Fixed:
        """As a tensor's."""
        return self._new(self.v.reshape(*shape))

    def expand(self, *sizes: Any) -> Fixed:
        """As a tensor's."""
        return self._new(self.v.expand(*sizes))

    @staticmethod
    def cat(parts: list[Fixed], dim: int = 0) -> Fixed:
        """As `torch.cat`."""
        return parts[0]._new(torch.cat([p.v for p in parts], dim))

    def clone(self) -> Fixed:
        """A copy."""
        return self._new(self.v.clone())

    def sum(self, dim: int | None = None, keepdim: bool = False) -> Fixed:
        """Exact."""
        if dim is None:
            return self._new(self.v.sum())
        return self._new(self.v.sum(dim, keepdim=keepdim))

    def max(self, dim: int | None = None, keepdim: bool = False) -> Any:
        """The largest values (exact: comparisons), and CrypTen's one-hot position."""
        if dim is None:
            return self._new(self.v.max())
        values, index = self.v.max(dim, keepdim=keepdim)
        return self._new(values), index

    # --- CrypTen's own approximations, run on this emulation ---------------------------------

    def exp(self) -> Fixed:
        """CrypTen's exp."""
        return cf.exp(self)  # type: ignore[no-any-return]

    def log(self, input_in_01: bool = False) -> Fixed:
        """CrypTen's log."""
        return cf.log(self, input_in_01)  # type: ignore[no-any-return]

    def reciprocal(self, input_in_01: bool = False) -> Fixed:
        """CrypTen's reciprocal."""
        return cf.reciprocal(self, input_in_01)  # type: ignore[no-any-return]

    def inv_sqrt(self) -> Fixed:
        """CrypTen's inverse square root."""
        return cf.inv_sqrt(self)  # type: ignore[no-any-return]

    def sqrt(self) -> Fixed:
        """CrypTen's square root."""
        return cf.sqrt(self)  # type: ignore[no-any-return]

    def sigmoid(self) -> Fixed:
        """CrypTen's sigmoid."""
        return cf.sigmoid(self)  # type: ignore[no-any-return]

    def tanh(self) -> Fixed:
        """CrypTen's tanh."""
        return cf.tanh(self)  # type: ignore[no-any-return]

    def erf(self) -> Fixed:
        """CrypTen's erf."""
        return cf.erf(self)  # type: ignore[no-any-return]

    def softmax(self, dim: int) -> Fixed:
        """CrypTen's softmax."""
        return cf.softmax(self, dim)  # type: ignore[no-any-return]

    def log_softmax(self, dim: int) -> Fixed:
        """CrypTen's log-softmax."""
        return cf.log_softmax(self, dim)  # type: ignore[no-any-return]
