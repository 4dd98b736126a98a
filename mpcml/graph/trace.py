"""mpcml's own ops of a torch module, and the encoding of settings.

The sequence-model lowering (`lower.py`) uses them; every other model is captured with
torch.export (`capture.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mpcml.graph.ops import SPECS, Attrs, GraphError
from mpcml.proto.v1 import graph_pb2 as pb


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _flatten_attrs(start_dim: int, end_dim: int) -> Attrs:
    if start_dim != 1 or end_dim != -1:
        raise GraphError(
            f"Flatten(start_dim={start_dim}, end_dim={end_dim}) is not supported: "
            "only flattening everything after the batch dimension"
        )
    return {}


def _pool_attrs(m: Any) -> Attrs:
    if getattr(m, "ceil_mode", False) or getattr(m, "dilation", 1) not in (1, (1, 1)):
        raise GraphError(f"{type(m).__name__} with ceil_mode or dilation is not supported")
    stride = m.stride if m.stride is not None else m.kernel_size
    return {
        "kernel_size": _pair(m.kernel_size),
        "stride": _pair(stride),
        "padding": _pair(m.padding),
    }


def from_module(m: torch.nn.Module) -> tuple[str, Attrs]:
    """The op and settings of a torch submodule; anything off the whitelist raises."""
    nn = torch.nn
    if isinstance(m, nn.Linear):
        return "Linear", {
            "in_features": m.in_features,
            "out_features": m.out_features,
            "bias": m.bias is not None,
        }
    if isinstance(m, nn.Conv2d):
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            raise GraphError(
                f"Conv2d with padding {m.padding!r} ({m.padding_mode}) is not "
                "supported: give the padding as numbers, padding_mode 'zeros'"
            )
        return "Conv2d", {
            "in_channels": m.in_channels,
            "out_channels": m.out_channels,
            "kernel_size": _pair(m.kernel_size),
            "stride": _pair(m.stride),
            "padding": _pair(m.padding),
            "dilation": _pair(m.dilation),
            "groups": m.groups,
            "bias": m.bias is not None,
        }
    if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
        if m.momentum is None or not m.affine or not m.track_running_stats:
            raise GraphError(
                f"{type(m).__name__} needs affine=True, track_running_stats=True "
                "and a numeric momentum"
            )
        return type(m).__name__, {
            "num_features": m.num_features,
            "eps": float(m.eps),
            "momentum": float(m.momentum),
        }
    if isinstance(m, nn.Embedding):
        if m.max_norm is not None or m.sparse:
            raise GraphError("Embedding with max_norm or sparse gradients is not supported")
        return "Embedding", {
            "num_embeddings": m.num_embeddings,
            "embedding_dim": m.embedding_dim,
        }
    if isinstance(m, nn.LayerNorm):
        if not m.elementwise_affine or m.bias is None or len(m.normalized_shape) != 1:
            raise GraphError(
                "LayerNorm needs elementwise_affine=True, a bias, and one normalised dimension"
            )
        return "LayerNorm", {"normalized_shape": tuple(m.normalized_shape), "eps": float(m.eps)}
    if isinstance(m, nn.GELU):
        return "GELU", {"approximate": str(m.approximate)}
    simple = {nn.ReLU: "ReLU", nn.Sigmoid: "Sigmoid", nn.Tanh: "Tanh", nn.SiLU: "SiLU"}
    for cls, op in simple.items():
        if type(m) is cls:
            return op, {}
    if isinstance(m, nn.Softmax):
        if m.dim is None:
            raise GraphError("Softmax needs an explicit dim")
        return "Softmax", {"dim": int(m.dim)}
    if isinstance(m, nn.Flatten):
        return "Flatten", _flatten_attrs(m.start_dim, m.end_dim)
    if isinstance(m, nn.Dropout):
        return "Dropout", {"p": float(m.p)}
    if isinstance(m, nn.MaxPool2d):
        return "MaxPool2d", _pool_attrs(m)
    if isinstance(m, nn.AvgPool2d):
        return "AvgPool2d", _pool_attrs(m)
    if isinstance(m, nn.AdaptiveAvgPool2d):
        return "AdaptiveAvgPool2d", {"output_size": _pair(m.output_size)}
    raise GraphError(
        f"module {type(m).__name__} is not a supported op; supported: {', '.join(sorted(SPECS))}"
    )


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


def parameter_specs(spec_name: str, module: torch.nn.Module) -> list[pb.ParameterSpec]:
    """The names and shapes (never values) of the parameters and buffers `module` holds."""
    spec = SPECS[spec_name]
    out = []
    for name, buffer in [(p, False) for p in spec.parameters] + [(b, True) for b in spec.buffers]:
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor):
            out.append(pb.ParameterSpec(name=name, shape=list(value.shape), buffer=buffer))
    return out


def make_node(
    name: str,
    op: str,
    inputs: list[str],
    attrs: Attrs,
    module: str,
    parameters: Sequence[pb.ParameterSpec],
) -> pb.Node:
    """One graph node; its settings encoded as `Attr`s."""
    node = pb.Node(name=name, op=op, inputs=inputs, module=module, parameters=parameters)
    for key, value in attrs.items():
        node.attrs[key].CopyFrom(encode_attr(value))
    return node
