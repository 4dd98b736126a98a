"""The job store in SQL: `SqliteJobStore` (one file, the default) and `PostgresJobStore`.

Both run the same statements (written with `?` placeholders; PostgreSQL's driver takes `%s`) in
one transaction per call. Where two coordinators share a PostgreSQL database, the job's row is
locked (`FOR UPDATE`) before it is read for a change, so a transition, an event number or a
lease is decided by one of them at a time; SQLite's `BEGIN IMMEDIATE` locks the whole file.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from typing_extensions import override

from mpcml.coordinator.store import (
    Event,
    Job,
    JobNotFound,
    JobState,
    JobStore,
    StoreError,
    StoreUnavailable,
    _check_same_spec,
    _check_transition,
    _digest,
    _pending_job,
)

SCHEMA_VERSION = 2
"""Version 2 added the lease (`lease_holder`, `lease_until`); a version-1 SQLite file gains it."""
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    n {serial},
    job_id TEXT UNIQUE NOT NULL,
    submitter TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    spec {blob} NOT NULL,
    spec_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    current_round INTEGER NOT NULL,
    state_times TEXT NOT NULL,
    lease_holder TEXT NOT NULL DEFAULT '',
    lease_until {real} NOT NULL DEFAULT 0,
    UNIQUE (submitter, idempotency_key)
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL REFERENCES jobs (job_id),
    seq INTEGER NOT NULL,
    at {real} NOT NULL,
    kind TEXT NOT NULL,
    round INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
"""
_COLUMNS = "job_id, submitter, idempotency_key, spec, state, reason, current_round, state_times"


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


