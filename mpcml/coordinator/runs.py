"""The run state machine: each job from STARTING to its end, as numbered rounds.

A job goes PENDING -> STARTING when all its parties are attached and have a free slot (a party
runs up to its `max_concurrent_jobs` at once; later jobs wait), RUNNING when every worker
reported READY, and through its rounds: GO r to every party, round r committed when every party
reported DONE r. The first failure of any party fails the job and stops the others. Callers
hold the scheduler's lock.

A coordinator runs a job only while it holds the job's lease in the store (store.py). One that
starts (a restart, or a standby whose peer stopped renewing) takes over every STARTING or
RUNNING job whose lease is free, lapsed or its own: it rebuilds the run from the job's events
(who was ready, who finished, each party's slot and peers) and waits for the parties to attach
again, which they do by themselves; each hears the current round's GO again, and a worker that
had already reported that round repeats its report. A party not back within the heartbeat
timeout fails the job naming it.
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

REPEAT_GO_S = 60.0
"""A round whose reports have not all come this long after its GO (or its last repeat) sends
GO again to the parties that have not reported: a worker repeats a report it made, so a report
lost on the way (the coordinator or its database was away longer than the party retries) costs
this wait, not the job."""
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
    go_sent: float = 0.0
    """When the current round's GO was last sent."""
    ready: set[str] = field(default_factory=set)
    done: dict[str, cpb.RoundDone] = field(default_factory=dict)
    finished: dict[str, cpb.Finished] = field(default_factory=dict)
    echo: tuple[float, str] | None = None
    """(when, reason) of the first failure that only echoes a peer's."""
    starts: dict[str, cpb.StartJob] = field(default_factory=dict)
    """What each party was told to start, to tell it again if it never heard."""
    slots: dict[str, int] = field(default_factory=dict)
    """The slot each party's worker took."""
    absent: set[str] = field(default_factory=set)
    """A run taken over from a stopped coordinator: the parties that have not attached since."""
    taken_over: float = 0.0
    """When this coordinator took the run over."""
    partial_finish: bool = False
    """Some party's Finished reached the stopped coordinator only: its metric shares are gone."""

    @property
    def public_metrics(self) -> bool:
        """Whether the job reveals its metrics to the coordinator."""
        return COORDINATOR in recipients(self.spec, jpb.OUTPUT_METRICS)


def _new_run(job: Job, spec: jpb.JobSpec, history: History) -> Run:
    """A run of `job` that goes on from its resume round, as its history says."""
    resume = _resume_round(spec, history)
    return Run(
        job.job_id,
        spec,
        list(spec.parties),
        history.total_rounds,
        resume_round=resume,
        round=resume,
        attempt=history.resumes,
    )


