"""`make demo`'s script runs as the README says and agrees with plaintext PyTorch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]


def test_session_demo_trains_like_plaintext_pytorch() -> None:
    env = {**os.environ, "MPCML_DEMO_EPOCHS": "1"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "session_demo.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    row = re.search(r"^\s+1\s+([\d.]+)\s+([\d.]+)\s+[\d.]+$", run.stdout, re.MULTILINE)
    assert row, run.stdout
    secure, plain = float(row.group(1)), float(row.group(2))
    assert abs(secure - plain) <= 0.02 and secure > 0.9
    assert "every party learned the same revealed weights: True" in run.stdout
