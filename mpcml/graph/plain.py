"""A graph evaluated in plaintext torch: what the parties compute, without the secret sharing.

The tuner runs a captured graph here (a transformer's own code holds Hugging Face's mask and
shape code, which the graph has folded away), with a hook that replaces each non-linear
function by its fixed-point emulation. Tests compare it with the model it was captured from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from mpcml.graph import aten_eval
from mpcml.graph.ops import decode_attrs, validate
from mpcml.proto.v1 import graph_pb2 as pb

Hook = Callable[[pb.Node, str, torch.Tensor, int], torch.Tensor | None]
"""(node, function, input, dim) -> the function's value, or None for the exact one."""

_EXACT: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "sigmoid": lambda x, d: torch.sigmoid(x),
    "tanh": lambda x, d: torch.tanh(x),
    "softmax": lambda x, d: torch.softmax(x, d),
    "silu": lambda x, d: F.silu(x),
    "rsqrt": lambda x, d: torch.rsqrt(x),
}


def evaluate(
    graph: pb.Graph,
    state: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    hook: Hook = lambda node, function, value, dim: None,
) -> torch.Tensor:
    """`graph` on the batch `x` with the weights `state` (a state_dict)."""
    validate(graph)

    def function(node: pb.Node, name: str, value: torch.Tensor, dim: int = -1) -> torch.Tensor:
        found = hook(node, name, value, dim)
        if found is not None:
            return found
        if name == "gelu":
            approximate = str(decode_attrs(node).get("approximate", "none"))
            return F.gelu(value, approximate=approximate)
        return _EXACT[name](value, dim)

    return aten_eval.run(graph, x.float(), state, function)
