"""`mpcml job status` text: the committed round beside the round in progress, and the loss
labelled with the round it belongs to."""

from __future__ import annotations

from mpcml.cli.jobs import _status_line
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb


def _status(state: int, current: int, committed: int) -> cpb.JobStatus:
    status = cpb.JobStatus(
        job_id="j" * 32,
        state=state,  # type: ignore[arg-type]
        current_round=current,
        committed_round=committed,
        total_rounds=8,
        task=jpb.TASK_TRAIN,
        parties=["alice", "bob", "carol"],
    )
    status.metrics["loss"] = 0.0754
    return status


def test_a_failed_job_shows_the_committed_round_and_its_loss() -> None:
    line = _status_line(_status(cpb.FAILED, current=5, committed=4))
    assert "FAILED" in line and "round 5/8, committed 4" in line
    assert "loss=0.0754 (round 4)" in line


def test_a_completed_job_shows_its_rounds_once() -> None:
    line = _status_line(_status(cpb.COMPLETED, current=8, committed=8))
    assert "round 8/8 " in line and "committed" not in line and "(round 8)" in line
