"""The coordinator's Prometheus metrics (`metrics_address` in coordinator.toml).

Jobs by state and the parties' heartbeats are read from the scheduler when Prometheus scrapes,
so they are right even after a coordinator restart; committed rounds and their durations are
counted from the scheduler's `round_done` events as they happen.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from mpcml.coordinator.scheduler import Scheduler
from mpcml.coordinator.store import Event, JobState
from mpcml.jobs.events import EventKind

ROUND_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
"""A round is a batch of secure training steps: from a fraction of a second to many minutes."""


class RoundMetrics:
    """Committed rounds and how long each took; `observe` is the scheduler's event listener."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.committed = Counter(
            "mpcml_coordinator_rounds_committed",
            "Job rounds committed (every party reported DONE).",
            registry=registry,
        )
        self.seconds = Histogram(
            "mpcml_coordinator_round_duration_seconds",
            "From a round's GO to its commit.",
            buckets=ROUND_BUCKETS_S,
            registry=registry,
        )

    def observe(self, event: Event) -> None:
        """Count a `round_done` event; other events are ignored."""
        if event.kind == EventKind.ROUND_DONE:
            self.committed.inc()
            self.seconds.observe(float(event.data.get("seconds", 0.0)))


class SchedulerCollector:
    """Jobs by state and each party's heartbeat, read from the scheduler at scrape time."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def describe(self) -> Iterable[Metric]:
        """The metric names, so that the registry need not scrape to learn them."""
        return self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("mpcml_coordinator_jobs", "Jobs by state.", labels=["state"]),
            GaugeMetricFamily(
                "mpcml_coordinator_party_heartbeat_age_seconds",
                "Seconds since each registered party's last heartbeat.",
                labels=["party"],
            ),
            GaugeMetricFamily(
                "mpcml_coordinator_party_connected",
                "1 while the party is attached and sending heartbeats, else 0.",
                labels=["party"],
            ),
            GaugeMetricFamily(
                "mpcml_coordinator_parties_connected", "Parties attached and sending heartbeats."
            ),
        ]

    def collect(self) -> Iterable[Metric]:
        """The current values."""
        jobs, age, connected, count = self._families()
        states = Tally(job.state for job in self.scheduler.store.jobs())
        for state in JobState:
            jobs.add_metric([state.value], states[state])
        parties = self.scheduler.parties()
        for party in parties:
            age.add_metric([party.name], party.heartbeat_age)
            connected.add_metric([party.name], 1.0 if party.connected else 0.0)
        count.add_metric([], sum(1 for p in parties if p.connected))
        return [jobs, age, connected, count]
