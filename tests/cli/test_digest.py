"""`mpcml job digest`: the digest an operator approves, computed offline from a job file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mpcml.demo.models import LogisticRegression
from mpcml.graph.capture import capture
from mpcml.graph.digest import graph_digest

JOB = """
task = "train"
[model]
python = "mpcml.demo.models:LogisticRegression"
args = {{ in_features = 30 }}
{shape}
[features]
alice = "bc-train"
bob = "bc-train"
[labels]
carol = "bc-train-labels"
"""


def _digest(job: Path) -> subprocess.CompletedProcess[str]:
    mpcml = Path(sys.executable).parent / "mpcml"
    return subprocess.run(
        [str(mpcml), "job", "digest", str(job)], capture_output=True, text=True, timeout=120
    )


def test_the_digest_of_a_job_file_is_that_of_the_model_captured_for_its_rows(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.toml").write_text(JOB.format(shape="input_shape = [30]"))
    done = _digest(tmp_path / "job.toml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == graph_digest(capture(LogisticRegression(), (30,)))


def test_a_job_file_without_input_shape_has_no_offline_digest(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(JOB.format(shape=""))
    done = _digest(tmp_path / "job.toml")
    assert done.returncode == 2 and "input_shape = [...]" in done.stderr
