"""mpcml's BatchedSGD against CrypTen's SGD and torch's, in real 2- and 3-party sessions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime import scenarios
from tests.support.parties import run_session

pytestmark = pytest.mark.system


@pytest.mark.parametrize("world_size", [2, 3])
def test_batched_sgd_updates_like_torch_in_fewer_rounds(tmp_path: Path, world_size: int) -> None:
    weights, grads = scenarios.sgd_inputs()
    params = [w.clone().requires_grad_(True) for w in weights]
    settings = scenarios.SGD_SETTINGS
    plain = torch.optim.SGD(
        params,
        lr=settings["lr"],
        momentum=settings["momentum"],
        weight_decay=settings["weight_decay"],
    )
    for step in grads:
        for p, g in zip(params, step, strict=True):
            p.grad = g.clone()
        plain.step()
    expected = torch.cat([p.detach().flatten() for p in params])

    results = run_session(tmp_path, world_size, "tests.runtime.scenarios:sgd_steps")
    for r in results:
        assert r.ok, r.traceback
        for name in ("crypten", "batched"):
            assert (r.value[name] - expected).abs().max() <= 1e-3, name
        stock, batched = r.value["crypten_rounds"].item(), r.value["batched_rounds"].item()
        if world_size == 2:
            assert stock == batched == 0  # two parties truncate locally
        else:
            # A truncation per product with a public float: CrypTen's per product (weight
            # decay, momentum, learning rate) and parameter (4 of them), mpcml's one a step.
            steps, truncation = len(scenarios.sgd_inputs()[1]), r.value["truncation_rounds"].item()
            assert batched == steps * truncation > 0
            # The first step has no buffer to multiply by the momentum yet.
            assert stock == (2 + 3 * (steps - 1)) * len(scenarios.SGD_SHAPES) * truncation
