"""A graph evaluated in plaintext torch: what the parties compute, without the secret sharing.

The tuner runs a lowered transformer here (the model's own trace holds Hugging Face's mask
and shape code, which the graph has folded away), with a hook that replaces each non-linear
function by its fixed-point emulation. Tests compare it with the model it was lowered from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from mpcml.approx.registry import OP_FUNCTIONS
from mpcml.graph.ops import GraphError, decode_attrs, validate
from mpcml.graph.sequence_ops import parse_index
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
    values: dict[str, torch.Tensor] = {graph.inputs[0]: x.float()}
    public: set[str] = set()

    def function(node: pb.Node, name: str, value: torch.Tensor, dim: int = -1) -> torch.Tensor:
        found = hook(node, name, value, dim)
        if found is not None:
            return found
        if name == "gelu":
            approximate = str(decode_attrs(node).get("approximate", "none"))
            return F.gelu(value, approximate=approximate)
        return _EXACT[name](value, dim)

    if graph.op_table:
        from mpcml.graph import aten_eval

        return aten_eval.run(graph, x.float(), state, function)
    for node in graph.nodes:
        a = decode_attrs(node)
        ins = [values[i] for i in node.inputs]
        weight = state.get(f"{node.module}.weight") if node.module else None
        bias = state.get(f"{node.module}.bias") if node.module else None
        op = node.op
        if op == "Tokens":
            vocab = int(a["vocab"])
            out = ins[0][..., :vocab] if a["part"] == "ids" else ins[0][..., vocab]
        elif op == "Constant":
            out = torch.tensor(a["values"], dtype=torch.float32).reshape(tuple(a["shape"]))
            public.add(node.name)
        elif op == "Embedding":
            assert weight is not None
            public_ids = node.inputs[0] in public
            out = weight.float()[ins[0].long()] if public_ids else ins[0] @ weight.float()
        elif op == "Linear":
            assert weight is not None
            out = F.linear(ins[0], weight.float(), None if bias is None else bias.float())
        elif op == "Conv1D":
            assert weight is not None and bias is not None
            out = ins[0] @ weight.float() + bias.float()
        elif op == "LayerNorm":  # before OP_FUNCTIONS: its function is inside it
            assert weight is not None and bias is not None
            centred = ins[0] - ins[0].mean(-1, keepdim=True)
            variance = centred.square().mean(-1, keepdim=True) + float(a["eps"])
            out = centred * function(node, "rsqrt", variance) * weight.float() + bias.float()
        elif op in OP_FUNCTIONS:
            out = function(node, OP_FUNCTIONS[op], ins[0], int(a.get("dim", -1)))
        elif op == "ReLU":
            out = torch.relu(ins[0])
        elif op in ("Dropout",):
            out = ins[0]
        elif op == "Flatten":
            out = ins[0].flatten(1)
        elif op == "Affine":
            out = ins[0] * float(a["scale"]) + float(a["shift"])
        elif op == "Add":
            out = ins[0] + ins[1]
        elif op == "Sub":
            out = ins[0] - ins[1]
        elif op == "Mul":
            out = ins[0] * ins[1]
        elif op == "MatMul":
            out = ins[0] @ ins[1]
        elif op == "Where":
            out = ins[1] * ins[0] + float(a["value"]) * (1 - ins[0])
        elif op == "Pow":
            out = ins[0] ** int(a["exponent"])
        elif op == "Reshape":
            out = ins[0].reshape(ins[0].size(0), *a["shape"])
        elif op == "Permute":
            out = ins[0].permute(*a["dims"])
        elif op == "Index":
            out = ins[0][parse_index(a["index"])]
        elif op == "Narrow":
            out = ins[0].narrow(a["dim"], a["start"], a["length"])
        elif op == "Cat":
            out = torch.cat(ins, dim=int(a["dim"]))
        elif op == "Mean":
            out = ins[0].mean(dim=tuple(a["dims"]), keepdim=bool(a["keepdim"]))
        else:
            raise GraphError(f"node {node.name!r}: {op} is not in the plaintext evaluator")
        values[node.name] = out
    return values[graph.output]
