"""`mpcml job digest`: the digest an operator approves, computed offline from a job file."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpcml.cli.main import main
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


def test_the_digest_of_a_job_file_is_that_of_the_model_captured_for_its_rows(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.toml").write_text(JOB.format(shape="input_shape = [30]"))
    assert main(["job", "digest", str(tmp_path / "job.toml")]) == 0
    expected = graph_digest(capture(LogisticRegression(), (30,)))
    assert capfd.readouterr().out.strip() == expected


def test_a_job_file_without_input_shape_has_no_offline_digest(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.toml").write_text(JOB.format(shape=""))
    assert main(["job", "digest", str(tmp_path / "job.toml")]) == 2
    assert "input_shape = [...]" in capfd.readouterr().err
