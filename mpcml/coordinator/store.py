"""The job store: every job, its state history and its events, behind one small interface.

Two implementations with the same behaviour: `MemoryJobStore` (tests, throwaway runs) and
`SqliteJobStore` (the default: a restarted coordinator still knows every job). The store keeps
a job's spec as opaque bytes (a serialized protobuf); it never sees a share or a private input.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from typing_extensions import override

from mpcml.errors import MpcmlError


class JobState(StrEnum):
    """docs/architecture.md: PENDING -> STARTING -> RUNNING -> COMPLETED | FAILED | CANCELLED."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
_NEXT = {
    JobState.PENDING: {JobState.STARTING, JobState.FAILED, JobState.CANCELLED},
    JobState.STARTING: {JobState.RUNNING, JobState.FAILED, JobState.CANCELLED},
    JobState.RUNNING: {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED},
    JobState.FAILED: {JobState.PENDING},  # resumed from its last committed round
}


class StoreError(MpcmlError):
    """A store operation was refused; the message says why."""


class JobNotFound(StoreError):
    """No job has that id."""


class InvalidTransition(StoreError):
    """The job's state does not allow the requested change."""


class IdempotencyConflict(StoreError):
    """The idempotency key was already used by the same submitter for a different spec."""


@dataclass(frozen=True)
class Job:
    """What the store knows about a job."""

    job_id: str
    submitter: str
    idempotency_key: str
    spec: bytes
    state: JobState
    reason: str
    current_round: int
    state_times: dict[str, float] = field(default_factory=dict)
    """When the job entered each state it has been in (seconds since the epoch)."""


@dataclass(frozen=True)
class Event:
    """One entry of a job's event log; `seq` counts from 1 per job."""

    job_id: str
    seq: int
    at: float
    kind: str
    round: int
    data: dict[str, Any]


class JobStore(Protocol):
    """The interface the coordinator uses; both implementations are safe across threads."""

    def create(self, submitter: str, idempotency_key: str, spec: bytes) -> tuple[Job, bool]:
        """The job for (submitter, key): a new PENDING one (True), or the existing (False)."""
        ...

    def find(self, submitter: str, idempotency_key: str, spec: bytes) -> Job | None:
        """The existing job for (submitter, key), or None; IdempotencyConflict on another spec."""
        ...

    def get(self, job_id: str) -> Job:
        """The job, or JobNotFound."""
        ...

    def jobs(self, state: JobState | None = None) -> list[Job]:
        """Jobs in creation order, optionally only those in `state`."""
        ...

    def transition(self, job_id: str, to: JobState, reason: str = "") -> Job:
        """Move the job to `to`, or InvalidTransition naming both states."""
        ...

    def set_round(self, job_id: str, round: int) -> Job:
        """Record the round the job is in."""
        ...

    def add_event(
        self, job_id: str, kind: str, round: int = 0, data: dict[str, Any] | None = None
    ) -> Event:
        """Append to the job's event log."""
        ...

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        """The job's events with `seq` greater than `after`."""
        ...


def _digest(spec: bytes) -> str:
    return hashlib.sha256(spec).hexdigest()


def _check_transition(job: Job, to: JobState) -> None:
    if to not in _NEXT.get(job.state, set()):
        raise InvalidTransition(f"job {job.job_id} is {job.state}; it cannot become {to}")


def _pending_job(submitter: str, idempotency_key: str, spec: bytes, now: float) -> Job:
    return Job(
        uuid.uuid4().hex,
        submitter,
        idempotency_key,
        spec,
        JobState.PENDING,
        "",
        0,
        {JobState.PENDING: now},
    )


def _check_same_spec(
    submitter: str, idempotency_key: str, job_id: str, stored_digest: str, spec: bytes
) -> None:
    if stored_digest != _digest(spec):
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} was used by {submitter!r} for job {job_id} "
            "with a different spec"
        )


class MemoryJobStore(JobStore):
    """A JobStore in this process's memory."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._keys: dict[tuple[str, str], tuple[str, str]] = {}
        self._events: dict[str, list[Event]] = {}

    def _find(self, submitter: str, idempotency_key: str, spec: bytes) -> Job | None:
        found = self._keys.get((submitter, idempotency_key))
        if found is None:
            return None
        job_id, digest = found
        _check_same_spec(submitter, idempotency_key, job_id, digest, spec)
        return self._jobs[job_id]

    @override
    def find(self, submitter: str, idempotency_key: str, spec: bytes) -> Job | None:
        with self._lock:
            return self._find(submitter, idempotency_key, spec)

    @override
    def create(self, submitter: str, idempotency_key: str, spec: bytes) -> tuple[Job, bool]:
        with self._lock:
            found = self._find(submitter, idempotency_key, spec)
            if found is not None:
                return found, False
            job = _pending_job(submitter, idempotency_key, spec, self._clock())
            self._jobs[job.job_id] = job
            self._keys[(submitter, idempotency_key)] = (job.job_id, _digest(spec))
            self._events[job.job_id] = []
            return job, True

    @override
    def get(self, job_id: str) -> Job:
        with self._lock:
            return self._get(job_id)

    def _get(self, job_id: str) -> Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise JobNotFound(f"no job {job_id!r}") from None

    @override
    def jobs(self, state: JobState | None = None) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if state is None or j.state == state]

    @override
    def transition(self, job_id: str, to: JobState, reason: str = "") -> Job:
        with self._lock:
            job = self._get(job_id)
            _check_transition(job, to)
            job = replace(
                job,
                state=to,
                reason=reason,
                state_times={**job.state_times, to.value: self._clock()},
            )
            self._jobs[job_id] = job
            return job

    @override
    def set_round(self, job_id: str, round: int) -> Job:
        with self._lock:
            job = replace(self._get(job_id), current_round=round)
            self._jobs[job_id] = job
            return job

    @override
    def add_event(
        self, job_id: str, kind: str, round: int = 0, data: dict[str, Any] | None = None
    ) -> Event:
        with self._lock:
            self._get(job_id)
            log = self._events[job_id]
            event = Event(
                job_id, len(log) + 1, self._clock(), kind, round, json.loads(json.dumps(data or {}))
            )
            log.append(event)
            return event

    @override
    def events(self, job_id: str, after: int = 0) -> list[Event]:
        with self._lock:
            self._get(job_id)
            return [e for e in self._events[job_id] if e.seq > after]


SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT UNIQUE NOT NULL,
    submitter TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    spec BLOB NOT NULL,
    spec_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    current_round INTEGER NOT NULL,
    state_times TEXT NOT NULL,
    UNIQUE (submitter, idempotency_key)
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL REFERENCES jobs (job_id),
    seq INTEGER NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    round INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
"""


