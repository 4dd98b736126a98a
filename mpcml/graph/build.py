"""Build the CrypTen computation of an `mpcml.v1.Graph`, and load its owner's weights."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import torch

from mpcml.approx.plan import Choice
from mpcml.graph.aten import PARAMETER
from mpcml.graph.ops import CONSTANT, GraphError, crypten_nn, decode_attrs, validate
from mpcml.graph.opspec import parameter_key
from mpcml.proto.v1 import graph_pb2 as pb
from mpcml.runtime import profile

_UNMEASURED = frozenset({PARAMETER, CONSTANT})
"""Nodes that only hand out a tensor: not in the job's cost profile."""


def ordered_graph(graph: pb.Graph, output: str) -> Any:
    """A crypten.nn.Graph that runs its nodes in the order they were added.

    CrypTen's own Graph looks for a ready node by scanning them all at every step, quadratic in
    the nodes: seconds per batch for a captured zoo model of a thousand nodes. Its inputs are
    `graph`'s; each node's forward pass is measured in the job's cost profile
    (`mpcml.runtime.profile`) under its name and op in `graph`.
    """
    ops = {node.name: node.op for node in graph.nodes}

    class _Ordered(crypten_nn().Graph):  # type: ignore[misc]
        def forward(self, *args: Any) -> Any:
            values: dict[str, Any] = dict(zip(self.input_names, args, strict=True))
            batch = int(args[0].size(0))
            for name, sources in self._graph.items():
                module = self._modules[name]
                given = [values[s] if s else None for s in sources]
                op = ops.get(name, "")
                with nullcontext() if op in _UNMEASURED else profile.measure(name, op):
                    if getattr(module, "aten", False):
                        module.batch = batch
                        values[name] = module(given)
                    else:
                        values[name] = module(given[0] if len(given) == 1 else given)
            return values[self.output_names[0]]

    return _Ordered(list(graph.inputs), [output])


def _captured(node: pb.Node, attrs: dict[str, Any], choice: Choice | None) -> Any:
    """The module of one node."""
    from mpcml.graph import aten_lower

    if node.op == PARAMETER:
        p = node.parameters[0]
        return aten_lower.parameter(p.name, list(p.shape), p.buffer)
    if node.op == CONSTANT:
        shape = tuple(int(d) for d in attrs["shape"])
        value = torch.tensor(attrs["values"], dtype=torch.float32).reshape(shape)
        return aten_lower.constant(value)
    return aten_lower.module(node.op, attrs, choice)


def build(graph: pb.Graph, choices: Mapping[str, Choice] | None = None) -> Any:
    """A crypten.nn module computing `graph` (with placeholder weights until loaded).

    A non-linear node runs the implementation `choices` names for it (`mpcml.approx.plan`);
    CrypTen's own where there is none.
    """
    validate(graph)
    module = ordered_graph(graph, graph.output)
    for node in graph.nodes:
        attrs = decode_attrs(node)
        choice = (choices or {}).get(node.name)
        module.add_module(node.name, _captured(node, attrs, choice), list(node.inputs))
    return module


def head(graph: pb.Graph, net: Any) -> Any | None:
    """The module computing the input of `graph`'s last node (its logits).

    It shares `net`'s layers and parameters; None when that input is the graph's own input.
    """
    last = graph.nodes[-1]
    if graph.output != last.name or last.inputs[0] in graph.inputs:
        return None
    module = ordered_graph(graph, last.inputs[0])
    for node in graph.nodes[:-1]:
        module.add_module(node.name, net._modules[node.name], list(node.inputs))
    module.encrypt(mode=net.encrypted)  # its layers are `net`'s, encrypted (or not) already
    return module.train(net.training)


def load_weights(module: Any, graph: pb.Graph, state: Mapping[str, torch.Tensor]) -> None:
    """Put the owner's weights (a torch state_dict) into a built, not yet encrypted, module."""
    for node in graph.nodes:
        target = module._modules[node.name]
        for p in node.parameters:
            key = parameter_key(node.module, p.name)
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
