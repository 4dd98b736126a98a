"""The coordinator's logic: registered parties, and each job's run as numbered rounds.

Everything here is public metadata (DESIGN.md 2). A job goes PENDING -> STARTING when all its
parties are attached and have a free slot (a party runs up to its `max_concurrent_jobs` at once;
later jobs wait), RUNNING when
every worker reported READY, and through its rounds: GO r to every party, round r committed when
every party reported DONE r. The first failure of any party fails the job and stops the others.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from mpcml.coordinator.store import (
    TERMINAL,
    Event,
    IdempotencyConflict,
    Job,
    JobNotFound,
    JobState,
    JobStore,
)
from mpcml.errors import StatusError
from mpcml.jobs.spec import COORDINATOR, parties_in_order, recipients
from mpcml.jobs.validate import SpecError, validate
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.address import port_offset
from mpcml.transport.tls import CLIENT_ROLE, PARTY_ROLE

log = logging.getLogger(__name__)

READ = "read"
"""The verb of `Scheduler.authorise` that a job's parties may too."""

VET_TIMEOUT_S = 10.0
"""How long a submission waits for every party's policy verdict."""

PEER_FAILURE_GRACE_S = 3.0
"""After a party reports it failed only because a peer did, wait this long for the peer's own
reason before failing the job with the echo."""


class SchedulerError(StatusError):
    """A request the scheduler refuses; `code` is the gRPC status name to answer with."""


@dataclass
class PartyLink:
    """A registered party and the queue of assignments its Attach stream sends."""

    info: cpb.AttachRequest
    assignments: queue.Queue[cpb.Assignment | None]
    last_seen: float
    connected: bool = True
    jobs: dict[str, int] = field(default_factory=dict)
    """The jobs it runs, each with the slot its worker took."""

    def free_slot(self) -> int | None:
        """A slot for one more job, or None while it runs `max_concurrent_jobs`."""
        free = set(range(max(1, self.info.max_concurrent_jobs))) - set(self.jobs.values())
        return min(free) if free else None


@dataclass
class History:
    """What a job's events say about its progress."""

    total_rounds: int
    committed: int = 0
    digests: dict[str, str] = field(default_factory=dict)
    """Each party's checkpoint digest of the committed round."""
    resumes: int = 0


def job_history(events: list[Event]) -> History:
    """Rounds, the last committed one with its checkpoint digests, and resumes.

    Read from the events, so that they survive a coordinator restart.
    """
    history = History(total_rounds=int(events[0].data["total_rounds"]) if events else 0)
    for event in events:
        if event.kind == "round_done":
            history.committed = event.round
            history.digests = dict(event.data.get("digests", {}))
        elif event.kind == "resumed":
            history.resumes += 1
    return history


def _resume_round(spec: jpb.JobSpec, history: History) -> int:
    """The round a resumed run goes on from.

    Training keeps checkpoints, so it goes on from its last committed round; other tasks keep
    no state between rounds and run again from the start.
    """
    return history.committed if spec.task == jpb.TASK_TRAIN else 0


@dataclass
class Run:
    """A job between STARTING and its end."""

    job_id: str
    spec: jpb.JobSpec
    parties: list[str]
    total_rounds: int
    resume_round: int = 0
    """The committed round this run goes on from (0: from the start)."""
    attempt: int = 0
    """`StartJob.attempt`: reports of any other run of the job are stale."""
    round: int = 0
    round_started: float = 0.0
    ready: set[str] = field(default_factory=set)
    done: dict[str, cpb.RoundDone] = field(default_factory=dict)
    finished: dict[str, cpb.Finished] = field(default_factory=dict)
    echo: tuple[float, str] | None = None
    """(when, reason) of the first failure that only echoes a peer's."""
    starts: dict[str, cpb.StartJob] = field(default_factory=dict)
    """What each party was told to start, to tell it again if it never heard."""


