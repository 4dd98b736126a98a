"""The whitelist: every op a model graph may hold, and the check of a graph against it.

For each op: its inputs, parameters and settings, and how it is built in CrypTen. An op not
listed here is refused by name, when the model is traced (`trace.py`) and when a graph arrives
(`validate`). Nothing here imports torch: the coordinator checks graphs without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpcml.graph import aten
from mpcml.graph.opspec import VARIADIC, Attrs, GraphError, OpSpec, crypten_nn
from mpcml.graph.sequence_ops import transformer_ops
from mpcml.proto.v1 import graph_pb2 as pb

__all__ = ["GRAPH_VERSION", "SPECS", "Attrs", "GraphError", "OpSpec", "crypten_nn", "validate"]

GRAPH_VERSION = 1
"""The version of `mpcml.v1.Graph` this build writes and reads."""


def _unary(method: str) -> Callable[[Attrs], Any]:
    # crypten.nn lacks some element-wise modules (Tanh); a method call is what they would do.
    def build(attrs: Attrs) -> Any:
        class _Method(crypten_nn().Module):  # type: ignore[misc]
            def forward(self, x: Any) -> Any:
                return getattr(x, method)(**attrs)

        _Method.__name__ = method.capitalize()
        return _Method()

    return build


def _batch_norm(name: str) -> OpSpec:
    return OpSpec(
        name,
        1,
        lambda a: getattr(crypten_nn(), name)(
            a["num_features"], eps=a["eps"], momentum=a["momentum"]
        ),
        parameters=("weight", "bias"),
        buffers=("running_mean", "running_var"),
        settings=("num_features", "eps", "momentum"),
    )


_WINDOW = ("kernel_size", "stride", "padding")

SPECS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in [
        OpSpec(
            "Linear",
            1,
            lambda a: crypten_nn().Linear(a["in_features"], a["out_features"], bias=a["bias"]),
            parameters=("weight", "bias"),
            settings=("in_features", "out_features", "bias"),
        ),
        OpSpec(
            "Conv2d",
            1,
            lambda a: crypten_nn().Conv2d(
                a["in_channels"],
                a["out_channels"],
                a["kernel_size"],
                stride=a["stride"],
                padding=a["padding"],
                dilation=a["dilation"],
                groups=a["groups"],
                bias=a["bias"],
            ),
            parameters=("weight", "bias"),
            settings=(
                "in_channels",
                "out_channels",
                "kernel_size",
                "stride",
                "padding",
                "dilation",
                "groups",
                "bias",
            ),
        ),
        _batch_norm("BatchNorm1d"),
        _batch_norm("BatchNorm2d"),
        OpSpec("ReLU", 1, lambda a: crypten_nn().ReLU()),
        OpSpec("Sigmoid", 1, lambda a: crypten_nn().Sigmoid()),
        OpSpec("Tanh", 1, _unary("tanh")),
        OpSpec("Softmax", 1, lambda a: crypten_nn().Softmax(a["dim"]), settings=("dim",)),
        OpSpec("Flatten", 1, lambda a: crypten_nn().Flatten(axis=1)),
        OpSpec("Dropout", 1, lambda a: crypten_nn().Dropout(a["p"]), settings=("p",)),
        OpSpec(
            "MaxPool2d",
            1,
            lambda a: crypten_nn().MaxPool2d(
                a["kernel_size"], stride=a["stride"], padding=a["padding"]
            ),
            settings=_WINDOW,
        ),
        OpSpec(
            "AvgPool2d",
            1,
            lambda a: crypten_nn().AvgPool2d(
                a["kernel_size"], stride=a["stride"], padding=a["padding"]
            ),
            settings=_WINDOW,
        ),
        OpSpec(
            "AdaptiveAvgPool2d",
            1,
            lambda a: crypten_nn().AdaptiveAvgPool2d(a["output_size"]),
            settings=("output_size",),
        ),
        OpSpec("Add", 2, lambda a: crypten_nn().Add()),
        *transformer_ops(),
    ]
}


SIGMOIDS = ("Sigmoid", "aten.sigmoid.default")
"""The ops of a final sigmoid, which a BCE loss fuses with."""
SOFTMAXES = ("Softmax", "aten._softmax.default", "aten._safe_softmax.default")
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
    if graph.op_table and graph.op_table != aten.TABLE_VERSION:
        raise GraphError(
            f"the graph names ATen op table version {graph.op_table}; this build has version "
            f"{aten.TABLE_VERSION}"
        )
    for node in graph.nodes:
        if node.name in known:
            raise GraphError(f"node name {node.name!r} is used twice")
        if graph.op_table and (node.op in aten.OPS or node.op == aten.PARAMETER):
            aten.check_node(node, known)
            known.add(node.name)
            continue
        if graph.op_table and node.op != "Constant":
            raise GraphError(
                f"node {node.name!r}: op {node.op!r} is not a supported core ATen op; "
                "docs/ops.md lists them"
            )
        spec = SPECS.get(node.op)
        if spec is None:
            raise GraphError(
                f"node {node.name!r}: op {node.op!r} is not supported; "
                f"supported: {', '.join(sorted(SPECS))}"
            )
        if len(node.inputs) != spec.arity and not (spec.arity == VARIADIC and node.inputs):
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
