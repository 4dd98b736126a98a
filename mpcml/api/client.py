"""`Client`: submit jobs to the coordinator, watch them, read their public results."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import grpc

from mpcml.api.job import Job, row_shape
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.serving import channel
from mpcml.transport.tls import CLIENT_ROLE, TLSFiles, check_certificate

TERMINAL = {cpb.COMPLETED, cpb.FAILED, cpb.CANCELLED}


class ClientError(Exception):
    """The coordinator refused a call; `code` is the gRPC status (e.g. INVALID_ARGUMENT)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class JobError(Exception):
    """A job did not complete; the message holds its state and reason."""


def _call(fn: Any, request: Any, **kwargs: Any) -> Any:
    # wait_for_ready: a coordinator that is still starting is waited for, up to the timeout.
    try:
        return fn(request, wait_for_ready=True, **kwargs)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            details = (
                f"no answer within {kwargs.get('timeout')} s: is the coordinator running, "
                f"reachable, and does it trust this client's certificate? ({details})"
            )
        raise ClientError(code, details) from None


class Client:
    """A connection to the coordinator with this client's certificate (mutual TLS)."""

    def __init__(
        self,
        address: str,
        tls: TLSFiles | None = None,
        *,
        server_name: str = "coordinator",
        insecure: bool = False,
        timeout: float = 30.0,
    ) -> None:
        if tls is None and not insecure:
            raise ValueError("tls is required; pass insecure=True only to debug over plaintext")
        if tls is not None:
            check_certificate(tls, CLIENT_ROLE)
        self.timeout = timeout
        self._channel = channel(address, tls, server_name)
        self.stub = cgrpc.CoordinatorStub(self._channel)

    def close(self) -> None:
        """Close the connection."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, job: Job, idempotency_key: str | None = None) -> JobHandle:
        """Submit a job; retrying with the same key never makes a second job.

        A job whose model is not yet captured is captured here, for the row shape its feature
        datasets were registered with.
        """
        if job.model is not None:
            job = job.captured(row_shape(job.spec, self.parties()))
        request = cpb.SubmitJobRequest(
            spec=job.spec, idempotency_key=idempotency_key or uuid.uuid4().hex
        )
        status = _call(self.stub.SubmitJob, request, timeout=self.timeout)
        return JobHandle(self, status.job_id)

    def job(self, job_id: str) -> JobHandle:
        """A handle on an existing job."""
        return JobHandle(self, job_id)

    def jobs(self, state: cpb.JobState | str = cpb.JOB_STATE_UNSPECIFIED) -> list[cpb.JobStatus]:
        """Every job (or those in `state`), in submission order."""
        return list(
            _call(self.stub.ListJobs, cpb.ListJobsRequest(state=state), timeout=self.timeout).jobs
        )

    def wait_for_parties(self, names: list[str], timeout: float = 60.0) -> list[cpb.PartyStatus]:
        """Block until every party in `names` is registered and connected."""
        deadline = time.monotonic() + timeout
        while True:
            parties = self.parties()
            missing = set(names) - {p.name for p in parties if p.connected}
            if not missing:
                return parties
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"parties not registered after {timeout:.0f} s: {', '.join(sorted(missing))}"
                )
            time.sleep(0.5)

    def parties(self) -> list[cpb.PartyStatus]:
        """Parties registered with the coordinator."""
        return list(
            _call(self.stub.ListParties, cpb.ListPartiesRequest(), timeout=self.timeout).parties
        )

    def estimate(self, job: Job) -> tuple[cpb.ResourceEstimate, dict[str, list[str]]]:
        """What `job` would cost each party, and which of their limits it would exceed.

        Computed here from the parties' public catalogues and limits, as each party computes it
        when it vets the job (mpcml/jobs/estimate.py); nothing is submitted.
        """
        from mpcml.api.job import JobSpecError
        from mpcml.jobs import estimate
        from mpcml.jobs.spec import parties_in_order

        parties = self.parties()
        if job.model is not None:
            job = job.captured(row_shape(job.spec, parties))
        spec = jpb.JobSpec.FromString(job.spec.SerializeToString())
        if not spec.graph.nodes:
            raise JobSpecError(
                "the job runs another job's model (from_job): its estimate is computed when it "
                "is submitted (JobStatus.estimate)"
            )
        if not spec.parties:
            spec.parties.extend(parties_in_order(spec))
        registered = {(p.name, d.name): int(d.rows) for p in parties for d in p.datasets}
        rows = max(
            (registered.get((b.party, b.dataset), 0) for b in [*spec.features, *spec.labels]),
            default=0,
        )
        found = estimate.estimate(spec, rows).to_proto()
        limits = {p.name: p.limits for p in parties}
        over = {
            name: estimate.over(found, name, limits[name])
            for name in spec.parties
            if name in limits
        }
        return found, over


class JobHandle:
    """A submitted job."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def status(self) -> cpb.JobStatus:
        """The job's state, round and public metrics now."""
        return cast(
            cpb.JobStatus,
            _call(
                self.client.stub.GetJob,
                cpb.GetJobRequest(job_id=self.id),
                timeout=self.client.timeout,
            ),
        )

    def watch(self, after_seq: int = 0) -> Iterator[cpb.JobEvent]:
        """Events as they happen, until the job has ended.

        State changes and rounds with their public metrics; a dropped connection is resumed
        from the last event seen.
        """
        seq = after_seq
        last_heard = time.monotonic()
        while True:
            try:
                for event in self.client.stub.WatchJob(
                    cpb.WatchJobRequest(job_id=self.id, after_seq=seq)
                ):
                    seq, last_heard = event.seq, time.monotonic()
                    yield event
                return
            except grpc.RpcError as exc:
                unavailable = exc.code() == grpc.StatusCode.UNAVAILABLE
                if not unavailable or time.monotonic() - last_heard > self.client.timeout:
                    raise ClientError(exc.code(), exc.details() or "") from None
                time.sleep(1.0)

    def wait(self, timeout: float | None = None) -> cpb.JobStatus:
        """Block until the job has ended; returns its final status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status.state in TERMINAL:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} is still {cpb.JobState.Name(status.state)}")
            time.sleep(0.2)

    def purge(self) -> cpb.PurgeJobResponse:
        """Remove the ended job's files at its parties attached now.

        Their checkpoints, kept shares and results; `absent` names the parties to purge again.
        """
        return cast(
            cpb.PurgeJobResponse,
            _call(
                self.client.stub.PurgeJob,
                cpb.PurgeJobRequest(job_id=self.id),
                timeout=self.client.timeout,
            ),
        )

    def cancel(self, reason: str = "") -> cpb.JobStatus:
        """Cancel the job; its workers stop within seconds."""
        return cast(
            cpb.JobStatus,
            _call(
                self.client.stub.CancelJob,
                cpb.CancelJobRequest(job_id=self.id, reason=reason),
                timeout=self.client.timeout,
            ),
        )

    def resume(self) -> cpb.JobStatus:
        """Queue a FAILED job again, to go on from its last committed round.

        Each party starts from its own checkpoint of that round; a job in any other state is
        FAILED_PRECONDITION.
        """
        return cast(
            cpb.JobStatus,
            _call(
                self.client.stub.ResumeJob,
                cpb.ResumeJobRequest(job_id=self.id),
                timeout=self.client.timeout,
            ),
        )

    def result(self) -> cpb.JobResult:
        """The public results of a COMPLETED job; raises JobError for any other state."""
        result = _call(
            self.client.stub.GetResult,
            cpb.GetResultRequest(job_id=self.id),
            timeout=self.client.timeout,
        )
        if result.status.state != cpb.COMPLETED:
            state = cpb.JobState.Name(result.status.state)
            raise JobError(
                f"job {self.id} is {state}"
                + (f": {result.status.reason}" if result.status.reason else "")
            )
        return cast(cpb.JobResult, result)
