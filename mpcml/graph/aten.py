"""The core ATen ops a captured model may hold: the one table of what mpcml computes.

`capture.py` writes a model's `torch.export` graph, decomposed to core ATen, as `mpcml.v1`
nodes named by these ops; `aten_lower.py` computes each in CrypTen and `aten_eval.py` in torch
(the plaintext reference, and the shape check on meta tensors). Torch-free, as the rest of the
whitelist is: the coordinator checks graphs without torch.

An op's arguments are written as in its ATen schema. A node carries its tensor arguments as
`inputs`, in schema order ("" for an absent optional tensor, or a None in an index list), and
every other argument as a setting of the same name. An integer that depends on the batch size
(`view(x, [12 * batch, 197, 64])` in ViT) is a setting `size` holding the constant parts and
`size@batch` the batch coefficients. Parameters and buffers are `Parameter` nodes, named as in
the model's state_dict; public values the capture folded are `Constant` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mpcml.graph.opspec import GraphError
from mpcml.proto.v1 import graph_pb2 as pb

TABLE_VERSION = 2
"""The version of this table a captured graph names (`Graph.op_table`); a party refuses others."""

BATCH_SUFFIX = "@batch"
"""The suffix of a setting holding an integer setting's batch coefficients."""

PARAMETER = "Parameter"
"""The op of a node holding one parameter or buffer of the model (its state_dict entry)."""

# Argument kinds: T tensor, T? optional tensor, TS tensor or number, TL list of tensors (None
# allowed), and settings: I int, I? optional int, IL int list, F float, F? optional float, B bool,
# S string. X: an argument that does not change the value (dtype, layout, memory format).
_TENSORS = ("T", "T?", "TS", "TL")


@dataclass(frozen=True)
class AtenOp:
    """One supported core ATen op."""

    name: str
    """`aten.<op>.<overload>`, as `str(target)` of the exported node prints it."""
    args: tuple[tuple[str, str], ...]
    """(name, kind) in schema order."""
    lowering: str
    """How CrypTen computes it (for the docs)."""
    function: str = ""
    """The registry function approximating its non-linearity (`mpcml.approx`), if any."""
    outputs: int = 1
    """Outputs of the ATen op; only the first is ever used (the others serve its backward)."""

    @property
    def settings(self) -> tuple[str, ...]:
        """The names of its non-tensor arguments a node carries as settings."""
        return tuple(n for n, k in self.args if k not in _TENSORS and k != "X")

    @property
    def optional(self) -> tuple[str, ...]:
        """The settings that may be absent (None in the schema)."""
        return tuple(n for n, k in self.args if k.endswith("?") and k not in _TENSORS)


def _op(signature: str, lowering: str, function: str = "", outputs: int = 1) -> AtenOp:
    name, rest = signature.split("(", 1)
    args = []
    for part in rest.rstrip(")").split(","):
        arg, kind = (s.strip() for s in part.split(":"))
        args.append((arg, kind))
    return AtenOp(f"aten.{name}", tuple(args), lowering, function, outputs)


_POOL = "self:T, kernel_size:IL, stride:IL, padding:IL"
_BN = "input:T, weight:T?, bias:T?, running_mean:T, running_var:T"

