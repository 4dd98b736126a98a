"""The decoder's causal mask as one traced call, for `hf.py`.

A module of its own because torch.fx records a call, instead of tracing into it, only for the
public functions of a module it is given: this is the only one here.
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
