"""The values of a sequence model's trace, sorted into public and secret, and graph nodes.

The lowering (`lower.py`) runs the trace on example batches of BATCHES rows. A value computed
from the token inputs or from weights is secret and becomes a graph node; any other is public
and is folded into its consumers' settings or into a `Constant`, which must not change with the
batch other than by repeating one row.

Masks: torch writes "minus infinity" as the float's lowest value, which no fixed-point ring
holds. A public number of magnitude at least `HUGE` is clipped to `MASK_VALUE`: a softmax weight
of e^-16 (1e-7) is zero in CrypTen's 16 fractional bits, and a score masked twice (GPT-2's
`where` and its additive mask) stays inside the exp's domain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from mpcml.graph.ops import GRAPH_VERSION, Attrs, GraphError
from mpcml.graph.trace import make_node
from mpcml.proto.v1 import graph_pb2 as pb

BATCHES = (2, 3)
"""The example batch sizes: a public value that follows them is batch-dependent."""
HUGE = 1e9
MASK_VALUE = 16.0
TOKENS = "tokens"
"""The graph's one input: each row one-hot token ids and the attention mask (`Tokens`)."""


@dataclass(frozen=True)
class Pieces:
    """A secret tensor split along `dim` (split, chunk): pieces are taken by `getitem`."""

    source: str
    dim: int
    bounds: tuple[tuple[int, int], ...]


class TraceValues:
    """The example runs' values of one trace, which of them are secret, and the graph so far."""

    def __init__(self, runs: int) -> None:
        self.values: list[dict[str, Any]] = [{} for _ in range(runs)]
        self.secret: dict[str, str | Pieces] = {}
        self.ids: set[str] = set()
        """Graph nodes holding one-hot token ids: only an Embedding may read them."""
        self.constants: dict[str, str] = {}
        self.graph = pb.Graph(version=GRAPH_VERSION, inputs=[TOKENS])

    def _where(self, n: torch.fx.Node) -> str:
        target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "?")
        stack = n.meta.get("stack_trace") or ""
        line = stack.strip().splitlines()[-2].strip() if stack.count("\n") > 1 else ""
        return f"node {n.name!r} ({n.op} {target}{', ' + line if line else ''})"

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

    def _input(self, value: Any, n: torch.fx.Node) -> str:
        """The graph name of a tensor argument, public ones as Constants."""
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
