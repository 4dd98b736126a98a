"""Capture a torch.nn.Module as an `mpcml.v1.Graph` of core ATen ops, with torch.export.

`torch.export` traces the model as PyTorch itself runs it, whatever the call forms (methods,
functions, modules, shape arithmetic), and its decompositions reduce it to core ATen. The capture
then sorts the exported values: one computed from the input or from a parameter or float buffer
is secret and becomes a node of an op in `aten.OPS`; any other is public (shapes, index tables,
masks) and is computed here, once, and folded into a `Constant`. Integer arguments that follow
the batch size stay symbolic (`aten.BATCH_SUFFIX`). An op outside the table is refused naming
the ATen op, the module that produced it and the user's source line.

A transformer's input is its token rows (`hf.trace`): per position the one-hot token id and
the attention mask, the one secret value that may be compared, negated and used as a `where`
condition, since it holds 0 or 1 only (`_mask_op`). Masks written as "minus infinity" (the
float's lowest value, which no fixed-point ring holds) are clipped: a public number of
magnitude at least `HUGE` becomes `MASK_VALUE` with its sign, a softmax weight of e^-16
(1e-7), zero in CrypTen's 16 fractional bits.

The model is captured in inference (eval) mode, so a training and an inference job of one
model share one graph and one digest: batch norm follows the job at the parties (batch
statistics while training), and dropout, which eval mode removes, is not applied in training.
"""

from __future__ import annotations

import operator
import threading
import warnings
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.fx

from mpcml.graph.aten import (
    BATCH_SUFFIX,
    OPS,
    PARAMETER,
    PUBLIC_ARGS,
    TABLE_VERSION,
    AtenOp,
    whole_power,
)
from mpcml.graph.ops import CONSTANT, GRAPH_VERSION, GraphError, encode_attr
from mpcml.proto.v1 import graph_pb2 as pb

_EXPORTING = threading.Lock()
"""torch.export keeps global tracing state: jobs submitted from several threads capture in turn."""

EXAMPLE_BATCH = 2
"""The batch of the example input the model is exported with (the batch stays dynamic)."""
HUGE = 1e9
MASK_VALUE = 16.0

_MASK_LAYOUT = frozenset(
    {
        "aten.view.default",
        "aten.unsqueeze.default",
        "aten.expand.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.permute.default",
        "aten.squeeze.dims",
        "aten.index.Tensor",
        "aten.clone.default",
        "aten.alias.default",
    }
)
"""Ops that move a mask's 0/1 values without changing them: their result is a mask too."""
_MASK_NOT = frozenset({"aten.logical_not.default", "aten.bitwise_not.default"})
_MASK_AND = frozenset({"aten.bitwise_and.Tensor", "aten.logical_and.default", "aten.mul.Tensor"})


def clip(value: float) -> float:
    """A public number as the capture keeps it: "minus infinity" becomes -MASK_VALUE."""
    return max(-MASK_VALUE, min(MASK_VALUE, value)) if abs(value) >= HUGE else value


def where(n: torch.fx.Node) -> str:
    """The module path, module type and user source line that produced an exported node."""
    parts = []
    stack = n.meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        name = getattr(kind, "__name__", None) or str(kind).rsplit(".", 1)[-1].strip("'>")
        parts.append(f"in module {path or '(top)'!r} ({name})")
    trace = (n.meta.get("stack_trace") or "").strip().splitlines()
    files = [i for i, line in enumerate(trace) if line.strip().startswith("File ")]
    if files:
        location = trace[files[-1]].strip()
        code = trace[files[-1] + 1].strip() if files[-1] + 1 < len(trace) else ""
        parts.append(f"at {location}" + (f": {code}" if code else ""))
    return ", ".join(parts)