class Runs:
    """Every job between STARTING and its end."""

    def __init__(
        self,
        store: JobStore,
        registry: Registry,
        emit: Emit,
        clock: Callable[[], float],
        holder: str = "coordinator",
        lease_s: float = 30.0,
    ) -> None:
        self.store = store
        self.registry = registry
        self._emit = emit
        self._clock = clock
        self.holder = holder
        """Whose name this coordinator's leases carry."""
        self.lease_s = lease_s
        self._runs: dict[str, Run] = {}
        self._leases_kept = clock()

    def history(self, job_id: str) -> History:
        """The job's progress (`job_history` of its events)."""
        return job_history(self.store.events(job_id))

    # --- leases and take-overs --------------------------------------------------------------

    def take_over(self) -> None:
        """Take over every started job nobody runs: its lease is free, lapsed or already ours."""
        for state in (JobState.STARTING, JobState.RUNNING):
            for job in self.store.jobs(state):
                if job.job_id in self._runs or not self.store.claim(
                    job.job_id, self.holder, self.lease_s
                ):
                    continue
                job = self.store.get(job.job_id)
                if job.state not in (JobState.STARTING, JobState.RUNNING):  # it ended meanwhile
                    self.store.release(job.job_id, self.holder)
                    continue
                run = self._rebuild(job)
                self._runs[job.job_id] = run
                log.warning(
                    "job %s taken over in round %d (%s): waiting for %s to attach again",
                    job.job_id,
                    run.round,
                    job.state.value,
                    ", ".join(run.parties),
                    extra={"job_id": job.job_id, "round": run.round},
                )
                for name in run.parties:  # parties attached already (a standby's take-over)
                    link = self.registry.links.get(name)
                    if link is not None and link.connected:
                        self.rejoin(link)

    def _rebuild(self, job: Job) -> Run:
        """The run of a job another coordinator (or this one, before a restart) was running."""
        spec = jpb.JobSpec.FromString(job.spec)
        events = self.store.events(job.job_id)
        history = job_history(events)
        run = _new_run(job, spec, history)
        if job.state == JobState.RUNNING:
            run.round = max(run.resume_round, job.current_round)
        run.absent = set(spec.parties)
        run.taken_over = run.go_sent = self._clock()
        started = [
            i
            for i, e in enumerate(events)
            if e.kind == EventKind.STATE.value and e.data.get("state") == JobState.STARTING.value
        ]
        since = events[started[-1] :] if started else []
        begun = since[0].data if since else {}
        run.slots = {str(k): int(v) for k, v in begun.get("slots", {}).items()}
        peers = [cpb.Peer(name=p["name"], address=p["address"]) for p in begun.get("peers", [])]
        for event in since:
            party = event.data.get("party", "")
            if event.kind == EventKind.PARTY_READY.value:
                run.ready.add(party)
            elif event.kind == EventKind.PARTY_FINISHED.value:
                run.finished[party] = cpb.Finished()
                run.partial_finish = True
        if job.state == JobState.RUNNING:
            run.ready = set(run.parties)
        for rank, name in enumerate(run.parties):
            run.starts[name] = self._start_message(
                job, spec, history, run, rank, name, peers, run.slots.get(name, 0)
            )
        return run

    def keep_leases(self) -> None:
        """Renew this coordinator's leases (every third of `lease_s`); drop runs it lost.

        A run is dropped when another coordinator took its lease (this one was too slow to
        renew) or the job ended there (cancelled through the other coordinator): its workers
        here are stopped and nothing is written, since the job is no longer this one's.
        """
        now = self._clock()
        if now - self._leases_kept < self.lease_s / 3:
            return
        self._leases_kept = now
        held = self.store.renew(self.holder, self.lease_s)
        for job_id in list(self._runs):
            job = self.store.get(job_id)
            if job_id not in held:
                self._drop(job_id, "another coordinator took the job over")
            elif job.state in TERMINAL:
                self._drop(job_id, job.reason or f"the job ended ({job.state.value})")
        self.take_over()

    def _drop(self, job_id: str, reason: str) -> None:
        run = self._runs.pop(job_id)
        log.error("job %s: %s; this coordinator stops its workers", job_id, reason)
        self._stop_workers(run, reason, JobState.CANCELLED)
        self.store.release(job_id, self.holder)

    def _stop_workers(self, run: Run, reason: str, state: JobState) -> None:
        committed = self.history(run.job_id).committed
        for name in run.parties:
            link = self.registry.links.get(name)
            if link is None or link.jobs.pop(run.job_id, None) is None:
                continue
            if state != JobState.COMPLETED:
                stop = cpb.StopJob(job_id=run.job_id, reason=reason, committed_round=committed)
                link.send(cpb.Assignment(stop=stop))

    def expire_absent(self) -> None:
        """Fail a taken-over job whose party has not attached again within the timeout."""
        timeout = self.registry.heartbeat_timeout
        for run in list(self._runs.values()):
            if run.absent and self._clock() - run.taken_over > timeout:
                names = ", ".join(repr(p) for p in sorted(run.absent))
                self.fail(
                    run.job_id,
                    f"party {names} did not attach again within {timeout:g} s after "
                    f"coordinator {self.holder!r} took the job over",
                )

    # --- starting and ending ----------------------------------------------------------------

    def end(self, job_id: str, state: JobState, reason: str = "") -> None:
        """Move the job to its final state (or FAILED), stop its workers, start waiting jobs."""
        if job_id in self._runs and not self.store.claim(job_id, self.holder, self.lease_s):
            self._drop(job_id, "another coordinator took the job over")
            return
        job = self.store.transition(job_id, state, reason)
        self._emit(job_id, EventKind.STATE, job.current_round, state=state.value, reason=reason)
        self.store.release(job_id, self.holder)
        run = self._runs.pop(job_id, None)
        if run is None:
            return
        self._stop_workers(run, reason, state)
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
            if len(ready) < len(links) or not self.store.claim(
                job.job_id, self.holder, self.lease_s
            ):
                continue
            if self.store.get(job.job_id).state != JobState.PENDING:  # another coordinator's
                self.store.release(job.job_id, self.holder)
                continue
            self._start(job, spec, ready)

    def _start(self, job: Job, spec: jpb.JobSpec, links: list[PartyLink]) -> None:
        history = self.history(job.job_id)
        run = _new_run(job, spec, history)
        self._runs[job.job_id] = run
        self.store.transition(job.job_id, JobState.STARTING)
        slots = [link.free_slot() or 0 for link in links]
        peers = [
            cpb.Peer(name=link.info.party, address=port_offset(link.info.data_address, slot))
            for link, slot in zip(links, slots, strict=True)
        ]
        run.slots = {link.info.party: slot for link, slot in zip(links, slots, strict=True)}
        self._emit(
            job.job_id,
            EventKind.STATE,
            state=JobState.STARTING.value,
            slots=run.slots,
            peers=[{"name": p.name, "address": p.address} for p in peers],
        )
        for rank, (link, slot) in enumerate(zip(links, slots, strict=True)):
            link.jobs[job.job_id] = slot
            name = link.info.party
            run.starts[name] = self._start_message(job, spec, history, run, rank, name, peers, slot)
            link.send(cpb.Assignment(start=run.starts[name]))

    @staticmethod
    def _start_message(
        job: Job,
        spec: jpb.JobSpec,
        history: History,
        run: Run,
        rank: int,
        party: str,
        peers: list[cpb.Peer],
        slot: int,
    ) -> cpb.StartJob:
        return cpb.StartJob(
            job_id=job.job_id,
            spec=spec,
            rank=rank,
            peers=peers,
            total_rounds=history.total_rounds,
            resume_round=run.resume_round,
            checkpoint_digest=history.digests.get(party, "") if run.resume_round else "",
            attempt=run.attempt,
            slot=slot,
            submitter=job.submitter,
            estimate=history.estimate,
        )

    # --- parties that come and go -----------------------------------------------------------

    def carry_over(self, old: PartyLink, link: PartyLink) -> None:
        """A party attached again while it had jobs: go on with each where that is safe.

        Its old stream may have died with assignments in it (a network blip the coordinator
        had not noticed yet). A worker the party still runs keeps its job, and hears the current
        round's GO again; a job the party never started (its StartJob was lost) is started
        again. Otherwise its worker is gone and the job fails.
        """
        for job_id, slot in old.jobs.items():
            run = self._runs.get(job_id)
            if run is not None:
                self._rejoin(run, link, slot)

    def rejoin(self, link: PartyLink) -> None:
        """A party attached to this coordinator: go on with the taken-over runs it is in."""
        party = link.info.party
        for run in list(self._runs.values()):
            if party in run.absent:
                run.absent.discard(party)
                self._rejoin(run, link, run.slots.get(party, 0))

    def _rejoin(self, run: Run, link: PartyLink, slot: int) -> None:
        party, job_id = link.info.party, run.job_id
        if party in run.finished:  # its worker is done; the others may still report
            link.jobs[job_id] = slot
            return
        if party in run.ready and job_id not in link.info.running_jobs:
            self.fail(job_id, f"party {party!r} attached again and no longer runs the job")
            return
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
        run.go_sent = run.round_started
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
            link = self.registry.links.get(name)
            if link is not None and name not in run.absent:  # an absent one hears it on attach
                link.send(cpb.Assignment(go=go))

    def _on_done(self, run: Run, party: str, done: cpb.RoundDone) -> None:
        if done.round < run.round:  # a repeat: the worker heard that round's GO again
            return
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
            peak_memory_bytes=finished.peak_memory_bytes,
            device=finished.device,
        )
        if set(run.finished) != set(run.parties):
            return
        shares = [s for f in run.finished.values() for s in f.metric_shares]
        if run.partial_finish and run.public_metrics:
            log.warning(
                "job %s: final metrics are lost: a party's shares of them reached only the "
                "coordinator that stopped",
                run.job_id,
                extra={"job_id": run.job_id},
            )
        elif shares and run.public_metrics:
            self._emit(run.job_id, EventKind.FINAL_METRICS, run.round, metrics=reconstruct(shares))
        self.end(run.job_id, JobState.COMPLETED)

    # --- time -------------------------------------------------------------------------------

    def repeat_go(self) -> None:
        """Send GO again to the parties whose report of the current round is overdue."""
        now = self._clock()
        for run in self._runs.values():
            if run.round <= run.resume_round or now - run.go_sent < REPEAT_GO_S:
                continue
            missing = [p for p in run.parties if p not in run.done and p not in run.absent]
            if not missing or run.finished:
                continue
            run.go_sent = now
            log.info(
                "job %s: no report of round %d from %s after %.0f s; its GO is sent again",
                run.job_id,
                run.round,
                ", ".join(missing),
                REPEAT_GO_S,
                extra={"job_id": run.job_id, "round": run.round},
            )
            go = cpb.GoRound(job_id=run.job_id, round=run.round, attempt=run.attempt)
            for name in missing:
                link = self.registry.links.get(name)
                if link is not None:
                    link.send(cpb.Assignment(go=go))

    def expire_echoes(self) -> None:
        """Fail with its echo a job whose peer never gave its own reason within the grace."""
        now = self._clock()
        for run in list(self._runs.values()):
            if run.echo is not None and now - run.echo[0] > PEER_FAILURE_GRACE_S:
                self.fail(run.job_id, run.echo[1])
