"""Hugging Face transformers as mpcml graphs: built from a class name and a JSON config.

No weights are downloaded and nothing is unpickled: the model is constructed from its config
(seeded random weights, which only the tracing sees), traced with `transformers.utils.fx`, and
lowered (`lower.py`) at a fixed sequence length. The party that owns the weights keeps a
`state_dict` of the same class, read with `weights_only=True`; its keys are the graph's
`<module>.<parameter>` names.
"""

from __future__ import annotations

import bisect
import copy
import dis
import importlib
import inspect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from mpcml.graph import hf_masks
from mpcml.graph.lower import BATCHES, lower
from mpcml.graph.ops import Attrs, GraphError
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
)
"""The model classes a job may name: encoders with a classification head and decoders with
next-token logits. Each traces at a fixed sequence length without padding-dependent pooling."""
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
    if eager and not getattr(config, "use_cache", False) and not model.training:
        return model
    settings = copy.deepcopy(config)
    settings._attn_implementation = "eager"
    settings.use_cache = False
    rebuilt = type(model)(settings)
    rebuilt.load_state_dict(model.state_dict())
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

    `inputs`: the model's arguments the token dataset provides: "input_ids", and for encoders
    "attention_mask" (the dataset's mask, or ones without one).
    """

    model: Any
    sequence: int
    inputs: tuple[str, ...] = field(default=())

    def names(self) -> tuple[str, ...]:
        """The inputs, by default those of the model's family."""
        if self.inputs:
            return self.inputs
        decoder = self.model.config.model_type == "gpt2"
        return ("input_ids",) if decoder else ("input_ids", "attention_mask")


def _causal_mask_call(
    config: Any, input_embeds: Any, attention_mask: Any = None, **rest: Any
) -> Any:
    if attention_mask is not None:
        raise GraphError("a decoder runs without an attention mask: its sequences are not padded")
    return hf_masks.causal_mask(input_embeds)


def _module_op(m: torch.nn.Module) -> tuple[str, Attrs] | None:
    name = type(m).__name__
    if name in _GELU_FORMS:
        return "GELU", {"approximate": _GELU_FORMS[name]}
    if name == "SiLUActivation":
        return "SiLU", {}
    if name == "Conv1D" and hasattr(m, "nf"):  # transformers.pytorch_utils.Conv1D: x W + b
        weight: Any = m.weight
        return "Conv1D", {"in_features": int(weight.shape[0]), "out_features": int(weight.shape[1])}
    return None


def _examples(vocab: int, sequence: int, names: tuple[str, ...]) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for rows in BATCHES:
        example = {"input_ids": torch.randint(0, vocab, (rows, sequence), generator=generator)}
        if "attention_mask" in names:
            mask = torch.ones(rows, sequence, dtype=torch.long)
            mask[-1, sequence // 2 :] = 0  # one padded row: the mask must flow as a value
            example["attention_mask"] = mask
        out.append(example)
    return out


def trace(model: SequenceModel) -> pb.Graph:
    """The graph of a Hugging Face model at its sequence length; GraphError names what fails."""
    transformers = _transformers()
    from transformers.utils import fx as hf_fx

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
    activations = [
        getattr(transformers.activations, n)
        for n in (*_GELU_FORMS, "SiLUActivation")
        if hasattr(transformers.activations, n)
    ]
    leaves = (transformers.pytorch_utils.Conv1D, *activations)

    class Proxy(hf_fx.HFProxy):
        def __iter__(self) -> Any:
            whole: Any = self
            # `(*x.shape[:-1], -1)`: a shape's length is known from the meta tensors.
            metadata = getattr(self, "_metadata", None)
            if isinstance(metadata, tuple):
                return iter([whole[i] for i in range(len(metadata))])
            # `a, b, c = x.shape`: what torch.fx's Proxy.__iter__ does, which reads the
            # unpacking from its caller's bytecode (so it cannot be called from here).
            caller = inspect.currentframe()
            assert caller is not None and caller.f_back is not None
            code = caller.f_back
            instructions = list(dis.get_instructions(code.f_code))
            at = bisect.bisect_left(instructions, code.f_lasti, key=lambda i: i.offset)
            if instructions[at].opname == "UNPACK_SEQUENCE":
                return iter([whole[i] for i in range(instructions[at].argval)])
            return self.tracer.iter(self)

    class Tracer(hf_fx.HFTracer):
        def __init__(self) -> None:
            super().__init__(autowrap_modules=(math, hf_masks))  # type: ignore[no-untyped-call]

        def proxy(self, node: Any) -> Any:
            return Proxy(node, self)

        def is_leaf_module(self, m: torch.nn.Module, qualified_name: str) -> bool:
            return isinstance(m, leaves) or super().is_leaf_module(m, qualified_name)

    family = importlib.import_module(type(hf).__module__)
    vocab = int(hf.config.vocab_size)
    tokens = {n: "ids" if n == "input_ids" else "mask" for n in names}
    hf_masks.CONFIGS.append(hf.config)
    try:
        conv1d = transformers.pytorch_utils.Conv1D
        metas = {conv1d: lambda m, x: x.new_empty((*x.shape[:-1], m.nf))}  # for split's pieces
        with (
            mock.patch.object(family, "create_causal_mask", _causal_mask_call, create=True),
            mock.patch.object(
                family,
                "create_position_ids_from_input_ids",
                hf_masks.right_padded_positions,
                create=True,
            ),
            mock.patch.dict(hf_fx._MANUAL_META_OVERRIDES, metas),
        ):
            try:
                traced = hf_fx.symbolic_trace(hf, input_names=list(names), tracer_cls=Tracer)
            except GraphError:
                raise
            except Exception as exc:  # tracing raises many types on what it cannot follow
                raise GraphError(
                    f"the {type(hf).__name__} cannot be traced with torch.fx: {exc}"
                ) from None
        return lower(
            traced,
            _examples(vocab, model.sequence, names),
            tokens,
            vocab,
            model.sequence,
            module_op=_module_op,
            public_functions=(hf_masks.causal_mask, hf_masks.right_padded_positions),
        )
    finally:
        hf_masks.CONFIGS.pop()