class SqliteJobStore(JobStore):
    """A JobStore in a SQLite file: jobs survive a coordinator restart."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)  # commits by itself: outside a transaction
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(
                    f"job store {path} has schema version {row[0]}; this "
                    f"coordinator reads version {SCHEMA_VERSION}"
                )

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    @staticmethod
    def _job(row: tuple[Any, ...]) -> Job:
        job_id, submitter, key, spec, state, reason, current_round, times = row
        return Job(
            job_id,
            submitter,
            key,
            bytes(spec),
            JobState(state),
            reason,
            current_round,
            json.loads(times),
        )

    _COLUMNS = "job_id, submitter, idempotency_key, spec, state, reason, current_round, state_times"

    def _get(self, db: sqlite3.Connection, job_id: str) -> Job:
        row = db.execute(f"SELECT {self._COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return self._job(row)

    def _find(
        self, db: sqlite3.Connection, submitter: str, idempotency_key: str, spec: bytes
    ) -> Job | None:
        row = db.execute(
            f"SELECT {self._COLUMNS}, spec_digest FROM jobs WHERE submitter = ? AND "
            "idempotency_key = ?",
            (submitter, idempotency_key),
        ).fetchone()
        if row is None:
            return None
        _check_same_spec(submitter, idempotency_key, row[0], row[-1], spec)
        return self._job(row[:-1])

    @override
    def find(self, submitter: str, idempotency_key: str, spec: bytes) -> Job | None:
        with self._tx() as db:
            return self._find(db, submitter, idempotency_key, spec)

    @override
    def create(self, submitter: str, idempotency_key: str, spec: bytes) -> tuple[Job, bool]:
        with self._tx() as db:
            found = self._find(db, submitter, idempotency_key, spec)
            if found is not None:
                return found, False
            job = _pending_job(submitter, idempotency_key, spec, self._clock())
            db.execute(
                "INSERT INTO jobs (job_id, submitter, idempotency_key, spec, spec_digest, state,"
                " reason, current_round, state_times) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job.job_id,
                    submitter,
                    idempotency_key,
                    spec,
                    _digest(spec),
                    job.state.value,
                    "",
                    0,
                    json.dumps(job.state_times),
                ),
            )
            return job, True

    @override
    def get(self, job_id: str) -> Job:
        with self._tx() as db:
            return self._get(db, job_id)

    @override
    def jobs(self, state: JobState | None = None) -> list[Job]:
        with self._tx() as db:
            rows = db.execute(f"SELECT {self._COLUMNS} FROM jobs ORDER BY n").fetchall()
        jobs = [self._job(r) for r in rows]
        return [j for j in jobs if state is None or j.state == state]

    @override
    def transition(self, job_id: str, to: JobState, reason: str = "") -> Job:
        with self._tx() as db:
            job = self._get(db, job_id)
            _check_transition(job, to)
            times = {**job.state_times, to.value: self._clock()}
            db.execute(
                "UPDATE jobs SET state = ?, reason = ?, state_times = ? WHERE job_id = ?",
                (to.value, reason, json.dumps(times), job_id),
            )
            return replace(job, state=to, reason=reason, state_times=times)

    @override
    def set_round(self, job_id: str, round: int) -> Job:
        with self._tx() as db:
            job = self._get(db, job_id)
            db.execute("UPDATE jobs SET current_round = ? WHERE job_id = ?", (round, job_id))
            return replace(job, current_round=round)

    @override
    def add_event(
        self, job_id: str, kind: str, round: int = 0, data: dict[str, Any] | None = None
    ) -> Event:
        with self._tx() as db:
            self._get(db, job_id)
            (last,) = db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
            ).fetchone()
            event = Event(
                job_id, last + 1, self._clock(), kind, round, json.loads(json.dumps(data or {}))
            )
            db.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, event.seq, event.at, kind, round, json.dumps(event.data)),
            )
            return event

    @override
    def events(self, job_id: str, after: int = 0) -> list[Event]:
        with self._tx() as db:
            self._get(db, job_id)
            rows = db.execute(
                "SELECT job_id, seq, at, kind, round, data FROM events WHERE "
                "job_id = ? AND seq > ? ORDER BY seq",
                (job_id, after),
            ).fetchall()
        return [Event(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]
