"""The job store: every job, its state history, its events and its lease, behind one interface.

Three implementations with the same behaviour (tests/coordinator/test_store.py runs one contract
on each): `MemoryJobStore` (tests, throwaway runs) here, and in `sql_store.py` `SqliteJobStore`
(the default: a restarted coordinator still knows every job) and `PostgresJobStore` (a
consortium that runs many jobs, or a standby coordinator on the same database). The store keeps
a job's spec as opaque bytes (a serialized protobuf); it never sees a share or a private input.

The lease: a coordinator runs a job only while it holds the job's lease (`claim`, kept alive by
`renew`, given up by `release`), so two coordinators on one database never run the same job;
a lease that is not renewed lapses after its time to live, and another coordinator (or the same
one, restarted) may take the job over.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from typing_extensions import override

from mpcml.errors import MpcmlError, StatusError


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


class StoreUnavailable(StatusError, StoreError):
    """The database could not be reached or failed mid-call; a request gets UNAVAILABLE.

    The next call opens a new connection, so a restarted database costs the calls made while it
    was down, not the coordinator.
    """

    def __init__(self, message: str) -> None:
        super().__init__("UNAVAILABLE", message)


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

    def claim(self, job_id: str, holder: str, ttl: float) -> bool:
        """Take the job's lease for `ttl` seconds: True if it was free, lapsed or `holder`'s."""
        ...

    def renew(self, holder: str, ttl: float) -> set[str]:
        """Extend every lease `holder` holds (lapsed ones too, if nobody took them); their ids."""
        ...

    def release(self, job_id: str, holder: str) -> None:
        """Give up the job's lease if `holder` holds it."""
        ...

    def close(self) -> None:
        """Close the database (nothing for the memory store)."""
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
        self._leases: dict[str, tuple[str, float]] = {}

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

    @override
    def claim(self, job_id: str, holder: str, ttl: float) -> bool:
        with self._lock:
            self._get(job_id)
            now = self._clock()
            lease = self._leases.get(job_id)
            if lease is not None and lease[0] != holder and lease[1] > now:
                return False
            self._leases[job_id] = (holder, now + ttl)
            return True

    @override
    def renew(self, holder: str, ttl: float) -> set[str]:
        with self._lock:
            now = self._clock()
            held = {j for j, (h, _) in self._leases.items() if h == holder}
            for job_id in held:
                self._leases[job_id] = (holder, now + ttl)
            return held

    @override
    def release(self, job_id: str, holder: str) -> None:
        with self._lock:
            if self._leases.get(job_id, ("", 0.0))[0] == holder:
                del self._leases[job_id]

    @override
    def close(self) -> None:
        pass


def open_store(location: str, clock: Callable[[], float] = time.time) -> JobStore:
    """The store at `location`: a `postgresql://` URL, or the path of a SQLite file."""
    from mpcml.coordinator import sql_store

    if location.startswith(sql_store.POSTGRES_SCHEMES):
        return sql_store.PostgresJobStore(location, clock)
    return sql_store.SqliteJobStore(location, clock)
