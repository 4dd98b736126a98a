"""The whitelisted ops of transformer encoders and decoders, as `lower.py` produces them.

Token ids enter as one-hot rows (their owner encodes them before sharing, so an embedding is one
secret matrix product and no comparison); positions, causal masks and other values that depend
only on the sequence length are public `Constant`s. Every op keeps dimension 0 as the batch.
Torch-free at import, as the whitelist is; the modules are made when a party builds a graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mpcml.graph.opspec import VARIADIC, Attrs, GraphError, OpSpec, crypten_nn

Forward = Callable[..., Any]


def _op(name: str, forward: Callable[[Attrs], Forward]) -> Callable[[Attrs], Any]:
    """A builder of a parameterless module running `forward(attrs)` on the node's inputs."""

    def build(attrs: Attrs) -> Any:
        compute = forward(attrs)

        class _Op(crypten_nn().Module):  # type: ignore[misc]
            SUPPORTS_PLAINTEXT_INPUTS = True  # a Constant's value is public

            def forward(self, x: Any) -> Any:
                return compute(*(x if isinstance(x, list) else [x]))

        _Op.__name__ = name
        return _Op()

    return build


def parse_index(text: str) -> tuple[Any, ...]:
    """An `Index` node's setting ("`:,None,0:4`") as a Python index; nothing is evaluated."""
    items: list[Any] = []
    for part in text.split(","):
        part = part.strip()
        if part == "None":
            items.append(None)
        elif ":" in part:
            bounds = [int(b) if b.strip() else None for b in part.split(":")]
            if len(bounds) > 3:
                raise GraphError(f"index {text!r}: {part!r} is not a slice")
            items.append(slice(*bounds))
        else:
            try:
                items.append(int(part))
            except ValueError:
                raise GraphError(f"index {text!r}: {part!r} is not an integer") from None
    if not items or items[0] != slice(None):
        raise GraphError(f"index {text!r} must keep the batch dimension (start with ':')")
    return tuple(items)


def token_rows(ids: np.ndarray, mask: np.ndarray | None, vocab: int) -> np.ndarray:
    """What a token dataset's owner shares: per position, one-hot ids and the attention mask.

    `ids` (rows x sequence) must be integers in 0..vocab-1; without a mask every position counts.
    """
    if ids.ndim != 2:
        raise GraphError(f"token ids must be rows x sequence, got shape {list(ids.shape)}")
    if not np.all((ids == np.round(ids)) & (ids >= 0) & (ids < vocab)):
        raise GraphError(f"token ids must be integers 0..{vocab - 1} (the model's vocabulary)")
    if mask is None:
        mask = np.ones(ids.shape, dtype=np.float32)
    if mask.shape != ids.shape or not np.all((mask == 0) | (mask == 1)):
        raise GraphError(f"the attention mask must be 0/1 of the ids' shape {list(ids.shape)}")
    rows = np.zeros((*ids.shape, vocab + 1), dtype=np.float32)
    np.put_along_axis(rows, ids.astype(np.int64)[..., None], 1.0, axis=-1)
    rows[..., vocab] = mask
    return rows


def token_vocab(graph: Any) -> int | None:
    """The vocabulary of a graph that reads token rows (an `mpcml.v1.Graph`), else None."""
    return int(graph.token_vocab) or None


