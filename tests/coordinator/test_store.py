"""Both job stores behave the same; the SQLite one survives a restart."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpcml.coordinator.store import (
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    JobState,
    JobStore,
    MemoryJobStore,
    SqliteJobStore,
    StoreError,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobStore(Clock())
    else:
        db = SqliteJobStore(tmp_path / "jobs.sqlite", Clock())
        yield db
        db.close()


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


def test_sqlite_store_keeps_every_job_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    before = SqliteJobStore(path)
    job, _ = before.create("c", "k", b"\x00spec\xff")
    before.transition(job.job_id, JobState.STARTING)
    before.add_event(job.job_id, "state", 0, {"state": "STARTING"})
    before.close()
    after = SqliteJobStore(path)
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
