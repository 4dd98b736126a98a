"""`mpcml party`: the long-running daemon of one organisation.

It registers with the coordinator (its catalogue's names and sizes, never values), keeps a
heartbeat, and runs each job it is assigned in a fresh worker process, relaying the worker's
reports to the coordinator and the coordinator's round GOs to the worker. A lost coordinator is
retried with exponential back-off and jitter.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import random
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import grpc

from mpcml.party import catalogue, policy, worker
from mpcml.party.config import PartyConfig
from mpcml.party.durable import discard_uncommitted
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.transport.serving import channel
from mpcml.transport.tls import PARTY_ROLE, check_certificate

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0
STOP_GRACE_S = 5.0
"""A stopped worker gets this long after SIGTERM before SIGKILL."""
WORKER_EXIT_S = 30.0
"""A worker that reported its end gets this long to close its session before the next job."""


@dataclass
class WorkerHandle:
    """A running job worker."""

    job_id: str
    process: BaseProcess
    conn: Connection
    slot: int
    ended: bool = False
    """A FINISHED or FAILED report was relayed."""
    committed_round: int | None = None
    """Set by a StopJob: once the process is gone, discard what is beyond this round."""
    exited: threading.Event = field(default_factory=threading.Event)
    """Set by the relay thread once it reaped the process (the only thread that joins it)."""


class PartyDaemon:
    """One party's daemon."""

    def __init__(self, config: PartyConfig) -> None:
        if config.tls is not None:
            check_certificate(config.tls, PARTY_ROLE)
        self.config = config
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerHandle] = {}
        self._channel = channel(config.coordinator, config.tls, config.coordinator_name)
        self._stub = cgrpc.PartyControlStub(self._channel)
        self._ctx = multiprocessing.get_context("spawn")

    def attach_request(self) -> cpb.AttachRequest:
        """What the party registers with: its catalogue's public description."""
        return cpb.AttachRequest(
            party=self.config.name,
            data_address=self.config.data_address,
            device=self.config.device,
            datasets=[catalogue.describe(e) for e in self.config.datasets.values()],
            models=sorted(self.config.models),
            running_jobs=sorted(self._workers),
            max_concurrent_jobs=self.config.max_concurrent_jobs,
        )

    def run(self) -> None:
        """Serve until `stopping` is set."""
        if self.config.tls is None:
            log.warning(
                "party %s runs over PLAINTEXT gRPC (insecure): debugging only", self.config.name
            )
        request = self.attach_request()
        heartbeat = threading.Thread(target=self._heartbeats, daemon=True, name="heartbeat")
        heartbeat.start()
        backoff = BACKOFF_MIN_S
        while not self.stopping.is_set():
            stream = self._stub.Attach(request)
            stopper = threading.Thread(target=self._cancel_on_stop, args=(stream,), daemon=True)
            stopper.start()
            try:
                for assignment in stream:
                    if backoff != BACKOFF_MIN_S:
                        log.info("attached to the coordinator at %s", self.config.coordinator)
                    backoff = BACKOFF_MIN_S
                    self._handle(assignment)
                log.warning("the coordinator closed the assignment stream; attaching again")
            except grpc.RpcError as exc:
                if self.stopping.is_set():
                    break
                code = exc.code()
                details = exc.details()
                if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT):
                    log.error("the coordinator refused party %s: %s", self.config.name, details)
                else:
                    log.warning(
                        "coordinator %s unreachable (%s: %s); retrying in %.1f s",
                        self.config.coordinator,
                        code.name,
                        details,
                        backoff,
                    )
            self.stopping.wait(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            request = self.attach_request()
        self.shutdown()

    def _cancel_on_stop(self, stream: Any) -> None:
        self.stopping.wait()
        stream.cancel()

    def _heartbeats(self) -> None:
        while not self.stopping.wait(self.config.heartbeat_s):
            with contextlib.suppress(grpc.RpcError):  # the attach loop reports and retries
                self._stub.Heartbeat(
                    cpb.HeartbeatRequest(
                        party=self.config.name, running_jobs=sorted(self._workers)
                    ),
                    timeout=self.config.heartbeat_s * 2,
                )

    def _handle(self, assignment: cpb.Assignment) -> None:
        kind = assignment.WhichOneof("kind")
        message = getattr(assignment, kind)
        log.debug(
            "assignment %s for %s", kind, message.request_id if kind == "vet" else message.job_id
        )
        if kind == "start":
            self._start(assignment.start)
        elif kind == "go":
            handle = self._workers.get(assignment.go.job_id)
            if handle is None:
                self._report(
                    cpb.WorkerReport(
                        job_id=assignment.go.job_id,
                        failed=cpb.Failure(
                            reason="the party has no worker for this job", round=assignment.go.round
                        ),
                    )
                )
                return
            try:
                handle.conn.send_bytes(assignment.SerializeToString())
            except OSError:
                log.warning("job %s: the worker is gone", handle.job_id)
        elif kind == "stop":
            stop = assignment.stop
            self._stop(stop.job_id, stop.reason, stop.committed_round)
        elif kind == "vet":
            self._vet(assignment.vet)

    def _vet(self, vet: cpb.VetJob) -> None:
        verdict = policy.check(self.config.policy, self.config.name, vet.spec, vet.submitter)
        if not verdict.allowed:
            log.warning("refused a job from %s: %s", vet.submitter, verdict.reason)
        self._report(
            cpb.WorkerReport(
                verdict=cpb.Verdict(
                    request_id=vet.request_id, allowed=verdict.allowed, reason=verdict.reason
                )
            )
        )

    def _start(self, start: cpb.StartJob) -> None:
        with self._lock:
            for handle in self._workers.values():
                # The slot's port is free only once its last worker closed its session.
                same_slot = handle.slot == start.slot and handle.ended
                if same_slot and not handle.exited.wait(WORKER_EXIT_S):
                    handle.process.kill()  # it reported, but did not close its session
                    handle.exited.wait(STOP_GRACE_S)
            busy = [
                f"job {j} in slot {h.slot}"
                for j, h in self._workers.items()
                if not h.exited.is_set() and (h.slot == start.slot or j == start.job_id)
            ]
            if busy or start.slot >= self.config.max_concurrent_jobs:
                reason = (
                    f"the party is still running {busy[0]}"
                    if busy
                    else f"slot {start.slot} is beyond max_concurrent_jobs = "
                    f"{self.config.max_concurrent_jobs}"
                )
                self._report(
                    cpb.WorkerReport(job_id=start.job_id, failed=cpb.Failure(reason=reason))
                )
                return
            parent, child = self._ctx.Pipe()
            process = self._ctx.Process(
                target=worker.main,
                args=(child, start.SerializeToString(), self.config),
                name=f"mpcml-worker-{start.job_id[:8]}",
                daemon=False,
            )
            process.start()
            child.close()
            handle = WorkerHandle(start.job_id, process, parent, start.slot)
            self._workers[start.job_id] = handle
        log.info(
            "job %s: worker %d started as rank %d in slot %d",
            start.job_id,
            process.pid,
            start.rank,
            start.slot,
        )
        threading.Thread(target=self._relay, args=(handle,), daemon=True).start()

    def _relay(self, handle: WorkerHandle) -> None:
        while True:
            try:
                data = handle.conn.recv_bytes()
            except (EOFError, OSError):
                break
            report = cpb.WorkerReport.FromString(data)
            if report.WhichOneof("kind") in ("finished", "failed"):
                handle.ended = True
            self._report(report)
        handle.process.join()
        handle.exited.set()
        code = handle.process.exitcode
        if not handle.ended:
            how = (
                f"was killed by signal {-code}"
                if code is not None and code < 0
                else f"exited with code {code}"
            )
            self._report(
                cpb.WorkerReport(
                    job_id=handle.job_id,
                    failed=cpb.Failure(reason=f"the job worker process {how} without a report"),
                )
            )
        with self._lock:
            if self._workers.get(handle.job_id) is handle:
                del self._workers[handle.job_id]
            committed = handle.committed_round
        if committed is not None:
            discard_uncommitted(self.config.job_state(handle.job_id), committed)
        log.info("job %s: worker exited (%s)", handle.job_id, code)

    def _report(self, report: cpb.WorkerReport) -> None:
        report.party = self.config.name
        for attempt in range(5):
            try:
                self._stub.Report(report, timeout=10)
                return
            except grpc.RpcError as exc:
                code = exc.code()
                if code in (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ):
                    log.info(
                        "job %s: the coordinator did not take a report: %s",
                        report.job_id,
                        exc.details(),
                    )
                    return
                if self.stopping.wait(0.5 * 2**attempt):
                    return
        log.error("job %s: could not deliver a report to the coordinator", report.job_id)

    def _stop(self, job_id: str, reason: str, committed_round: int | None = None) -> None:
        """Stop the job's worker; with `committed_round`, then discard what is beyond it."""
        with self._lock:
            handle = self._workers.get(job_id)
            if handle is not None:
                handle.committed_round = committed_round
        if handle is None:
            if committed_round is not None:  # the worker is gone already
                discard_uncommitted(self.config.job_state(job_id), committed_round)
            return
        handle.ended = True
        log.info("job %s: stopping the worker (%s)", job_id, reason)
        handle.process.terminate()
        if not handle.exited.wait(STOP_GRACE_S):
            handle.process.kill()

    def shutdown(self) -> None:
        """Stop every worker and close the channel."""
        self.stopping.set()
        for job_id in list(self._workers):
            self._stop(job_id, "the party daemon is shutting down")
        self._channel.close()
