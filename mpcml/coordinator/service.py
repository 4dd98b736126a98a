"""The coordinator's gRPC services: `Coordinator` for clients, `PartyControl` for parties.

Thin translators: each method checks who calls (`serving.caller`), calls the scheduler and
returns its answer as protobuf (`history.py` builds the views). A refusal is a StatusError,
which every daemon's request guard turns into its gRPC status and logs once.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc

from mpcml.coordinator.admission import READ
from mpcml.coordinator.history import job_event, job_result, job_status
from mpcml.coordinator.scheduler import Scheduler
from mpcml.coordinator.store import TERMINAL, Job, JobState
from mpcml.errors import StatusError
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.transport.address import AddressError, parse
from mpcml.transport.serving import caller
from mpcml.transport.tls import CLIENT_ROLE, PARTY_ROLE

WATCH_POLL_S = 1.0
READERS = (CLIENT_ROLE, PARTY_ROLE)
"""Who may read a job: its submitter (or an admin), and its parties."""


class CoordinatorService(cgrpc.CoordinatorServicer):
    """Submit, watch, cancel and read jobs; each job only by those `Admission.authorise` lets."""

    def __init__(self, scheduler: Scheduler, insecure: bool = False) -> None:
        self.scheduler = scheduler
        self.insecure = insecure

    def _client(self, context: grpc.ServicerContext, what: str) -> str:
        return caller(context, (CLIENT_ROLE,), what, insecure=self.insecure).name

    def _job(
        self,
        job_id: str,
        context: grpc.ServicerContext,
        verb: str,
        roles: tuple[str, ...] = (CLIENT_ROLE,),
    ) -> Job:
        """The job, if the caller may `verb` it."""
        who = caller(context, roles, f"{verb} jobs", insecure=self.insecure)
        if not job_id:
            raise StatusError("INVALID_ARGUMENT", "job_id is empty")
        return self.scheduler.authorise(job_id, who.name, who.role, verb)

    def _status(self, job: Job) -> cpb.JobStatus:
        return job_status(job, self.scheduler.store.events(job.job_id), self.insecure)

    def SubmitJob(
        self, request: cpb.SubmitJobRequest, context: grpc.ServicerContext
    ) -> cpb.JobStatus:
        """Validate and queue a job."""
        submitter = self._client(context, "submit jobs")
        if len(request.idempotency_key) > 200:
            raise StatusError(
                "INVALID_ARGUMENT", "the idempotency key is longer than 200 characters"
            )
        return self._status(self.scheduler.submit(request.spec, request.idempotency_key, submitter))

    def GetJob(self, request: cpb.GetJobRequest, context: grpc.ServicerContext) -> cpb.JobStatus:
        """One job's status."""
        return self._status(self._job(request.job_id, context, READ, READERS))

    def ListJobs(
        self, request: cpb.ListJobsRequest, context: grpc.ServicerContext
    ) -> cpb.ListJobsResponse:
        """The caller's jobs in submission order."""
        who = self._client(context, "read jobs")
        if request.state not in cpb.JobState.values():
            raise StatusError("INVALID_ARGUMENT", f"unknown job state {request.state}")
        state = (
            None
            if request.state == cpb.JOB_STATE_UNSPECIFIED
            else JobState(cpb.JobState.Name(request.state))
        )
        jobs = self.scheduler.jobs_of(who, state)
        return cpb.ListJobsResponse(jobs=[self._status(j) for j in jobs])

    def WatchJob(
        self, request: cpb.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[cpb.JobEvent]:
        """Events until the job has ended and all were sent."""
        job = self._job(request.job_id, context, READ, READERS)
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
        return self._status(
            self.scheduler.cancel(job.job_id, request.reason or f"cancelled by {who}")
        )

    def PurgeJob(
        self, request: cpb.PurgeJobRequest, context: grpc.ServicerContext
    ) -> cpb.PurgeJobResponse:
        """Tell an ended job's parties to remove its files."""
        job = self._job(request.job_id, context, "purge")
        sent, absent = self.scheduler.purge(job.job_id)
        return cpb.PurgeJobResponse(parties=sent, absent=absent)

    def ResumeJob(
        self, request: cpb.ResumeJobRequest, context: grpc.ServicerContext
    ) -> cpb.JobStatus:
        """Queue a FAILED job again from its last committed round."""
        job = self._job(request.job_id, context, "resume")
        return self._status(self.scheduler.resume(job.job_id))

    def GetResult(
        self, request: cpb.GetResultRequest, context: grpc.ServicerContext
    ) -> cpb.JobResult:
        """The public part of a job's results."""
        job = self._job(request.job_id, context, READ, READERS)
        return job_result(job, self.scheduler.store.events(job.job_id), self.insecure)

    def ListParties(
        self, request: cpb.ListPartiesRequest, context: grpc.ServicerContext
    ) -> cpb.ListPartiesResponse:
        """Parties registered since the coordinator started."""
        self._client(context, "read jobs")
        return cpb.ListPartiesResponse(parties=self.scheduler.parties())


class PartyControlService(cgrpc.PartyControlServicer):
    """Registration, heartbeats and worker reports from party daemons."""

    def __init__(self, scheduler: Scheduler, insecure: bool = False) -> None:
        self.scheduler = scheduler
        self.insecure = insecure

    def _party(self, context: grpc.ServicerContext, claimed: str, what: str) -> str:
        return caller(context, (PARTY_ROLE,), what, insecure=self.insecure, claimed=claimed).name

    def Attach(
        self, request: cpb.AttachRequest, context: grpc.ServicerContext
    ) -> Iterator[cpb.Assignment]:
        """Register and stream assignments."""
        party = self._party(context, request.party, "act as a party")
        if not request.party:
            raise StatusError("INVALID_ARGUMENT", "the request names no party")
        try:
            parse(request.data_address, "data_address")
        except AddressError as exc:
            raise StatusError("INVALID_ARGUMENT", str(exc)) from None
        assignments = self.scheduler.attach(request)
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
        self.scheduler.heartbeat(
            self._party(context, request.party, "act as a party"), request.running_jobs
        )
        return cpb.HeartbeatResponse()

    def ListPeers(
        self, request: cpb.ListPeersRequest, context: grpc.ServicerContext
    ) -> cpb.ListPeersResponse:
        """The other attached parties, for the caller's preflight check."""
        party = self._party(context, "", "list a party's peers")
        return cpb.ListPeersResponse(peers=self.scheduler.peers(party))

    def Report(
        self, request: cpb.WorkerReport, context: grpc.ServicerContext
    ) -> cpb.ReportResponse:
        """A worker's progress, or a verdict on a policy check."""
        party = self._party(context, request.party, "act as a party")
        if request.WhichOneof("kind") == "verdict":
            self.scheduler.verdict(party, request.verdict)
        elif not request.job_id:
            raise StatusError("INVALID_ARGUMENT", "the report names no job")
        else:
            self.scheduler.report(party, request)
        return cpb.ReportResponse()
