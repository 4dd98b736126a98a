"""What a graph may hold, and the check of a graph against it.

A graph is a model captured with torch.export (`capture.py`): nodes of the core ATen ops of
`aten.OPS`, `Parameter` nodes (a parameter or buffer of the model, by its state_dict key) and
`Constant` nodes (public values folded at capture). Anything else is refused by name when a
graph arrives (`validate`). Nothing here imports torch: the coordinator checks graphs without it.
"""

from __future__ import annotations

import math
from typing import Any

from mpcml.graph import aten
from mpcml.graph.opspec import Attrs, GraphError, crypten_nn
from mpcml.proto.v1 import graph_pb2 as pb

__all__ = ["CONSTANT", "GRAPH_VERSION", "Attrs", "GraphError", "crypten_nn", "validate"]

GRAPH_VERSION = 1
"""The version of `mpcml.v1.Graph` this build writes and reads."""
CONSTANT = "Constant"
"""The op of a node holding a public value the capture folded (settings `shape`, `values`)."""

SIGMOIDS = ("aten.sigmoid.default",)
"""The ops of a final sigmoid, which a BCE loss fuses with."""
SOFTMAXES = ("aten._softmax.default", "aten._safe_softmax.default")
"""The ops of a final softmax, which a cross-entropy loss fuses with."""


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
    if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        return pb.Attr(floats=pb.FloatList(values=list(value)))
    raise GraphError(f"setting {value!r} cannot be put in a graph")


def decode_attrs(node: pb.Node) -> Attrs:
    """A node's settings as Python values."""
    out: Attrs = {}
    for key, attr in node.attrs.items():
        kind = attr.WhichOneof("kind")
        if kind is None:
            raise GraphError(f"node {node.name!r}: setting {key!r} has no value")
        value = getattr(attr, kind)
        out[key] = tuple(value.values) if kind in ("ints", "floats") else value
    return out


def _check_constant(node: pb.Node) -> None:
    if node.inputs or node.parameters or set(node.attrs) != {"shape", "values"}:
        raise GraphError(
            f"node {node.name!r}: a Constant reads nothing and holds the settings shape and "
            "values only"
        )
    shape = list(node.attrs["shape"].ints.values)
    if any(d < 0 for d in shape) or math.prod(shape) != len(node.attrs["values"].floats.values):
        raise GraphError(
            f"node {node.name!r}: a Constant of shape {shape} holds "
            f"{len(node.attrs['values'].floats.values)} values"
        )


def validate(graph: pb.Graph) -> None:
    """Refuse a graph this builder cannot run, naming what is wrong."""
    if graph.version != GRAPH_VERSION:
        raise GraphError(
            f"graph version {graph.version} is not supported (this build "
            f"reads version {GRAPH_VERSION})"
        )
    if graph.op_table != aten.TABLE_VERSION:
        if not graph.op_table:
            raise GraphError(
                "the graph names no core ATen op table: models are captured with torch.export "
                f"(mpcml.graph.capture); this build reads op table version {aten.TABLE_VERSION}"
            )
        raise GraphError(
            f"the graph names ATen op table version {graph.op_table}; this build has version "
            f"{aten.TABLE_VERSION}"
        )
    known = set(graph.inputs)
    if not known:
        raise GraphError("the graph has no inputs")
    for node in graph.nodes:
        if node.name in known:
            raise GraphError(f"node name {node.name!r} is used twice")
        if node.op in aten.OPS or node.op == aten.PARAMETER:
            aten.check_node(node, known)
        elif node.op == CONSTANT:
            _check_constant(node)
        else:
            raise GraphError(
                f"node {node.name!r}: op {node.op!r} is not a supported core ATen op; "
                "docs/ops.md lists them"
            )
        known.add(node.name)
    if graph.output not in known:
        raise GraphError(f"the graph's output {graph.output!r} is not defined")
