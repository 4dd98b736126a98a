"""Every implementation stays within its stated error bound in 2- and 3-party MPC (real
sessions: separate processes, the gRPC data plane over mutual TLS, the dealer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mpcml.approx.bounds import error_bound, errors, sample
from tests.support.parties import party_specs, run_specs_on_dealer

pytestmark = pytest.mark.system


@pytest.mark.parametrize("parties", [2, 3])
def test_every_implementation_is_within_its_bound_under_mpc(tmp_path: Path, parties: int) -> None:
    specs = party_specs(tmp_path, parties, "tests.approx.scenarios:every_implementation")
    results = run_specs_on_dealer(tmp_path, specs, timeout=600)
    assert all(r.ok for r in results), [r.traceback for r in results if not r.ok]
    wrong = []
    for case in results[0].value:
        f, name, knobs = case["function"], case["name"], case["knobs"]
        x = sample(f, name, knobs).to(torch.float32).double()
        err = errors(f, name, knobs, case["out"].double(), x)
        bound = error_bound(f, name, knobs)
        if float(err.max()) > bound:
            worst = int(err.argmax())
            wrong.append(
                f"{f} {name} {knobs}: error {float(err.max()):.4g} > bound {bound:.4g} "
                f"at input {x.reshape(-1)[worst] if x.dim() == 1 else x[worst // x.shape[1]]}"
            )
    assert not wrong, "\n".join(wrong)
