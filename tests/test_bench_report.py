"""bench/report.py on its smallest workload, through the daemons, so that the report cannot rot.

Logistic regression (2 epochs) trained by mpcml's default on the emulated WAN: real daemons,
real TLS, the same code `make bench` runs, written to a folder of the test's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.system
def test_the_smoke_report_trains_on_the_emulated_wan_and_writes_tables_plots_and_figures(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "bench/report.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "REPORT.md").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    (wan,) = (r["figures"] for r in results)
    assert wan["network"] == "rtt=40ms,bandwidth=352mbit"
    fused = wan["ours"]["0"]["fused"]
    # Trained for real: the secure model matches plaintext's accuracy on the test rows.
    assert fused["accuracy"] >= wan["plain"]["0"] - 0.03, fused["accuracy"]
    # Every round waits at least the emulated one-way delay (20 ms).
    assert fused["epoch_seconds"] >= fused["rounds"] * 0.020, fused
    assert "python bench/train.py --network rtt=40ms,bandwidth=352mbit" in report
    assert "![training.png](report/training.png)" in report
    assert "| logreg, breast cancer | fused |" in report  # its row against the round-trip floor
    for png in ("training.png", "training-layers.png", "accuracy.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
