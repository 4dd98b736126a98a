"""A coordinator that stops mid-job, and the one that takes the job over: the scheduler's side.

Two Scheduler objects on one store stand for a coordinator and its restart (the same lease
holder) or its standby (another holder): on the memory store, and on a real PostgreSQL server
with a connection of its own each, as two coordinator processes have. The parties attach again
by themselves; each hears the current round's GO again. tests/system/test_recovery.py kills a
real coordinator process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from mpcml.coordinator.scheduler import Scheduler
from mpcml.coordinator.sql_store import PostgresJobStore
from mpcml.coordinator.store import JobState, JobStore, MemoryJobStore
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from tests.coordinator.test_reattach import Clock, Queue, _attach, _drain, _kinds, _report

TIMEOUT_S = 15.0
LEASE_S = 30.0


def _scheduler(store: JobStore, clock: Clock, holder: str = "c1") -> Scheduler:
    return Scheduler(
        store,
        ["alice", "bob"],
        heartbeat_timeout=TIMEOUT_S,
        clock=clock,
        holder=holder,
        lease_s=LEASE_S,
    )


def _submit(scheduler: Scheduler, rounds: int = 2) -> str:
    spec = jpb.JobSpec(task=jpb.TASK_TRAIN, parties=["alice", "bob"])
    job, _ = scheduler.store.create("analyst", "k", spec.SerializeToString())
    scheduler.store.add_event(job.job_id, "submitted", 0, {"total_rounds": rounds})
    return job.job_id


@pytest.fixture
def clock() -> Clock:
    return Clock()


Stores = Callable[[], JobStore]
"""A coordinator's own store on the test's database (the memory store: the one object)."""


@pytest.fixture(params=["memory", "postgresql"])
def store(request: pytest.FixtureRequest, clock: Clock) -> Iterator[Stores]:
    if request.param == "memory":
        shared = MemoryJobStore(clock)
        yield lambda: shared
        return
    url = request.getfixturevalue("pg_url")
    opened: list[JobStore] = []

    def connect() -> JobStore:
        opened.append(PostgresJobStore(url, clock))
        return opened[-1]

    yield connect
    for each in opened:
        each.close()


def _running(store: Stores, clock: Clock) -> tuple[Scheduler, str, dict[str, Queue]]:
    """Round 1 of a two-round job under way on coordinator c1."""
    first = _scheduler(store(), clock)
    job_id = _submit(first)
    queues = {p: _attach(first, p) for p in ("alice", "bob")}
    for party in queues:
        [start] = _drain(queues[party])
        assert start is not None
        _report(first, party, job_id, ready=cpb.Ready(rows=1))
    for assignments in queues.values():
        assert _kinds(assignments) == ["go"]
    return first, job_id, queues


def test_a_restarted_coordinator_takes_its_running_job_back_and_finishes_it(
    store: Stores, clock: Clock
) -> None:
    first, job_id, _ = _running(store, clock)
    _report(first, "alice", job_id, done=cpb.RoundDone(round=1))  # reached the old one only
    restarted = _scheduler(store(), clock)  # the same name: the lease is its own
    assert restarted.job(job_id).state == JobState.RUNNING
    queues = {p: _attach(restarted, p, running=[job_id]) for p in ("alice", "bob")}
    for assignments in queues.values():
        [go] = _drain(assignments)
        assert go is not None and go.go.round == 1 and go.go.attempt == 0
    for party in ("alice", "bob"):  # alice's worker repeats its report on the repeated GO
        _report(restarted, party, job_id, done=cpb.RoundDone(round=1))
    for assignments in queues.values():
        assert _kinds(assignments) == ["go"]
    for party in ("alice", "bob"):
        _report(restarted, party, job_id, done=cpb.RoundDone(round=2))
    _report(restarted, "alice", job_id, done=cpb.RoundDone(round=1))  # a late repeat: ignored
    for party in ("alice", "bob"):
        _report(restarted, party, job_id, finished=cpb.Finished())
    assert restarted.job(job_id).state == JobState.COMPLETED
    assert restarted.history(job_id).committed == 2
    rounds = [e.round for e in restarted.store.events(job_id) if e.kind == "round_done"]
    assert rounds == [1, 2]


def test_a_party_that_does_not_attach_to_the_restarted_coordinator_fails_the_job(
    store: Stores, clock: Clock
) -> None:
    _, job_id, _ = _running(store, clock)
    restarted = _scheduler(store(), clock)
    _attach(restarted, "alice", running=[job_id])
    restarted.tick()
    assert restarted.job(job_id).state == JobState.RUNNING
    clock.advance(TIMEOUT_S + 1)
    restarted.heartbeat("alice")
    restarted.tick()
    job = restarted.job(job_id)
    assert job.state == JobState.FAILED
    assert job.reason == (
        f"party 'bob' did not attach again within {TIMEOUT_S:g} s after coordinator 'c1' "
        "took the job over"
    )


def test_a_party_whose_worker_is_gone_after_the_restart_fails_the_job(
    store: Stores, clock: Clock
) -> None:
    _, job_id, _ = _running(store, clock)
    restarted = _scheduler(store(), clock)
    _attach(restarted, "bob", running=[])  # bob's daemon restarted too: no worker
    job = restarted.job(job_id)
    assert job.state == JobState.FAILED
    assert job.reason == "party 'bob' attached again and no longer runs the job"


def test_a_starting_job_taken_over_restarts_only_the_workers_that_were_not_ready(
    store: Stores, clock: Clock
) -> None:
    first = _scheduler(store(), clock)
    job_id = _submit(first)
    queues = {p: _attach(first, p) for p in ("alice", "bob")}
    starts = {p: _drain(q)[0] for p, q in queues.items()}
    _report(first, "alice", job_id, ready=cpb.Ready(rows=1))
    restarted = _scheduler(store(), clock)
    assert restarted.job(job_id).state == JobState.STARTING
    alice = _attach(restarted, "alice", running=[job_id])
    bob = _attach(restarted, "bob", running=[job_id])
    assert _kinds(alice) == []  # ready already: it waits for the GO
    [start] = _drain(bob)
    assert start is not None and start.start == starts["bob"].start  # type: ignore[union-attr]
    _report(restarted, "bob", job_id, ready=cpb.Ready(rows=1))
    assert restarted.job(job_id).state == JobState.RUNNING
    assert _kinds(alice) == ["go"] and _kinds(bob) == ["go"]


def test_two_coordinators_never_run_one_job_and_a_standby_takes_over_a_lapsed_lease(
    store: Stores, clock: Clock
) -> None:
    active, standby = _scheduler(store(), clock, "active"), _scheduler(store(), clock, "standby")
    on_standby = {p: _attach(standby, p) for p in ("alice", "bob")}
    job_id = _submit(active)
    on_active = {p: _attach(active, p) for p in ("alice", "bob")}
    standby.runs.schedule()
    for party in ("alice", "bob"):
        assert _kinds(on_active[party]) == ["start"]
        assert _kinds(on_standby[party]) == []  # the lease is the active one's
        _report(active, party, job_id, ready=cpb.Ready(rows=1))
    clock.advance(LEASE_S / 2)
    for scheduler in (active, standby):
        for party in ("alice", "bob"):
            scheduler.heartbeat(party)
        scheduler.tick()  # the active renews; the standby cannot take the job
    assert all(_kinds(q) == [] for q in on_standby.values())

    clock.advance(LEASE_S + 1)  # the active stopped renewing: it froze
    for party in ("alice", "bob"):  # the parties' heartbeats say what their workers run
        standby.heartbeat(party, [job_id])
    standby.tick()
    for party in ("alice", "bob"):  # the parties' links are the standby's: GO 1 again
        [go] = _drain(on_standby[party])
        assert go is not None and go.go.round == 1
    active.tick()  # back from its freeze: the lease is gone, so it stops its workers
    for party in ("alice", "bob"):  # and then ends the streams of parties silent to it
        assert _kinds(on_active[party]) == ["go", "stop", "end"]
    assert active.job(job_id).state == JobState.RUNNING
    for party in ("alice", "bob"):
        _report(standby, party, job_id, done=cpb.RoundDone(round=1))
    assert standby.history(job_id).committed == 1


def test_a_job_cancelled_through_one_coordinator_is_stopped_by_the_one_running_it(
    store: Stores, clock: Clock
) -> None:
    active, other = _scheduler(store(), clock, "active"), _scheduler(store(), clock, "other")
    job_id = _submit(active)
    queues = {p: _attach(active, p) for p in ("alice", "bob")}
    for party in ("alice", "bob"):
        _report(active, party, job_id, ready=cpb.Ready(rows=1))
    other.cancel(job_id, "not needed")
    clock.advance(LEASE_S / 2)
    for party in ("alice", "bob"):
        active.heartbeat(party)
    active.tick()
    for party in ("alice", "bob"):
        assert _kinds(queues[party]) == ["start", "go", "stop"]
    assert active.job(job_id).state == JobState.CANCELLED