def _affine(value: Any, concrete: Any) -> tuple[int, int]:
    """An integer argument as (constant, batch coefficient)."""
    if isinstance(value, torch.fx.Node):
        symbolic = value.meta.get("val")
        if not isinstance(symbolic, torch.SymInt):
            raise GraphError(f"integer argument {value.name!r} is not a size")
        expr = symbolic.node.expr
        symbols = list(expr.free_symbols)
        if not symbols:
            return int(expr), 0
        if len(symbols) > 1 or expr.diff(symbols[0], 2) != 0:
            raise GraphError(f"a size {expr} is not a multiple of the batch size plus a constant")
        coefficient, constant = expr.diff(symbols[0]), expr.subs(symbols[0], 0)
        if not (coefficient.is_integer and constant.is_integer):
            raise GraphError(f"a size {expr} is not an integer function of the batch size")
        if int(constant) + int(coefficient) * EXAMPLE_BATCH != int(concrete):
            raise GraphError(f"a size {expr} does not match its value {concrete} at capture")
        return int(constant), int(coefficient)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphError(f"expected an integer, got {value!r}")
    return int(value), 0


_KEPT = (torch.ops.aten._safe_softmax.default, torch.ops.aten._adaptive_avg_pool2d.default)
"""Ops kept whole: their decompositions hold data-dependent code (a softmax row of -inf set to
zero, which no fixed-point value is) or strided views that CrypTen's pooling does directly."""


