"""bench/report.py on its smallest workloads, through the daemons, so that the report cannot rot.

Logistic regression (2 epochs) trained by mpcml's default on the emulated WAN, and the daemon
jobs of bench/consortium.py at 2 and 3 parties: real daemons, real TLS, the same code
`make bench` runs, written to a folder of the test's own. It takes about 90 s, so `make bench`
runs it first and `make test` leaves it out (marker `bench_smoke`): the suite must stay under
20 minutes in CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.system
@pytest.mark.bench_smoke
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
    wan, consortium = (r["figures"] for r in results)
    assert wan["network"] == "rtt=40ms,bandwidth=352mbit"
    fused = wan["ours"]["0"]["fused"]
    # Trained for real: the secure model matches plaintext's accuracy on the test rows.
    assert fused["accuracy"] >= wan["plain"]["0"] - 0.03, fused["accuracy"]
    # Every round waits at least the emulated one-way delay (20 ms).
    assert fused["epoch_seconds"] >= fused["rounds"] * 0.020, fused
    assert "python bench/train.py --network rtt=40ms,bandwidth=352mbit" in report
    assert "![training.png](report/training.png)" in report
    assert "| logreg, breast cancer | fused |" in report  # its row against the round-trip floor
    # The daemon jobs at 2 and 3 parties: trained for real, each against plaintext.
    (two, three) = consortium["sweeps"]["parties, logreg"]
    assert [two["setting"]["parties"], three["setting"]["parties"]] == [2, 3]
    for row in (two, three):
        assert row["accuracy"] >= consortium["plain"]["logreg"] - 0.03, row
        assert row["rounds"] > 0 and row["seconds"] > 0, row
    assert "## Where mpcml is slower, and why" in report
    assert "of the run time is outside the workers' profiled compute" in report
    for png in ("training.png", "training-layers.png", "accuracy.png", "consortium.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_stack_sweep_is_drawn_as_the_time_each_layer_adds_and_explained(
    tmp_path: Path,
) -> None:
    """The stack plot and the "why" lines read the scaling sweep's rows as measured."""
    sys.path.insert(0, str(ROOT))
    from bench import report

    def row(stack: str, seconds: float) -> dict[str, object]:
        return {"setting": {"stack": stack}, "seconds": seconds, "rounds": 1, "floor": 0.0}

    stack = [
        row("mpcml", 8.0),
        row("TFP", 5.0),
        row("TFP, no TLS", 4.5),
        row("torch PRG", 7.5),
        row("stock CrypTen", 10.0),
    ]
    by_name = {report.SUITES[3].name: {"figures": {"stack": stack}}}
    lines = "\n".join(report.why(by_name))
    assert "The dealer costs 3.00 s of 8.00 s" in lines
    assert "stock CrypTen on gloo 10.00 s (1.25x mpcml's time)" in lines
    assert "8.00 s against 7.50 s with CrypTen's (insecure) torch generators" in lines
    assert report.plot_stack(stack, tmp_path) == ["stack.png"]
    assert (tmp_path / "stack.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A sweep that lacks a row it subtracts draws nothing rather than a wrong bar.
    assert report.plot_stack(stack[:2], tmp_path / "none") == []
    # --render writes the report again from results.json alone, under the command that ran.
    result = {
        "name": report.SUITES[3].name,
        "command": "python bench/scaling.py",
        "returncode": 0,
        "table": "a table",
        "error": "",
        "figures": {"stack": stack},
        "seconds": 1.0,
        "date": "2026-12-07 10:00",
        "commit": "abc1234",
        "report_command": "python bench/report.py --only Scaling",
    }
    (tmp_path / "results.json").write_text(json.dumps([result]))
    assert report.main(["--render", "--out", str(tmp_path)]) == 0
    rendered = (tmp_path / "REPORT.md").read_text()
    assert "Written by `python bench/report.py --only Scaling`" in rendered
    assert "The dealer costs 3.00 s of 8.00 s" in rendered
    assert "(1 s, run 2026-12-07 10:00 at abc1234)" in rendered