def reconstruct(shares: list[cpb.MetricShare]) -> dict[str, float]:
    """Sum additive fixed-point shares modulo 2^64 and decode them."""
    sums: dict[str, int] = {}
    scales: dict[str, int] = {}
    for s in shares:
        sums[s.name] = (sums.get(s.name, 0) + s.share) % 2**64
        scales[s.name] = s.scale
    out = {}
    for name, total in sums.items():
        signed = total - 2**64 if total >= 2**63 else total
        out[name] = signed / max(scales[name], 1)
    return out


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
    ) -> None:
        self.store = store
        self.admins = frozenset(admins)
        """Client names that may act on every job (`admins` in coordinator.toml)."""
        self.on_event = on_event
        """Called with every event as it is stored, under the scheduler's lock (the metrics)."""
        self.roster = roster
        self.heartbeat_timeout = heartbeat_timeout
        self.max_job_rows = max_job_rows
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._parties: dict[str, PartyLink] = {}
        self._runs: dict[str, Run] = {}
        self._verdicts: dict[str, dict[str, cpb.Verdict]] = {}
        self._verdict_ready = threading.Condition(threading.Lock())
        with self._lock:
            self._interrupted()

    def _interrupted(self) -> None:
        for job in self.store.jobs():
            if job.state in (JobState.STARTING, JobState.RUNNING):
                self._end(
                    job.job_id,
                    JobState.FAILED,
                    f"interrupted: the coordinator restarted during round {job.current_round}",
                )

    # --- events -----------------------------------------------------------------------------

    def _event(self, job_id: str, kind: str, round: int = 0, **data: Any) -> Event:
        event = self.store.add_event(job_id, kind, round, data)
        self._changed.notify_all()
        if self.on_event is not None:
            self.on_event(event)
        return event

    def _end(self, job_id: str, state: JobState, reason: str = "") -> None:
        job = self.store.transition(job_id, state, reason)
        self._event(job_id, "state", job.current_round, state=state.value, reason=reason)
        run = self._runs.pop(job_id, None)
        if run is None:
            return
        committed = self.history(job_id).committed
        for name in run.parties:
            link = self._parties.get(name)
            if link is None or link.jobs.pop(job_id, None) is None:
                continue
            if state != JobState.COMPLETED:
                stop = cpb.StopJob(job_id=job_id, reason=reason, committed_round=committed)
                link.assignments.put(cpb.Assignment(stop=stop))
        log.info(
            "job %s %s %s",
            job_id,
            state.value,
            reason,
            extra={"job_id": job_id, "round": job.current_round},
        )
        self._schedule()

    # --- parties ----------------------------------------------------------------------------

    def attach(self, info: cpb.AttachRequest) -> queue.Queue[cpb.Assignment | None]:
        """Register `info.party`; a newer Attach of the same party replaces the older one."""
        with self._lock:
            if self.roster and info.party not in self.roster:
                raise SchedulerError(
                    "PERMISSION_DENIED",
                    f"party {info.party!r} is not in the coordinator's roster "
                    f"({', '.join(self.roster)})",
                )
            old = self._parties.get(info.party)
            link = PartyLink(info, queue.Queue(), time.monotonic())
            self._parties[info.party] = link
            if old is not None:
                old.assignments.put(None)
                for job_id, slot in old.jobs.items():
                    self._carry_over(job_id, slot, link)
            log.info(
                "party %s attached from %s",
                info.party,
                info.data_address,
                extra={"party": info.party},
            )
            for job_id in info.running_jobs:
                if job_id not in self._runs:  # e.g. this coordinator restarted during it
                    stop = cpb.StopJob(
                        job_id=job_id, reason=f"the coordinator no longer runs job {job_id}"
                    )
                    with contextlib.suppress(JobNotFound):
                        self.store.get(job_id)
                        stop.committed_round = self.history(job_id).committed
                    link.assignments.put(cpb.Assignment(stop=stop))
            self._schedule()
            return link.assignments

    def _carry_over(self, job_id: str, slot: int, link: PartyLink) -> None:
        """A party attached again while it had a job: go on with it where that is safe.

        Its old stream may have died with assignments in it (a network blip the coordinator
        had not noticed yet). A worker the party still runs keeps its job, and hears the current
        round's GO again; a job the party never started (its StartJob was lost) is started
        again. Otherwise its worker is gone and the job fails.
        """
        run = self._runs.get(job_id)
        party = link.info.party
        if run is None:
            return
        if party in run.ready and job_id not in link.info.running_jobs:
            self._fail(job_id, f"party {party!r} attached again and no longer runs the job")
            return
        log.info(
            "job %s: party %s attached again; the job goes on",
            job_id,
            party,
            extra={"job_id": job_id, "party": party},
        )
        link.jobs[job_id] = slot
        if party not in run.ready:  # the party ignores a StartJob its worker already runs
            link.assignments.put(cpb.Assignment(start=run.starts[party]))
        elif run.round > run.resume_round and party not in run.done:
            go = cpb.GoRound(job_id=job_id, round=run.round, attempt=run.attempt)
            link.assignments.put(cpb.Assignment(go=go))

    def detach(self, name: str, assignments: queue.Queue[cpb.Assignment | None]) -> None:
        """The party's Attach stream ended.

        Its jobs go on: a party whose stream broke (a network blip) attaches again and carries
        them over. `tick` fails them once it has been silent for the heartbeat timeout.
        """
        with self._lock:
            link = self._parties.get(name)
            if link is None or link.assignments is not assignments:
                return
            link.connected = False
            log.warning(
                "party %s detached%s",
                name,
                f"; its jobs fail unless it attaches again within {self.heartbeat_timeout:g} s"
                if link.jobs
                else "",
                extra={"party": name},
            )

    def heartbeat(self, name: str) -> None:
        """Note that `name` is alive."""
        with self._lock:
            link = self._parties.get(name)
            if link is None or not link.connected:
                raise SchedulerError("FAILED_PRECONDITION", f"party {name!r} is not attached")
            link.last_seen = time.monotonic()

    def peers(self, caller: str) -> list[cpb.PeerEndpoint]:
        """The parties attached now but `caller`: names and addresses only."""
        with self._lock:
            return [
                cpb.PeerEndpoint(
                    name=name,
                    data_address=link.info.data_address,
                    health_address=link.info.health_address,
                )
                for name, link in sorted(self._parties.items())
                if link.connected and name != caller
            ]

    def parties(self) -> list[cpb.PartyStatus]:
        """Every party that has registered since the coordinator started."""
        with self._lock:
            now = time.monotonic()
            return [
                cpb.PartyStatus(
                    name=name,
                    data_address=link.info.data_address,
                    device=link.info.device,
                    connected=link.connected,
                    heartbeat_age=now - link.last_seen,
                    datasets=list(link.info.datasets),
                    models=list(link.info.models),
                )
                for name, link in sorted(self._parties.items())
            ]

    # --- jobs -------------------------------------------------------------------------------

    def submit(self, spec: jpb.JobSpec, idempotency_key: str, submitter: str) -> Job:
        """Validate a job, have every party vet it, and store it.

        The same key and spec give the same job.
        """
        with self._lock:
            spec = self._normalise(spec, submitter)
            registered = {n: p.info for n, p in self._parties.items() if p.connected}
            try:
                plan = validate(spec, registered, self.roster)
            except SpecError as exc:
                raise SchedulerError(
                    "FAILED_PRECONDITION" if exc.precondition else "INVALID_ARGUMENT", str(exc)
                ) from None
            rows = plan.rows * plan.epochs
            if self.max_job_rows is not None and rows > self.max_job_rows:
                raise SchedulerError(
                    "RESOURCE_EXHAUSTED",
                    f"the job passes {rows} rows through its model ({plan.rows} rows x "
                    f"{plan.epochs} epochs), over the coordinator's limit max_job_rows = "
                    f"{self.max_job_rows}",
                )
            links = {name: self._parties[name] for name in spec.parties}
            encoded = spec.SerializeToString(deterministic=True)
            if idempotency_key:  # a retry: the job exists, vetted already
                try:
                    existing = self.store.find(submitter, idempotency_key, encoded)
                except IdempotencyConflict as exc:
                    raise SchedulerError("ALREADY_EXISTS", str(exc)) from None
                if existing is not None:
                    return existing
        self._vet(spec, submitter, links)
        with self._lock:
            key = idempotency_key or f"auto-{time.time_ns()}"
            try:
                job, created = self.store.create(submitter, key, encoded)
            except IdempotencyConflict as exc:
                raise SchedulerError("ALREADY_EXISTS", str(exc)) from None
            if created:
                self._event(
                    job.job_id,
                    "submitted",
                    total_rounds=plan.total_rounds,
                    parties=list(spec.parties),
                    name=spec.name,
                )
                self._event(job.job_id, "state", state=JobState.PENDING.value)
                log.info(
                    "job %s submitted by %s: %d rounds",
                    job.job_id,
                    submitter,
                    plan.total_rounds,
                    extra={"job_id": job.job_id},
                )
                self._schedule()
            return self.store.get(job.job_id)

    def _vet(self, spec: jpb.JobSpec, submitter: str, links: dict[str, PartyLink]) -> None:
        """Ask every party of the job whether its policy allows it (DESIGN.md 7)."""
        request_id = uuid.uuid4().hex
        with self._verdict_ready:
            self._verdicts[request_id] = {}
        vet = cpb.VetJob(request_id=request_id, spec=spec, submitter=submitter)
        for link in links.values():
            link.assignments.put(cpb.Assignment(vet=vet))
        deadline = time.monotonic() + VET_TIMEOUT_S
        with self._verdict_ready:
            while len(self._verdicts[request_id]) < len(links):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._verdict_ready.wait(left)
            verdicts = self._verdicts.pop(request_id)
        for name in links:
            verdict = verdicts.get(name)
            if verdict is None:
                raise SchedulerError(
                    "FAILED_PRECONDITION",
                    f"party {name!r} did not answer the policy check within {VET_TIMEOUT_S:.0f} s",
                )
            if not verdict.allowed:
                raise SchedulerError(
                    "PERMISSION_DENIED", f"party {name!r} refuses the job: {verdict.reason}"
                )

    def verdict(self, party: str, verdict: cpb.Verdict) -> None:
        """A party's answer to a policy check."""
        with self._verdict_ready:
            pending = self._verdicts.get(verdict.request_id)
            if pending is None:
                raise SchedulerError("FAILED_PRECONDITION", "no policy check is waiting for it")
            pending[party] = verdict
            self._verdict_ready.notify_all()

    def _normalise(self, spec: jpb.JobSpec, submitter: str) -> jpb.JobSpec:
        spec = jpb.JobSpec.FromString(spec.SerializeToString())
        if spec.split == jpb.SPLIT_UNSPECIFIED and len(spec.features) <= 1:
            spec.split = jpb.SPLIT_VERTICAL
        if spec.weights.WhichOneof("source") == "from_job":
            source = self.authorise(
                spec.weights.from_job, submitter, CLIENT_ROLE, "use the model of"
            )
            trained = jpb.JobSpec.FromString(source.spec)
            if source.state != JobState.COMPLETED or trained.task != jpb.TASK_TRAIN:
                raise SchedulerError(
                    "FAILED_PRECONDITION",
                    f"job {source.job_id} is a {jpb.Task.Name(trained.task)} job in state "
                    f"{source.state}; only a COMPLETED train job leaves a model to use",
                )
            if not spec.graph.nodes:
                spec.graph.CopyFrom(trained.graph)
            elif spec.graph != trained.graph:
                raise SchedulerError(
                    "INVALID_ARGUMENT", f"the job's graph differs from job {source.job_id}'s model"
                )
            if spec.parties and list(spec.parties) != list(trained.parties):
                raise SchedulerError(
                    "INVALID_ARGUMENT",
                    f"job {source.job_id}'s model is shared among {list(trained.parties)} in "
                    f"that order; this job names {list(spec.parties)}",
                )
            mine = set(parties_in_order(spec)) - set(trained.parties)
            if mine:
                raise SchedulerError(
                    "INVALID_ARGUMENT",
                    f"parties {sorted(mine)} hold no shares of job {source.job_id}'s model "
                    f"(shared among {list(trained.parties)})",
                )
            del spec.parties[:]
            spec.parties.extend(trained.parties)
        elif not spec.parties:
            spec.parties.extend(parties_in_order(spec))
        return spec

    def job(self, job_id: str) -> Job:
        """The stored job, or NOT_FOUND."""
        try:
            return self.store.get(job_id)
        except JobNotFound as exc:
            raise SchedulerError("NOT_FOUND", str(exc)) from None

    def authorise(self, job_id: str, caller: str, role: str, verb: str) -> Job:
        """The job, if `caller` may `verb` it; else PERMISSION_DENIED.

        A job belongs to its submitter; admins may act on every job, and a party of a job may
        read it (`verb` "read").
        """
        job = self.job(job_id)
        if role == CLIENT_ROLE and (caller == job.submitter or caller in self.admins):
            return job
        if role == PARTY_ROLE and verb == READ:
            if caller in jpb.JobSpec.FromString(job.spec).parties:
                return job
            raise SchedulerError(
                "PERMISSION_DENIED", f"party {caller!r} is not a party of job {job_id}"
            )
        raise SchedulerError(
            "PERMISSION_DENIED",
            f"job {job_id} belongs to another submitter: only its submitter or an admin "
            f"(`admins` in coordinator.toml) may {verb} it",
        )

    def jobs_of(self, caller: str, state: JobState | None = None) -> list[Job]:
        """The jobs `caller` submitted (every job for an admin), in submission order."""
        jobs = self.store.jobs(state)
        return jobs if caller in self.admins else [j for j in jobs if j.submitter == caller]

    def cancel(self, job_id: str, reason: str) -> Job:
        """Cancel a job that has not ended; its workers are stopped."""
        with self._lock:
            job = self.job(job_id)
            if job.state in TERMINAL:
                raise SchedulerError(
                    "FAILED_PRECONDITION", f"job {job_id} has already ended ({job.state})"
                )
            self._end(job_id, JobState.CANCELLED, reason or "cancelled by the submitter")
            return self.store.get(job_id)

    def _schedule(self) -> None:
        """Start every PENDING job, oldest first, whose parties all have a free slot."""
        for job in self.store.jobs(JobState.PENDING):
            spec = jpb.JobSpec.FromString(job.spec)
            links = [self._parties.get(p) for p in spec.parties]
            ready = [
                link
                for link in links
                if link is not None and link.connected and link.free_slot() is not None
            ]
            if len(ready) == len(links):
                self._start(job, spec, ready)

    def _start(self, job: Job, spec: jpb.JobSpec, links: list[PartyLink]) -> None:
        history = self.history(job.job_id)
        resume = _resume_round(spec, history)
        run = Run(
            job.job_id,
            spec,
            list(spec.parties),
            history.total_rounds,
            resume_round=resume,
            round=resume,
            attempt=history.resumes,
        )
        self._runs[job.job_id] = run
        self.store.transition(job.job_id, JobState.STARTING)
        self._event(job.job_id, "state", state=JobState.STARTING.value)
        slots = [link.free_slot() or 0 for link in links]
        peers = [
            cpb.Peer(name=link.info.party, address=port_offset(link.info.data_address, slot))
            for link, slot in zip(links, slots, strict=True)
        ]
        for rank, (link, slot) in enumerate(zip(links, slots, strict=True)):
            link.jobs[job.job_id] = slot
            start = cpb.StartJob(
                job_id=job.job_id,
                spec=spec,
                rank=rank,
                peers=peers,
                total_rounds=history.total_rounds,
                resume_round=resume,
                checkpoint_digest=history.digests.get(link.info.party, "") if resume else "",
                attempt=run.attempt,
                slot=slot,
                submitter=job.submitter,
            )
            run.starts[link.info.party] = start
            link.assignments.put(cpb.Assignment(start=start))

    def history(self, job_id: str) -> History:
        """The job's progress (`job_history` of its events)."""
        return job_history(self.store.events(job_id))

    def resume(self, job_id: str) -> Job:
        """Queue a FAILED job again, to go on from its last committed round."""
        with self._lock:
            job = self.job(job_id)
            if job.state != JobState.FAILED:
                raise SchedulerError(
                    "FAILED_PRECONDITION",
                    f"job {job_id} is {job.state}; only a FAILED job can be resumed",
                )
            history = self.history(job_id)
            resume = _resume_round(jpb.JobSpec.FromString(job.spec), history)
            self.store.transition(job_id, JobState.PENDING, "")
            self._event(
                job_id, "resumed", resume, from_round=resume, total_rounds=history.total_rounds
            )
            self._event(job_id, "state", resume, state=JobState.PENDING.value)
            log.info(
                "job %s resumed from round %d",
                job_id,
                resume,
                extra={"job_id": job_id, "round": resume},
            )
            self._schedule()
            return self.store.get(job_id)

    # --- reports from workers ---------------------------------------------------------------

    def report(self, party: str, report: cpb.WorkerReport) -> None:
        """A worker's READY, DONE, FINISHED or FAILED."""
        with self._lock:
            run = self._runs.get(report.job_id)
            if run is None:
                job = self.job(report.job_id)
                raise SchedulerError(
                    "FAILED_PRECONDITION", f"job {report.job_id} is not running ({job.state})"
                )
            if report.attempt != run.attempt:
                raise SchedulerError(
                    "FAILED_PRECONDITION",
                    f"the report is of run {report.attempt} of job {run.job_id}, which ended; "
                    f"run {run.attempt} is running",
                )
            if party not in run.parties:
                raise SchedulerError(
                    "PERMISSION_DENIED", f"party {party!r} is not a party of job {run.job_id}"
                )
            kind = report.WhichOneof("kind")
            if kind == "failed":
                self._on_failure(run, party, report.failed)
            elif kind == "ready":
                self._on_ready(run, party, report.ready)
            elif kind == "done":
                self._on_done(run, party, report.done)
            elif kind == "finished":
                self._on_finished(run, party, report.finished)
            else:
                raise SchedulerError("INVALID_ARGUMENT", "the report carries nothing")

    def _on_failure(self, run: Run, party: str, failure: cpb.Failure) -> None:
        reason = f"party {party!r} failed: {failure.reason}"
        if failure.peer:
            if run.echo is None:
                run.echo = (time.monotonic(), reason)
            return
        self._fail(run.job_id, reason)

    def _fail(self, job_id: str, reason: str) -> None:
        if job_id in self._runs:
            self._end(job_id, JobState.FAILED, reason)

    def _on_ready(self, run: Run, party: str, ready: cpb.Ready) -> None:
        run.ready.add(party)
        self._event(run.job_id, "party_ready", party=party, rows=ready.rows)
        if run.ready == set(run.parties) and run.round == run.resume_round:
            self.store.transition(run.job_id, JobState.RUNNING)
            self._event(run.job_id, "state", run.round, state=JobState.RUNNING.value)
            if run.round < run.total_rounds:  # else the workers go straight to their outputs
                self._go(run, run.round + 1)

    def _go(self, run: Run, round: int) -> None:
        run.round, run.done, run.round_started = round, {}, time.monotonic()
        self.store.set_round(run.job_id, round)
        self._event(run.job_id, "round_started", round, total_rounds=run.total_rounds)
        log.debug(
            "job %s: round %d of %d",
            run.job_id,
            round,
            run.total_rounds,
            extra={"job_id": run.job_id, "round": round},
        )
        for name in run.parties:
            self._parties[name].assignments.put(
                cpb.Assignment(go=cpb.GoRound(job_id=run.job_id, round=round, attempt=run.attempt))
            )

    def _on_done(self, run: Run, party: str, done: cpb.RoundDone) -> None:
        if done.round != run.round:
            raise SchedulerError(
                "FAILED_PRECONDITION",
                f"party {party!r} reported round {done.round}; round {run.round} is running",
            )
        run.done[party] = done
        if set(run.done) != set(run.parties):
            return
        shares = [s for d in run.done.values() for s in d.metric_shares]
        metrics = reconstruct(shares) if self._public_metrics(run) else {}
        seconds = time.monotonic() - run.round_started
        self._event(
            run.job_id,
            "round_done",
            run.round,
            metrics=metrics,
            digests={p: d.checkpoint_digest for p, d in run.done.items()},
            seconds=seconds,
            total_rounds=run.total_rounds,
        )
        log.debug(
            "job %s: round %d committed after %.2f s",
            run.job_id,
            run.round,
            seconds,
            extra={"job_id": run.job_id, "round": run.round},
        )
        if run.round < run.total_rounds:
            self._go(run, run.round + 1)

    @staticmethod
    def _public_metrics(run: Run) -> bool:
        return COORDINATOR in recipients(run.spec, jpb.OUTPUT_METRICS)

    def _on_finished(self, run: Run, party: str, finished: cpb.Finished) -> None:
        run.finished[party] = finished
        self._event(
            run.job_id,
            "party_finished",
            run.round,
            party=party,
            outputs=[
                {"output": jpb.Output.Name(o.output), "path": o.path, "shape": list(o.shape)}
                for o in finished.outputs
            ],
            bytes_sent=finished.bytes_sent,
            communication_rounds=finished.communication_rounds,
        )
        if set(run.finished) != set(run.parties):
            return
        shares = [s for f in run.finished.values() for s in f.metric_shares]
        if shares and self._public_metrics(run):
            self._event(run.job_id, "final_metrics", run.round, metrics=reconstruct(shares))
        self._end(run.job_id, JobState.COMPLETED)

    # --- time -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Fail jobs of parties whose heartbeats stopped, and echoes whose grace ran out."""
        with self._lock:
            now = time.monotonic()
            for name, link in self._parties.items():
                silent = now - link.last_seen
                if silent <= self.heartbeat_timeout:
                    continue
                if link.connected:
                    link.connected = False
                    link.assignments.put(None)
                    log.warning(
                        "party %s missed its heartbeats for %.0f s",
                        name,
                        silent,
                        extra={"party": name},
                    )
                    cause = f"sent no heartbeat for {silent:.0f} s"
                else:
                    cause = f"detached and was not back after {silent:.0f} s"
                for job_id in list(link.jobs):
                    self._fail(
                        job_id,
                        f"party {name!r} {cause} (timeout {self.heartbeat_timeout:.0f} s)",
                    )
            for run in list(self._runs.values()):
                if run.echo is not None and now - run.echo[0] > PEER_FAILURE_GRACE_S:
                    self._fail(run.job_id, run.echo[1])

    def wait_events(self, job_id: str, after: int, timeout: float) -> list[Event]:
        """The job's events after `after`, waiting up to `timeout` for one to arrive."""
        with self._lock:
            events = self.store.events(job_id, after)
            if not events:
                self._changed.wait(timeout)
                events = self.store.events(job_id, after)
            return events
