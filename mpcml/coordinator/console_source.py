"""The coordinator's console source: every job in its store, and its rounds."""

from __future__ import annotations

from typing import Any

from mpcml.console.sources import MAX_JOBS, AuditView, public_losses
from mpcml.coordinator.history import job_result
from mpcml.proto.v1 import coordinator_pb2 as cpb


class CoordinatorSource:
    """The consortium's view: every job and its rounds."""

    party = False

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.title = "mpcml coordinator"

    def _result(self, job: Any) -> cpb.JobResult:
        return job_result(job, self.scheduler.store.events(job.job_id))

    def jobs(self) -> list[cpb.JobResult]:
        """Jobs, newest first."""
        jobs = self.scheduler.store.jobs()[-MAX_JOBS:]
        return [self._result(j) for j in reversed(jobs)]

    def job(self, job_id: str) -> cpb.JobResult | None:
        """One job's public result, None when unknown here."""
        try:
            return self._result(self.scheduler.store.get(job_id))
        except Exception:  # an unknown job
            return None

    def losses(self, result: cpb.JobResult) -> tuple[list[tuple[int, float]], str]:
        """(round, loss) points and where they come from."""
        return public_losses(result), "revealed to the coordinator"

    def datasets(self) -> list[cpb.DatasetInfo]:
        """None here: the coordinator holds no data."""
        return []

    def policy(self) -> Any:
        """None here: policies are the parties'."""
        return None

    def audit(self) -> AuditView:
        """Empty here: audit logs are the parties'."""
        return AuditView()
