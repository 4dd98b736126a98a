"""The coordinator's gRPC services: `Coordinator` for clients, `PartyControl` for parties.

A caller's identity is its client certificate's common name. Every request is checked before it
reaches the scheduler, and every refusal is a gRPC status whose message names the problem.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator
from typing import NoReturn

import grpc

from mpcml.coordinator.scheduler import READ, Scheduler, SchedulerError, job_history
from mpcml.coordinator.store import TERMINAL, Event, Job, JobState
from mpcml.graph.digest import graph_digest
from mpcml.jobs.spec import parties_in_order
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.address import AddressError, parse
from mpcml.transport.tls import CLIENT_ROLE, PARTY_ROLE, Identity, caller_identity

log = logging.getLogger(__name__)

WATCH_POLL_S = 1.0


def _abort(context: grpc.ServicerContext, code: str, message: str) -> NoReturn:
    context.abort(getattr(grpc.StatusCode, code), message)
    raise AssertionError("unreachable")


def _identity(
    context: grpc.ServicerContext, claimed: str, insecure: bool, roles: tuple[str, ...], what: str
) -> Identity:
    """The caller's certificate name and role.

    Refuses a call whose certificate has none of `roles` or names someone other than the
    request claims. Without TLS (`--insecure`) the caller is who it claims, in the first role.
    """
    identity = caller_identity(context)
    if identity is None:
        if not insecure:
            _abort(context, "UNAUTHENTICATED", "a client certificate is required")
        return Identity(claimed or "anonymous", roles[0])
    if identity.role not in roles:
        _abort(
            context,
            "PERMISSION_DENIED",
            f"certificate {identity.name!r} has role {identity.role or 'none'!r}; only a "
            f"{roles[0]!r} certificate may {what}",
        )
    if claimed and claimed != identity.name:
        _abort(
            context,
            "PERMISSION_DENIED",
            f"the caller's certificate names {identity.name!r}, the request claims {claimed!r}",
        )
    return identity


def _caller(
    context: grpc.ServicerContext, claimed: str, insecure: bool, role: str, what: str
) -> str:
    """The caller's certificate name, which must have `role` (see `_identity`)."""
    return _identity(context, claimed, insecure, (role,), what).name


TFP_WARNING = (
    "INSECURE: insecure_provider = 'tfp': correlated randomness comes from CrypTen's TFP "
    "provider, which lets party 0 recover the other parties' inputs"
)
PLAINTEXT_WARNING = "INSECURE: the coordinator runs without TLS or authentication (--insecure)"


def job_status(job: Job, events: list[Event], insecure: bool = False) -> cpb.JobStatus:
    """A job's public status from its store record and its event log."""
    spec = jpb.JobSpec.FromString(job.spec)
    status = cpb.JobStatus(
        job_id=job.job_id,
        name=spec.name,
        state=job.state.value,
        reason=job.reason,
        current_round=job.current_round,
        submitter=job.submitter,
        task=spec.task,
        parties=parties_in_order(spec),
        idempotency_key=job.idempotency_key,
        warnings=[
            *([TFP_WARNING] if spec.insecure_provider == "tfp" else []),
            *([PLAINTEXT_WARNING] if insecure else []),
        ],
    )
    status.state_times.update(job.state_times)
    history = job_history(events)
    status.total_rounds = history.total_rounds
    status.committed_round, status.resumes = history.committed, history.resumes
    status.graph_digest = graph_digest(spec.graph)
    for event in events:
        if event.kind in ("round_done", "final_metrics"):
            status.metrics.clear()
            status.metrics.update(event.data.get("metrics", {}))
    return status


def job_event(event: Event) -> cpb.JobEvent:
    """A store event as the public `JobEvent`."""
    out = cpb.JobEvent(
        seq=event.seq,
        at=event.at,
        kind=event.kind,
        round=event.round,
        message=str(event.data.get("reason") or event.data.get("party") or ""),
        total_rounds=int(event.data.get("total_rounds", 0)),
        state=event.data.get("state", "JOB_STATE_UNSPECIFIED"),
    )
    out.metrics.update(event.data.get("metrics", {}))
    return out


