"""A captured graph run in plain torch.

It is the reference the parties' result is compared with, the tuner's emulation, and each
party's shape check on meta tensors (torch's own shape rules, so a party checks the graph it
received, not the shapes the client recorded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from mpcml.graph.aten import ABSENT, OPS, PARAMETER, PUBLIC_ARGS, bind
from mpcml.graph.ops import CONSTANT, GraphError, decode_attrs
from mpcml.graph.opspec import parameter_key
from mpcml.proto.v1 import graph_pb2 as pb

Function = Callable[[pb.Node, str, torch.Tensor, int], torch.Tensor]
"""(node, registry function, input, dim) -> its value: the exact one or an emulation."""

_RESHAPES = ("aten.view.default",)
"""Run as reshape: the capture drops memory formats, so a view's input may not be contiguous."""


def target(name: str) -> Any:
    """The torch op `aten.<op>.<overload>`."""
    _, op, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, op), overload)


def key(node: pb.Node) -> str:
    """The state_dict key of a Parameter node."""
    leaf = node.parameters[0].name
    return parameter_key(node.module, leaf)


def run(
    graph: pb.Graph,
    x: torch.Tensor,
    state: Mapping[str, torch.Tensor],
    function: Function | None = None,
    observe: Callable[[pb.Node, Any], None] | None = None,
) -> torch.Tensor:
    """`graph` on the batch `x` with the weights `state`; meta tensors give shapes only.

    `observe` sees every node with its value (the job's estimate counts their elements).
    """
    values: dict[str, Any] = {graph.inputs[0]: x}
    batch = int(x.size(0))
    for node in graph.nodes:
        attrs = decode_attrs(node)
        if node.op == PARAMETER:
            value = state.get(key(node))
            if value is None:
                raise GraphError(f"the weights have no {key(node)!r} for node {node.name!r}")
            values[node.name] = value.to(x.device, torch.float32)
            continue
        if node.op == CONSTANT:
            shape = tuple(int(d) for d in attrs["shape"])
            values[node.name] = (
                torch.tensor(attrs["values"], dtype=torch.float32).reshape(shape).to(x.device)
            )
            continue
        op = OPS[node.op]
        inputs = [values[i] if i else ABSENT for i in node.inputs]
        a = bind(op, attrs, inputs, batch)
        for arg, kind in PUBLIC_ARGS.items():
            if arg in a and a[arg] is not None:
                a[arg] = _as(a[arg], kind)
        out = _function(node, a, function) if function is not None else None
        if out is None and node.op in _RESHAPES:
            out = a["self"].reshape(a["size"])
        elif out is None:
            out = target(node.op)(**a)
        values[node.name] = out[0] if isinstance(out, tuple | list) else out
        if observe is not None:
            observe(node, values[node.name])
    return values[graph.output]  # type: ignore[no-any-return]


def _as(value: Any, kind: str) -> Any:
    if isinstance(value, list):
        return [None if v is None else _as(v, kind) for v in value]
    if not torch.is_tensor(value):
        return value
    return value.long() if kind == "long" else value.bool()


def _function(node: pb.Node, a: dict[str, Any], function: Function) -> Any:
    """The op computed through `function` where it holds a registry function, else None."""
    op = OPS[node.op]
    if not op.function:
        return None
    if node.op == "aten.native_layer_norm.default":
        x, dims = a["input"], len(a["normalized_shape"])
        axes = tuple(range(-dims, 0))
        centred = x - x.mean(axes, keepdim=True)
        variance = centred.square().mean(axes, keepdim=True) + a["eps"]
        out = centred * function(node, "rsqrt", variance, -1)
        if a["weight"] is not None:
            out = out * a["weight"]
        return out if a["bias"] is None else out + a["bias"]
    return function(node, op.function, a["self"], int(a.get("dim") or -1))


def output_shape(graph: pb.Graph, row_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output row shape of `graph` on rows of `row_shape`, by torch's meta kernels."""
    shapes = {}
    for batch in (3, 5):  # two batch sizes: an op that mixes rows of a batch shows
        x = torch.empty((batch, *row_shape), device="meta")
        state = {
            key(n): torch.empty(tuple(n.parameters[0].shape), device="meta")
            for n in graph.nodes
            if n.op == PARAMETER
        }
        try:
            out = run(graph, x, state)
        except GraphError:
            raise
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GraphError(
                f"the graph does not fit rows of shape {list(row_shape)}: {first}"
            ) from None
        if out.dim() == 0 or out.size(0) != batch:
            raise GraphError("the graph's output does not keep the batch dimension")
        shapes[batch] = tuple(int(d) for d in out.shape[1:])
    if shapes[3] != shapes[5]:
        raise GraphError("the graph's output shape depends on the batch size")
    return shapes[3]
