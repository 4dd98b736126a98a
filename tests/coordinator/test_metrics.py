"""The coordinator's metrics, read from a scheduler without gRPC."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from mpcml.coordinator.metrics import RoundMetrics, SchedulerCollector
from mpcml.coordinator.scheduler import Scheduler
from mpcml.coordinator.store import Event, JobState, MemoryJobStore
from mpcml.proto.v1 import coordinator_pb2 as cpb


def _event(kind: str, round: int = 0, **data: object) -> Event:
    return Event("job", 1, 0.0, kind, round, dict(data))


def test_jobs_by_state_and_heartbeats_are_read_when_scraped() -> None:
    registry = CollectorRegistry()
    events: list[Event] = []
    scheduler = Scheduler(MemoryJobStore(), ["alice", "bob"], on_event=events.append)
    registry.register(SchedulerCollector(scheduler))
    scheduler.attach(cpb.AttachRequest(party="alice", data_address="127.0.0.1:1"))
    bob = scheduler.attach(cpb.AttachRequest(party="bob", data_address="127.0.0.1:2"))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("mpcml_coordinator_jobs", state="PENDING") == 0
    for key in ("a", "b", "c"):
        scheduler.store.create("analyst", key, b"")
    assert sample("mpcml_coordinator_jobs", state="PENDING") == 3
    job = scheduler.store.jobs()[0]
    scheduler.cancel(job.job_id, "no longer needed")
    assert sample("mpcml_coordinator_jobs", state="PENDING") == 2
    assert sample("mpcml_coordinator_jobs", state="CANCELLED") == 1
    assert [e.data.get("state") for e in events] == [JobState.CANCELLED.value]

    assert sample("mpcml_coordinator_parties_connected") == 2
    assert 0 <= (sample("mpcml_coordinator_party_heartbeat_age_seconds", party="bob") or -1) < 60
    scheduler.detach("bob", bob)
    assert sample("mpcml_coordinator_parties_connected") == 1
    assert sample("mpcml_coordinator_party_connected", party="bob") == 0
    assert sample("mpcml_coordinator_party_connected", party="alice") == 1
    assert sample("mpcml_coordinator_party_heartbeat_age_seconds", party="carol") is None


def test_committed_rounds_and_their_durations_come_from_round_done_events() -> None:
    registry = CollectorRegistry()
    rounds = RoundMetrics(registry)
    rounds.observe(_event("round_started", 1))
    rounds.observe(_event("round_done", 1, seconds=0.4))
    rounds.observe(_event("round_done", 2, seconds=3.0))
    rounds.observe(_event("state", 2, state="COMPLETED"))
    assert registry.get_sample_value("mpcml_coordinator_rounds_committed_total") == 2
    assert registry.get_sample_value("mpcml_coordinator_round_duration_seconds_count") == 2
    assert registry.get_sample_value("mpcml_coordinator_round_duration_seconds_sum") == 3.4
    bucket = "mpcml_coordinator_round_duration_seconds_bucket"
    assert registry.get_sample_value(bucket, {"le": "0.5"}) == 1
    assert registry.get_sample_value(bucket, {"le": "5.0"}) == 2
