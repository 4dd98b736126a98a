"""A party whose Attach stream breaks mid-job: the scheduler's side, without gRPC.

The stream can die unnoticed in a network blip, with assignments in it. The party attaches
again; its jobs must go on (the assignments it missed are sent again), fail only when it stays
away for the heartbeat timeout, and never take a late report of an earlier run for the current
one. The compose test (tests/docker) drives the same path through real processes with a cut
link, but its timing decides which branch it takes; here each one is forced.
"""

from __future__ import annotations

import queue

import pytest

from mpcml.coordinator.runs import REPEAT_GO_S
from mpcml.coordinator.scheduler import Scheduler
from mpcml.coordinator.store import JobState, MemoryJobStore
from mpcml.errors import StatusError
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb

TIMEOUT_S = 15.0


class Clock:
    """The scheduler's clock, moved by the tests instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


Queue = queue.Queue[cpb.Assignment | None]


def _drain(assignments: Queue) -> list[cpb.Assignment | None]:
    out = []
    while not assignments.empty():
        out.append(assignments.get_nowait())
    return out


def _kinds(assignments: Queue) -> list[str]:
    return [a.WhichOneof("kind") if a is not None else "end" for a in _drain(assignments)]


def _attach(scheduler: Scheduler, party: str, running: list[str] | None = None) -> Queue:
    port = {"alice": 1, "bob": 2}[party]
    request = cpb.AttachRequest(
        party=party, data_address=f"127.0.0.1:{port}", running_jobs=running or []
    )
    return scheduler.attach(request)


def _report(
    scheduler: Scheduler, party: str, job_id: str, attempt: int = 0, **kind: object
) -> None:
    report = cpb.WorkerReport(job_id=job_id, party=party, attempt=attempt, **kind)  # type: ignore[arg-type]
    scheduler.report(party, report)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def running(clock: Clock) -> tuple[Scheduler, str, dict[str, Queue]]:
    """A two-round training job of alice and bob, both workers ready, round 1 under way."""
    scheduler = Scheduler(
        MemoryJobStore(), ["alice", "bob"], heartbeat_timeout=TIMEOUT_S, clock=clock
    )
    spec = jpb.JobSpec(task=jpb.TASK_TRAIN, parties=["alice", "bob"])
    job, _ = scheduler.store.create("analyst", "k", spec.SerializeToString())
    scheduler.store.add_event(job.job_id, "submitted", 0, {"total_rounds": 2})
    queues = {p: _attach(scheduler, p) for p in ("alice", "bob")}
    for party, assignments in queues.items():
        assert _kinds(assignments) == ["start"]
        _report(scheduler, party, job.job_id, ready=cpb.Ready(rows=1))
    for assignments in queues.values():
        assert _kinds(assignments) == ["go"]
    assert scheduler.job(job.job_id).state == JobState.RUNNING
    return scheduler, job.job_id, queues


def test_a_party_that_attaches_again_mid_round_keeps_its_job_and_hears_the_go_again(
    running: tuple[Scheduler, str, dict[str, Queue]], clock: Clock
) -> None:
    scheduler, job_id, queues = running
    scheduler.detach("bob", queues["bob"])
    assert scheduler.job(job_id).state == JobState.RUNNING  # no failure on the detach itself
    bob = _attach(scheduler, "bob", running=[job_id])
    [go] = _drain(bob)
    assert go is not None and go.go.round == 1 and go.go.attempt == 0
    for party in ("alice", "bob"):
        _report(scheduler, party, job_id, done=cpb.RoundDone(round=1))
    assert _kinds(bob) == ["go"] and _kinds(queues["alice"]) == ["go"]
    clock.advance(TIMEOUT_S * 2)
    scheduler.heartbeat("alice")
    scheduler.heartbeat("bob")
    scheduler.tick()
    assert scheduler.job(job_id).state == JobState.RUNNING


def test_a_party_that_stays_away_fails_its_job_after_the_heartbeat_timeout(
    running: tuple[Scheduler, str, dict[str, Queue]], clock: Clock
) -> None:
    scheduler, job_id, queues = running
    scheduler.detach("bob", queues["bob"])
    scheduler.heartbeat("alice")
    scheduler.tick()
    assert scheduler.job(job_id).state == JobState.RUNNING
    clock.advance(TIMEOUT_S * 2)
    scheduler.heartbeat("alice")
    scheduler.tick()
    job = scheduler.job(job_id)
    assert job.state == JobState.FAILED
    assert "party 'bob' detached and was not back after" in job.reason, job.reason


def test_a_party_back_without_the_worker_it_had_fails_the_job_naming_it(
    running: tuple[Scheduler, str, dict[str, Queue]],
) -> None:
    scheduler, job_id, queues = running
    scheduler.detach("bob", queues["bob"])
    _attach(scheduler, "bob", running=[])
    job = scheduler.job(job_id)
    assert job.state == JobState.FAILED
    assert job.reason == "party 'bob' attached again and no longer runs the job"


def test_a_lost_start_is_sent_again_and_reports_of_the_earlier_run_are_refused(
    running: tuple[Scheduler, str, dict[str, Queue]],
) -> None:
    scheduler, job_id, queues = running
    _report(scheduler, "alice", job_id, failed=cpb.Failure(reason="disk full"))
    assert scheduler.job(job_id).state == JobState.FAILED
    assert _kinds(queues["alice"]) == ["stop"]
    assert _kinds(queues["bob"]) == ["stop"]  # lost: bob's stream is dead, unnoticed

    scheduler.resume(job_id)  # bob still counts as attached: run 1 starts at once
    for assignments in queues.values():
        [start] = _drain(assignments)
        assert start is not None and start.start.attempt == 1 and start.start.resume_round == 0
    # bob's stream dies now; its worker of run 0 is still running and reports its failure late
    scheduler.detach("bob", queues["bob"])
    with pytest.raises(StatusError) as info:
        _report(scheduler, "bob", job_id, attempt=0, failed=cpb.Failure(reason="peer lost"))
    assert info.value.code == "FAILED_PRECONDITION"
    assert "the report is of run 0" in str(info.value), info.value
    assert "run 1 is running" in str(info.value), info.value
    assert scheduler.job(job_id).state == JobState.STARTING

    bob = _attach(scheduler, "bob", running=[job_id])  # the run-0 worker: bob replaces it
    [start] = _drain(bob)
    assert start is not None and start.start.attempt == 1
    for party in ("alice", "bob"):
        _report(scheduler, party, job_id, attempt=1, ready=cpb.Ready(rows=1))
    assert scheduler.job(job_id).state == JobState.RUNNING
    assert _kinds(bob) == ["go"]


def test_a_lost_report_is_asked_for_again_with_the_rounds_go(
    running: tuple[Scheduler, str, dict[str, Queue]], clock: Clock
) -> None:
    scheduler, job_id, queues = running
    _report(scheduler, "alice", job_id, done=cpb.RoundDone(round=1))
    # bob's report of round 1 was lost (its retries ran out while the coordinator was away)
    clock.advance(REPEAT_GO_S - 1)
    for party in ("alice", "bob"):
        scheduler.heartbeat(party)
    scheduler.tick()
    assert _kinds(queues["bob"]) == []
    clock.advance(2)
    for party in ("alice", "bob"):
        scheduler.heartbeat(party)
    scheduler.tick()
    [go] = _drain(queues["bob"])
    assert go is not None and go.go.round == 1
    assert _kinds(queues["alice"]) == []  # alice's report came
    _report(scheduler, "bob", job_id, done=cpb.RoundDone(round=1))  # the worker repeats it
    assert _kinds(queues["alice"]) == ["go"] and scheduler.history(job_id).committed == 1