OPS: dict[str, AtenOp] = {
    op.name: op
    for op in [
        # linear algebra
        _op(
            "convolution.default(input:T, weight:T, bias:T?, stride:IL, padding:IL, dilation:IL,"
            " transposed:B, output_padding:IL, groups:I)",
            "conv1d/conv2d on shares (Beaver triples); transposed refused",
        ),
        _op("addmm.default(self:T, mat1:T, mat2:T, beta:F?, alpha:F?)", "matmul, then add"),
        _op("mm.default(self:T, mat2:T)", "matmul"),
        _op("bmm.default(self:T, mat2:T)", "matmul"),
        # element-wise arithmetic
        _op("add.Tensor(self:TS, other:TS, alpha:F?)", "local add (public or secret operand)"),
        _op("sub.Tensor(self:TS, other:TS, alpha:F?)", "local subtract"),
        _op("mul.Tensor(self:TS, other:TS)", "public: local; secret: Beaver product"),
        _op("mul.Scalar(self:T, other:F)", "local scale"),
        _op("div.Tensor(self:T, other:TS)", "by a public value: local; a secret divisor refused"),
        _op("neg.default(self:T)", "local"),
        _op("pow.Tensor_Scalar(self:T, exponent:F)", "a whole exponent: Beaver products"),
        _op(
            "where.self(condition:T, self:TS, other:TS)",
            "c*x + (1-c)*y: a public condition, or the attention mask (a Beaver product)",
        ),
        # non-linear functions
        _op("relu.default(self:T)", "CrypTen relu (one comparison)"),
        _op("hardtanh.default(self:T, min_val:F, max_val:F)", "two relus (ReLU6 and the like)"),
        _op("clamp.default(self:T, min:F?, max:F?)", "one relu per bound"),
        _op("sigmoid.default(self:T)", "plan: sigmoid", "sigmoid"),
        _op("tanh.default(self:T)", "plan: tanh", "tanh"),
        _op("gelu.default(self:T, approximate:S)", "plan: gelu", "gelu"),
        _op("_softmax.default(self:T, dim:I, half_to_float:B)", "plan: softmax", "softmax"),
        _op("_safe_softmax.default(self:T, dim:I, dtype:X)", "plan: softmax", "softmax"),
        _op("exp.default(self:T)", "CrypTen exp (limit approximation)"),
        _op("rsqrt.default(self:T)", "plan: rsqrt", "rsqrt"),
        # normalisation, pooling, dropout
        _op(
            "native_layer_norm.default(input:T, normalized_shape:IL, weight:T?, bias:T?, eps:F)",
            "mean, variance, plan: rsqrt of the variance",
            "rsqrt",
            outputs=3,
        ),
        _op(
            f"_native_batch_norm_legit_no_training.default({_BN}, momentum:F, eps:F)",
            "CrypTen batchnorm: running statistics; batch statistics in a training job",
            outputs=3,
        ),
        _op(
            f"max_pool2d_with_indices.default({_POOL}, dilation:IL, ceil_mode:B)",
            "CrypTen max_pool2d (pairwise maxima in rounds)",
            outputs=2,
        ),
        _op(
            f"avg_pool2d.default({_POOL}, ceil_mode:B, count_include_pad:B, divisor_override:I?)",
            "local window sums, times public 1/divisor",
        ),
        _op("_adaptive_avg_pool2d.default(self:T, output_size:IL)", "CrypTen adaptive_avg_pool2d"),
        _op("mean.dim(self:T, dim:IL, keepdim:B, dtype:X)", "local"),
        _op("sum.dim_IntList(self:T, dim:IL, keepdim:B, dtype:X)", "local"),
        # layout: local on shares
        _op("view.default(self:T, size:IL)", "reshape"),
        _op("permute.default(self:T, dims:IL)", "permute"),
        _op("expand.default(self:T, size:IL, implicit:B)", "expand"),
        _op("unsqueeze.default(self:T, dim:I)", "unsqueeze"),
        _op("squeeze.dims(self:T, dim:IL)", "squeeze"),
        _op("slice.Tensor(self:T, dim:I, start:I?, end:I?, step:I)", "index by a slice"),
        _op("select.int(self:T, dim:I, index:I)", "index by an integer"),
        _op("cat.default(tensors:TL, dim:I)", "crypten.cat"),
        _op("index_select.default(self:T, dim:I, index:T)", "public indices: index_select"),
        _op("index.Tensor(self:T, indices:TL)", "public indices: advanced indexing"),
        _op(
            "embedding.default(weight:T, indices:T, padding_idx:I, scale_grad_by_freq:B, sparse:B)",
            "public indices (positions, token types): rows of the weight, index_select",
        ),
        _op("constant_pad_nd.default(self:T, pad:IL, value:F)", "pad"),
        _op("clone.default(self:T, memory_format:X)", "nothing (a copy)"),
        _op("alias.default(self:T)", "nothing"),
        _op(
            "as_strided.default(self:T, size:IL, stride:IL, storage_offset:I?)",
            "nothing: only a restride of the same shape (a memory format) is accepted",
        ),
        _op(
            "_to_copy.default(self:T, dtype:X, layout:X, device:X, pin_memory:X, non_blocking:X,"
            " memory_format:X)",
            "nothing (a float copy)",
        ),
    ]
}
"""Every supported core ATen op, by name."""


def whole_power(exponent: float) -> int:
    """The exponent of `pow` as the int CrypTen computes with; GraphError if it is not whole."""
    if exponent != int(exponent) or exponent < 0:
        raise GraphError(f"a secret value to the power {exponent}: only whole powers are computed")
    return int(exponent)


PUBLIC_ARGS = {"index": "long", "indices": "long", "condition": "bool"}
"""Arguments that must be public, and the type their (float) Constant is read as."""

FUNCTIONS = {name: op.function for name, op in OPS.items() if op.function}
"""The ops whose non-linear function an approximation plan chooses."""