class _Capture:
    """One capture: `run` returns the graph."""

    def __init__(
        self, model: torch.nn.Module, example: torch.Tensor, vocab: int = 0, prefix: str = ""
    ) -> None:
        self.model, self.example, self.vocab, self.prefix = model, example, vocab, prefix
        self.graph = pb.Graph(version=GRAPH_VERSION, op_table=TABLE_VERSION, token_vocab=vocab)
        self.masks: set[str] = set()
        """Secret values that hold 0 or 1 only: the attention mask and what is computed from it."""
        self.values: dict[str, Any] = {}
        self.secret: dict[str, str] = {}
        """Exported node name -> graph node name, for every secret value."""
        self.pending: dict[str, tuple[str, bool]] = {}
        """Secret parameters and buffers not yet emitted: node name -> (state_dict key, buffer)."""
        self.constants: dict[str, str] = {}
        self.pieces: dict[str, list[tuple[int, int, int]]] = {}
        """split_with_sizes nodes: (dim, start, end) of each piece."""

    def run(self) -> pb.Graph:
        was_training = self.model.training
        self.model.eval()
        try:
            program = self._export()
        finally:
            self.model.train(was_training)
        kinds = {s.arg.name: s for s in program.graph_signature.input_specs}
        state = {**program.state_dict, **program.constants}
        nodes = list(program.graph.nodes)
        user_outputs = [
            s.arg.name
            for s in program.graph_signature.output_specs
            if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT
        ]
        if len(user_outputs) != 1:
            raise GraphError(f"the model must return one tensor, it returns {len(user_outputs)}")
        by_name = {n.name: n for n in nodes}
        needed = self._needed(by_name[user_outputs[0]])
        for n in nodes:
            if n.name not in needed:
                continue
            if n.op == "placeholder":
                self._placeholder(n, kinds[n.name], state)
            elif n.op == "call_function":
                self._call(n)
        out = by_name[user_outputs[0]]
        if out.name not in self.secret:
            raise GraphError("the model's output does not depend on its input or weights")
        if not self.graph.nodes:
            raise GraphError("the model computes nothing: its output is its input")
        self.graph.output = self.secret[out.name]
        value = self.values[out.name]
        self.graph.input_shape.extend(self.example.shape[1:])
        self.graph.output_shape.extend(int(d) for d in value.shape[1:])
        if value.dim() == 0 or value.size(0) != EXAMPLE_BATCH:
            raise GraphError("the model's output has no batch dimension")
        return self.graph

    def _export(self) -> Any:
        batch = torch.export.Dim("batch", min=1, max=1 << 20)
        try:
            with warnings.catch_warnings():  # torch's own deprecations inside export
                warnings.simplefilter("ignore", FutureWarning)
                program = torch.export.export(
                    self.model, (self.example,), dynamic_shapes=({0: batch},)
                )
                table = torch.export.default_decompositions()
                for kept in _KEPT:
                    table.pop(kept, None)  # type: ignore[no-untyped-call]
                return program.run_decompositions(table)
        except GraphError:
            raise
        except Exception as exc:  # export raises many kinds on what it cannot trace
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GraphError(f"torch.export cannot capture the model: {first}") from exc

    def _needed(self, output: torch.fx.Node) -> set[str]:
        needed, todo = set(), [output]
        while todo:
            n = todo.pop()
            if n.name not in needed:
                needed.add(n.name)
                todo.extend(n.all_input_nodes)
        return needed

    # --- values -----------------------------------------------------------------------------

    def _placeholder(self, n: torch.fx.Node, spec: Any, state: dict[str, Any]) -> None:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            self.values[n.name] = self.example
            self.graph.inputs.append(n.name)
            self.secret[n.name] = n.name
            return
        value = state[spec.target]
        self.values[n.name] = value
        weight = kind == "PARAMETER" or (
            kind == "BUFFER" and spec.persistent and value.is_floating_point()
        )
        if weight:  # the owner's: read from its state_dict by key, secret-shared
            target = str(spec.target).removeprefix(self.prefix)
            self.pending[n.name] = (target, kind == "BUFFER")

    def _evaluate(self, n: torch.fx.Node) -> Any:
        args = torch.fx.node.map_arg(n.args, lambda a: self.values[a.name])
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: self.values[a.name])
        with torch.no_grad():
            return n.target(*args, **kwargs)  # type: ignore[operator]

    def _is_secret(self, n: torch.fx.Node) -> bool:
        return n.name in self.secret or n.name in self.pending or n.name in self.pieces

    def _call(self, n: torch.fx.Node) -> None:
        try:
            self.values[n.name] = self._evaluate(n)
        except Exception as exc:
            raise GraphError(f"node {n.name!r} ({n.target}) fails at capture: {exc}") from None
        if not any(self._is_secret(a) for a in n.all_input_nodes):
            return  # public: folded where a secret op reads it
        if isinstance(self.values[n.name], int | float | torch.SymInt):
            return  # a size: read as a setting by the ops that use it
        name = str(n.target)
        if n.target is operator.getitem:
            return self._getitem(n)
        if name == "aten.split_with_sizes.default":
            return self._split(n)
        if self._mask_op(n, name):
            return
        op = OPS.get(name)
        if op is None:
            raise GraphError(
                f"op {name} has no lowering in mpcml ({where(n) or 'node ' + repr(n.name)}); "
                "docs/ops.md lists the supported core ATen ops"
            )
        self._emit(n, op)

    def _mask_op(self, n: torch.fx.Node, name: str) -> bool:
        """Capture an op on a mask (0/1 values) as arithmetic; False where it is no mask op."""
        secret = [a for a in n.all_input_nodes if self._is_secret(a)]
        if self.vocab and name == "aten.select.int" and self._is_mask_column(n):
            self._emit(n, OPS[name])
            self.masks.add(n.name)
            return True
        if not secret or any(a.name not in self.masks for a in secret):
            return False
        x = self._secret(secret[0])
        if name in _MASK_LAYOUT:
            self._emit(n, OPS[name])
        elif name == "aten._to_copy.default":
            self.secret[n.name] = x  # 0/1 as a bool, an integer or a float alike
        elif name in ("aten.eq.Scalar", "aten.ne.Scalar"):
            c = float(cast(float, n.args[1]))
            if c not in (0.0, 1.0):
                raise GraphError(f"a mask is compared with 0 or 1 only, not {c} ({where(n)})")
            if (c == 1.0) == (name == "aten.eq.Scalar"):  # m == 1 and m != 0 are m itself
                self.secret[n.name] = x
            else:
                self._not(n, x)
        elif name in _MASK_NOT:
            self._not(n, x)
        elif name in _MASK_AND:
            self._emit(n, OPS["aten.mul.Tensor"])
        elif name == "aten.where.self" and n.args[0] in secret and len(secret) == 1:
            self._emit(n, OPS[name])
            return True  # x where the mask is 1, y where it is 0: no longer a mask
        else:
            return False
        self.masks.add(n.name)
        return True

    def _is_mask_column(self, n: torch.fx.Node) -> bool:
        """Whether `n` selects the attention mask, the last column of the token rows."""
        source, dim, index = n.args[:3]
        return (
            isinstance(source, torch.fx.Node)
            and source.name == self.graph.inputs[0]
            and int(cast(int, dim)) % self.example.dim() == self.example.dim() - 1
            and int(cast(int, index)) % self.example.size(-1) == self.vocab
        )

    def _not(self, n: torch.fx.Node, mask: str) -> None:
        """1 - m: a negation, then an add of the number 1."""
        negated = pb.Node(name=f"{n.name}_neg", op="aten.neg.default", inputs=[mask])
        self.graph.nodes.append(negated)
        node = pb.Node(name=n.name, op="aten.add.Tensor", inputs=[negated.name])
        node.attrs["other"].CopyFrom(encode_attr(1.0))
        node.attrs["alpha"].CopyFrom(encode_attr(1.0))
        self._append(n, node)

    def _getitem(self, n: torch.fx.Node) -> None:
        source, index = n.args
        assert isinstance(source, torch.fx.Node)
        if source.name in self.pieces:
            dim, start, end = self.pieces[source.name][cast(int, index)]
            node = pb.Node(name=n.name, op="aten.slice.Tensor", inputs=[self._secret(source)])
            for key, value in (("dim", dim), ("start", start), ("end", end), ("step", 1)):
                node.attrs[key].CopyFrom(encode_attr(value))
            self._append(n, node)
            return
        if index != 0:
            raise GraphError(
                f"output {index} of {source.target} is used ({where(n)}); only the first "
                "output of an op is computed"
            )
        self.secret[n.name] = self.secret[source.name]

    def _split(self, n: torch.fx.Node) -> None:
        sizes = [int(s) for s in cast(list[int], n.args[1])]
        dim = cast(int, n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0))
        source = n.args[0]
        assert isinstance(source, torch.fx.Node)
        self._secret(source)
        bounds, start = [], 0
        for size in sizes:
            bounds.append((dim, start, start + size))
            start += size
        self.pieces[n.name] = bounds
        self.secret[n.name] = self.secret[source.name]

    # --- nodes ------------------------------------------------------------------------------

    def _secret(self, n: torch.fx.Node) -> str:
        if n.name in self.pending:
            key, buffer = self.pending.pop(n.name)
            module, _, leaf = key.rpartition(".")
            shape = list(self.values[n.name].shape)
            spec = pb.ParameterSpec(name=leaf, shape=shape, buffer=buffer)
            node = pb.Node(name=n.name, op=PARAMETER, module=module, parameters=[spec])
            self.graph.nodes.append(node)
            self.secret[n.name] = n.name
        return self.secret[n.name]

    def _tensor(self, value: Any, n: torch.fx.Node) -> str:
        """The graph name of a tensor argument: secret ones as they are, public ones folded."""
        if value is None:
            return ""
        if not isinstance(value, torch.fx.Node):
            raise GraphError(f"{n.target} ({where(n)}): argument {value!r} is not a tensor")
        if value.name in self.pieces:
            raise GraphError(f"{n.target} ({where(n)}) reads a whole split")
        if self._is_secret(value):
            return self._secret(value)
        return self._constant(value, n)

    def _constant(self, value: torch.fx.Node, n: torch.fx.Node) -> str:
        if value.name in self.constants:
            return self.constants[value.name]
        tensor = torch.as_tensor(self.values[value.name])
        fake = value.meta.get("val")
        shape = getattr(fake, "shape", ())
        if any(isinstance(d, torch.SymInt) and d.node.expr.free_symbols for d in shape):
            raise GraphError(
                f"{n.target} ({where(n)}) reads a public tensor whose shape follows the batch "
                f"size ({list(shape)}); only secret values may"
            )
        flat = tensor.detach().double().reshape(-1)
        flat = flat.clamp(-MASK_VALUE, MASK_VALUE).where(flat.abs() >= HUGE, flat)
        node = pb.Node(name=f"{value.name}_constant", op=CONSTANT)
        node.attrs["shape"].CopyFrom(pb.Attr(ints=pb.IntList(values=list(tensor.shape))))
        node.attrs["values"].CopyFrom(pb.Attr(floats=pb.FloatList(values=flat.tolist())))
        self.graph.nodes.append(node)
        self.constants[value.name] = node.name
        return node.name

    def _emit(self, n: torch.fx.Node, op: AtenOp) -> None:
        schema = n.target._schema  # type: ignore[union-attr]
        bound: dict[str, Any] = {}
        for i, arg in enumerate(schema.arguments):
            if i < len(n.args):
                bound[arg.name] = n.args[i]
            elif arg.name in n.kwargs:
                bound[arg.name] = n.kwargs[arg.name]
            else:
                bound[arg.name] = arg.default_value if arg.has_default_value() else None
        names = [a.name for a in schema.arguments]
        if names != [a for a, _ in op.args]:
            raise GraphError(f"{op.name}: torch's schema {names} is not the table's; update it")
        node = pb.Node(name=n.name, op=op.name)
        concrete = dict(zip(names, self._concrete(n), strict=False))
        for arg, kind in op.args:
            value = bound[arg]
            if kind in ("T", "T?"):
                if value is None and kind == "T":
                    raise GraphError(f"{op.name} ({where(n)}): {arg} is missing")
                node.inputs.append(self._tensor(value, n))
            elif kind == "TS":
                if isinstance(value, torch.fx.Node):
                    node.inputs.append(self._tensor(value, n))
                else:
                    node.attrs[arg].CopyFrom(encode_attr(clip(float(value))))
            elif kind == "TL":
                node.inputs.extend(self._tensor(v, n) for v in value)
                node.attrs[f"{arg}#"].CopyFrom(encode_attr(len(value)))
            elif kind == "X":
                self._check_ignored(op, arg, value, n)
            elif value is not None:
                self._setting(node, arg, kind, value, concrete.get(arg), n)
        for arg in PUBLIC_ARGS:
            value = bound.get(arg)
            values = value if isinstance(value, list | tuple) else [value]
            hidden = [v for v in values if isinstance(v, torch.fx.Node) and self._is_secret(v)]
            if hidden and not (arg == "condition" and all(v.name in self.masks for v in hidden)):
                raise GraphError(
                    f"{op.name} ({where(n)}): its {arg} is computed from secret values; "
                    "it must be public (only the attention mask may be a condition)"
                )
        if op.name == "aten.div.Tensor" and len(node.inputs) > 1:
            divisor = n.args[1]
            if isinstance(divisor, torch.fx.Node) and self._is_secret(divisor):
                raise GraphError(f"division by a secret value is not supported ({where(n)})")
        if op.name == "aten.as_strided.default":
            source = self.values[cast(torch.fx.Node, n.args[0]).name]
            if tuple(self.values[n.name].shape) != tuple(source.shape) or bound["storage_offset"]:
                raise GraphError(f"as_strided that changes the shape is not supported ({where(n)})")
        if op.name == "aten.pow.Tensor_Scalar":
            try:
                whole_power(float(bound["exponent"]))
            except GraphError as exc:
                raise GraphError(f"{exc} ({where(n)})") from None
        if op.name == "aten.convolution.default" and bound["transposed"]:
            raise GraphError(f"transposed convolution is not supported ({where(n)})")
        self._append(n, node)

    def _concrete(self, n: torch.fx.Node) -> list[Any]:
        return list(torch.fx.node.map_arg(n.args, lambda a: self.values[a.name]))

    def _check_ignored(self, op: AtenOp, arg: str, value: Any, n: torch.fx.Node) -> None:
        if arg == "dtype" and value is not None and not value.is_floating_point:
            raise GraphError(f"{op.name} ({where(n)}) converts a secret value to {value}")

    def _setting(
        self, node: pb.Node, arg: str, kind: str, value: Any, concrete: Any, n: torch.fx.Node
    ) -> None:
        try:
            if kind in ("I", "I?"):
                constant, coefficient = _affine(value, concrete)
                node.attrs[arg].CopyFrom(encode_attr(constant))
                if coefficient:
                    node.attrs[arg + BATCH_SUFFIX].CopyFrom(encode_attr(coefficient))
            elif kind == "IL":
                items = list(value) if isinstance(value, list | tuple) else [value]
                known = (
                    list(concrete)
                    if isinstance(concrete, list | tuple)
                    else [concrete] * len(items)
                )
                pairs = [_affine(v, c) for v, c in zip(items, known, strict=True)]
                node.attrs[arg].CopyFrom(pb.Attr(ints=pb.IntList(values=[c for c, _ in pairs])))
                if any(b for _, b in pairs):
                    node.attrs[arg + BATCH_SUFFIX].CopyFrom(
                        pb.Attr(ints=pb.IntList(values=[b for _, b in pairs]))
                    )
            elif kind in ("F", "F?"):
                node.attrs[arg].CopyFrom(encode_attr(clip(float(value))))
            elif kind == "B":
                node.attrs[arg].CopyFrom(encode_attr(bool(value)))
            else:
                node.attrs[arg].CopyFrom(encode_attr(str(value)))
        except GraphError as exc:
            raise GraphError(f"{node.op} ({where(n)}): {arg}: {exc}") from None

    def _append(self, n: torch.fx.Node, node: pb.Node) -> None:
        self.graph.nodes.append(node)
        self.secret[n.name] = node.name


