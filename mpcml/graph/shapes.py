"""Shapes through a graph, checked before any party encrypts anything.

A shape that does not fit would otherwise surface mid-protocol, on every party, as an opaque
CrypTen or torch error; checked here it is one message naming the node, its op and the mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from mpcml.graph.ops import Attrs, GraphError, decode_attrs, validate
from mpcml.proto.v1 import graph_pb2 as pb

Shape = tuple[int, ...]
"""A shape without the batch dimension."""


class _Misfit(Exception):
    """A mismatch, worded without the node; `infer_shapes` names it."""


def _rank(x: Shape, ranks: Sequence[int], layout: str) -> Shape:
    if len(x) not in ranks:
        raise _Misfit(f"expects a {layout} input, the input has shape {list(x)}")
    return x


def _at_least_1d(x: Shape) -> Shape:
    return _rank(x, range(1, len(x) + 1), "at least 1-D")


def _linear(a: Attrs, x: Shape) -> Shape:
    if _at_least_1d(x)[-1] != a["in_features"]:
        raise _Misfit(f"expects {a['in_features']} input features, the input has {x[-1]}")
    return (*x[:-1], int(a["out_features"]))


def _channels(x: Shape, expected: int, ranks: Sequence[int], layout: str) -> Shape:
    if _rank(x, ranks, layout)[0] != expected:
        raise _Misfit(f"expects {expected} channels, the input has {x[0]}")
    return x


def _window(a: Attrs, x: Shape, dilation: Sequence[int] = (1, 1)) -> Shape:
    # Floor mode, as torch and CrypTen compute it; an empty output is refused, not propagated.
    kernel, stride, padding = a["kernel_size"], a["stride"], a["padding"]
    out = []
    for size, k, s, p, d in zip(x[1:], kernel, stride, padding, dilation, strict=True):
        n = (size + 2 * p - d * (k - 1) - 1) // s + 1
        if n < 1:
            raise _Misfit(
                f"has kernel {list(kernel)} (padding {list(padding)}, dilation {list(dilation)}), "
                f"larger than its {list(x[1:])} input"
            )
        out.append(n)
    return (x[0], *out)


def _conv2d(a: Attrs, x: Shape) -> Shape:
    _channels(x, a["in_channels"], (3,), "(C, H, W)")
    return (int(a["out_channels"]), *_window(a, x, a["dilation"])[1:])


def _pool(a: Attrs, x: Shape) -> Shape:
    _rank(x, (3,), "(C, H, W)")
    if any(2 * p > k for p, k in zip(a["padding"], a["kernel_size"], strict=True)):
        raise _Misfit(f"has padding {list(a['padding'])} over half its kernel, which torch refuses")
    return _window(a, x)


def _softmax(a: Attrs, x: Shape) -> Shape:
    # `dim` counts the batch dimension, which `x` leaves out.
    rank = len(x) + 1
    if not -rank <= a["dim"] < rank:
        raise _Misfit(
            f"has dim {a['dim']}, out of range for a batched input of {rank} dimensions "
            f"(valid: {-rank} to {rank - 1})"
        )
    return x


def _add(a: Attrs, x: Shape, y: Shape) -> Shape:
    if x != y:
        raise _Misfit(f"adds shapes {list(x)} and {list(y)}; they must be equal (no broadcasting)")
    return x


def _flatten(a: Attrs, x: Shape) -> Shape:
    return (math.prod(_at_least_1d(x)),)


def _same(a: Attrs, x: Shape) -> Shape:
    return x


_RULES: dict[str, Callable[..., Shape]] = {
    "Linear": _linear,
    "Conv2d": _conv2d,
    "BatchNorm1d": lambda a, x: _channels(x, a["num_features"], (1, 2), "(C,) or (C, L)"),
    "BatchNorm2d": lambda a, x: _channels(x, a["num_features"], (3,), "(C, H, W)"),
    "MaxPool2d": _pool,
    "AvgPool2d": _pool,
    "AdaptiveAvgPool2d": lambda a, x: (_rank(x, (3,), "(C, H, W)")[0], *a["output_size"]),
    "Flatten": _flatten,
    "Softmax": _softmax,
    "Add": _add,
}


def _parameter_shapes(op: str, a: Attrs) -> dict[str, list[int]]:
    if op == "Linear":
        return {"weight": [a["out_features"], a["in_features"]], "bias": [a["out_features"]]}
    if op == "Conv2d":
        out, per_group = a["out_channels"], a["in_channels"] // a["groups"]
        return {"weight": [out, per_group, *a["kernel_size"]], "bias": [out]}
    if op.startswith("BatchNorm"):
        names = ("weight", "bias", "running_mean", "running_var")
        return {name: [a["num_features"]] for name in names}
    return {}


def infer_shapes(graph: pb.Graph, input_shape: Sequence[int]) -> Shape:
    """The output shape of one sample of `input_shape` (both without the batch dimension)."""
    validate(graph)
    if len(graph.inputs) != 1:
        raise GraphError(
            f"only single-input models are supported; the graph has {len(graph.inputs)} inputs"
        )
    shape = tuple(int(d) for d in input_shape)
    if any(d < 1 for d in shape):
        raise GraphError(f"input shape {list(shape)} has a dimension below 1")
    shapes: dict[str, Shape] = {graph.inputs[0]: shape}
    for node in graph.nodes:
        where = f"node {node.name!r} ({node.op})"
        attrs = decode_attrs(node)
        try:
            expected = _parameter_shapes(node.op, attrs)
            for p in node.parameters:
                if p.name in expected and list(p.shape) != expected[p.name]:
                    raise _Misfit(
                        f"has {p.name} {list(p.shape)}, its settings say {expected[p.name]}"
                    )
            rule = _RULES.get(node.op, _same)  # element-wise ops keep the shape
            shapes[node.name] = rule(attrs, *(shapes[i] for i in node.inputs))
        except _Misfit as exc:
            raise GraphError(f"{where} {exc}") from None
        except KeyError as exc:
            raise GraphError(f"{where} needs the setting {exc}") from None
    return shapes[graph.output]
