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
}


def _parameter_shapes(op: str, a: Attrs) -> dict[str, list[int]]:
    if op == "Linear":
        return {"weight": [a["out_features"], a["in_features"]], "bias": [a["out_features"]]}
    if op == "Conv1D":
        return {"weight": [a["in_features"], a["out_features"]], "bias": [a["out_features"]]}
    if op == "Embedding":
        return {"weight": [a["num_embeddings"], a["embedding_dim"]]}
    if op == "LayerNorm":
        return {name: list(a["normalized_shape"]) for name in ("weight", "bias")}
    if op == "Conv2d":
        out, per_group = a["out_channels"], a["in_channels"] // a["groups"]
        return {"weight": [out, per_group, *a["kernel_size"]], "bias": [out]}
    if op.startswith("BatchNorm"):
        names = ("weight", "bias", "running_mean", "running_var")
        return {name: [a["num_features"]] for name in names}
    return {}


BATCH = -1
"""The batch dimension inside a full shape: any size, the same for every batched value."""


def _broadcast(*shapes: Shape) -> Shape:
    """Torch's broadcasting of full shapes; a public constant's dimension 0 is 1 or absent."""
    rank = max(len(s) for s in shapes)
    out = []
    for sizes in zip(*((1,) * (rank - len(s)) + s for s in shapes), strict=True):
        kept = {d for d in sizes if d != 1}
        if len(kept) > 1:
            raise _Misfit(f"cannot broadcast shapes {' and '.join(str(_show(s)) for s in shapes)}")
        out.append(kept.pop() if kept else 1)
    return tuple(out)


def _show(shape: Shape) -> list[str | int]:
    return ["batch" if d == BATCH else d for d in shape]


def _dim(x: Shape, d: int, what: str = "dim") -> int:
    if not -len(x) <= d < len(x):
        raise _Misfit(f"has {what} {d}, out of range for shape {_show(x)}")
    d %= len(x)
    if d == 0 and x[0] == BATCH:
        raise _Misfit(f"has {what} {d}: the batch dimension cannot be reshaped or reduced")
    return d


def _batched(rule: Callable[..., Shape]) -> Callable[..., Shape]:
    """A rule on shapes without the batch dimension, applied to full shapes."""

    def full(a: Attrs, *xs: Shape) -> Shape:
        for x in xs:
            if not x or x[0] != BATCH:
                raise _Misfit(f"needs batched inputs, got a value of shape {_show(x)}")
        return (BATCH, *rule(a, *(x[1:] for x in xs)))

    return full


def _tokens(a: Attrs, x: Shape) -> Shape:
    if len(x) != 3 or x[-1] != a["vocab"] + 1:
        raise _Misfit(
            f"expects token rows of shape [sequence, {a['vocab'] + 1}] (one-hot ids over a "
            f"vocabulary of {a['vocab']} and the attention mask), got {_show(x[1:])}"
        )
    return x[:-1] + ((a["vocab"],) if a["part"] == "ids" else ())


def _constant(a: Attrs) -> Shape:
    shape = tuple(int(d) for d in a["shape"])
    if math.prod(shape) != len(a["values"]) or any(d < 1 for d in shape):
        raise _Misfit(f"has shape {list(shape)} but {len(a['values'])} values")
    return shape


def _embedding(a: Attrs, x: Shape) -> Shape:
    if x and x[0] == BATCH:  # one-hot rows of secret ids
        if x[-1] != a["num_embeddings"]:
            raise _Misfit(f"expects one-hot rows over {a['num_embeddings']} ids, got {x[-1]}")
        return (*x[:-1], int(a["embedding_dim"]))
    return (*x, int(a["embedding_dim"]))  # public ids


def _last(size_key: str, out_key: str) -> Callable[[Attrs, Shape], Shape]:
    def rule(a: Attrs, x: Shape) -> Shape:
        if not x or x[-1] != a[size_key]:
            raise _Misfit(f"expects {a[size_key]} input features, got shape {_show(x)}")
        return (*x[:-1], int(a[out_key])) if out_key else x

    return rule


def _layer_norm(a: Attrs, x: Shape) -> Shape:
    norm = tuple(a["normalized_shape"])
    if len(norm) != 1 or x[-1:] != norm:
        raise _Misfit(f"normalises over {list(norm)} (the last dimension only), input {_show(x)}")
    return x


def _matmul(a: Attrs, x: Shape, y: Shape) -> Shape:
    if len(x) < 2 or len(y) < 2 or x[-1] != y[-2]:
        raise _Misfit(f"multiplies shapes {_show(x)} and {_show(y)}")
    return (*_broadcast(x[:-2], y[:-2]), x[-2], y[-1])


