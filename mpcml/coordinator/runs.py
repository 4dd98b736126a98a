"""The run state machine: each job from STARTING to its end, as numbered rounds.

A job goes PENDING -> STARTING when all its parties are attached and have a free slot (a party
runs up to its `max_concurrent_jobs` at once; later jobs wait), RUNNING when every worker
reported READY, and through its rounds: GO r to every party, round r committed when every party
reported DONE r. The first failure of any party fails the job and stops the others. Callers
hold the scheduler's lock.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpcml.coordinator.history import History, job_history, reconstruct
from mpcml.coordinator.registry import PartyLink, Registry
from mpcml.coordinator.store import TERMINAL, Event, Job, JobNotFound, JobState, JobStore
from mpcml.errors import StatusError
from mpcml.jobs.events import EventKind
from mpcml.jobs.spec import COORDINATOR, recipients
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.address import port_offset

log = logging.getLogger(__name__)

PEER_FAILURE_GRACE_S = 3.0
"""After a party reports it failed only because a peer did, wait this long for the peer's own
reason before failing the job with the echo."""

Emit = Callable[..., Event]
"""Stores an event of a job: `emit(job_id, kind, round=0, **data)`."""


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

    @property
    def public_metrics(self) -> bool:
        """Whether the job reveals its metrics to the coordinator."""
        return COORDINATOR in recipients(self.spec, jpb.OUTPUT_METRICS)


class Runs:
    """Every job between STARTING and its end."""

    def __init__(
        self, store: JobStore, registry: Registry, emit: Emit, clock: Callable[[], float]
    ) -> None:
        self.store = store
        self.registry = registry
        self._emit = emit
        self._clock = clock
        self._runs: dict[str, Run] = {}

    def history(self, job_id: str) -> History:
        """The job's progress (`job_history` of its events)."""
        return job_history(self.store.events(job_id))

    def interrupted(self) -> None:
        """Fail the jobs a previous coordinator was running when it stopped."""
        for job in self.store.jobs():
            if job.state in (JobState.STARTING, JobState.RUNNING):
                self.end(
                    job.job_id,
                    JobState.FAILED,
                    f"interrupted: the coordinator restarted during round {job.current_round}",
                )

    # --- starting and ending ----------------------------------------------------------------

    def end(self, job_id: str, state: JobState, reason: str = "") -> None:
        """Move the job to its final state (or FAILED), stop its workers, start waiting jobs."""
        job = self.store.transition(job_id, state, reason)
        self._emit(job_id, EventKind.STATE, job.current_round, state=state.value, reason=reason)
        run = self._runs.pop(job_id, None)
        if run is None:
            return
        committed = self.history(job_id).committed
        for name in run.parties:
            link = self.registry.links.get(name)
            if link is None or link.jobs.pop(job_id, None) is None:
                continue
            if state != JobState.COMPLETED:
                stop = cpb.StopJob(job_id=job_id, reason=reason, committed_round=committed)
                link.send(cpb.Assignment(stop=stop))
        log.info(
            "job %s %s %s",
            job_id,
            state.value,
            reason,
            extra={"job_id": job_id, "round": job.current_round},
        )
        self.schedule()

    def fail(self, job_id: str, reason: str) -> None:
        """Fail a running job (nothing if it has ended)."""
        if job_id in self._runs:
            self.end(job_id, JobState.FAILED, reason)

    def cancel(self, job_id: str, reason: str) -> None:
        """Cancel a job that has not ended; its workers are stopped."""
        job = self.store.get(job_id)
        if job.state in TERMINAL:
            raise StatusError(
                "FAILED_PRECONDITION", f"job {job_id} has already ended ({job.state})"
            )
        self.end(job_id, JobState.CANCELLED, reason)

    def resume(self, job: Job) -> None:
        """Queue a FAILED job again, to go on from its last committed round."""
        if job.state != JobState.FAILED:
            raise StatusError(
                "FAILED_PRECONDITION",
                f"job {job.job_id} is {job.state}; only a FAILED job can be resumed",
            )
        history = self.history(job.job_id)
        resume = _resume_round(jpb.JobSpec.FromString(job.spec), history)
        self.store.transition(job.job_id, JobState.PENDING, "")
        self._emit(
            job.job_id,
            EventKind.RESUMED,
            resume,
            from_round=resume,
            total_rounds=history.total_rounds,
        )
        self._emit(job.job_id, EventKind.STATE, resume, state=JobState.PENDING.value)
        log.info(
            "job %s resumed from round %d",
            job.job_id,
            resume,
            extra={"job_id": job.job_id, "round": resume},
        )
        self.schedule()

    def schedule(self) -> None:
        """Start every PENDING job, oldest first, whose parties all have a free slot."""
        for job in self.store.jobs(JobState.PENDING):
            spec = jpb.JobSpec.FromString(job.spec)
            links = [self.registry.links.get(p) for p in spec.parties]
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
        self._emit(job.job_id, EventKind.STATE, state=JobState.STARTING.value)
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
            link.send(cpb.Assignment(start=start))

    # --- parties that come and go -----------------------------------------------------------

    def carry_over(self, old: PartyLink, link: PartyLink) -> None:
        """A party attached again while it had jobs: go on with each where that is safe.

        Its old stream may have died with assignments in it (a network blip the coordinator
        had not noticed yet). A worker the party still runs keeps its job, and hears the current
        round's GO again; a job the party never started (its StartJob was lost) is started
        again. Otherwise its worker is gone and the job fails.
        """
        party = link.info.party
        for job_id, slot in old.jobs.items():
            run = self._runs.get(job_id)
            if run is None:
                continue
            if party in run.ready and job_id not in link.info.running_jobs:
                self.fail(job_id, f"party {party!r} attached again and no longer runs the job")
                continue
            log.info(
                "job %s: party %s attached again; the job goes on",
                job_id,
                party,
                extra={"job_id": job_id, "party": party},
            )
            link.jobs[job_id] = slot
            if party not in run.ready:  # the party ignores a StartJob its worker already runs
                link.send(cpb.Assignment(start=run.starts[party]))
            elif run.round > run.resume_round and party not in run.done:
                go = cpb.GoRound(job_id=job_id, round=run.round, attempt=run.attempt)
                link.send(cpb.Assignment(go=go))

    def stop_unknown(self, link: PartyLink) -> None:
        """Stop the workers a party runs for jobs this coordinator does not run."""
        for job_id in link.info.running_jobs:
            if job_id in self._runs:
                continue
            stop = cpb.StopJob(job_id=job_id, reason=f"the coordinator no longer runs job {job_id}")
            with contextlib.suppress(JobNotFound):  # e.g. this coordinator restarted during it
                self.store.get(job_id)
                stop.committed_round = self.history(job_id).committed
            link.send(cpb.Assignment(stop=stop))

    # --- reports from workers ---------------------------------------------------------------

    def report(self, party: str, report: cpb.WorkerReport) -> None:
        """A worker's READY, DONE, FINISHED or FAILED."""
        run = self._runs.get(report.job_id)
        if run is None:
            job = self.store.get(report.job_id)
            raise StatusError(
                "FAILED_PRECONDITION", f"job {report.job_id} is not running ({job.state})"
            )
        if report.attempt != run.attempt:
            raise StatusError(
                "FAILED_PRECONDITION",
                f"the report is of run {report.attempt} of job {run.job_id}, which ended; "
                f"run {run.attempt} is running",
            )
        if party not in run.parties:
            raise StatusError(
                "PERMISSION_DENIED", f"party {party!r} is not a party of job {run.job_id}"
            )
        handlers: dict[str, Callable[[Run, str, Any], None]] = {
            "failed": self._on_failure,
            "ready": self._on_ready,
            "done": self._on_done,
            "finished": self._on_finished,
        }
        kind = report.WhichOneof("kind")
        if kind not in handlers:
            raise StatusError("INVALID_ARGUMENT", "the report carries nothing")
        handlers[kind](run, party, getattr(report, kind))

    def _on_failure(self, run: Run, party: str, failure: cpb.Failure) -> None:
        reason = f"party {party!r} failed: {failure.reason}"
        if failure.peer:
            if run.echo is None:
                run.echo = (self._clock(), reason)
            return
        self.fail(run.job_id, reason)

    def _on_ready(self, run: Run, party: str, ready: cpb.Ready) -> None:
        run.ready.add(party)
        self._emit(run.job_id, EventKind.PARTY_READY, party=party, rows=ready.rows)
        if run.ready == set(run.parties) and run.round == run.resume_round:
            self.store.transition(run.job_id, JobState.RUNNING)
            self._emit(run.job_id, EventKind.STATE, run.round, state=JobState.RUNNING.value)
            if run.round < run.total_rounds:  # else the workers go straight to their outputs
                self._go(run, run.round + 1)

    def _go(self, run: Run, round: int) -> None:
        run.round, run.done, run.round_started = round, {}, self._clock()
        self.store.set_round(run.job_id, round)
        self._emit(run.job_id, EventKind.ROUND_STARTED, round, total_rounds=run.total_rounds)
        log.debug(
            "job %s: round %d of %d",
            run.job_id,
            round,
            run.total_rounds,
            extra={"job_id": run.job_id, "round": round},
        )
        go = cpb.GoRound(job_id=run.job_id, round=round, attempt=run.attempt)
        for name in run.parties:
            self.registry.links[name].send(cpb.Assignment(go=go))

    def _on_done(self, run: Run, party: str, done: cpb.RoundDone) -> None:
        if done.round != run.round:
            raise StatusError(
                "FAILED_PRECONDITION",
                f"party {party!r} reported round {done.round}; round {run.round} is running",
            )
        run.done[party] = done
        if set(run.done) != set(run.parties):
            return
        shares = [s for d in run.done.values() for s in d.metric_shares]
        metrics = reconstruct(shares) if run.public_metrics else {}
        seconds = self._clock() - run.round_started
        self._emit(
            run.job_id,
            EventKind.ROUND_DONE,
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

    def _on_finished(self, run: Run, party: str, finished: cpb.Finished) -> None:
        run.finished[party] = finished
        self._emit(
            run.job_id,
            EventKind.PARTY_FINISHED,
            run.round,
            party=party,
            outputs=[
                {"output": jpb.Output.Name(o.output), "path": o.path, "shape": list(o.shape)}
                for o in finished.outputs
            ],
            bytes_sent=finished.bytes_sent,
            communication_rounds=finished.communication_rounds,
            profile=[
                {
                    "node": c.node,
                    "op": c.op,
                    "rounds": c.rounds,
                    "bytes": c.bytes,
                    "seconds": c.seconds,
                    "calls": c.calls,
                }
                for c in finished.profile
            ],
            first_batch_seconds=finished.first_batch_seconds,
            median_batch_seconds=finished.median_batch_seconds,
        )
        if set(run.finished) != set(run.parties):
            return
        shares = [s for f in run.finished.values() for s in f.metric_shares]
        if shares and run.public_metrics:
            self._emit(run.job_id, EventKind.FINAL_METRICS, run.round, metrics=reconstruct(shares))
        self.end(run.job_id, JobState.COMPLETED)

    # --- time -------------------------------------------------------------------------------

    def expire_echoes(self) -> None:
        """Fail with its echo a job whose peer never gave its own reason within the grace."""
        now = self._clock()
        for run in list(self._runs.values()):
            if run.echo is not None and now - run.echo[0] > PEER_FAILURE_GRACE_S:
                self.fail(run.job_id, run.echo[1])
