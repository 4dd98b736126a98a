"""The whitelist: every op a model graph may hold.

For each op: how it is read off torch and how it is built in CrypTen. An op not listed here is
refused, by name, when the model is traced.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Attrs = dict[str, Any]
"""An op's settings: ints, floats, bools, strings and tuples of ints."""


class GraphError(ValueError):
    """A model or a graph uses something outside the whitelist, or is malformed."""


@dataclass(frozen=True)
class OpSpec:
    """One whitelisted op."""

    name: str
    arity: int
    build: Callable[[Attrs], Any]
    """Makes the crypten.nn module that computes the op."""
    parameters: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    """The attributes a node of this op carries, no more and no fewer."""


def crypten_nn() -> Any:
    """crypten.nn, imported (with mpcml's shims) only when a graph is built."""
    from mpcml.runtime import compat

    compat.apply()
    import crypten.nn

    return crypten.nn


def _unary(method: str) -> Callable[[Attrs], Any]:
    # crypten.nn lacks some element-wise modules (Tanh); a method call is what they would do.
    def build(attrs: Attrs) -> Any:
        class _Method(crypten_nn().Module):  # type: ignore[misc]
            def forward(self, x: Any) -> Any:
                return getattr(x, method)(**attrs)

        _Method.__name__ = method.capitalize()
        return _Method()

    return build


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


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
    ]
}


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
    simple = {nn.ReLU: "ReLU", nn.Sigmoid: "Sigmoid", nn.Tanh: "Tanh"}
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


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


_FUNCTIONS: dict[Any, str] = {
    operator.add: "Add",
    torch.add: "Add",
    torch.relu: "ReLU",
    F.relu: "ReLU",
    torch.sigmoid: "Sigmoid",
    torch.tanh: "Tanh",
    F.softmax: "Softmax",
    torch.softmax: "Softmax",
    torch.flatten: "Flatten",
}
_METHODS = {
    "add": "Add",
    "relu": "ReLU",
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "softmax": "Softmax",
    "flatten": "Flatten",
}


def from_call(
    kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, Attrs]:
    """The op and settings of a traced function or method call.

    `args` holds the positional arguments left after the call's tensor inputs.
    """
    op = _FUNCTIONS.get(target) if kind == "call_function" else _METHODS.get(str(target))
    if op is None:
        name = getattr(target, "__name__", str(target))
        raise GraphError(
            f"{kind.replace('call_', '')} {name!r} is not a supported op; "
            f"supported: {', '.join(sorted(SPECS))}"
        )
    if op == "Softmax":
        dim = _arg(args, kwargs, 0, "dim", None)
        if dim is None:
            raise GraphError("softmax needs an explicit dim")
        return op, {"dim": int(dim)}
    if op == "Flatten":
        return op, _flatten_attrs(
            _arg(args, kwargs, 0, "start_dim", 0), _arg(args, kwargs, 1, "end_dim", -1)
        )
    if op == "Add" and (args or kwargs):
        raise GraphError("add with alpha or out= is not supported")
    return op, {}