def example_input(input_shape: Sequence[int], seed: int = 0) -> torch.Tensor:
    """The example batch a model is captured with: `EXAMPLE_BATCH` rows of `input_shape`."""
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d < 1 for d in shape):
        raise GraphError(f"input shape {list(shape)} must have dimensions of at least 1")
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((EXAMPLE_BATCH, *shape), generator=generator)


def capture(model: torch.nn.Module, input_shape: Sequence[int]) -> pb.Graph:
    """The core ATen graph of `model` on rows of `input_shape` (no batch dimension)."""
    if not isinstance(model, torch.nn.Module):
        raise GraphError(f"the model must be a torch.nn.Module, got {type(model).__name__}")
    with _EXPORTING:
        return _Capture(model, example_input(input_shape)).run()


def token_rows_example(sequence: int, vocab: int) -> torch.Tensor:
    """Example token rows: random one-hot ids, and a mask whose second row is padded."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (EXAMPLE_BATCH, sequence), generator=generator)
    rows = torch.nn.functional.one_hot(ids, vocab + 1).float()
    rows[..., vocab] = 1.0
    rows[-1, (sequence + 1) // 2 :, vocab] = 0.0  # padding: the mask must flow as a value
    return rows


def capture_tokens(model: torch.nn.Module, sequence: int, vocab: int, prefix: str = "") -> pb.Graph:
    """The graph of `model` on token rows (`sequence` positions of `vocab` + 1 columns).

    `prefix` is taken off its parameters' names: the model is a wrapper around the user's.
    """
    with _EXPORTING:
        return _Capture(model, token_rows_example(sequence, vocab), vocab, prefix).run()