def input_shape(graph: Any, row_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The graph's input row for a dataset's rows: token ids become one-hot rows and a mask."""
    vocab = token_vocab(graph)
    return row_shape if vocab is None else (*row_shape, vocab + 1)


def _tokens(a: Attrs) -> Forward:
    vocab = int(a["vocab"])
    if a["part"] == "ids":
        return lambda x: x[..., :vocab]
    return lambda x: x[..., vocab]


def _constant(a: Attrs) -> Any:
    import torch

    value = torch.tensor(a["values"], dtype=torch.float32).reshape(tuple(a["shape"]))
    return crypten_nn().Constant(value)


def _matmul(a: Attrs) -> Forward:
    def compute(x: Any, y: Any) -> Any:
        import torch

        if torch.is_tensor(x):  # a public left factor: (y^T x^T)^T keeps the secret first
            return y.transpose(-1, -2).matmul(x.transpose(-1, -2)).transpose(-1, -2)
        return x.matmul(y)

    return compute


def _where(a: Attrs) -> Forward:
    # where(public condition, x, value) = x * c + value * (1 - c): local, no communication.
    return lambda condition, x: x.mul(condition).add((1 - condition) * float(a["value"]))


def _pow(a: Attrs) -> Forward:
    # Repeated products: CrypTen 0.4.1's pow is wrong for odd exponents (docs/approximations.md).
    def compute(x: Any) -> Any:
        result = x
        for _ in range(int(a["exponent"]) - 1):
            result = result.mul(x)
        return result

    return compute


def _cat(a: Attrs) -> Forward:
    def compute(*xs: Any) -> Any:
        import crypten

        return crypten.cat(list(xs), dim=int(a["dim"]))

    return compute


def _reshape(a: Attrs) -> Forward:
    return lambda x: x.reshape(x.size(0), *a["shape"])


def _mean(a: Attrs) -> Forward:
    def compute(x: Any) -> Any:
        dims = sorted((d % x.dim() for d in a["dims"]), reverse=True)
        for d in dims:
            x = x.mean(d, keepdim=True)
        if not a["keepdim"]:
            for d in dims:
                x = x.squeeze(d)
        return x

    return compute


def _embedding(a: Attrs) -> Any:
    import torch

    class Embedding(crypten_nn().Module):  # type: ignore[misc]
        SUPPORTS_PLAINTEXT_INPUTS = True

        def __init__(self) -> None:
            super().__init__()
            self.register_parameter("weight", torch.zeros(a["num_embeddings"], a["embedding_dim"]))

        def forward(self, x: Any) -> Any:
            if torch.is_tensor(x):  # public ids (positions): a local row selection
                return self.weight[x.long()]
            return x.matmul(self.weight)  # one-hot rows of secret ids

    return Embedding()


def _conv1d(a: Attrs) -> Any:
    import torch

    class Conv1D(crypten_nn().Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.register_parameter("weight", torch.zeros(a["in_features"], a["out_features"]))
            self.register_parameter("bias", torch.zeros(a["out_features"]))

        def forward(self, x: Any) -> Any:
            return x.matmul(self.weight).add(self.bias)

    return Conv1D()


def _layer_norm(a: Attrs, choice: Any = None) -> Any:
    import torch

    from mpcml.approx.implementations import apply
    from mpcml.approx.plan import Choice

    rsqrt = choice or Choice("", "rsqrt")
    shape = tuple(a["normalized_shape"])

    class LayerNorm(crypten_nn().Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.register_parameter("weight", torch.ones(shape))
            self.register_parameter("bias", torch.zeros(shape))

        def forward(self, x: Any) -> Any:
            centred = x.sub(x.mean(-1, keepdim=True))
            variance = centred.square().mean(-1, keepdim=True).add(float(a["eps"]))
            scale = apply("rsqrt", rsqrt.implementation, variance, rsqrt.knobs)
            return centred.mul(scale).mul(self.weight).add(self.bias)

    return LayerNorm()


def _function(function: str) -> Callable[[Attrs], Any]:
    """GELU, SiLU: the registry's CrypTen-based implementation unless the plan names another."""

    def build(a: Attrs) -> Any:
        from mpcml.approx.plan import Choice
        from mpcml.graph.build import approximated

        return approximated(Choice("", function))

    return build


def transformer_ops() -> list[OpSpec]:
    """The ops `ops.SPECS` adds for transformers."""
    return [
        OpSpec("Tokens", 1, _op("Tokens", _tokens), settings=("vocab", "part")),
        OpSpec("Constant", 0, _constant, settings=("shape", "values")),
        OpSpec(
            "Embedding",
            1,
            _embedding,
            parameters=("weight",),
            settings=("num_embeddings", "embedding_dim"),
        ),
        OpSpec(
            "Conv1D",
            1,
            _conv1d,
            parameters=("weight", "bias"),
            settings=("in_features", "out_features"),
        ),
        OpSpec(
            "LayerNorm",
            1,
            _layer_norm,
            parameters=("weight", "bias"),
            settings=("normalized_shape", "eps"),
            interior=_layer_norm,
        ),
        OpSpec("GELU", 1, _function("gelu"), settings=("approximate",)),
        OpSpec("SiLU", 1, _function("silu")),
        OpSpec(
            "Affine",
            1,
            _op("Affine", lambda a: lambda x: x.mul(float(a["scale"])).add(float(a["shift"]))),
            settings=("scale", "shift"),
        ),
        OpSpec("Sub", 2, _op("Sub", lambda a: lambda x, y: x.sub(y))),
        OpSpec("Mul", 2, _op("Mul", lambda a: lambda x, y: x.mul(y))),
        OpSpec("MatMul", 2, _op("MatMul", _matmul)),
        OpSpec("Pow", 1, _op("Pow", _pow), settings=("exponent",)),
        OpSpec("Where", 2, _op("Where", _where), settings=("value",)),
        OpSpec("Reshape", 1, _op("Reshape", _reshape), settings=("shape",)),
        OpSpec(
            "Permute",
            1,
            _op("Permute", lambda a: lambda x: x.permute(*a["dims"])),
            settings=("dims",),
        ),
        OpSpec(
            "Index",
            1,
            _op("Index", lambda a: (lambda index: lambda x: x[index])(parse_index(a["index"]))),
            settings=("index",),
        ),
        OpSpec(
            "Narrow",
            1,
            _op("Narrow", lambda a: lambda x: x.narrow(a["dim"], a["start"], a["length"])),
            settings=("dim", "start", "length"),
        ),
        OpSpec("Cat", VARIADIC, _op("Cat", _cat), settings=("dim",)),
        OpSpec("Mean", 1, _op("Mean", _mean), settings=("dims", "keepdim")),
    ]
