"""What every graph module shares: settings, the graph error, CrypTen's nn, parameter keys.

Torch-free: the coordinator checks graphs without torch.
"""

from __future__ import annotations

from typing import Any

from mpcml.errors import MpcmlError

Attrs = dict[str, Any]
"""An op's settings: ints, floats, bools, strings and tuples of ints or of floats."""


class GraphError(MpcmlError, ValueError):
    """A model or a graph uses something outside the op table, or is malformed."""


def crypten_nn() -> Any:
    """crypten.nn, imported (with mpcml's shims) only when a graph is built."""
    from mpcml.runtime import compat

    compat.apply()
    import crypten.nn

    return crypten.nn


def parameter_key(module: str, name: str) -> str:
    """The state_dict key of parameter `name` of the module at path `module` ("" at the root)."""
    return f"{module}.{name}" if module else name
