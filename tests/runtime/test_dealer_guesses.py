"""Rank 0 asks the dealer for a batch's tuples ahead, guessing them from a past batch: with a
real dealer process and 2 or 3 party processes over mutual TLS, every batch's result matches
plaintext PyTorch whether the guess was right, absent or wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime import scenarios
from tests.support.parties import party_specs, run_specs_on_dealer

pytestmark = pytest.mark.system


@pytest.mark.parametrize("world_size", [2, 3])
def test_guessed_tuples_give_the_plaintext_result(tmp_path: Path, world_size: int) -> None:
    specs = party_specs(tmp_path, world_size, "tests.runtime.scenarios:guessed_batches")
    results = run_specs_on_dealer(tmp_path, specs, timeout=240)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.traceback}"
    w, xs = scenarios.guess_inputs()
    expected = torch.cat(
        [
            getattr(torch, activation)(x @ w) * x.sum(1, keepdim=True)
            for (activation, _), x in zip(scenarios.GUESS_BATCHES, xs, strict=True)
        ]
    )
    for r in results:
        assert torch.allclose(r.value["outputs"], expected, atol=0.05), (
            f"rank {r.rank}: off by {(r.value['outputs'] - expected).abs().max():.4f}"
        )
    tuples = results[0].value["tuples"].tolist()
    guessed = results[0].value["guessed"].tolist()
    assert tuples[0] == tuples[1] == tuples[2] > 10, tuples
    # The first batch has no past, the short one none like it; batches 2 and 3 are guessed
    # whole but their first tuple; the relu batch starts like the sigmoid ones, then differs.
    assert guessed[:4] == [0, tuples[0] - 1, tuples[0] - 1, 0], (guessed, tuples)
    assert guessed[4] < tuples[4] - 1, (guessed, tuples)
    for r in results[1:]:
        assert r.value["guessed"].sum() == 0, "only rank 0 talks to the dealer"


def test_a_correction_over_the_chunk_size_comes_in_chunks_asked_or_guessed(
    tmp_path: Path,
) -> None:
    specs = party_specs(tmp_path, 2, "tests.runtime.scenarios:chunked_products")
    results = run_specs_on_dealer(tmp_path, specs, timeout=240)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.traceback}"
    a, b, x, y = scenarios.chunk_inputs()
    for r in results:
        assert torch.allclose(r.value["small"], (a * b).expand(4, 4, 3), atol=0.01)
        assert torch.allclose(r.value["big"], (x * y).expand(2, *scenarios.BIG), atol=0.01)
    # Rank 0: the big correction in chunks in both batches, the second's guessed ahead.
    assert int(results[0].value["chunked"]) == 2, results[0].value
    assert int(results[0].value["guessed"]) == 2, results[0].value
