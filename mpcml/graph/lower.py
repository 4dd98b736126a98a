"""Lower a torch.fx trace of a sequence model to an `mpcml.v1.Graph` by running it on examples.

A trace of a transformer holds more than its layers: shape arithmetic, position ids, the causal
mask, dtype casts. None of that depends on a party's data, only on the sequence length. The
lowering runs the trace on two example batches of different sizes and splits its values: one
computed from the token inputs or from weights is secret and becomes a graph node; any other is
public and is folded into its consumers' settings or into a `Constant`. A public value that
changes with the batch size other than by repeating one row, or an op with no secret
counterpart, is refused naming the op and the node of the trace.

Masks: torch writes "minus infinity" as the float's lowest value, which no fixed-point ring
holds. A public number of magnitude at least `HUGE` is clipped to `MASK_VALUE`: a softmax weight
of e^-16 (1e-7) is zero in CrypTen's 16 fractional bits, and a score masked twice (GPT-2's
`where` and its additive mask) stays inside the exp's domain.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from mpcml.graph.ops import GRAPH_VERSION, SPECS, Attrs, GraphError
from mpcml.graph.shapes import infer_shapes
from mpcml.graph.trace import from_module, make_node, parameter_specs
from mpcml.proto.v1 import graph_pb2 as pb

BATCHES = (2, 3)
"""The example batch sizes: a public value that follows them is batch-dependent."""
HUGE = 1e9
MASK_VALUE = 16.0
TOKENS = "tokens"
"""The graph's one input: each row one-hot token ids and the attention mask (`Tokens`)."""

ModuleOp = Callable[[torch.nn.Module], tuple[str, Attrs] | None]
"""A hook naming the op of a model family's own module (Hugging Face's Conv1D, activations)."""


@dataclass(frozen=True)
class _Pieces:
    """A secret tensor split along `dim` (split, chunk): pieces are taken by `getitem`."""

    source: str
    dim: int
    bounds: tuple[tuple[int, int], ...]


