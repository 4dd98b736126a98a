"""What a whitelisted op is: its inputs, parameters, settings and how CrypTen builds it.

Torch-free, as the whitelist is: the coordinator checks graphs without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpcml.errors import MpcmlError

VARIADIC = -1
"""The arity of an op taking any number (at least one) of inputs (Cat)."""

Attrs = dict[str, Any]
"""An op's settings: ints, floats, bools, strings and tuples of ints or of floats."""


class GraphError(MpcmlError, ValueError):
    """A model or a graph uses something outside the whitelist, or is malformed."""


@dataclass(frozen=True)
class OpSpec:
    """One whitelisted op."""

    name: str
    arity: int
    build: Callable[[Attrs], Any]
    """Makes the crypten.nn module that computes the op."""
    parameters: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    """The attributes a node of this op carries, no more and no fewer."""
    interior: Callable[[Attrs, Any], Any] | None = None
    """For an op whose approximated function is inside it (LayerNorm's rsqrt): builds it with
    the plan's choice for that function."""


def crypten_nn() -> Any:
    """crypten.nn, imported (with mpcml's shims) only when a graph is built."""
    from mpcml.runtime import compat

    compat.apply()
    import crypten.nn

    return crypten.nn


def parameter_key(module: str, name: str) -> str:
    """The state_dict key of parameter `name` of the module at path `module` ("" at the root)."""
    return f"{module}.{name}" if module else name
