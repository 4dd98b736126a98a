"""Hugging Face transformers as mpcml graphs: built from a class name and a JSON config.

No weights are downloaded and nothing is unpickled: the model is constructed from its config
(seeded random weights, which only the capture sees), rebuilt with eager attention and no cache
(`traceable`), and captured with torch.export on token rows of a fixed sequence length
(`capture.capture_tokens`), as every other model is. The party that owns the weights keeps a
`state_dict` of the same class, read with `weights_only=True`; its keys are the graph's
`<module>.<parameter>` names.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mpcml.graph import capture
from mpcml.graph.ops import GraphError
from mpcml.proto.v1 import graph_pb2 as pb

CLASSES = (
    "BertModel",
    "BertForSequenceClassification",
    "RobertaModel",
    "RobertaForSequenceClassification",
    "DistilBertModel",
    "DistilBertForSequenceClassification",
    "GPT2Model",
    "GPT2LMHeadModel",
    "GPT2ForSequenceClassification",
)
"""The model classes a job may name: encoders with a classification head, decoders with
next-token logits or a classification head on their last token. Each is captured at a fixed
sequence length."""
_GELU_FORMS = {
    "GELUActivation": "none",
    "NewGELUActivation": "tanh",
    "GELUTanh": "tanh",
    "FastGELUActivation": "tanh",
    "PytorchGELUTanh": "tanh",
}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise GraphError(
            "Hugging Face models need the `transformers` package (pip install 'transformers<5')"
        ) from None
    return transformers


def from_config(class_name: str, config: Mapping[str, Any], seed: int = 0) -> Any:
    """An untrained `class_name` (one of CLASSES) built from a config dict, in eval mode."""
    if class_name not in CLASSES:
        raise GraphError(
            f"model class {class_name!r} is not supported; supported: {', '.join(CLASSES)}"
        )
    transformers = _transformers()
    cls = getattr(transformers, class_name)
    settings = dict(config)
    settings.pop("architectures", None)
    settings.update(attn_implementation="eager", use_cache=False)
    try:
        hf_config = cls.config_class(**settings)
    except (TypeError, ValueError) as exc:
        raise GraphError(f"the {class_name} config is invalid: {exc}") from None
    torch.manual_seed(seed)
    return cls(hf_config).eval()


def is_transformers_model(model: Any) -> bool:
    """Whether `model` is a Hugging Face model, judged by its classes' modules."""
    return isinstance(model, torch.nn.Module) and any(
        c.__module__.startswith("transformers.") for c in type(model).__mro__
    )


def traceable(model: Any) -> Any:
    """The user's model as the lowering reads it: eager attention, no cache, eval mode.

    A model built the ordinary way uses sdpa attention, which some families (BERT) fix when
    they are built, and keeps a key-value cache: it is rebuilt from a copy of its config with
    the user's weights. The user's model itself is not changed.
    """
    name = type(model).__name__
    if name not in CLASSES:
        raise GraphError(
            f"the {name} (module {type(model).__module__}) is not a supported model class; "
            f"supported: {', '.join(CLASSES)}"
        )
    config = model.config
    eager = config._attn_implementation == "eager"
    gelus = [n for n, m in model.named_modules() if type(m).__name__ in _GELU_FORMS]
    if eager and not getattr(config, "use_cache", False) and not model.training and not gelus:
        return model
    settings = copy.deepcopy(config)
    settings._attn_implementation = "eager"
    settings.use_cache = False
    rebuilt = type(model)(settings)
    rebuilt.load_state_dict(model.state_dict())
    for name in gelus:  # one GELU op (a plan knob), not the formula's pieces
        parent, _, leaf = name.rpartition(".")
        form = _GELU_FORMS[type(rebuilt.get_submodule(name)).__name__]
        setattr(rebuilt.get_submodule(parent), leaf, torch.nn.GELU(approximate=form))
    return rebuilt.eval()


def from_directory(path: str | Path) -> Any:
    """The model a `save_pretrained` directory holds, built from its config.json alone.

    Its class is the config's first `architectures` entry. The weight files are not read: the
    job's weights are a party's, and the graph carries none.
    """
    config = read_config(Path(path) / "config.json")
    names = config.get("architectures") or []
    if not names or not isinstance(names[0], str):
        raise GraphError(f"the model config in {path} names no class in `architectures`")
    return from_config(names[0], config)


