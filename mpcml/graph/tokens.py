"""Token rows: what a token dataset's owner shares with the other parties.

Token ids enter a transformer's graph as one-hot rows, their owner encoding them before
sharing (so the word embedding is one secret matrix product and no id is compared), with the
attention mask as the last column (`hf.trace`). Torch-free.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpcml.graph.opspec import GraphError


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
