"""The row order of a shuffled job: a public permutation derived from `shuffle_seed`.

Every party, and a plaintext reference, computes the same one. Apart from `spec.py` because it
needs torch, which the coordinator never loads.
"""

from __future__ import annotations

import torch


def epoch_order(rows: int, shuffle_seed: int, epoch: int) -> torch.Tensor:
    """The row order of `epoch` in a shuffled job: public, the same at every party."""
    generator = torch.Generator().manual_seed(shuffle_seed + epoch)
    return torch.randperm(rows, generator=generator)
