"""Every job store behaves the same; the SQL ones survive a restart.

The PostgreSQL cases run against a real server the tests start (tests/support/postgres.py),
and skip with the reason where this machine cannot start one.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpcml.coordinator.sql_store import PostgresJobStore, SqliteJobStore
from mpcml.coordinator.store import (
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    JobState,
    JobStore,
    MemoryJobStore,
    StoreError,
    StoreUnavailable,
    open_store,
)
from tests.support import postgres


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStore]:
    db: JobStore
    if request.param == "memory":
        db = MemoryJobStore(Clock())
    elif request.param == "sqlite":
        db = SqliteJobStore(tmp_path / "jobs.sqlite", Clock())
    else:
        db = PostgresJobStore(request.getfixturevalue("pg_url"), Clock())
    yield db
    db.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a SQL store lives: a file path or a database URL."""
    if request.param == "sqlite":
        return str(tmp_path / "jobs.sqlite")
    return str(request.getfixturevalue("pg_url"))


def test_same_idempotency_key_gives_one_job(store: JobStore) -> None:
    first, created = store.create("client-a", "key-1", b"spec")
    again, created_again = store.create("client-a", "key-1", b"spec")
    other, _ = store.create("client-b", "key-1", b"spec")
    assert created and not created_again
    assert again == first and other.job_id != first.job_id
    assert [j.job_id for j in store.jobs()] == [first.job_id, other.job_id]


def test_reusing_a_key_for_another_spec_is_refused(store: JobStore) -> None:
    job, _ = store.create("client-a", "key-1", b"spec")
    with pytest.raises(IdempotencyConflict, match=f"job {job.job_id} with a different spec"):
        store.create("client-a", "key-1", b"other spec")


def test_states_move_forward_only_with_timestamps_and_reasons(store: JobStore) -> None:
    job, _ = store.create("c", "k", b"s")
    assert job.state == JobState.PENDING
    store.transition(job.job_id, JobState.STARTING)
    store.transition(job.job_id, JobState.RUNNING)
    failed = store.transition(job.job_id, JobState.FAILED, "party 'bob' missed its heartbeats")
    assert failed.reason == "party 'bob' missed its heartbeats"
    times = store.get(job.job_id).state_times
    assert list(times) == ["PENDING", "STARTING", "RUNNING", "FAILED"]
    assert times["PENDING"] < times["STARTING"] < times["RUNNING"] < times["FAILED"]
    with pytest.raises(InvalidTransition, match="is FAILED; it cannot become RUNNING"):
        store.transition(job.job_id, JobState.RUNNING)
    assert store.jobs(JobState.FAILED) == [store.get(job.job_id)]
    assert store.jobs(JobState.RUNNING) == []


def test_skipping_a_state_is_refused(store: JobStore) -> None:
    job, _ = store.create("c", "k", b"s")
    with pytest.raises(InvalidTransition, match="is PENDING; it cannot become COMPLETED"):
        store.transition(job.job_id, JobState.COMPLETED)


def test_rounds_and_events_are_recorded_in_order(store: JobStore) -> None:
    job, _ = store.create("c", "k", b"s")
    store.set_round(job.job_id, 3)
    for r in (1, 2, 3):
        store.add_event(job.job_id, "round_done", r, {"loss": 1.0 / r})
    assert store.get(job.job_id).current_round == 3
    events = store.events(job.job_id)
    assert [(e.seq, e.round, e.data["loss"]) for e in events] == [
        (1, 1, 1.0),
        (2, 2, 0.5),
        (3, 3, 1.0 / 3),
    ]
    assert [e.seq for e in store.events(job.job_id, after=2)] == [3]


def test_unknown_job_ids_are_reported(store: JobStore) -> None:
    for call in (
        lambda: store.get("nope"),
        lambda: store.events("nope"),
        lambda: store.transition("nope", JobState.STARTING),
        lambda: store.add_event("nope", "x"),
    ):
        with pytest.raises(JobNotFound, match="no job 'nope'"):
            call()


