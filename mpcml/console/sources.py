"""What a console shows, whoever serves it: the `Source` each daemon implements.

The coordinator's (`mpcml/coordinator/console_source.py`) reads its job store; a party's
(`mpcml/party/console_source.py`) its own audit log, catalogue and policy, and asks the
coordinator for the public result of the jobs its audit log names. Both give jobs as the public
`JobResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from mpcml.proto.v1 import coordinator_pb2 as cpb

MAX_JOBS = 200
"""The most recent jobs a page lists."""


@dataclass
class AuditView:
    """A party's audit log as its page shows it."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    verified: bool = True
    verdict: str = ""


class Source(Protocol):
    """What a console serves from."""

    title: str
    party: bool
    """Whether this is a party's console (datasets, policy and audit pages)."""

    def jobs(self) -> list[cpb.JobResult]:
        """Jobs, newest first (status only is enough)."""

    def job(self, job_id: str) -> cpb.JobResult | None:
        """One job's public result, None when unknown here."""

    def losses(self, result: cpb.JobResult) -> tuple[list[tuple[int, float]], str]:
        """(round, loss) points and where they come from."""

    def datasets(self) -> list[cpb.DatasetInfo]:
        """A party's catalogue as it registers it; empty for the coordinator."""

    def policy(self) -> Any:
        """A party's policy; None for the coordinator."""

    def audit(self) -> AuditView:
        """A party's audit log; empty for the coordinator."""


def public_losses(result: cpb.JobResult) -> list[tuple[int, float]]:
    """The losses the coordinator holds: those revealed to "coordinator"."""
    return [(r.round, r.metrics["loss"]) for r in result.rounds if "loss" in r.metrics]