def check_node(node: pb.Node, known: set[str]) -> None:
    """Refuse an ATen or Parameter node that does not match the table, naming what is wrong."""
    if node.op == PARAMETER:
        if node.inputs or node.attrs or len(node.parameters) != 1:
            raise GraphError(f"node {node.name!r}: a Parameter holds one tensor and reads none")
        return
    op = OPS[node.op]
    tensors = [(n, k) for n, k in op.args if k in _TENSORS]
    lists = [n for n, k in tensors if k == "TL"]
    given = set(node.attrs)
    scalars_given = {n for n, k in tensors if k == "TS" and n in given}
    expected = len(tensors) - len(scalars_given) - len(lists)
    if lists:
        count_key = f"{lists[0]}#"
        if count_key not in given:
            raise GraphError(f"node {node.name!r}: {node.op} needs the setting {count_key!r}")
        expected += int(node.attrs[count_key].i)
        given.discard(count_key)
    if len(node.inputs) != expected:
        raise GraphError(
            f"node {node.name!r}: {node.op} takes {expected} tensor input(s) here, "
            f"got {len(node.inputs)}"
        )
    for i, name in enumerate(node.inputs):
        if name and name not in known:
            raise GraphError(
                f"node {node.name!r} reads {name!r}, which no earlier node or input defines"
            )
        kind = _input_kind(op, node, i)
        if not name and kind not in ("T?", "TL"):
            raise GraphError(f"node {node.name!r}: {node.op} input {i} cannot be absent")
    allowed = set(op.settings) | scalars_given
    allowed |= {s + BATCH_SUFFIX for s in op.settings}
    if given - allowed:
        raise GraphError(
            f"node {node.name!r}: {node.op} has no setting {sorted(given - allowed)[0]!r} "
            f"(its settings: {', '.join(op.settings) or 'none'})"
        )
    missing = set(op.settings) - set(op.optional) - given
    if missing:
        raise GraphError(f"node {node.name!r}: {node.op} needs the setting {sorted(missing)[0]!r}")
    if node.parameters:
        raise GraphError(f"node {node.name!r}: an ATen op holds no parameters (Parameter nodes do)")


def _input_kind(op: AtenOp, node: pb.Node, index: int) -> str:
    """The kind of the argument the node's `index`-th input stands for."""
    start = 0
    for _, kind, width in tensor_args(op, node):
        if index < start + width:
            return kind
        start += width
    return ""


def tensor_args(op: AtenOp, node: pb.Node) -> list[tuple[str, str, int]]:
    """(argument, kind, width) of each tensor argument the node's inputs stand for, in order."""
    out = []
    for name, kind in op.args:
        if kind not in _TENSORS or (kind == "TS" and name in node.attrs):
            continue
        out.append((name, kind, int(node.attrs[f"{name}#"].i) if kind == "TL" else 1))
    return out


def table_markdown() -> str:
    """The supported-op table as Markdown (docs/ops.md is generated from it)."""
    lines = [
        f"Table version {TABLE_VERSION}: {len(OPS)} core ATen ops.",
        "",
        "| ATen op | arguments | computed in CrypTen as | plan knob |",
        "|---|---|---|---|",
    ]
    for op in sorted(OPS.values(), key=lambda o: o.name):
        args = ", ".join(f"{n}: {k}" for n, k in op.args)
        lines.append(f"| `{op.name}` | {args} | {op.lowering} | {op.function or ''} |")
    return "\n".join(lines) + "\n"


def bind(op: AtenOp, attrs: dict[str, Any], inputs: Sequence[Any], batch: int) -> dict[str, Any]:
    """An ATen node's arguments by name.

    Inputs are None where absent; settings are resolved at the batch size `batch`.
    """
    out: dict[str, Any] = {}
    i = 0
    for name, kind in op.args:
        if kind == "TL":
            width = int(attrs[f"{name}#"])
            out[name] = [None if v is _ABSENT else v for v in inputs[i : i + width]]
            i += width
        elif kind in ("T", "T?") or (kind == "TS" and name not in attrs):
            out[name] = None if inputs[i] is _ABSENT else inputs[i]
            i += 1
        elif kind == "X":
            continue
        elif name not in attrs:
            out[name] = None
        elif name + BATCH_SUFFIX in attrs:
            value, coefficients = attrs[name], attrs[name + BATCH_SUFFIX]
            if isinstance(value, tuple):
                out[name] = [v + c * batch for v, c in zip(value, coefficients, strict=True)]
            else:
                out[name] = value + coefficients * batch
        else:
            value = attrs[name]
            out[name] = list(value) if kind == "IL" and isinstance(value, tuple) else value
    return out


class _Absent:
    """An absent optional tensor among a node's inputs (its input name is "")."""


_ABSENT = _Absent()
ABSENT: Any = _ABSENT


if __name__ == "__main__":  # python -m mpcml.graph.aten > docs/ops.md
    print(
        "# Supported core ATen ops\n\n"
        "Generated from `mpcml/graph/aten.py` (`python -m mpcml.graph.aten > docs/ops.md`); a\n"
        "test checks it. A model is captured with `torch.export` and decomposed to core ATen\n"
        "(`mpcml/graph/capture.py`); an op outside this table is refused at capture, naming the\n"
        "op, the module that produced it and the source line. Argument kinds: T tensor, T?\n"
        "optional tensor, TS tensor or number, TL tensor list, I int, IL int list, F float, B\n"
        "bool, S string, X ignored (dtype, memory format); `?` marks an optional setting.\n\n"
        "Limits, as built: the model is captured in eval mode, so dropout is not applied in\n"
        "training (batch norm does use batch statistics in a training job); a transposed\n"
        "convolution, a division by a secret value and data-dependent control flow are\n"
        "refused; indexing by several index tensors at once computes but passes no gradient;\n"
        "the attention mask of a transformer is the one secret value that may be compared\n"
        "(with 0 or 1) or be a `where` condition; a public number of magnitude 1e9 or more\n"
        '("minus infinity" in a mask) is clipped to 16 with its sign.\n'
    )
    print(table_markdown(), end="")