def test_concurrent_submissions_with_one_key_make_one_job(store: JobStore) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def submit() -> None:
        job, _ = store.create("c", "same", b"s")
        with lock:
            ids.append(job.job_id)

    threads = [threading.Thread(target=submit) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 16 and len(set(ids)) == 1
    assert len(store.jobs()) == 1


def test_a_sql_store_keeps_every_job_across_a_restart(location: str) -> None:
    before = open_store(location)
    job, _ = before.create("c", "k", b"\x00spec\xff")
    before.transition(job.job_id, JobState.STARTING)
    before.add_event(job.job_id, "state", 0, {"state": "STARTING"})
    before.close()
    after = open_store(location)
    restored = after.get(job.job_id)
    assert restored.spec == b"\x00spec\xff" and restored.state == JobState.STARTING
    assert after.events(job.job_id)[0].data == {"state": "STARTING"}
    assert after.create("c", "k", b"\x00spec\xff") == (restored, False)
    after.close()


def test_sqlite_store_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    SqliteJobStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        SqliteJobStore(path)


def test_a_lease_is_held_by_one_holder_until_released_or_lapsed(store: JobStore) -> None:
    job, _ = store.create("c", "k", b"s")
    assert store.claim(job.job_id, "coordinator-a", ttl=10)
    assert store.claim(job.job_id, "coordinator-a", ttl=10)  # its own again: renewed
    assert not store.claim(job.job_id, "coordinator-b", ttl=10)
    assert store.renew("coordinator-a", ttl=10) == {job.job_id}
    assert store.renew("coordinator-b", ttl=10) == set()
    store.release(job.job_id, "coordinator-b")  # not its lease: nothing changes
    assert not store.claim(job.job_id, "coordinator-b", ttl=10)
    store.release(job.job_id, "coordinator-a")
    assert store.claim(job.job_id, "coordinator-b", ttl=10)
    # the Clock moves one second a call: a 1 s lease has lapsed by the next call
    assert store.claim(job.job_id, "coordinator-b", ttl=1)
    assert store.claim(job.job_id, "coordinator-a", ttl=10)
    assert store.renew("coordinator-b", ttl=10) == set()
    with pytest.raises(JobNotFound):
        store.claim("nope", "coordinator-a", ttl=10)


def test_concurrent_claims_give_the_lease_to_one(store: JobStore) -> None:
    job, _ = store.create("c", "k", b"s")
    winners: list[str] = []
    lock = threading.Lock()

    def claim(holder: str) -> None:
        if store.claim(job.job_id, holder, ttl=1000):
            with lock:
                winners.append(holder)

    threads = [threading.Thread(target=claim, args=(f"h{i}",)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_two_postgresql_stores_on_one_database_share_jobs_events_and_leases(pg_url: str) -> None:
    a, b = PostgresJobStore(pg_url), PostgresJobStore(pg_url)
    job, created = a.create("c", "k", b"spec")
    assert created and b.create("c", "k", b"spec") == (job, False)
    a.add_event(job.job_id, "x")
    b.add_event(job.job_id, "y")
    assert [(e.seq, e.kind) for e in a.events(job.job_id)] == [(1, "x"), (2, "y")]
    assert a.claim(job.job_id, "a", ttl=60) and not b.claim(job.job_id, "b", ttl=60)
    b.transition(job.job_id, JobState.STARTING)
    with pytest.raises(InvalidTransition):
        a.transition(job.job_id, JobState.PENDING)
    a.close()
    b.close()


def test_a_version_1_sqlite_store_gains_the_lease(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    SqliteJobStore(path).create("c", "k", b"s")
    with sqlite3.connect(path) as db:  # what a coordinator before the lease left
        db.execute("ALTER TABLE jobs DROP COLUMN lease_holder")
        db.execute("ALTER TABLE jobs DROP COLUMN lease_until")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    store = SqliteJobStore(path)
    [job] = store.jobs()
    assert store.claim(job.job_id, "a", ttl=10)
    store.close()


def test_an_unreachable_postgresql_store_is_named_without_its_password() -> None:
    if postgres.skip_reason() is not None and "psycopg" in (postgres.skip_reason() or ""):
        pytest.skip("psycopg is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreError) as info:
        open_store(f"postgresql://mpcml:s3cret@127.0.0.1:{port}/jobs")
    message = str(info.value)
    assert f"cannot open the job store postgresql://mpcml@127.0.0.1:{port}/jobs" in message
    assert "s3cret" not in message


def test_a_postgresql_store_whose_connection_dies_says_unavailable_and_reconnects(
    pg_url: str,
) -> None:
    import psycopg

    store = PostgresJobStore(pg_url)
    job, _ = store.create("c", "k", b"s")
    with psycopg.connect(pg_url, autocommit=True) as admin:  # what a database restart does
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    with pytest.raises(StoreUnavailable, match="the job store postgresql://") as info:
        store.get(job.job_id)
    assert info.value.code == "UNAVAILABLE"
    assert store.get(job.job_id) == job  # a new connection
    store.close()
