"""CUDA shares over the data plane (run where a GPU is present; skipped elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.check import crypten_close
from tests.support.parties import run_session
from tests.transport import scenarios

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA device on this machine: the GPU path of the data plane is tested only "
        "where one is present",
    ),
]


def test_cuda_shares_compute_like_plaintext_pytorch(tmp_path: Path) -> None:
    results = run_session(
        tmp_path, 2, "tests.transport.scenarios:cuda_ops", session_kwargs={"device": "cuda:0"}
    )
    assert all(r.ok for r in results), [r.traceback for r in results]
    expected = scenarios.reference(2)
    for r in results:
        for op, value in r.value.items():
            ok, detail = crypten_close(value, expected[op])
            assert ok, f"{op} on rank {r.rank}: {detail}"
