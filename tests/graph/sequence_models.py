"""Small transformers and an op-by-op model for the sequence tests, the same in every process."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mpcml.graph import hf
from mpcml.graph.capture import capture_tokens
from mpcml.graph.tokens import token_rows
from mpcml.proto.v1 import graph_pb2 as pb

VOCAB = 40
SEQUENCE = 16
ROWS = 4
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # initializer_range 0.3: every LayerNorm's variance inside CrypTen's inverse square root's
    # domain, [0.1, 200] (HF's default 0.02 gives variances near 0.001, which only the tuner's
    # scaled rsqrt reaches).
    "bert": (
        "BertForSequenceClassification",
        {
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 32,
            "num_labels": 3,
            "initializer_range": 0.3,
        },
    ),
    "roberta": (
        "RobertaForSequenceClassification",
        {
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": SEQUENCE + 3,  # positions count from pad_token_id + 1
            "num_labels": 3,
            "initializer_range": 0.3,
            "pad_token_id": 1,
        },
    ),
    "distilbert": (
        "DistilBertForSequenceClassification",
        {
            "vocab_size": VOCAB,
            "dim": 64,
            "n_layers": 2,
            "n_heads": 2,
            "hidden_dim": 128,
            "max_position_embeddings": 32,
            "num_labels": 3,
            "initializer_range": 0.3,
        },
    ),
    "gpt2": (
        "GPT2LMHeadModel",
        {
            "vocab_size": VOCAB,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 2,
            "n_positions": 32,
            "initializer_range": 0.3,
        },
    ),
}
CONFIGS["gpt2-classifier"] = (
    "GPT2ForSequenceClassification",
    {**CONFIGS["gpt2"][1], "num_labels": 3, "pad_token_id": 0},
)


def ordinary(name: str) -> Any:
    """The model `name` as a user builds it: its class on its config, nothing else (sdpa
    attention, the key-value cache on, training mode), with the weights of `transformer`."""
    import transformers

    cls, config = CONFIGS[name]
    model_class = getattr(transformers, cls)
    model = model_class(model_class.config_class(**config))
    model.load_state_dict(transformer(name).model.state_dict())
    return model


def transformer(name: str) -> hf.SequenceModel:
    """The seeded model `name` (a key of CONFIGS) at SEQUENCE tokens."""
    cls, config = CONFIGS[name]
    model = hf.from_config(cls, config, seed=3)
    if name.startswith("gpt2"):  # its first LayerNorm sees wte + wpe alone: keep it clear of 0.1
        with torch.no_grad():
            model.transformer.wpe.weight.mul_(2.0)
    return hf.SequenceModel(model, SEQUENCE)


@functools.cache
def _graph_bytes(name: str) -> bytes:
    return hf.trace(transformer(name)).SerializeToString()


def graph(name: str) -> pb.Graph:
    """The graph of `transformer(name)`, captured once per process (a capture takes seconds)."""
    return pb.Graph.FromString(_graph_bytes(name))


def tokens(
    seed: int = 0, rows: int = ROWS, padded: bool = True, pad: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and an attention mask (one row padded from the middle when `padded`).

    With `pad`, as a tokenizer writes them: that id where the mask is 0 and nowhere else.
    """
    ids = np.random.default_rng(seed).integers(0, VOCAB, (rows, SEQUENCE))
    mask = np.ones((rows, SEQUENCE), dtype=np.float32)
    if padded:
        mask[1, SEQUENCE // 2 + 3 :] = 0
    if pad is not None:
        ids[ids == pad] = (pad + 1) % VOCAB
        ids[mask == 0] = pad
    return ids, mask


def model_tokens(
    name: str, seed: int = 0, rows: int = ROWS, padded: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens the tests give model `name`: one row padded on the right (GPT-2's too: its
    padding mask joins its causal mask), with RoBERTa's pad token for RoBERTa."""
    pad = CONFIGS[name][1].get("pad_token_id") if name in ("roberta", "gpt2-classifier") else None
    return tokens(seed, rows, True if padded is None else padded, pad)


def plaintext(model: hf.SequenceModel, ids: np.ndarray, mask: np.ndarray | None) -> torch.Tensor:
    """The Hugging Face model's logits."""
    kwargs = {"input_ids": torch.from_numpy(ids)}
    if mask is not None and "attention_mask" in model.names():
        kwargs["attention_mask"] = torch.from_numpy(mask).long()
    with torch.no_grad():
        out: torch.Tensor = model.model(**kwargs).logits
    return out


class Ops(nn.Module):
    """Ops the two models leave out, on token rows: sub, mul, pow, mean, cat, silu, chunk, and
    a product with the attention mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        ids, mask = rows[..., :VOCAB], rows[..., VOCAB]
        h = self.norm(ids @ self.embed.weight)
        centred = h - h.mean(-1, keepdim=True)
        left, right = centred.chunk(2, dim=-1)
        product = left * right + 0.5 * left.pow(3)
        joined = torch.cat([F.silu(product), F.gelu(right, approximate="tanh")], dim=-1)
        masked = joined * mask.unsqueeze(-1)
        return masked.mean(1) - 2.0


def ops_model() -> nn.Module:
    torch.manual_seed(4)
    model = Ops().eval()
    with torch.no_grad():
        model.embed.weight.mul_(2.0)
    return model


def ops_graph() -> pb.Graph:
    """The Ops model captured on token rows."""
    return capture_tokens(ops_model(), SEQUENCE, VOCAB)


def rows(ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """What the token owner shares."""
    return token_rows(ids, mask, VOCAB)
