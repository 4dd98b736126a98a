"""`mpcml demo` (what `make demo` runs): the whole system on loopback, compared with plaintext,
and every process it started is gone afterwards, also after Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.system


def _processes_in(workdir: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == workdir:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_demo_reports_secure_results_that_match_plaintext(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpcml.cli.main",
            "demo",
            "--json",
            "--epochs",
            "1",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["tls"] is True
    names = [t["name"] for t in report["tasks"]]
    assert len(names) == 4 and names[2].startswith("digits"), names
    assert names[3].startswith("sentiment"), names
    for task in report["tasks"]:
        assert 0.9 < task["secure_accuracy"] <= 1.0, task
        assert abs(task["secure_accuracy"] - task["plaintext_accuracy"]) <= 0.01, task
        assert task["max_abs_diff"] <= 0.05, task
        assert task["bytes"] > 0 and task["rounds"] >= 1 and task["seconds"] > 0, task
    assert "round 1/1" in run.stderr  # progress is shown
    assert _processes_in(tmp_path) == []


def test_ctrl_c_stops_every_process_the_demo_started(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "mpcml.cli.main", "demo", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stderr is not None
    deadline = time.monotonic() + 120
    for line in demo.stderr:
        if "round 1/" in line or time.monotonic() > deadline:
            break
    assert len(_processes_in(tmp_path)) >= 4  # coordinator, three parties (and workers)
    demo.send_signal(signal.SIGINT)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 130, err[-2000:]
    assert "every process the demo started was stopped" in err
    assert _processes_in(tmp_path) == []
