"""Each core ATen op of `aten.OPS` computed on CrypTen shares.

A value is a CrypTensor (secret) or a torch tensor (a public `Constant`); every lowering takes
the node's arguments by name (`aten.bind`). Layout ops are local on shares; products are Beaver
multiplications; non-linear functions run the implementation the plan chose for the node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpcml.approx.implementations import apply, products
from mpcml.approx.plan import Choice
from mpcml.graph.aten import ABSENT, OPS, PARAMETER, PUBLIC_ARGS, bind, whole_power
from mpcml.graph.opspec import GraphError, crypten_nn

Args = dict[str, Any]
Lowering = Callable[[Args, Any], Any]
"""(arguments, the node's module) -> the value; the module carries `training` and `choice`."""


def _secret(value: Any) -> bool:
    return value is not None and not torch.is_tensor(value) and not isinstance(value, int | float)


def _add(x: Any, y: Any) -> Any:
    return y.add(x) if not _secret(x) and _secret(y) else x.add(y)


def _mul(x: Any, y: Any) -> Any:
    if not _secret(x) and not _secret(y):
        return x * y
    return y.mul(x) if not _secret(x) else x.mul(y)


def _scaled(value: Any, alpha: float | None) -> Any:
    return value if alpha in (None, 1.0) else _mul(value, float(alpha))


def _sub(a: Args, m: Any) -> Any:
    x, y = a["self"], _scaled(a["other"], a["alpha"])
    if not _secret(x):
        return y.neg().add(x)
    return x.sub(y)


def _convolution(a: Args, m: Any) -> Any:
    x, w = a["input"], a["weight"]
    settings = {"stride": a["stride"], "padding": a["padding"], "dilation": a["dilation"]}
    shape: tuple[int, ...]
    if len(a["stride"]) == 1:
        out = x.conv1d(w, groups=a["groups"], **settings)
        shape = (1, -1, 1)
    elif len(a["stride"]) == 2:
        out = x.conv2d(w, groups=a["groups"], **{k: tuple(v) for k, v in settings.items()})
        shape = (1, -1, 1, 1)
    else:
        raise GraphError(f"{len(a['stride'])}-D convolution is not supported")
    return out if a["bias"] is None else out.add(a["bias"].reshape(shape))


PRODUCT_ELEMENTS = 1 << 22
"""The most elements of a secret weight one Beaver product takes: a bigger matrix is multiplied
in blocks, one more product (two rounds) each, so that no party holds the whole triple (the
dealer serves tuples of at most 2^26 elements). A tall one (a word embedding, whose inner
dimension is the vocabulary) is cut along the inner dimension, and the left factor with it: the
one-hot token rows are then never multiplied whole; a wide one in column blocks."""


def _product(x: Any, w: Any) -> Any:
    if not _secret(w) or w.dim() != 2 or w.size(0) * w.size(1) <= PRODUCT_ELEMENTS:
        return x.matmul(w)
    import crypten

    inner, columns = w.size(0), w.size(1)
    last = x.dim() - 1  # CrypTen's narrow and cat backward need dimensions counted from the front
    if inner >= columns:
        height = max(1, PRODUCT_ELEMENTS // columns)
        total = None
        for start in range(0, inner, height):
            rows = min(height, inner - start)
            part = x.narrow(last, start, rows).matmul(w.narrow(0, start, rows))
            total = part if total is None else total.add(part)
        return total
    width = max(1, PRODUCT_ELEMENTS // inner)
    blocks = [
        x.matmul(w.narrow(1, start, min(width, columns - start)))
        for start in range(0, columns, width)
    ]
    return crypten.cat(blocks, dim=last)


def _addmm(a: Args, m: Any) -> Any:
    product = _scaled(_product(a["mat1"], a["mat2"]), a["alpha"])
    return _add(product, _scaled(a["self"], a["beta"]))


def _matmul(a: Args, m: Any) -> Any:
    x, y = a["self"], a["mat2"]
    if not _secret(x):  # a public left factor: (y^T x^T)^T keeps the secret first
        return y.transpose(-1, -2).matmul(x.transpose(-1, -2)).transpose(-1, -2)
    return _product(x, y)


def _div(a: Args, m: Any) -> Any:
    divisor = a["other"]
    if _secret(divisor):
        raise GraphError("division by a secret value is not supported")
    inverse = 1.0 / divisor if isinstance(divisor, int | float) else divisor.reciprocal()
    return _mul(a["self"], inverse)


def _where(a: Args, m: Any) -> Any:
    condition = a["condition"]  # public (bool), or the secret 0/1 attention mask
    condition = condition if _secret(condition) else condition.float()
    x, y = a["self"], a["other"]
    return _add(_mul(x, condition), _mul(y, condition.neg().add(1.0)))


def _pow(a: Args, m: Any) -> Any:
    return a["self"].pow(whole_power(float(a["exponent"])))


def _embedding(a: Args, m: Any) -> Any:
    weight, indices = a["weight"], a["indices"]
    rows = weight.index_select(0, indices.reshape(-1).to(weight.device))
    return rows.reshape((*indices.shape, weight.size(-1)))


def _clamp(x: Any, low: float | None, high: float | None) -> Any:
    if low is not None and high is not None:
        return x.hardtanh(float(low), float(high))
    if low is not None:
        return x.sub(float(low)).relu().add(float(low))
    if high is not None:
        return x.neg().add(float(high)).relu().neg().add(float(high))
    return x


def _function(a: Args, m: Any) -> Any:
    choice: Choice = m.choice
    x = a["self"]
    if choice.is_crypten and choice.function in ("sigmoid", "tanh"):
        return getattr(x, choice.function)()
    if choice.is_crypten and choice.function == "softmax":
        return x.softmax(a["dim"])
    return apply(choice.function, choice.implementation, x, choice.knobs, int(a.get("dim") or -1))


def _layer_norm(a: Args, m: Any) -> Any:
    x, dims = a["input"], len(a["normalized_shape"])
    for _ in range(dims - 1):  # normalise over the last `dims` dimensions as one
        x = x.flatten(-2)
    centred = x.sub(x.mean(-1, keepdim=True))
    weight = a["weight"]
    if _secret(weight):  # its product with the centred values rides with their square
        zeros = torch.zeros(centred.size(), device=centred.device)
        scale = weight.reshape(-1).add(zeros)  # expand has no gradient
        square, centred = products([centred, centred], [centred, scale])
    else:
        square = centred.square()
        if weight is not None:
            centred = centred.mul(weight.reshape(-1))
    variance = square.mean(-1, keepdim=True).add(float(a["eps"]))
    choice: Choice = m.choice
    out = centred.mul(apply("rsqrt", choice.implementation, variance, choice.knobs))
    out = out.reshape(a["input"].size())
    return out if a["bias"] is None else out.add(a["bias"])


def _batch_norm(a: Args, m: Any) -> Any:
    return a["input"].batchnorm(
        a["weight"],
        a["bias"],
        running_mean=a["running_mean"],
        running_var=a["running_var"],
        training=m.training,
        eps=float(a["eps"]),
        momentum=float(a["momentum"]),
    )


def _max_pool(a: Args, m: Any) -> Any:
    return a["self"].max_pool2d(
        tuple(a["kernel_size"]),
        padding=tuple(a["padding"]) if a["padding"] else 0,
        stride=tuple(a["stride"]) if a["stride"] else None,
        dilation=tuple(a["dilation"]) if a["dilation"] else 1,
        ceil_mode=bool(a["ceil_mode"]),
    )


def _avg_pool(a: Args, m: Any) -> Any:
    # Window sums on shares (zero padding, extra rows for ceil_mode), divided by torch's own
    # divisor for each window: count_include_pad, ceil_mode and divisor_override all hold.
    x = a["self"]
    kernel = tuple(a["kernel_size"])
    stride = tuple(a["stride"]) if a["stride"] else kernel
    padding = tuple(a["padding"]) if a["padding"] else (0, 0)
    settings = {
        "kernel_size": kernel,
        "stride": stride,
        "padding": padding,
        "ceil_mode": bool(a["ceil_mode"]),
        "count_include_pad": bool(a["count_include_pad"]),
        "divisor_override": a["divisor_override"],
    }
    ones = torch.ones((1, 1, *x.shape[-2:]), device=x.device)
    means = torch.nn.functional.avg_pool2d(ones, **settings)
    sums = torch.nn.functional.avg_pool2d(ones, **{**settings, "divisor_override": 1})
    out_h, out_w = means.shape[-2:]
    extra = [
        max(0, (o - 1) * s + k - (size + 2 * p))
        for o, s, k, size, p in zip(
            (out_h, out_w), stride, kernel, x.shape[-2:], padding, strict=True
        )
    ]
    padded = x.pad((padding[1], padding[1] + extra[1], padding[0], padding[0] + extra[0]))
    window = padded.avg_pool2d(kernel, stride=stride, padding=0)
    rows = window.dim() - 2  # narrow's backward needs dimensions counted from the front
    window = window.narrow(rows, 0, out_h).narrow(rows + 1, 0, out_w)
    area = float(kernel[0] * kernel[1])
    return window.mul((means / sums * area)[0, 0])


def _mean(a: Args, m: Any, total: bool = False) -> Any:
    x = a["self"]
    dims = a["dim"] if a["dim"] else list(range(x.dim()))
    dims = sorted((d % x.dim() for d in dims), reverse=True)
    for d in dims:
        x = x.sum(d, keepdim=True) if total else x.mean(d, keepdim=True)
    if not a["keepdim"]:
        for d in dims:
            x = x.squeeze(d)
    return x


# Slicing and indexing by narrow and index_select: CrypTen's autograd never sees `x[...]` (Python
# looks dunder methods up on the type), so indexing would cut the gradient of a training job.


def _slice(a: Args, m: Any) -> Any:
    x = a["self"]
    dim = a["dim"] % x.dim()
    start, stop, step = slice(a["start"], a["end"], a["step"]).indices(x.size(dim))
    if step == 1:
        return x.narrow(dim, start, max(stop - start, 0))
    return x.index_select(dim, torch.arange(start, stop, step, device=x.device))


def _select(a: Args, m: Any) -> Any:
    x = a["self"]
    dim = a["dim"] % x.dim()
    return x.narrow(dim, a["index"] % x.size(dim), 1).squeeze(dim)


def _squeeze(a: Args, m: Any) -> Any:
    x = a["self"]
    dims = a["dim"]
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        if x.size(d) == 1:
            x = x.squeeze(d)
    return x


def _expand(a: Args, m: Any) -> Any:
    # A product with public ones: CrypTen's expand has no gradient, a broadcast product has.
    x = a["self"]
    size = list(a["size"])
    offset = len(size) - x.dim()
    target = [x.size(i - offset) if s == -1 else s for i, s in enumerate(size)]
    if list(x.size()) == target:
        return x
    return x.mul(torch.ones(target, device=x.device))


def _cat(a: Args, m: Any) -> Any:
    import crypten

    device = next((p.device for p in a["tensors"] if _secret(p)), None)
    parts = [p if _secret(p) else crypten.cryptensor(p.to(device)) for p in a["tensors"]]
    return crypten.cat(parts, dim=a["dim"])


def _index(a: Args, m: Any) -> Any:
    given = [(d, i) for d, i in enumerate(a["indices"]) if i is not None]
    if len(given) == 1 and given[0][1].dim() == 1:  # one index tensor: a differentiable gather
        dim, index = given[0]
        return a["self"].index_select(dim, index.to(a["self"].device))
    return a["self"][tuple(slice(None) if i is None else i for i in a["indices"])]


def _as_strided(a: Args, m: Any) -> Any:
    x = a["self"]
    if list(x.size()) != list(a["size"]):
        raise GraphError("as_strided that changes the shape is not supported")
    return x


def _identity(a: Args, m: Any) -> Any:
    return a["self"]


LOWERINGS: dict[str, Lowering] = {
    "aten.convolution.default": _convolution,
    "aten.addmm.default": _addmm,
    "aten.mm.default": _matmul,
    "aten.bmm.default": _matmul,
    "aten.add.Tensor": lambda a, m: _add(a["self"], _scaled(a["other"], a["alpha"])),
    "aten.sub.Tensor": _sub,
    "aten.mul.Tensor": lambda a, m: _mul(a["self"], a["other"]),
    "aten.mul.Scalar": lambda a, m: a["self"].mul(float(a["other"])),
    "aten.div.Tensor": _div,
    "aten.neg.default": lambda a, m: a["self"].neg(),
    "aten.pow.Tensor_Scalar": _pow,
    "aten.where.self": _where,
    "aten.relu.default": lambda a, m: a["self"].relu(),
    "aten.hardtanh.default": lambda a, m: _clamp(a["self"], a["min_val"], a["max_val"]),
    "aten.clamp.default": lambda a, m: _clamp(a["self"], a["min"], a["max"]),
    "aten.sigmoid.default": _function,
    "aten.tanh.default": _function,
    "aten.gelu.default": _function,
    "aten._softmax.default": _function,
    "aten._safe_softmax.default": _function,
    "aten.rsqrt.default": _function,
    "aten.exp.default": lambda a, m: a["self"].exp(),
    "aten.native_layer_norm.default": _layer_norm,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.max_pool2d_with_indices.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
    "aten._adaptive_avg_pool2d.default": lambda a, m: a["self"].adaptive_avg_pool2d(
        tuple(a["output_size"])
    ),
    "aten.mean.dim": _mean,
    "aten.sum.dim_IntList": lambda a, m: _mean(a, m, total=True),
    "aten.view.default": lambda a, m: a["self"].reshape(a["size"]),
    "aten.permute.default": lambda a, m: a["self"].permute(a["dims"]),
    "aten.expand.default": _expand,
    "aten.unsqueeze.default": lambda a, m: a["self"].unsqueeze(a["dim"]),
    "aten.squeeze.dims": _squeeze,
    "aten.slice.Tensor": _slice,
    "aten.select.int": _select,
    "aten.cat.default": _cat,
    "aten.index_select.default": lambda a, m: a["self"].index_select(a["dim"], a["index"]),
    "aten.index.Tensor": _index,
    "aten.embedding.default": _embedding,
    "aten.constant_pad_nd.default": lambda a, m: a["self"].pad(
        tuple(a["pad"]), value=float(a["value"])
    ),
    "aten.clone.default": _identity,
    "aten.alias.default": _identity,
    "aten._to_copy.default": _identity,
    "aten.as_strided.default": _as_strided,
}
"""The CrypTen computation of every op in the table (a test checks none is missing)."""


def _typed(a: Args) -> Args:
    for arg, kind in PUBLIC_ARGS.items():
        value = a.get(arg)
        if torch.is_tensor(value):
            a[arg] = value.long() if kind == "long" else value.bool()
        elif isinstance(value, list):
            a[arg] = [v.long() if torch.is_tensor(v) else v for v in value]
        elif _secret(value) and arg != "condition":  # a condition may be the attention mask
            raise GraphError(f"argument {arg!r} must be public, it is secret")
    return a


def _on_device(inputs: list[Any]) -> list[Any]:
    """Public tensors (constants, masks, indices) moved to the device of the secret inputs.

    A public operand on the CPU cannot meet a share on a GPU; on the CPU this moves nothing.
    """
    device = next((v.device for v in inputs if _secret(v) and hasattr(v, "device")), None)
    if device is None or device.type == "cpu":
        return inputs
    return [v.to(device) if torch.is_tensor(v) else v for v in inputs]


def module(op_name: str, attrs: dict[str, Any], choice: Choice | None) -> Any:
    """The crypten.nn module computing one ATen node."""
    op = OPS[op_name]
    lowering = LOWERINGS[op_name]
    if op.function and choice is None:
        choice = Choice("", op.function)

    class _Aten(crypten_nn().Module):  # type: ignore[misc]
        SUPPORTS_PLAINTEXT_INPUTS = True
        aten = True
        """Called with the list of its inputs (None where absent) and the batch size set."""

        def __init__(self) -> None:
            super().__init__()
            self.choice = choice
            self.batch = 0
            """The batch size of the current forward pass (for batch-affine sizes)."""

        def forward(self, x: Any) -> Any:
            inputs = _on_device([ABSENT if v is None else v for v in x])
            return lowering(_typed(bind(op, attrs, inputs, self.batch)), self)

    _Aten.__name__ = op_name.split(".")[1]
    return _Aten()


def parameter(name: str, shape: list[int], buffer: bool) -> Any:
    """The module holding one parameter or buffer (a `Parameter` node), placeholder-valued."""

    class _Parameter(crypten_nn().Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            value = torch.zeros(shape)
            if buffer:
                self.register_buffer(name, value)
            else:
                self.register_parameter(name, value)

        def forward(self, x: Any) -> Any:
            return getattr(self, name)

    _Parameter.__name__ = PARAMETER
    return _Parameter()


def constant(value: torch.Tensor) -> Any:
    """The module of a public `Constant` of a captured graph: it stays a torch tensor."""

    class _Constant(crypten_nn().Module):  # type: ignore[misc]
        SUPPORTS_PLAINTEXT_INPUTS = True

        def forward(self, x: Any) -> Any:
            return value

    return _Constant()
