"""Trace a torch.nn.Module into an `mpcml.v1.Graph` with torch.fx."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from mpcml.graph.ops import SPECS, Attrs, GraphError, from_call, from_module
from mpcml.proto.v1 import graph_pb2 as pb

GRAPH_VERSION = 1


def encode_attr(value: Any) -> pb.Attr:
    """One setting as an `Attr`."""
    if isinstance(value, bool):
        return pb.Attr(b=value)
    if isinstance(value, int):
        return pb.Attr(i=value)
    if isinstance(value, float):
        return pb.Attr(f=value)
    if isinstance(value, str):
        return pb.Attr(s=value)
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return pb.Attr(ints=pb.IntList(values=list(value)))
    raise GraphError(f"setting {value!r} cannot be put in a graph")


def _tensor_inputs(node: torch.fx.Node) -> tuple[list[str], tuple[Any, ...]]:
    # Leading fx-node arguments are the op's tensor inputs; the rest are its settings.
    names: list[str] = []
    rest = list(node.args)
    while rest and isinstance(rest[0], torch.fx.Node):
        first = rest.pop(0)
        assert isinstance(first, torch.fx.Node)
        names.append(first.name)
    if any(isinstance(a, torch.fx.Node) for a in rest) or any(
        isinstance(v, torch.fx.Node) for v in node.kwargs.values()
    ):
        raise GraphError(f"node {node.name!r}: tensor arguments after settings are not supported")
    return names, tuple(rest)


def _parameters(spec_name: str, module: torch.nn.Module) -> list[pb.ParameterSpec]:
    spec = SPECS[spec_name]
    out = []
    for name, buffer in [(p, False) for p in spec.parameters] + [(b, True) for b in spec.buffers]:
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor):
            out.append(pb.ParameterSpec(name=name, shape=list(value.shape), buffer=buffer))
    return out


def trace(model: torch.nn.Module) -> pb.Graph:
    """The graph of `model`; raises GraphError naming the first op outside the whitelist."""
    try:
        traced = torch.fx.symbolic_trace(model)
    except Exception as exc:  # fx raises many types on dynamic control flow
        raise GraphError(f"the model cannot be traced with torch.fx: {exc}") from exc
    graph = pb.Graph(version=GRAPH_VERSION)
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            graph.inputs.append(node.name)
            continue
        if node.op == "output":
            if not isinstance(node.args[0], torch.fx.Node):
                raise GraphError("the model must return a single tensor")
            graph.output = node.args[0].name
            continue
        if node.op == "get_attr":
            raise GraphError(
                f"node {node.name!r} reads the tensor {node.target!r} directly; "
                "only parameters of whitelisted modules are supported"
            )
        inputs, rest = _tensor_inputs(node)
        module_path = ""
        parameters: list[pb.ParameterSpec] = []
        if node.op == "call_module":
            module = traced.get_submodule(str(node.target))
            op, attrs = from_module(module)
            module_path = str(node.target)
            parameters = _parameters(op, module)
        else:
            op, attrs = from_call(node.op, node.target, rest, dict(node.kwargs))
        if len(inputs) != SPECS[op].arity:
            raise GraphError(
                f"node {node.name!r}: {op} takes {SPECS[op].arity} tensor "
                f"input(s), got {len(inputs)}"
            )
        graph.nodes.append(_node(node.name, op, inputs, attrs, module_path, parameters))
    return graph


def _node(
    name: str,
    op: str,
    inputs: list[str],
    attrs: Attrs,
    module: str,
    parameters: list[pb.ParameterSpec],
) -> pb.Node:
    node = pb.Node(name=name, op=op, inputs=inputs, module=module, parameters=parameters)
    for key, value in attrs.items():
        node.attrs[key].CopyFrom(encode_attr(value))
    return node
