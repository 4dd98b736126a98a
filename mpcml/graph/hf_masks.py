"""Public values a model computes from its inputs' shape, as traced calls, for `hf.py`.

A module of its own because torch.fx records a call, instead of tracing into it, only for the
public functions of a module it is given: these are the only ones here.
"""

from __future__ import annotations

from typing import Any

import torch

CONFIGS: list[Any] = []
"""The config of the decoder being traced and lowered, for `causal_mask`."""


def causal_mask(input_embeds: torch.Tensor) -> Any:
    """The decoder's causal mask, a traced call: it depends on the shape only, so it is public.

    Hugging Face's `create_causal_mask` takes the config, which torch.fx cannot record.
    """
    from transformers.masking_utils import create_causal_mask

    sequence = input_embeds.shape[1]
    return create_causal_mask(
        config=CONFIGS[-1],
        input_embeds=input_embeds,
        attention_mask=None,
        cache_position=torch.arange(sequence),
        past_key_values=None,
        position_ids=None,
    )


def right_padded_positions(input_ids: torch.Tensor, padding_idx: int, *rest: Any) -> Any:
    """RoBERTa's position ids, public: `padding_idx + 1 + i` at position i of every row.

    RoBERTa numbers a row's tokens from its ids (padding tokens get `padding_idx`), which would
    make the positions secret. For rows padded on the right, as its tokenizer pads them, the
    real tokens get these same numbers, and the padding tokens, which the attention mask hides
    from every real token, get others: every real token's output is the model's.
    """
    rows, sequence = input_ids.shape
    return (torch.arange(sequence) + padding_idx + 1).expand(rows, sequence)