def _reshape(a: Attrs, x: Shape) -> Shape:
    shape = [int(d) for d in a["shape"]]
    size = math.prod(x)
    if shape.count(-1) == 1:
        known = math.prod(d for d in shape if d != -1)
        if known and size % known == 0:
            shape[shape.index(-1)] = size // known
    if math.prod(shape) != size or any(d < 1 for d in shape):
        raise _Misfit(f"reshapes {list(x)} to {list(a['shape'])}")
    return tuple(shape)


def _permute(a: Attrs, x: Shape) -> Shape:
    dims = [d % len(x) if -len(x) <= d < len(x) else d for d in a["dims"]]
    if sorted(dims) != list(range(len(x))) or dims[0] != 0:
        raise _Misfit(f"permutes {_show(x)} by {list(a['dims'])}: not a permutation keeping 0")
    return tuple(x[d] for d in dims)


def _index(a: Attrs, x: Shape) -> Shape:
    from mpcml.graph.sequence_ops import parse_index

    out: list[int] = []
    i = 0
    for item in parse_index(a["index"]):
        if item is None:
            out.append(1)
            continue
        if i >= len(x):
            raise _Misfit(f"indexes {_show(x)} with {a['index']!r}: too many indices")
        if isinstance(item, slice):
            out.append(x[i] if x[i] == BATCH else len(range(*item.indices(x[i]))))
        elif not -x[i] <= item < x[i]:
            raise _Misfit(f"indexes {item} on a dimension of size {x[i]}")
        i += 1
    return (*out, *x[i:])


def _narrow(a: Attrs, x: Shape) -> Shape:
    d = _dim(x, a["dim"])
    if a["start"] < 0 or a["length"] < 1 or a["start"] + a["length"] > x[d]:
        raise _Misfit(f"takes {a['start']}..{a['start'] + a['length']} of a dimension of {x[d]}")
    return (*x[:d], int(a["length"]), *x[d + 1 :])


def _cat(a: Attrs, *xs: Shape) -> Shape:
    d = _dim(xs[0], a["dim"])
    for x in xs[1:]:
        if len(x) != len(xs[0]) or x[:d] + x[d + 1 :] != xs[0][:d] + xs[0][d + 1 :]:
            raise _Misfit(f"joins shapes {[_show(x) for x in xs]} along {a['dim']}")
    return (*xs[0][:d], sum(x[d] for x in xs), *xs[0][d + 1 :])


def _mean(a: Attrs, x: Shape) -> Shape:
    dims = {_dim(x, d) for d in a["dims"]}
    if a["keepdim"]:
        return tuple(1 if i in dims else n for i, n in enumerate(x))
    return tuple(n for i, n in enumerate(x) if i not in dims)


_FULL_RULES: dict[str, Callable[..., Shape]] = {
    "Tokens": _tokens,
    "Constant": _constant,
    "Embedding": _embedding,
    "Conv1D": _last("in_features", "out_features"),
    "LayerNorm": _layer_norm,
    "Add": lambda a, x, y: _broadcast(x, y),
    "Sub": lambda a, x, y: _broadcast(x, y),
    "Mul": lambda a, x, y: _broadcast(x, y),
    "Where": lambda a, c, x: _broadcast(c, x),
    "MatMul": _matmul,
    "Reshape": _batched(_reshape),
    "Permute": _permute,
    "Index": _index,
    "Narrow": _narrow,
    "Cat": _cat,
    "Mean": _mean,
}


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
    if graph.op_table:  # captured for one row shape; parties re-derive the output on meta tensors
        if shape != tuple(graph.input_shape):
            raise GraphError(
                f"the model was captured for rows of shape {list(graph.input_shape)}, the data's "
                f"rows have shape {list(shape)}"
            )
        if not graph.output_shape:
            raise GraphError("the captured graph records no output shape")
        return tuple(int(d) for d in graph.output_shape)
    shapes: dict[str, Shape] = {graph.inputs[0]: (BATCH, *shape)}
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
            rule = _FULL_RULES.get(node.op) or _batched(_RULES.get(node.op, _same))
            shapes[node.name] = rule(attrs, *(shapes[i] for i in node.inputs))
        except _Misfit as exc:
            raise GraphError(f"{where} {exc}") from None
        except KeyError as exc:
            raise GraphError(f"{where} needs the setting {exc}") from None
    out = shapes[graph.output]
    if not out or out[0] != BATCH:
        raise GraphError(f"the graph's output {graph.output!r} has no batch dimension")
    return out[1:]
