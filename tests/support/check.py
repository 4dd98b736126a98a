"""The closeness check CrypTen's own tests use (crypten/test/test_mpc.py `_check`)."""

from __future__ import annotations

import torch


def crypten_close(
    result: torch.Tensor, reference: torch.Tensor, tolerance: float = 0.05
) -> tuple[bool, str]:
    """True where every element is within `tolerance` relative or `tolerance * 0.2` absolute."""
    if result.shape != reference.shape:
        return False, f"shape {tuple(result.shape)} != reference {tuple(reference.shape)}"
    if result.numel() == 0:
        return True, "no elements"
    result, reference = result.double(), reference.double()
    diff = (result - reference).abs()
    norm_diff = diff / (result.abs() + reference.abs())
    ok = norm_diff.le(tolerance) | diff.le(tolerance * 0.2)
    worst = int(torch.argmax(torch.where(ok, 0.0, diff + 1.0).reshape(-1)))
    detail = (
        f"worst element {worst}: got {result.reshape(-1)[worst].item():.6g}, expected "
        f"{reference.reshape(-1)[worst].item():.6g}"
    )
    return bool(ok.all()), detail
