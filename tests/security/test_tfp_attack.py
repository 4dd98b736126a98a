"""The TFP attack (docs/security.md): party 0 replays the streams it holds against what was opened.

Under `insecure_provider = "tfp"` it recovers party 1's input exactly; under the dealer (the
default), which only hands party 0 its own share of each triple, no candidate comes near it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.security import scenarios
from tests.support.parties import PartyResult, party_specs, run_specs, run_specs_on_dealer

pytestmark = pytest.mark.system

SEED = 20261202


def _attack(tmp: Path, provider: str) -> list[PartyResult]:
    specs = party_specs(
        tmp, 2, "tests.security.scenarios:replay_attack", scenario_kwargs={"seed": SEED}
    )
    run = run_specs if provider == "tfp" else run_specs_on_dealer
    results = run(tmp, specs, timeout=120)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.traceback}"
    return results


def _closest_error(candidates: torch.Tensor, secret: torch.Tensor) -> float:
    """The smallest worst-element error of any candidate against the secret."""
    return float((candidates - secret.double()).abs().amax(dim=1).min())


@pytest.mark.parametrize("provider", ["tfp", "dealer"])
def test_party_0_replaying_its_streams(tmp_path: Path, provider: str) -> None:
    attacker, victim = _attack(tmp_path, provider)
    secret = scenarios.secret_input(SEED)
    expected = secret * torch.linspace(-2, 2, scenarios.SIZE)
    for r in (attacker, victim):  # the multiplication itself is right either way
        assert torch.allclose(r.value["product"], expected, atol=0.05), r.value["product"]
    streams = int(attacker.value["streams"])
    assert streams == (4 if provider == "tfp" else 5), "the attacker holds every stream"
    assert int(attacker.value["opened"]) == 2, "epsilon and delta were opened"
    error = _closest_error(attacker.value["candidates"], secret)
    if provider == "tfp":
        assert error < 1e-4, f"under TFP the replay should recover the input, off by {error}"
    else:
        # A candidate is the secret plus a uniform 64-bit mask over 2^16: off by ~1e13.
        assert error > 1e6, f"under the dealer a candidate came within {error} of the input"
