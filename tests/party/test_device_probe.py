"""A party daemon configured for a device its machine lacks refuses to start, saying why.

The check runs in a process forked from the workers' fork server, as a job worker would be, so
that neither the daemon nor the fork server initialises CUDA.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from mpcml.cli.exits import EXIT_BAD_INPUT
from mpcml.party.config import PartyConfig
from mpcml.party.metrics import PartyMetrics
from mpcml.party.pool import WorkerPool
from mpcml.runtime.devices import DeviceError

HAS_CUDA = "this machine has CUDA: a missing device cannot be shown here"


def _config(tmp_path: Path, device: str) -> Path:
    path = tmp_path / "party.toml"
    path.write_text(
        'name = "erin"\ndata_address = "127.0.0.1:1"\ncoordinator = "127.0.0.1:2"\n'
        f'device = "{device}"\ninsecure = true\n'
    )
    return path


def _pool(tmp_path: Path, device: str) -> WorkerPool:
    config = PartyConfig.load(_config(tmp_path, device))
    metrics = PartyMetrics(CollectorRegistry(), running=lambda: 0, heartbeat_age=lambda: 0.0)
    return WorkerPool(config, metrics, lambda report: None)


def test_a_cpu_party_asks_nothing(tmp_path: Path) -> None:
    began = time.monotonic()
    _pool(tmp_path, "cpu").check_device()
    assert time.monotonic() - began < 0.5


@pytest.mark.skipif(torch.cuda.is_available(), reason=HAS_CUDA)
def test_a_missing_gpu_is_refused_naming_the_party_and_the_device(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="party 'erin' is configured for device 'cuda:1'"):
        _pool(tmp_path, "cuda:1").check_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason=HAS_CUDA)
def test_mpcml_party_exits_with_the_reason_before_attaching(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpcml.cli.main",
            "party",
            "--config",
            str(_config(tmp_path, "cuda:0")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == EXIT_BAD_INPUT, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: party 'erin' is configured for device 'cuda:0'"), run.stderr
    assert "Traceback" not in run.stderr