class _SqlJobStore(JobStore):
    """The statements both databases run; a subclass opens the connection and transactions."""

    _placeholder = "?"
    _for_update = ""

    def __init__(self, name: str, clock: Callable[[], float]) -> None:
        self._name = name
        """Where the jobs are, for messages (never a password)."""
        self._clock = clock
        self._lock = threading.Lock()

    def _tx(self) -> Any:
        """A context manager: one transaction, yielding a cursor-like object with `execute`."""
        raise NotImplementedError

    def _q(self, sql: str) -> str:
        return sql.replace("?", self._placeholder)

    def _run(self, db: Any, sql: str, args: tuple[Any, ...] = ()) -> Any:
        return db.execute(self._q(sql), args)

    def _check_version(self, version: int) -> None:
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"job store {self._name} has schema version {version}; this "
                f"coordinator reads version {SCHEMA_VERSION}"
            )

    def _get(self, db: Any, job_id: str, lock: bool = False) -> Job:
        suffix = self._for_update if lock else ""
        row = self._run(
            db, f"SELECT {_COLUMNS} FROM jobs WHERE job_id = ?{suffix}", (job_id,)
        ).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return _job(row)

    def _find(self, db: Any, submitter: str, idempotency_key: str, spec: bytes) -> Job | None:
        row = self._run(
            db,
            f"SELECT {_COLUMNS}, spec_digest FROM jobs WHERE submitter = ? AND idempotency_key = ?",
            (submitter, idempotency_key),
        ).fetchone()
        if row is None:
            return None
        _check_same_spec(submitter, idempotency_key, row[0], row[-1], spec)
        return _job(row[:-1])

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
            inserted = self._run(
                db,
                "INSERT INTO jobs (job_id, submitter, idempotency_key, spec, spec_digest, state,"
                " reason, current_round, state_times) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (submitter, idempotency_key) DO NOTHING",
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
            if inserted.rowcount == 1:
                return job, True
        # another coordinator inserted the same key since we looked: that job is the one
        found = self.find(submitter, idempotency_key, spec)
        assert found is not None
        return found, False

    @override
    def get(self, job_id: str) -> Job:
        with self._tx() as db:
            return self._get(db, job_id)

    @override
    def jobs(self, state: JobState | None = None) -> list[Job]:
        with self._tx() as db:
            if state is None:
                rows = self._run(db, f"SELECT {_COLUMNS} FROM jobs ORDER BY n").fetchall()
            else:
                rows = self._run(
                    db, f"SELECT {_COLUMNS} FROM jobs WHERE state = ? ORDER BY n", (state.value,)
                ).fetchall()
        return [_job(r) for r in rows]

    @override
    def transition(self, job_id: str, to: JobState, reason: str = "") -> Job:
        with self._tx() as db:
            job = self._get(db, job_id, lock=True)
            _check_transition(job, to)
            times = {**job.state_times, to.value: self._clock()}
            self._run(
                db,
                "UPDATE jobs SET state = ?, reason = ?, state_times = ? WHERE job_id = ?",
                (to.value, reason, json.dumps(times), job_id),
            )
            return replace(job, state=to, reason=reason, state_times=times)

    @override
    def set_round(self, job_id: str, round: int) -> Job:
        with self._tx() as db:
            job = self._get(db, job_id, lock=True)
            self._run(db, "UPDATE jobs SET current_round = ? WHERE job_id = ?", (round, job_id))
            return replace(job, current_round=round)

    @override
    def add_event(
        self, job_id: str, kind: str, round: int = 0, data: dict[str, Any] | None = None
    ) -> Event:
        with self._tx() as db:
            self._get(db, job_id, lock=True)  # numbers the job's events one writer at a time
            (last,) = self._run(
                db, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
            ).fetchone()
            event = Event(
                job_id, last + 1, self._clock(), kind, round, json.loads(json.dumps(data or {}))
            )
            self._run(
                db,
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, event.seq, event.at, kind, round, json.dumps(event.data)),
            )
            return event

    @override
    def events(self, job_id: str, after: int = 0) -> list[Event]:
        with self._tx() as db:
            self._get(db, job_id)
            rows = self._run(
                db,
                "SELECT job_id, seq, at, kind, round, data FROM events WHERE "
                "job_id = ? AND seq > ? ORDER BY seq",
                (job_id, after),
            ).fetchall()
        return [Event(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    @override
    def claim(self, job_id: str, holder: str, ttl: float) -> bool:
        with self._tx() as db:
            self._get(db, job_id, lock=True)
            now = self._clock()
            taken = self._run(
                db,
                "UPDATE jobs SET lease_holder = ?, lease_until = ? WHERE job_id = ? AND "
                "(lease_holder = '' OR lease_holder = ? OR lease_until <= ?)",
                (holder, now + ttl, job_id, holder, now),
            )
            return bool(taken.rowcount == 1)

    @override
    def renew(self, holder: str, ttl: float) -> set[str]:
        with self._tx() as db:
            rows = self._run(
                db, f"SELECT job_id FROM jobs WHERE lease_holder = ?{self._for_update}", (holder,)
            ).fetchall()
            self._run(
                db,
                "UPDATE jobs SET lease_until = ? WHERE lease_holder = ?",
                (self._clock() + ttl, holder),
            )
        return {r[0] for r in rows}

    @override
    def release(self, job_id: str, holder: str) -> None:
        with self._tx() as db:
            self._run(
                db,
                "UPDATE jobs SET lease_holder = '', lease_until = 0 "
                "WHERE job_id = ? AND lease_holder = ?",
                (job_id, holder),
            )


class SqliteJobStore(_SqlJobStore):
    """A JobStore in a SQLite file: jobs survive a coordinator restart."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__(str(path), clock)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        schema = _TABLES.format(
            serial="INTEGER PRIMARY KEY AUTOINCREMENT", blob="BLOB", real="REAL"
        )
        self._db.executescript(schema)  # commits by itself: outside a transaction
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            elif int(row[0]) == 1:  # before the lease: the same tables less its two columns
                db.execute("ALTER TABLE jobs ADD COLUMN lease_holder TEXT NOT NULL DEFAULT ''")
                db.execute("ALTER TABLE jobs ADD COLUMN lease_until REAL NOT NULL DEFAULT 0")
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", ("2",))
            else:
                self._check_version(int(row[0]))

    @override
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

    @override
    def close(self) -> None:
        self._db.close()


def postgres_name(url: str) -> str:
    """`url` without its password or options, for logs and messages."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(url)
    except Exception:  # a malformed URL: say nothing of what it holds
        return "postgresql://(unparsable URL)"
    host, port = info.get("host", "localhost"), info.get("port", "5432")
    return f"postgresql://{info.get('user', '')}@{host}:{port}/{info.get('dbname', '')}"


class PostgresJobStore(_SqlJobStore):
    """A JobStore in a PostgreSQL database, which several coordinators may share."""

    _placeholder = "%s"
    _for_update = " FOR UPDATE"

    def __init__(self, url: str, clock: Callable[[], float] = time.time) -> None:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "store is a postgresql:// URL but the PostgreSQL driver is not installed: "
                "pip install 'mpcml[postgres]' (psycopg 3)"
            ) from None
        super().__init__(postgres_name(url), clock)
        self._psycopg = psycopg
        self._url = url
        self._db = self._connect()
        schema = _TABLES.format(
            serial="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
            blob="BYTEA",
            real="DOUBLE PRECISION",
        )
        with self._tx() as db:
            # one creator at a time when several coordinators start on an empty database
            db.execute("SELECT pg_advisory_xact_lock(7327)")
            for statement in filter(str.strip, schema.split(";")):
                db.execute(statement)
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),))
            else:
                self._check_version(int(row[0]))

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(self._url, autocommit=True, connect_timeout=10)
        except self._psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreUnavailable(f"cannot open the job store {self._name}: {reason}") from None

    @override
    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            if self._db.closed or self._db.broken:  # the server restarted, or the link broke
                self._db = self._connect()
            try:
                with self._db.transaction():
                    yield self._db
            except self._psycopg.OperationalError as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "no reason"
                raise StoreUnavailable(f"the job store {self._name} failed: {reason}") from None

    @override
    def close(self) -> None:
        self._db.close()
