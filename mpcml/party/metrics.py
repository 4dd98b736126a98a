"""A party daemon's Prometheus metrics (`metrics_address` in party.toml).

The daemon counts its job workers as it starts them and relays their reports. The data-plane
traffic with each peer is measured in the worker (a separate process) and arrives as running
totals in its reports (`PeerTraffic`); the daemon adds what grew since the previous report.
Running jobs and the heartbeat's age are read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from mpcml.proto.v1 import coordinator_pb2 as cpb

Totals = dict[str, tuple[int, int]]
"""(bytes sent, bytes received) by peer name, as one worker last reported them."""


class PartyMetrics:
    """The daemon's counters; `running()` and `heartbeat_age()` are read when scraped."""

    def __init__(
        self,
        registry: CollectorRegistry,
        running: Callable[[], int],
        heartbeat_age: Callable[[], float],
    ) -> None:
        self.started = Counter(
            "mpcml_party_job_workers_started", "Job worker processes started.", registry=registry
        )
        self.finished = Counter(
            "mpcml_party_job_workers_finished",
            "Job workers that reported their job finished.",
            registry=registry,
        )
        self.failed = Counter(
            "mpcml_party_job_workers_failed",
            "Job workers that reported a failure or exited without a report.",
            registry=registry,
        )
        self.rounds = Counter(
            "mpcml_party_rounds_done",
            "Job rounds this party's workers completed.",
            registry=registry,
        )
        self.sent = Counter(
            "mpcml_party_peer_sent_bytes",
            "Data-plane payload bytes sent to each peer.",
            labelnames=["peer"],
            registry=registry,
        )
        self.received = Counter(
            "mpcml_party_peer_received_bytes",
            "Data-plane payload bytes received from each peer.",
            labelnames=["peer"],
            registry=registry,
        )
        jobs = Gauge("mpcml_party_jobs_running", "Job workers running now.", registry=registry)
        jobs.set_function(lambda: float(running()))
        age = Gauge(
            "mpcml_party_heartbeat_age_seconds",
            "Seconds since the coordinator last took a heartbeat (or since the daemon started).",
            registry=registry,
        )
        age.set_function(heartbeat_age)

    def traffic(self, previous: Totals, reported: Iterable[cpb.PeerTraffic]) -> Totals:
        """Count what grew since `previous` (one worker's last report); returns the new totals."""
        totals = dict(previous)
        for t in reported:
            sent, received = previous.get(t.peer, (0, 0))
            self.sent.labels(t.peer).inc(max(0, t.bytes_sent - sent))
            self.received.labels(t.peer).inc(max(0, t.bytes_received - received))
            totals[t.peer] = (t.bytes_sent, t.bytes_received)
        return totals
