"""The coordinator's logic behind one lock: the party registry, admission, the runs, events.

Everything here is public metadata (docs/architecture.md): the scheduler composes the registry
(`registry.py`), admission (`admission.py`) and the run state machine (`runs.py`), stores every
event (`history.py` reads them), and is what the gRPC services call. Every method is safe to
call from any gRPC thread. The clock is injected, so that tests move time instead of sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from google.protobuf import json_format

from mpcml.coordinator.admission import Admission
from mpcml.coordinator.history import History
from mpcml.coordinator.registry import Assignments, Registry
from mpcml.coordinator.runs import Runs
from mpcml.coordinator.store import TERMINAL, Event, IdempotencyConflict, Job, JobState, JobStore
from mpcml.errors import StatusError
from mpcml.jobs.events import EventKind
from mpcml.jobs.validate import binding_rows, pin_weights
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb

log = logging.getLogger(__name__)


class Scheduler:
    """Parties, jobs and rounds; every method is safe to call from any gRPC thread."""

    def __init__(
        self,
        store: JobStore,
        roster: list[str],
        heartbeat_timeout: float = 15.0,
        max_job_rows: int | None = None,
        on_event: Callable[[Event], None] | None = None,
        admins: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
        holder: str = "coordinator",
        lease_s: float = 30.0,
    ) -> None:
        self.store = store
        self.on_event = on_event
        """Called with every event as it is stored, under the scheduler's lock (the metrics)."""
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self.registry = Registry(roster, heartbeat_timeout, clock)
        self.admission = Admission(store, roster, max_job_rows, admins)
        self.runs = Runs(store, self.registry, self._event, clock, holder, lease_s)
        with self._lock:
            self.runs.take_over()

    @property
    def holder(self) -> str:
        """The name this coordinator's job leases carry."""
        return self.runs.holder

    def _event(self, job_id: str, kind: EventKind, round: int = 0, **data: Any) -> Event:
        event = self.store.add_event(job_id, kind.value, round, data)
        self._changed.notify_all()
        if self.on_event is not None:
            self.on_event(event)
        return event

    # --- parties ----------------------------------------------------------------------------

    def attach(self, info: cpb.AttachRequest) -> Assignments:
        """Register `info.party`; a newer Attach of the same party replaces the older one."""
        with self._lock:
            link, old = self.registry.attach(info)
            if old is not None:
                self.runs.carry_over(old, link)
            self.runs.rejoin(link)
            self.runs.stop_unknown(link)
            self.runs.schedule()
            return link.assignments

    def detach(self, name: str, assignments: Assignments) -> None:
        """The party's Attach stream ended.

        Its jobs go on: a party whose stream broke (a network blip) attaches again and carries
        them over. `tick` fails them once it has been silent for the heartbeat timeout.
        """
        with self._lock:
            link = self.registry.detach(name, assignments)
            if link is None:
                return
            timeout = self.registry.heartbeat_timeout
            log.warning(
                "party %s detached%s",
                name,
                f"; its jobs fail unless it attaches again within {timeout:g} s"
                if link.jobs
                else "",
                extra={"party": name},
            )

    def heartbeat(self, name: str, running: Collection[str] | None = None) -> None:
        """Note that `name` is alive, and the jobs its workers run (when it says)."""
        with self._lock:
            self.registry.heartbeat(name, running)

    def peers(self, caller: str) -> list[cpb.PeerEndpoint]:
        """The parties attached now but `caller`: names and addresses only."""
        with self._lock:
            return self.registry.peers(caller)

    def parties(self) -> list[cpb.PartyStatus]:
        """Every party that has registered since the coordinator started."""
        with self._lock:
            return self.registry.parties()

    # --- jobs -------------------------------------------------------------------------------

    def submit(self, spec: jpb.JobSpec, idempotency_key: str, submitter: str) -> Job:
        """Validate a job, have every party vet it, and store it.

        The same key and spec give the same job, without a second vet.
        """
        with self._lock:
            spec = self.admission.normalise(spec, submitter)
            attached = self.registry.connected()
            infos = {n: link.info for n, link in attached.items()}
            pin_weights(spec, infos)
            plan = self.admission.check(spec, infos)
            rows = binding_rows(spec, infos)
            links = {name: attached[name] for name in spec.parties}
            encoded = spec.SerializeToString(deterministic=True)
            if idempotency_key:  # a retry: the job exists, vetted already
                try:
                    existing = self.store.find(submitter, idempotency_key, encoded)
                except IdempotencyConflict as exc:
                    raise StatusError("ALREADY_EXISTS", str(exc)) from None
                if existing is not None:
                    return existing
        found = self.admission.vet(spec, submitter, links, rows)
        with self._lock:
            key = idempotency_key or f"auto-{time.time_ns()}"
            try:
                job, created = self.store.create(submitter, key, encoded)
            except IdempotencyConflict as exc:
                raise StatusError("ALREADY_EXISTS", str(exc)) from None
            if created:
                self._event(
                    job.job_id,
                    EventKind.SUBMITTED,
                    total_rounds=plan.total_rounds,
                    parties=list(spec.parties),
                    name=spec.name,
                    estimate=json_format.MessageToDict(found, preserving_proto_field_name=True),
                )
                self._event(job.job_id, EventKind.STATE, state=JobState.PENDING.value)
                log.info(
                    "job %s submitted by %s: %d rounds",
                    job.job_id,
                    submitter,
                    plan.total_rounds,
                    extra={"job_id": job.job_id},
                )
                self.runs.schedule()
            return self.store.get(job.job_id)

    def verdict(self, party: str, verdict: cpb.Verdict) -> None:
        """A party's answer to a policy check."""
        self.admission.verdict(party, verdict)

    def job(self, job_id: str) -> Job:
        """The stored job, or NOT_FOUND."""
        return self.admission.job(job_id)

    def authorise(self, job_id: str, caller: str, role: str, verb: str) -> Job:
        """The job, if `caller` may `verb` it (`Admission.authorise`)."""
        return self.admission.authorise(job_id, caller, role, verb)

    def jobs_of(self, caller: str, state: JobState | None = None) -> list[Job]:
        """The jobs `caller` may list."""
        return self.admission.jobs_of(caller, state)

    def cancel(self, job_id: str, reason: str) -> Job:
        """Cancel a job that has not ended; its workers are stopped."""
        with self._lock:
            self.job(job_id)
            self.runs.cancel(job_id, reason or "cancelled by the submitter")
            return self.store.get(job_id)

    def purge(self, job_id: str) -> tuple[list[str], list[str]]:
        """Send an ended job's parties a PurgeJob; (the parties told, those not attached)."""
        with self._lock:
            job = self.job(job_id)
            if job.state not in TERMINAL:
                raise StatusError(
                    "FAILED_PRECONDITION",
                    f"job {job_id} is {job.state}: cancel it before purging its files",
                )
            sent, absent = [], []
            for name in jpb.JobSpec.FromString(job.spec).parties:
                link = self.registry.links.get(name)
                if link is None:
                    absent.append(name)
                    continue
                link.send(cpb.Assignment(purge=cpb.PurgeJob(job_id=job_id)))
                sent.append(name)
            log.info("job %s: purge sent to %s", job_id, ", ".join(sent) or "no party")
            return sent, absent

    def resume(self, job_id: str) -> Job:
        """Queue a FAILED job again, to go on from its last committed round."""
        with self._lock:
            self.runs.resume(self.job(job_id))
            return self.store.get(job_id)

    def history(self, job_id: str) -> History:
        """The job's progress."""
        return self.runs.history(job_id)

    def report(self, party: str, report: cpb.WorkerReport) -> None:
        """A worker's READY, DONE, FINISHED or FAILED."""
        with self._lock:
            self.job(report.job_id)
            self.runs.report(party, report)

    # --- time -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Fail jobs of parties whose heartbeats stopped, and echoes whose grace ran out.

        Also renews this coordinator's job leases, takes over jobs whose coordinator stopped,
        fails taken-over jobs whose parties did not come back, and sends an overdue round's GO
        again.
        """
        with self._lock:
            self.runs.keep_leases()  # first: a job whose lease is gone is not this one's to fail
            timeout = self.registry.heartbeat_timeout
            for silence in self.registry.silent():
                name = silence.link.info.party
                for job_id in list(silence.link.jobs):
                    self.runs.fail(
                        job_id, f"party {name!r} {silence.cause} (timeout {timeout:.0f} s)"
                    )
            self.runs.expire_echoes()
            self.runs.expire_absent()
            self.runs.repeat_go()

    def wait_events(self, job_id: str, after: int, timeout: float) -> list[Event]:
        """The job's events after `after`, waiting up to `timeout` for one to arrive."""
        with self._lock:
            events = self.store.events(job_id, after)
            if not events:
                self._changed.wait(timeout)
                events = self.store.events(job_id, after)
            return events