_SHAPE_QUERIES = {"size", "dim", "numel"}
_IDENTITY_METHODS = {"contiguous", "to", "float", "type", "type_as", "clone", "detach"}
_RESHAPES_M = {"view", "reshape", "unsqueeze", "squeeze", "flatten", "view_as", "reshape_as"}
_RESHAPES_F = {torch.reshape, torch.unsqueeze, torch.squeeze, torch.flatten}
_ADD = {operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__radd__"}
_SUB = {operator.sub, operator.isub, torch.sub, "sub", "__sub__"}
_RSUB = {torch.rsub, "__rsub__", "rsub"}
_MUL = {operator.mul, operator.imul, torch.mul, "mul", "__mul__", "__rmul__"}
_DIV = {operator.truediv, torch.div, torch.true_divide, "div", "__truediv__", "truediv"}
_MATMUL = {operator.matmul, torch.matmul, torch.bmm, "matmul", "bmm"}
_SOFTMAX = {F.softmax, torch.softmax, "softmax"}
_TRANSPOSE = {torch.transpose, "transpose"}
_PERMUTE = {torch.permute, "permute"}
_SPLIT = {torch.split, torch.chunk, "split", "chunk"}
_POW = {operator.pow, torch.pow, "pow", "__pow__"}
_EQ = {operator.eq, torch.eq, "eq", "__eq__"}
_NE = {operator.ne, torch.ne, "ne", "__ne__"}
_EXPAND = {"expand", "expand_as"}
_MASKED_FILL = {"masked_fill", torch.masked_fill}
_UNARY: dict[Any, tuple[str, Attrs]] = {
    torch.tanh: ("Tanh", {}),
    "tanh": ("Tanh", {}),
    torch.sigmoid: ("Sigmoid", {}),
    "sigmoid": ("Sigmoid", {}),
    torch.relu: ("ReLU", {}),
    F.relu: ("ReLU", {}),
    "relu": ("ReLU", {}),
    F.silu: ("SiLU", {}),
}


def _key(target: Any) -> Any:
    return target if callable(target) else str(target)


def _member(target: Any, group: set[Any]) -> bool:
    try:
        return _key(target) in group
    except TypeError:  # an unhashable target
        return False


class Lowering:
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
        self.module, self.examples, self.tokens, self.vocab = module, examples, tokens, vocab
        self.module_op, self.public_functions = module_op, tuple(public_functions)
        self.values: list[dict[str, Any]] = [{} for _ in examples]
        self.secret: dict[str, str | _Pieces] = {}
        self.ids: set[str] = set()
        """Graph nodes holding one-hot token ids: only an Embedding may read them."""
        self.masks: set[str] = set()
        """Trace nodes known to hold 0 or 1 only: the attention mask and what is derived from
        it by comparison with 0 or 1, reshaping and expansion (DistilBERT's `mask == 0`)."""
        self.expanded: set[str] = set()
        """Masks expanded in the trace but not in the graph: only masked_fill, which
        broadcasts, may read them."""
        self.constants: dict[str, str] = {}
        self.graph = pb.Graph(version=GRAPH_VERSION, inputs=[TOKENS])

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

    def _where(self, n: torch.fx.Node) -> str:
        target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "?")
        stack = n.meta.get("stack_trace") or ""
        line = stack.strip().splitlines()[-2].strip() if stack.count("\n") > 1 else ""
        return f"node {n.name!r} ({n.op} {target}{', ' + line if line else ''})"

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
        if n.op == "call_method" and n.target in _SHAPE_QUERIES:
            return
        if n.op == "call_function" and (n.target is getattr or n.target in self.public_functions):
            return
        if secret_inputs:
            self._function(n)

    # --- secret values ----------------------------------------------------------------------

    def _emit(
        self,
        name: str,
        op: str,
        inputs: list[str],
        attrs: Attrs,
        module: str = "",
        parameters: Sequence[pb.ParameterSpec] = (),
    ) -> str:
        for i in inputs:
            if i in self.ids and op != "Embedding":
                raise GraphError(
                    f"node {name!r}: {op} reads the token ids {i!r}; only an Embedding may"
                )
        self.graph.nodes.append(make_node(name, op, inputs, attrs, module, parameters))
        self.secret[name] = name
        return name

    def _alias(self, n: torch.fx.Node, source: torch.fx.Node) -> None:
        self.secret[n.name] = self.secret[source.name]
        for marks in (self.masks, self.expanded):
            if source.name in marks:
                marks.add(n.name)

    def _input(self, value: Any, n: torch.fx.Node) -> str:
        """The graph name of a tensor argument, public ones as Constants."""
        expanded = isinstance(value, torch.fx.Node) and value.name in self.expanded
        if expanded and not _member(n.target, _MASKED_FILL):
            raise GraphError(f"{self._where(n)} reads an expanded mask; only masked_fill may")
        if isinstance(value, torch.fx.Node):
            found = self.secret.get(value.name)
            if isinstance(found, str):
                return found
            if found is not None:
                raise GraphError(f"{self._where(n)} uses the pieces of a split as one tensor")
            return self._constant(value.name, [env[value.name] for env in self.values], n)
        raise GraphError(f"{self._where(n)}: argument {value!r} is not a tensor")

    def _constant(self, name: str, values: list[Any], n: torch.fx.Node) -> str:
        if name in self.constants:
            return self.constants[name]
        first, second = (torch.as_tensor(v).float() for v in values)
        if first.shape != second.shape:
            batched = (
                first.dim() > 0
                and (first.size(0), second.size(0)) == BATCHES
                and first.shape[1:] == second.shape[1:]
                and bool((first == first[:1]).all() and (second == first[:1]).all())
            )
            if not batched:
                raise GraphError(
                    f"{self._where(n)} reads a public value that differs between batches "
                    f"(shapes {list(first.shape)} and {list(second.shape)})"
                )
            first = first[:1]
        elif not torch.equal(first, second):
            raise GraphError(f"{self._where(n)} reads a public value that differs between batches")
        value = first.clamp(-MASK_VALUE, MASK_VALUE).where(first.abs() >= HUGE, first)
        self.constants[name] = self._emit(
            f"{name}_constant",
            "Constant",
            [],
            {"shape": tuple(value.shape), "values": tuple(float(v) for v in value.reshape(-1))},
        )
        return self.constants[name]

    def _scalar(self, value: Any) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        v = float(value)
        return max(-MASK_VALUE, min(MASK_VALUE, v)) if abs(v) >= HUGE else v

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
        if (n.op == "call_method" and t in _IDENTITY_METHODS) or t is F.dropout:
            return self._alias(n, args[0])
        if (n.op == "call_method" and t in _RESHAPES_M) or t in _RESHAPES_F:
            return self._reshape(n, args[0])
        if t is operator.getitem:
            return self._getitem(n, args[0], args[1])
        for group, op in ((_ADD, "Add"), (_SUB, "Sub"), (_RSUB, "RSub"), (_MUL, "Mul")):
            if _member(t, group):
                return self._arithmetic(n, op, args[0], args[1])
        if _member(t, _DIV):
            return self._divide(n, args[0], args[1])
        if _member(t, _MATMUL):
            return self._binary(n, "MatMul", args[0], args[1])
        if _member(t, _SOFTMAX):
            dim = args[1] if len(args) > 1 else kw.get("dim")
            if not isinstance(dim, int):
                raise GraphError(f"{self._where(n)}: softmax needs an explicit dim")
            return self._unary(n, args[0], "Softmax", {"dim": dim})
        if t is F.gelu:
            approximate = str(kw.get("approximate", args[1] if len(args) > 1 else "none"))
            return self._unary(n, args[0], "GELU", {"approximate": approximate})
        if _member(t, set(_UNARY)):
            op, attrs = _UNARY[_key(t)]
            return self._unary(n, args[0], op, attrs)
        if _member(t, _TRANSPOSE) or _member(t, _PERMUTE):
            return self._permute(n, args[0])
        if _member(t, _SPLIT):
            return self._split(n, args[0])
        if _member(t, _POW):
            exponent = args[1]
            if not (isinstance(exponent, int | float) and float(exponent).is_integer()):
                raise GraphError(f"{self._where(n)}: only whole powers are supported")
            if not 1 <= int(exponent) <= 8:
                raise GraphError(f"{self._where(n)}: powers 1 to 8 only, got {exponent}")
            return self._unary(n, args[0], "Pow", {"exponent": int(exponent)})
        if t is torch.cat:
            return self._cat(n, args[0], args[1] if len(args) > 1 else kw.get("dim", 0))
        if _member(t, {torch.mean, "mean"}):
            dims = args[1] if len(args) > 1 else kw.get("dim")
            dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
            keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
            if not dims:
                raise GraphError(f"{self._where(n)}: mean over every dimension mixes the batch")
            return self._unary(n, args[0], "Mean", {"dims": dims, "keepdim": keep})
        if t is torch.where:
            return self._where_op(n, args)
        if _member(t, _EQ | _NE | _EXPAND | _MASKED_FILL):
            return self._mask_op(n, args)
        raise GraphError(f"{self._where(n)} is not a supported op on secret values")

    def _unary(self, n: torch.fx.Node, x: Any, op: str, attrs: Attrs) -> None:
        self._emit(n.name, op, [self._input(x, n)], attrs)

    def _binary(self, n: torch.fx.Node, op: str, x: Any, y: Any) -> None:
        self._emit(n.name, op, [self._input(x, n), self._input(y, n)], {})

    def _is_secret(self, value: Any) -> bool:
        return isinstance(value, torch.fx.Node) and value.name in self.secret

    def _public_scalar(self, value: Any) -> float | None:
        if isinstance(value, torch.fx.Node):
            if value.name in self.secret:
                return None
            values = [env[value.name] for env in self.values]
            values = [v.item() if torch.is_tensor(v) and v.dim() == 0 else v for v in values]
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                if values[0] != values[1]:
                    return None
                return self._scalar(values[0])
            return None
        return self._scalar(value)

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
        if _member(t, _MASKED_FILL):
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
        if x.name not in self.masks:
            raise GraphError(
                f"{self._where(n)} compares or expands a secret value: only the attention mask"
            )
        if _member(t, _EXPAND):
            self._alias(n, x)
            self.expanded.add(n.name)
            return
        c = self._public_scalar(args[1])
        if c not in (0.0, 1.0):
            raise GraphError(f"{self._where(n)}: a mask is compared with 0 or 1 only")
        if (c == 1.0) == _member(t, _EQ):  # m == 1 and m != 0 are m itself
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
        if isinstance(source, _Pieces):
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
        self.secret[n.name] = _Pieces(self._input(x, n), dim, tuple(bounds))

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
