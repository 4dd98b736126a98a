"""Build the CrypTen computation of an `mpcml.v1.Graph`, and load its owner's weights."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mpcml.graph.ops import SPECS, Attrs, GraphError, crypten_nn
from mpcml.graph.trace import GRAPH_VERSION
from mpcml.proto.v1 import graph_pb2 as pb


def decode_attrs(node: pb.Node) -> Attrs:
    """A node's settings as Python values."""
    out: Attrs = {}
    for key, attr in node.attrs.items():
        kind = attr.WhichOneof("kind")
        if kind is None:
            raise GraphError(f"node {node.name!r}: setting {key!r} has no value")
        value = getattr(attr, kind)
        out[key] = tuple(value.values) if kind == "ints" else value
    return out


def _check_settings(node: pb.Node, expected: tuple[str, ...]) -> None:
    """Refuse a setting the op does not take: a silently ignored one could change the meaning."""
    given = set(node.attrs)
    problem = ""
    if given - set(expected):
        problem = f"has no setting {sorted(given - set(expected))[0]!r}"
    elif set(expected) - given:
        problem = f"needs the setting {sorted(set(expected) - given)[0]!r}"
    if problem:
        raise GraphError(
            f"node {node.name!r}: {node.op} {problem} (its settings: "
            f"{', '.join(expected) or 'none'})"
        )


def validate(graph: pb.Graph) -> None:
    """Refuse a graph this builder cannot run, naming what is wrong."""
    if graph.version != GRAPH_VERSION:
        raise GraphError(
            f"graph version {graph.version} is not supported (this build "
            f"reads version {GRAPH_VERSION})"
        )
    known = set(graph.inputs)
    if not known:
        raise GraphError("the graph has no inputs")
    for node in graph.nodes:
        if node.name in known:
            raise GraphError(f"node name {node.name!r} is used twice")
        spec = SPECS.get(node.op)
        if spec is None:
            raise GraphError(
                f"node {node.name!r}: op {node.op!r} is not supported; "
                f"supported: {', '.join(sorted(SPECS))}"
            )
        if len(node.inputs) != spec.arity:
            raise GraphError(
                f"node {node.name!r}: {node.op} takes {spec.arity} input(s), got {len(node.inputs)}"
            )
        for name in node.inputs:
            if name not in known:
                raise GraphError(
                    f"node {node.name!r} reads {name!r}, which no earlier node or input defines"
                )
        _check_settings(node, spec.settings)
        allowed = set(spec.parameters) | set(spec.buffers)
        for p in node.parameters:
            if p.name not in allowed or any(d < 0 for d in p.shape):
                raise GraphError(
                    f"node {node.name!r}: unexpected parameter {p.name!r} {list(p.shape)}"
                )
        known.add(node.name)
    if graph.output not in known:
        raise GraphError(f"the graph's output {graph.output!r} is not defined")


def build(graph: pb.Graph) -> Any:
    """A crypten.nn module computing `graph` (with placeholder weights until loaded)."""
    validate(graph)
    module = crypten_nn().Graph(list(graph.inputs), [graph.output])
    for node in graph.nodes:
        try:
            op_module = SPECS[node.op].build(decode_attrs(node))
        except KeyError as exc:
            raise GraphError(f"node {node.name!r}: {node.op} needs the setting {exc}") from None
        module.add_module(node.name, op_module, list(node.inputs))
    return module


def load_weights(module: Any, graph: pb.Graph, state: Mapping[str, torch.Tensor]) -> None:
    """Put the owner's weights (a torch state_dict) into a built, not yet encrypted, module."""
    for node in graph.nodes:
        target = module._modules[node.name]
        for p in node.parameters:
            key = f"{node.module}.{p.name}"
            value = state.get(key)
            if value is None:
                raise GraphError(f"the weights have no {key!r} for node {node.name!r}")
            if list(value.shape) != list(p.shape):
                raise GraphError(
                    f"weight {key!r} has shape {list(value.shape)}, the graph says {list(p.shape)}"
                )
            tensor = value.detach().clone().float()
            if p.buffer:
                target.set_buffer(p.name, tensor)
            else:
                tensor.requires_grad = True
                target.set_parameter(p.name, tensor)
