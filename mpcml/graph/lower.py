"""Lower a torch.fx trace of a sequence model to an `mpcml.v1.Graph` by running it on examples.

A trace of a transformer holds more than its layers: shape arithmetic, position ids, the causal
mask, dtype casts. None of that depends on a party's data, only on the sequence length. The
lowering runs the trace on two example batches of different sizes and sorts its values
(`lower_values.py`): secret ones become graph nodes, public ones are folded. A public value that
changes with the batch size other than by repeating one row, or an op with no secret
counterpart (`lower_forms.py` lists the call forms recognised), is refused naming the op and the
node of the trace.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from mpcml.graph import lower_forms as forms
from mpcml.graph.lower_values import BATCHES, HUGE, MASK_VALUE, TOKENS, Pieces, TraceValues
from mpcml.graph.ops import SPECS, Attrs, GraphError
from mpcml.graph.shapes import infer_shapes
from mpcml.graph.trace import from_module, parameter_specs
from mpcml.proto.v1 import graph_pb2 as pb

__all__ = ["BATCHES", "HUGE", "MASK_VALUE", "TOKENS", "Lowering", "ModuleOp", "lower"]

ModuleOp = Callable[[torch.nn.Module], tuple[str, Attrs] | None]
"""A hook naming the op of a model family's own module (Hugging Face's Conv1D, activations)."""


class Lowering(TraceValues):
    """One lowering of `module`'s trace; `run` returns the graph."""

    def __init__(
        self,
        module: torch.fx.GraphModule,
        examples: Sequence[Mapping[str, torch.Tensor]],
        tokens: Mapping[str, str],
        vocab: int,
        module_op: ModuleOp = lambda m: None,
        public_functions: Sequence[Callable[..., Any]] = (),
    ) -> None:
        super().__init__(len(examples))
        self.module, self.examples, self.tokens, self.vocab = module, examples, tokens, vocab
        self.module_op, self.public_functions = module_op, tuple(public_functions)
        self.masks: set[str] = set()
        """Trace nodes known to hold 0 or 1 only: the attention mask and what is derived from
        it by comparison with 0 or 1, reshaping and expansion (DistilBERT's `mask == 0`)."""
        self.expanded: set[str] = set()
        """Masks expanded in the trace but not in the graph: only masked_fill, which
        broadcasts, may read them."""

    # --- running the trace ------------------------------------------------------------------

    def _execute(self, n: torch.fx.Node, run: int) -> Any:
        env = self.values[run]
        args = torch.fx.node.map_arg(n.args, lambda a: env[a.name])
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a.name])
        if n.op == "placeholder":
            return self.examples[run][str(n.target)]
        if n.op == "get_attr":
            value: Any = self.module
            for part in str(n.target).split("."):
                value = getattr(value, part)
            return value
        if n.op == "call_module":
            return self.module.get_submodule(str(n.target))(*args, **kwargs)
        if n.op == "call_function":
            return n.target(*args, **kwargs)  # type: ignore[operator]
        if n.op == "call_method":
            return getattr(args[0], str(n.target))(*args[1:], **kwargs)
        return args[0]

    def run(self) -> pb.Graph:
        """The graph; GraphError names the first op or value that cannot be lowered."""
        output: Any = None
        for n in self.module.graph.nodes:
            with torch.no_grad():
                try:
                    for run, env in enumerate(self.values):
                        env[n.name] = self._execute(n, run)
                except GraphError:
                    raise
                except Exception as exc:
                    raise GraphError(f"{self._where(n)} fails on an example input: {exc}") from None
            if n.op == "output":
                output = n.args[0]
                continue
            self._node(n)
        self.graph.output = self._output(output)
        return self.graph

    # --- sorting values ---------------------------------------------------------------------

    def _alias(self, n: torch.fx.Node, source: torch.fx.Node) -> None:
        super()._alias(n, source)
        for marks in (self.masks, self.expanded):
            if source.name in marks:
                marks.add(n.name)

    def _input(self, value: Any, n: torch.fx.Node) -> str:
        expanded = isinstance(value, torch.fx.Node) and value.name in self.expanded
        if expanded and not forms.member(n.target, forms.MASKED_FILL):
            raise GraphError(f"{self._where(n)} reads an expanded mask; only masked_fill may")
        return super()._input(value, n)

    def _node(self, n: torch.fx.Node) -> None:
        secret_inputs = [a for a in n.all_input_nodes if a.name in self.secret]
        if n.op == "placeholder":
            part = self.tokens.get(str(n.target))
            if part is None:
                raise GraphError(
                    f"input {n.target!r} is not a token input ({', '.join(self.tokens)})"
                )
            self._emit(n.name, "Tokens", [TOKENS], {"vocab": self.vocab, "part": part})
            (self.ids if part == "ids" else self.masks).add(n.name)
            return
        if n.op == "get_attr":
            if isinstance(self.values[0][n.name], torch.nn.Parameter):
                raise GraphError(
                    f"{self._where(n)} reads a parameter outside a module; only whitelisted "
                    "modules may hold weights"
                )
            return
        if n.op == "call_module":
            module = self.module.get_submodule(str(n.target))
            if secret_inputs or any(True for _ in module.parameters()):
                self._module(n, module)
            return
        if n.op == "call_method" and n.target in forms.SHAPE_QUERIES:
            return
        if n.op == "call_function" and (n.target is getattr or n.target in self.public_functions):
            return
        if secret_inputs:
            self._function(n)

    # --- secret values ----------------------------------------------------------------------

    def _module(self, n: torch.fx.Node, module: torch.nn.Module) -> None:
        if isinstance(module, torch.nn.Identity):
            source: Any = n.args[0]
            return self._alias(n, source)
        found = self.module_op(module)
        try:
            op, attrs = found if found is not None else from_module(module)
        except GraphError as exc:
            raise GraphError(f"{self._where(n)}: {exc}") from None
        args = [a for a in n.args if isinstance(a, torch.fx.Node)]
        if len(args) != max(SPECS[op].arity, 1) or n.kwargs:
            raise GraphError(f"{self._where(n)}: {op} is called with other arguments than a tensor")
        self._emit(
            n.name, op, [self._input(args[0], n)], attrs, str(n.target), parameter_specs(op, module)
        )

    def _function(self, n: torch.fx.Node) -> None:
        t = n.target
        args: list[Any] = list(n.args)
        kw: dict[str, Any] = dict(n.kwargs)
        if (n.op == "call_method" and t in forms.IDENTITY_METHODS) or t is F.dropout:
            return self._alias(n, args[0])
        if (n.op == "call_method" and t in forms.RESHAPES_M) or t in forms.RESHAPES_F:
            return self._reshape(n, args[0])
        if t is operator.getitem:
            return self._getitem(n, args[0], args[1])
        for group, op in (
            (forms.ADD, "Add"),
            (forms.SUB, "Sub"),
            (forms.RSUB, "RSub"),
            (forms.MUL, "Mul"),
        ):
            if forms.member(t, group):
                return self._arithmetic(n, op, args[0], args[1])
        if forms.member(t, forms.DIV):
            return self._divide(n, args[0], args[1])
        if forms.member(t, forms.MATMUL):
            return self._binary(n, "MatMul", args[0], args[1])
        if forms.member(t, forms.SOFTMAX):
            dim = args[1] if len(args) > 1 else kw.get("dim")
            if not isinstance(dim, int):
                raise GraphError(f"{self._where(n)}: softmax needs an explicit dim")
            return self._unary(n, args[0], "Softmax", {"dim": dim})
        if t is F.gelu:
            approximate = str(kw.get("approximate", args[1] if len(args) > 1 else "none"))
            return self._unary(n, args[0], "GELU", {"approximate": approximate})
        if forms.member(t, set(forms.UNARY)):
            op, attrs = forms.UNARY[forms.key(t)]
            return self._unary(n, args[0], op, attrs)
        if forms.member(t, forms.TRANSPOSE) or forms.member(t, forms.PERMUTE):
            return self._permute(n, args[0])
        if forms.member(t, forms.SPLIT):
            return self._split(n, args[0])
        if forms.member(t, forms.POW):
            exponent = args[1]
            if not (isinstance(exponent, int | float) and float(exponent).is_integer()):
                raise GraphError(f"{self._where(n)}: only whole powers are supported")
            if not 1 <= int(exponent) <= 8:
                raise GraphError(f"{self._where(n)}: powers 1 to 8 only, got {exponent}")
            return self._unary(n, args[0], "Pow", {"exponent": int(exponent)})
        if t is torch.cat:
            return self._cat(n, args[0], args[1] if len(args) > 1 else kw.get("dim", 0))
        if forms.member(t, {torch.mean, "mean"}):
            dims = args[1] if len(args) > 1 else kw.get("dim")
            dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
            keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
            if not dims:
                raise GraphError(f"{self._where(n)}: mean over every dimension mixes the batch")
            return self._unary(n, args[0], "Mean", {"dims": dims, "keepdim": keep})
        if t is torch.where:
            return self._where_op(n, args)
        if forms.member(t, forms.EQ | forms.NE | forms.EXPAND | forms.MASKED_FILL):
            return self._mask_op(n, args)
        raise GraphError(f"{self._where(n)} is not a supported op on secret values")

    def _arithmetic(self, n: torch.fx.Node, op: str, x: Any, y: Any) -> None:
        if op == "RSub":
            op, x, y = "Sub", y, x
        cx, cy = self._public_scalar(x), self._public_scalar(y)
        if cy is not None or cx is not None:
            secret, c = (x, cy) if cy is not None else (y, cx)
            assert c is not None
            affine = {
                "Add": (1.0, c),
                "Mul": (c, 0.0),
                "Sub": (1.0, -c) if cy is not None else (-1.0, c),
            }[op]
            return self._unary(n, secret, "Affine", {"scale": affine[0], "shift": affine[1]})
        if not self._is_secret(x):  # a public tensor first: keep the secret operand first
            if op == "Sub":
                difference = self._emit(
                    f"{n.name}_negated", "Sub", [self._input(y, n), self._input(x, n)], {}
                )
                self._emit(n.name, "Affine", [difference], {"scale": -1.0, "shift": 0.0})
                return
            x, y = y, x
        self._binary(n, op, x, y)

    def _divide(self, n: torch.fx.Node, x: Any, y: Any) -> None:
        c = self._public_scalar(y)
        if c is not None and c != 0 and self._is_secret(x):
            return self._unary(n, x, "Affine", {"scale": 1.0 / c, "shift": 0.0})
        if self._is_secret(x) and not self._is_secret(y) and isinstance(y, torch.fx.Node):
            inverse = [1.0 / torch.as_tensor(env[y.name]).float() for env in self.values]
            self._emit(
                n.name,
                "Mul",
                [self._input(x, n), self._constant(y.name + "_inverse", inverse, n)],
                {},
            )
            return
        raise GraphError(f"{self._where(n)}: division by a secret value is not supported")

    def _mask_op(self, n: torch.fx.Node, args: list[Any]) -> None:
        """A 0/1 mask compared with 0 or 1, expanded, or filling a tensor where it is 1."""
        t, x = n.target, args[0]
        if forms.member(t, forms.MASKED_FILL):
            condition, value = args[1], self._public_scalar(args[2])
            if not self._is_secret(condition) or condition.name not in self.masks or value is None:
                raise GraphError(f"{self._where(n)}: only masked_fill(x, secret mask, number)")
            # x (1 - m) + value m: x where the mask is 0, the value (clipped) where it is 1.
            cond = self._input(condition, n)
            keep = self._emit(f"{n.name}_keep", "Affine", [cond], {"scale": -1.0, "shift": 1.0})
            kept = self._emit(f"{n.name}_kept", "Mul", [self._input(x, n), keep], {})
            fill = self._emit(f"{n.name}_fill", "Affine", [cond], {"scale": value, "shift": 0.0})
            self._emit(n.name, "Add", [kept, fill], {})
            return
        if not self._is_secret(x) or x.name not in self.masks:
            raise GraphError(
                f"{self._where(n)} compares or expands a secret value: only the attention mask"
            )
        if forms.member(t, forms.EXPAND):
            self._alias(n, x)
            self.expanded.add(n.name)
            return
        c = self._public_scalar(args[1])
        if c not in (0.0, 1.0):
            raise GraphError(f"{self._where(n)}: a mask is compared with 0 or 1 only")
        if (c == 1.0) == forms.member(t, forms.EQ):  # m == 1 and m != 0 are m itself
            return self._alias(n, x)
        self._unary(n, x, "Affine", {"scale": -1.0, "shift": 1.0})
        self.masks.add(n.name)

    def _reshape(self, n: torch.fx.Node, x: Any) -> None:
        if x.name in self.expanded:
            raise GraphError(f"{self._where(n)} reshapes an expanded mask")
        if x.name in self.masks:
            self.masks.add(n.name)
        first, second = (env[n.name] for env in self.values)
        if (first.size(0), second.size(0)) != BATCHES or first.shape[1:] != second.shape[1:]:
            raise GraphError(
                f"{self._where(n)} reshapes the batch dimension (shapes {list(first.shape)} "
                f"and {list(second.shape)} for batches of {BATCHES[0]} and {BATCHES[1]})"
            )
        if first.shape == self.values[0][x.name].shape:
            return self._alias(n, x)  # a view that changes nothing (`ids.view(-1, length)`)
        self._unary(n, x, "Reshape", {"shape": tuple(int(d) for d in first.shape[1:])})

    def _permute(self, n: torch.fx.Node, x: Any) -> None:
        rank = self.values[0][x.name].dim()
        args: list[Any] = list(n.args[1:])
        if n.target in ("permute",) or n.target is torch.permute:
            dims = args[0] if len(args) == 1 and isinstance(args[0], list | tuple) else args
            perm = [int(d) % rank for d in dims]
        else:
            d0, d1 = (int(d) % rank for d in (args or [n.kwargs["dim0"], n.kwargs["dim1"]]))
            perm = list(range(rank))
            perm[d0], perm[d1] = perm[d1], perm[d0]
        if perm[0] != 0:
            raise GraphError(f"{self._where(n)} moves the batch dimension")
        self._unary(n, x, "Permute", {"dims": tuple(perm)})

    def _getitem(self, n: torch.fx.Node, x: Any, index: Any) -> None:
        source = self.secret[x.name]
        if isinstance(source, Pieces):
            if not isinstance(index, int):
                raise GraphError(f"{self._where(n)} takes a slice of a split's pieces")
            start, length = source.bounds[index]
            attrs = {"dim": source.dim, "start": start, "length": length}
            self._emit(n.name, "Narrow", [source.source], attrs)
            return
        texts = {self._index_text(n, index, env) for env in self.values}
        if len(texts) != 1:
            raise GraphError(f"{self._where(n)} indexes by a value that depends on the batch")
        self._emit(n.name, "Index", [source], {"index": texts.pop()})

    def _index_text(self, n: torch.fx.Node, index: Any, env: dict[str, Any]) -> str:
        items = index if isinstance(index, tuple) else (index,)
        parts = []
        for item in torch.fx.node.map_arg(items, lambda a: env[a.name]):
            if item is None:
                parts.append("None")
            elif isinstance(item, slice):
                if item.step not in (None, 1):
                    raise GraphError(f"{self._where(n)}: slices with a step are not supported")
                bounds = ["" if b is None else str(int(b)) for b in (item.start, item.stop)]
                parts.append(":".join(bounds))
            elif isinstance(item, int) and not isinstance(item, bool):
                parts.append(str(item))
            else:
                raise GraphError(
                    f"{self._where(n)} indexes by {type(item).__name__}: only integers, slices "
                    "and None"
                )
        text = ",".join(parts)
        if not parts or parts[0] != ":":
            raise GraphError(f"{self._where(n)} indexes the batch dimension ({text!r})")
        return text

    def _split(self, n: torch.fx.Node, x: Any) -> None:
        pieces = self.values[0][n.name]
        dim: Any = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
        rank = self.values[0][x.name].dim()
        dim = int(dim) % rank
        if dim == 0:
            raise GraphError(f"{self._where(n)} splits the batch dimension")
        bounds, start = [], 0
        for piece in pieces:
            bounds.append((start, int(piece.size(dim))))
            start += int(piece.size(dim))
        self.secret[n.name] = Pieces(self._input(x, n), dim, tuple(bounds))

    def _cat(self, n: torch.fx.Node, parts: Any, dim: int) -> None:
        names = [self._input(p, n) for p in parts]
        rank = self.values[0][n.name].dim()
        if int(dim) % rank == 0:
            raise GraphError(f"{self._where(n)} concatenates along the batch dimension")
        self._emit(n.name, "Cat", names, {"dim": int(dim)})

    def _where_op(self, n: torch.fx.Node, args: list[Any]) -> None:
        condition, x, other = args
        value = self._public_scalar(other)
        if self._is_secret(condition) or not self._is_secret(x) or value is None:
            raise GraphError(
                f"{self._where(n)}: only where(public condition, secret tensor, number)"
            )
        self._emit(
            n.name, "Where", [self._input(condition, n), self._input(x, n)], {"value": value}
        )

    # --- the output -------------------------------------------------------------------------

    def _output(self, output: Any) -> str:
        if isinstance(output, dict):
            for key in ("logits", "last_hidden_state"):
                if key in output:
                    output = output[key]
                    break
            else:
                secret = [v for v in output.values() if self._is_secret(v)]
                if len(secret) != 1:
                    raise GraphError(f"the model returns {sorted(output)}: no single output")
                output = secret[0]
        if isinstance(output, tuple | list):
            output = output[0]
        if not self._is_secret(output):
            raise GraphError("the model's output does not depend on its inputs or weights")
        name = self.secret[output.name]
        assert isinstance(name, str)
        return name


def lower(
    module: torch.fx.GraphModule,
    examples: Sequence[Mapping[str, torch.Tensor]],
    tokens: Mapping[str, str],
    vocab: int,
    sequence: int,
    module_op: ModuleOp = lambda m: None,
    public_functions: Sequence[Callable[..., Any]] = (),
) -> pb.Graph:
    """The graph of a traced sequence model; `tokens` maps each input to "ids" or "mask".

    `examples` are the inputs of batches of BATCHES rows. The result is checked: its output
    shape, inferred the way every party infers it, is the example output's.
    """
    graph = Lowering(module, examples, tokens, vocab, module_op, public_functions).run()
    shape = infer_shapes(graph, (sequence, vocab + 1))
    out = _output_tensor(module, examples[0])
    if tuple(out.shape[1:]) != tuple(shape):
        raise GraphError(
            f"the lowered graph's output has shape {list(shape)}, the model's {list(out.shape[1:])}"
        )
    return graph


def _output_tensor(module: torch.fx.GraphModule, example: Mapping[str, torch.Tensor]) -> Any:
    with torch.no_grad():
        out = module(**example)
    if isinstance(out, dict):
        out = out.get("logits", out.get("last_hidden_state"))
    return out[0] if isinstance(out, tuple | list) else out