def read_config(path: str | Path) -> dict[str, Any]:
    """A config file (JSON, as `config.save_pretrained` writes it)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise GraphError(f"cannot read the model config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise GraphError(f"the model config {path} is not a JSON object")
    return data


@dataclass(frozen=True)
class SequenceModel:
    """A Hugging Face model to run on token sequences of a fixed length.

    `inputs`: the model's arguments the token dataset provides: "input_ids", and by default
    "attention_mask" too (the dataset's mask, or ones without one), for every family.
    """

    model: Any
    sequence: int
    inputs: tuple[str, ...] = field(default=())

    def names(self) -> tuple[str, ...]:
        """The inputs: both unless named."""
        return self.inputs or ("input_ids", "attention_mask")


class _TokenRows(torch.nn.Module):
    """The user's model on token rows as a party shares them (`tokens.token_rows`).

    The ids arrive one-hot, so the word embedding is their product with its weight. Positions
    and token types follow the sequence length only: they are public, given for one row (the
    model broadcasts them over the batch). RoBERTa numbers positions from `padding_idx + 1`
    as for rows padded on the right, as its tokenizer pads them (it would number them from the
    ids, which are secret): every real token's output is the model's, and the padding
    positions, which the mask hides from every real token, differ.
    """

    def __init__(self, model: Any, vocab: int, masked: bool) -> None:
        super().__init__()
        self.model, self.vocab, self.masked = model, vocab, masked
        config = model.config
        self.first = int(config.pad_token_id) + 1 if config.model_type == "roberta" else 0
        self.decoder = config.model_type == "gpt2"
        arguments = inspect.signature(model.forward).parameters
        # GPT-2 takes token types too, but looks them up in its word embedding: none there
        self.types = "token_type_ids" in arguments and bool(getattr(config, "type_vocab_size", 0))
        self.positions = "position_ids" in arguments

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        sequence = rows.size(1)
        embeds = rows[..., : self.vocab] @ self.model.get_input_embeddings().weight
        extra: dict[str, Any] = {}
        if self.positions:
            extra["position_ids"] = (torch.arange(sequence) + self.first).unsqueeze(0)
        if self.types:
            extra["token_type_ids"] = torch.zeros((1, sequence), dtype=torch.long)
        mask = rows[..., self.vocab]
        if self.masked:
            if self.decoder:  # causal, 4D and additive, as `create_causal_mask` makes it
                causal = torch.ones(sequence, sequence).tril()
                keep = causal[None, None] * mask[:, None, None, :]
                extra["attention_mask"] = (1.0 - keep) * torch.finfo(embeds.dtype).min
            else:
                extra["attention_mask"] = mask
        if type(self.model).__name__ == "GPT2ForSequenceClassification":
            return self._last_token(embeds, mask, extra)
        out = self.model(inputs_embeds=embeds, return_dict=False, **extra)
        return out[0]  # type: ignore[no-any-return]

    def _last_token(self, embeds: torch.Tensor, mask: torch.Tensor, extra: Any) -> torch.Tensor:
        """GPT-2's classification: the logits of each row's last real token.

        Hugging Face finds it from the ids (the last that is not the pad token), which are
        secret here; for rows padded on the right it is the last position whose mask is 1:
        m[j] - m[j + 1] is 1 there and 0 elsewhere, and the pooled logits are a product with it.
        """
        hidden = self.model.transformer(inputs_embeds=embeds, return_dict=False, **extra)[0]
        logits: torch.Tensor = self.model.score(hidden)
        following = torch.nn.functional.pad(mask[:, 1:], (0, 1))
        last = (mask - following).unsqueeze(-1)
        return (logits * last).sum(1)


def trace(model: SequenceModel) -> pb.Graph:
    """The graph of a Hugging Face model at its sequence length; GraphError names what fails."""
    hf = traceable(model.model)
    names = model.names()
    unknown = set(names) - {"input_ids", "attention_mask"}
    if unknown or "input_ids" not in names:
        raise GraphError(f"token inputs are input_ids and attention_mask, not {sorted(unknown)}")
    limit = getattr(hf.config, "max_position_embeddings", None) or getattr(
        hf.config, "n_positions", None
    )
    if model.sequence < 1 or (limit is not None and model.sequence > limit):
        raise GraphError(f"sequence length {model.sequence} is outside 1..{limit} for this model")
    vocab = int(hf.config.vocab_size)
    rows = _TokenRows(hf, vocab, "attention_mask" in names)
    return capture.capture_tokens(rows, model.sequence, vocab, prefix="model.")