class CoordinatorService(cgrpc.CoordinatorServicer):
    """Submit, watch, cancel and read jobs; each job only by those `Scheduler.authorise` lets."""

    def __init__(self, scheduler: Scheduler, insecure: bool = False) -> None:
        self.scheduler = scheduler
        self.insecure = insecure

    def _client(self, context: grpc.ServicerContext, what: str) -> str:
        return _caller(context, "", self.insecure, CLIENT_ROLE, what)

    def _job(
        self,
        job_id: str,
        context: grpc.ServicerContext,
        verb: str,
        roles: tuple[str, ...] = (CLIENT_ROLE,),
    ) -> Job:
        """The job, if the caller may `verb` it."""
        caller = _identity(context, "", self.insecure, roles, f"{verb} jobs")
        if not job_id:
            _abort(context, "INVALID_ARGUMENT", "job_id is empty")
        try:
            return self.scheduler.authorise(job_id, caller.name, caller.role, verb)
        except SchedulerError as exc:
            _abort(context, exc.code, str(exc))

    def _status(self, job: Job) -> cpb.JobStatus:
        return job_status(job, self.scheduler.store.events(job.job_id), self.insecure)

    def SubmitJob(
        self, request: cpb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> cpb.JobStatus:
        """Validate and queue a job."""
        submitter = self._client(context, "submit jobs")
        if len(request.idempotency_key) > 200:
            _abort(context, "INVALID_ARGUMENT", "the idempotency key is longer than 200 characters")
        try:
            job = self.scheduler.submit(request.spec, request.idempotency_key, submitter)
        except SchedulerError as exc:
            _abort(context, exc.code, str(exc))
        return self._status(job)

    def GetJob(self, request: cpb.GetJobRequest, context: grpc.ServicerContext) -> cpb.JobStatus:
        """One job's status."""
        return self._status(self._job(request.job_id, context, READ, (CLIENT_ROLE, PARTY_ROLE)))

    def ListJobs(
        self, request: cpb.ListJobsRequest, context: grpc.ServicerContext
    ) -> cpb.ListJobsResponse:
        """The caller's jobs in submission order."""
        who = self._client(context, "read jobs")
        if request.state not in cpb.JobState.values():
            _abort(context, "INVALID_ARGUMENT", f"unknown job state {request.state}")
        state = (
            None
            if request.state == cpb.JOB_STATE_UNSPECIFIED
            else JobState(cpb.JobState.Name(request.state))
        )
        return cpb.ListJobsResponse(
            jobs=[self._status(j) for j in self.scheduler.jobs_of(who, state)]
        )

    def WatchJob(
        self, request: cpb.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[cpb.JobEvent]:
        """Events until the job has ended and all were sent."""
        job = self._job(request.job_id, context, READ, (CLIENT_ROLE, PARTY_ROLE))
        after = request.after_seq
        while context.is_active():
            events = self.scheduler.wait_events(job.job_id, after, WATCH_POLL_S)
            for event in events:
                yield job_event(event)
                after = event.seq
            if not events and self.scheduler.store.get(job.job_id).state in TERMINAL:
                return

    def CancelJob(
        self, request: cpb.CancelJobRequest, context: grpc.ServicerContext
    ) -> cpb.JobStatus:
        """Cancel a job and stop its workers."""
        who = self._client(context, "cancel jobs")
        job = self._job(request.job_id, context, "cancel")
        try:
            job = self.scheduler.cancel(job.job_id, request.reason or f"cancelled by {who}")
        except SchedulerError as exc:
            _abort(context, exc.code, str(exc))
        return self._status(job)

    def ResumeJob(
        self, request: cpb.ResumeJobRequest, context: grpc.ServicerContext
    ) -> cpb.JobStatus:
        """Queue a FAILED job again from its last committed round."""
        job = self._job(request.job_id, context, "resume")
        try:
            job = self.scheduler.resume(job.job_id)
        except SchedulerError as exc:
            _abort(context, exc.code, str(exc))
        return self._status(job)

    def GetResult(
        self, request: cpb.GetResultRequest, context: grpc.ServicerContext
    ) -> cpb.JobResult:
        """The public part of a job's results."""
        job = self._job(request.job_id, context, "read the results of")
        events = self.scheduler.store.events(job.job_id)
        result = cpb.JobResult(status=job_status(job, events, self.insecure))
        for e in events:
            if e.kind == "round_done":
                result.rounds.append(cpb.RoundMetrics(round=e.round, metrics=e.data["metrics"]))
            elif e.kind == "resumed":  # what counts is the run that finished
                del result.outputs[:]
                result.bytes_sent = result.communication_rounds = 0
            elif e.kind == "party_finished":
                result.bytes_sent += int(e.data["bytes_sent"])
                result.communication_rounds = max(
                    result.communication_rounds, int(e.data["communication_rounds"])
                )
                for o in e.data["outputs"]:
                    result.outputs.append(
                        cpb.PartyOutput(
                            party=e.data["party"],
                            output=o["output"],
                            path=o["path"],
                            shape=o["shape"],
                        )
                    )
        times = job.state_times
        if JobState.RUNNING.value in times:
            end = max(times.values())
            result.seconds = end - times[JobState.STARTING.value]
        return result

    def ListParties(
        self, request: cpb.ListPartiesRequest, context: grpc.ServicerContext
    ) -> cpb.ListPartiesResponse:
        """Parties registered since the coordinator started."""
        _caller(context, "", self.insecure, CLIENT_ROLE, "read jobs")
        return cpb.ListPartiesResponse(parties=self.scheduler.parties())


class PartyControlService(cgrpc.PartyControlServicer):
    """Registration, heartbeats and worker reports from party daemons."""

    def __init__(self, scheduler: Scheduler, insecure: bool = False) -> None:
        self.scheduler = scheduler
        self.insecure = insecure

    def Attach(
        self, request: cpb.AttachRequest, context: grpc.ServicerContext
    ) -> Iterator[cpb.Assignment]:
        """Register and stream assignments."""
        party = _caller(context, request.party, self.insecure, PARTY_ROLE, "act as a party")
        if not request.party:
            _abort(context, "INVALID_ARGUMENT", "the request names no party")
        try:
            parse(request.data_address, "data_address")
        except AddressError as exc:
            _abort(context, "INVALID_ARGUMENT", str(exc))
        try:
            assignments = self.scheduler.attach(request)
        except SchedulerError as exc:
            _abort(context, exc.code, str(exc))
        try:
            while context.is_active():
                try:
                    item = assignments.get(timeout=1.0)
                except queue.Empty:
                    continue
                if item is None:
                    return
                yield item
        finally:
            self.scheduler.detach(party, assignments)

    def Heartbeat(
        self, request: cpb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> cpb.HeartbeatResponse:
        """Note the party is alive."""
        party = _caller(context, request.party, self.insecure, PARTY_ROLE, "act as a party")
        try:
            self.scheduler.heartbeat(party)
        except SchedulerError as exc:
            _abort(context, exc.code, str(exc))
        return cpb.HeartbeatResponse()

    def ListPeers(
        self, request: cpb.ListPeersRequest, context: grpc.ServicerContext
    ) -> cpb.ListPeersResponse:
        """The other attached parties, for the caller's preflight check."""
        party = _caller(context, "", self.insecure, PARTY_ROLE, "list a party's peers")
        return cpb.ListPeersResponse(peers=self.scheduler.peers(party))

    def Report(
        self, request: cpb.WorkerReport, context: grpc.ServicerContext
    ) -> cpb.ReportResponse:
        """A worker's progress."""
        party = _caller(context, request.party, self.insecure, PARTY_ROLE, "act as a party")
        try:
            if request.WhichOneof("kind") == "verdict":
                self.scheduler.verdict(party, request.verdict)
                return cpb.ReportResponse()
            if not request.job_id:
                _abort(context, "INVALID_ARGUMENT", "the report names no job")
            self.scheduler.report(party, request)
        except SchedulerError as exc:
            _abort(context, exc.code, str(exc))
        return cpb.ReportResponse()
