"""A party's console source: its own audit log, catalogue and policy.

And the public result of each job its audit log names: a job's parties may read it from the
coordinator.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc

from mpcml.console.sources import MAX_JOBS, AuditView, public_losses
from mpcml.party import audit, catalogue
from mpcml.party.config import PartyConfig
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cpb_grpc
from mpcml.transport.serving import channel

log = logging.getLogger(__name__)


class PartySource:
    """A party's view of its own organisation's data and the jobs that used it."""

    party = True

    def __init__(self, config: PartyConfig) -> None:
        self.config = config
        self.title = f"mpcml party {config.name}"
        self._channel: grpc.Channel | None = None

    def _stub(self) -> cpb_grpc.CoordinatorStub:
        if self._channel is None:
            config = self.config
            self._channel = channel(config.coordinator, config.tls, config.coordinator_name)
        return cpb_grpc.CoordinatorStub(self._channel)

    def audit(self) -> AuditView:
        """The entries, and whether the chain verifies."""
        path = self.config.state_dir / audit.FILE
        if not path.exists():
            return AuditView()
        view = AuditView(entries=[e for _, e in audit.entries(path)])
        try:
            head = audit.verify(path)
            view.verdict = f"verified: {head.seq} entries chain to the head {head}"
        except audit.AuditError as exc:
            view.verified, view.verdict = False, f"DOES NOT VERIFY: {exc}"
        return view

    def _job_ids(self) -> list[str]:
        """The jobs the audit log names, newest first (read once; the chain is not checked)."""
        path = self.config.state_dir / audit.FILE
        seen: dict[str, None] = {}
        if path.exists():
            for _, entry in reversed(list(audit.entries(path))):
                if entry.get("job"):
                    seen.setdefault(str(entry["job"]), None)
        return list(seen)[:MAX_JOBS]

    def job(self, job_id: str) -> cpb.JobResult | None:
        """One job's public result, None when unknown here."""
        if job_id not in self._job_ids():
            return None
        return self._result(job_id)

    def _result(self, job_id: str) -> cpb.JobResult:
        try:
            result: cpb.JobResult = self._stub().GetResult(
                cpb.GetResultRequest(job_id=job_id), timeout=5
            )
            return result
        except grpc.RpcError as exc:
            log.warning("console: job %s: the coordinator did not answer: %s", job_id, exc.code())
            return cpb.JobResult(status=cpb.JobStatus(job_id=job_id))

    def jobs(self) -> list[cpb.JobResult]:
        """Jobs, newest first."""
        return [self._result(job_id) for job_id in self._job_ids()]

    def losses(self, result: cpb.JobResult) -> tuple[list[tuple[int, float]], str]:
        """(round, loss) points and where they come from."""
        public = public_losses(result)
        if public:
            return public, "revealed to the coordinator"
        path = self.config.job_results(result.status.job_id) / "metrics.jsonl"
        points = []
        if path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if "loss" in record and record.get("round"):
                    points.append((int(record["round"]), float(record["loss"])))
        return points, f"revealed to {self.config.name}" if points else ""

    def datasets(self) -> list[cpb.DatasetInfo]:
        """The catalogue as the party registers it."""
        out = []
        for entry in self.config.datasets.values():
            try:
                out.append(catalogue.describe(entry))
            except catalogue.DataError as exc:
                out.append(cpb.DatasetInfo(name=entry.name, id_column=f"unreadable: {exc}"))
        return out

    def results_dir(self) -> Path:
        """Where the party writes what is revealed to it."""
        return Path(self.config.results_dir)

    def policy(self) -> Any:
        """The party's policy."""
        return self.config.policy
