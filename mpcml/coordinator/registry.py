"""The party registry: which parties are attached, their assignment streams and heartbeats.

It knows parties, not jobs: what a party's re-attach means for the jobs it runs is the run
state machine's (`runs.py`). Callers hold the scheduler's lock.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from mpcml.errors import StatusError
from mpcml.proto.v1 import coordinator_pb2 as cpb

log = logging.getLogger(__name__)

Assignments = queue.Queue[cpb.Assignment | None]
"""What a party's Attach stream sends; None ends the stream."""


@dataclass
class PartyLink:
    """A registered party and the queue of assignments its Attach stream sends."""

    info: cpb.AttachRequest
    assignments: Assignments
    last_seen: float
    connected: bool = True
    jobs: dict[str, int] = field(default_factory=dict)
    """The jobs it runs, each with the slot its worker took."""

    def free_slot(self) -> int | None:
        """A slot for one more job, or None while it runs `max_concurrent_jobs`."""
        free = set(range(max(1, self.info.max_concurrent_jobs))) - set(self.jobs.values())
        return min(free) if free else None

    def send(self, assignment: cpb.Assignment) -> None:
        """Queue an assignment on the party's stream."""
        self.assignments.put(assignment)


@dataclass(frozen=True)
class Silence:
    """A party that missed its heartbeat timeout, and how (`cause`, for the jobs' reasons)."""

    link: PartyLink
    cause: str


class Registry:
    """The parties that registered since the coordinator started."""

    def __init__(
        self, roster: Collection[str], heartbeat_timeout: float, clock: Callable[[], float]
    ) -> None:
        self.roster = list(roster)
        self.heartbeat_timeout = heartbeat_timeout
        self._clock = clock
        self.links: dict[str, PartyLink] = {}

    def attach(self, info: cpb.AttachRequest) -> tuple[PartyLink, PartyLink | None]:
        """Register `info.party`; returns its link and the one it replaces (whose stream ends)."""
        if self.roster and info.party not in self.roster:
            raise StatusError(
                "PERMISSION_DENIED",
                f"party {info.party!r} is not in the coordinator's roster "
                f"({', '.join(self.roster)})",
            )
        old = self.links.get(info.party)
        link = PartyLink(info, queue.Queue(), self._clock())
        self.links[info.party] = link
        if old is not None:
            old.assignments.put(None)
        log.info(
            "party %s attached from %s", info.party, info.data_address, extra={"party": info.party}
        )
        return link, old

    def detach(self, name: str, assignments: Assignments) -> PartyLink | None:
        """The party's stream ended; its link, unless a newer Attach replaced that stream."""
        link = self.links.get(name)
        if link is None or link.assignments is not assignments:
            return None
        link.connected = False
        return link

    def heartbeat(self, name: str, running: Collection[str] | None = None) -> None:
        """Note that `name` is alive; `running` replaces the jobs it said it runs at Attach."""
        link = self.links.get(name)
        if link is None or not link.connected:
            raise StatusError("FAILED_PRECONDITION", f"party {name!r} is not attached")
        link.last_seen = self._clock()
        if running is not None:
            del link.info.running_jobs[:]
            link.info.running_jobs.extend(running)

    def connected(self) -> dict[str, PartyLink]:
        """The parties attached now."""
        return {name: link for name, link in self.links.items() if link.connected}

    def silent(self) -> list[Silence]:
        """Parties silent for longer than the timeout; a connected one is disconnected now."""
        now = self._clock()
        out = []
        for name, link in self.links.items():
            quiet = now - link.last_seen
            if quiet <= self.heartbeat_timeout:
                continue
            if link.connected:
                link.connected = False
                link.assignments.put(None)
                log.warning(
                    "party %s missed its heartbeats for %.0f s", name, quiet, extra={"party": name}
                )
                cause = f"sent no heartbeat for {quiet:.0f} s"
            else:
                cause = f"detached and was not back after {quiet:.0f} s"
            out.append(Silence(link, cause))
        return out

    def peers(self, caller: str) -> list[cpb.PeerEndpoint]:
        """The parties attached now but `caller`: names and addresses only."""
        return [
            cpb.PeerEndpoint(
                name=name,
                data_address=link.info.data_address,
                health_address=link.info.health_address,
            )
            for name, link in sorted(self.connected().items())
            if name != caller
        ]

    def parties(self) -> list[cpb.PartyStatus]:
        """Every party that has registered since the coordinator started."""
        now = self._clock()
        return [
            cpb.PartyStatus(
                name=name,
                data_address=link.info.data_address,
                device=link.info.device,
                connected=link.connected,
                heartbeat_age=now - link.last_seen,
                datasets=list(link.info.datasets),
                models=list(link.info.models),
                model_info=list(link.info.model_info),
                limits=link.info.limits,
            )
            for name, link in sorted(self.links.items())
        ]
