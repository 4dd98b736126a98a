"""`mpcml party`: the long-running daemon of one organisation.

It registers with the coordinator (its catalogue's names and sizes, never values), keeps a
heartbeat, and runs each job it is assigned in a fresh worker process, relaying the worker's
reports to the coordinator and the coordinator's round GOs to the worker. A lost coordinator is
retried with exponential back-off and jitter.
"""

from __future__ import annotations

import logging
import multiprocessing
import random
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import HealthServicer
from prometheus_client import CollectorRegistry

from mpcml import logs, metrics
from mpcml.party import catalogue, policy, provenance, worker
from mpcml.party.config import PartyConfig
from mpcml.party.durable import discard_uncommitted
from mpcml.party.metrics import PartyMetrics, Totals
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.interceptors import RequestGuard
from mpcml.transport.serving import add_health_and_reflection, bind, channel
from mpcml.transport.tls import PARTY_ROLE, check_certificate

log = logging.getLogger(__name__)

HEALTH_REQUEST_BYTES = 64 * 1024
"""Largest request the health endpoint reads: health and reflection requests are tiny."""
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
    attempt: int
    """The run of the job it works on (`StartJob.attempt`); its reports carry it."""
    ended: bool = False
    """A FINISHED or FAILED report was relayed."""
    committed_round: int | None = None
    """Set by a StopJob: once the process is gone, discard what is beyond this round."""
    exited: threading.Event = field(default_factory=threading.Event)
    """Set by the relay thread once it reaped the process (the only thread that joins it)."""
    traffic: Totals = field(default_factory=dict)
    """The per-peer traffic of its last report, counted in the metrics already."""


WORKER_PRELOAD = ["mpcml", "crypten"]
"""What the worker fork server imports once, instead of every worker importing it afresh.

Importing torch and CrypTen took a spawned worker about 3 s of CPU for every job. Forking from
a server that has imported them shares no secret (every key comes from `os.urandom` in the
worker, after the fork) and no CUDA state (importing them does not initialise CUDA).
"""


def worker_context() -> ForkServerContext:
    """The fork-server context job workers start from, preloading `WORKER_PRELOAD`."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(WORKER_PRELOAD)
    return ctx


class PartyDaemon:
    """One party's daemon."""

    def __init__(self, config: PartyConfig, registry: CollectorRegistry | None = None) -> None:
        if config.tls is not None:
            check_certificate(config.tls, PARTY_ROLE)
        self.config = config
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerHandle] = {}
        self._heartbeat_at = time.monotonic()
        self.registry = registry or metrics.registry()
        """What `metrics_address` serves; counted into even when nothing serves it."""
        self.metrics = PartyMetrics(
            self.registry,
            running=lambda: len(self._workers),
            heartbeat_age=lambda: time.monotonic() - self._heartbeat_at,
        )
        self._endpoint: metrics.MetricsServer | None = None
        self._channel = channel(config.coordinator, config.tls, config.coordinator_name)
        self._stub = cgrpc.PartyControlStub(self._channel)
        self._ctx = worker_context()
        self._health: HealthServicer | None = None

    def attach_request(self) -> cpb.AttachRequest:
        """What the party registers with: its catalogue's public description."""
        return cpb.AttachRequest(
            party=self.config.name,
            data_address=self.config.data_address,
            device=self.config.device,
            datasets=[catalogue.describe(e) for e in self.config.datasets.values()],
            models=sorted(self.config.models),
            running_jobs=self._running(),
            max_concurrent_jobs=self.config.max_concurrent_jobs,
            health_address=self.config.public_health_address(),
        )

    def run(self) -> None:
        """Serve until `stopping` is set."""
        if self.config.tls is None:
            log.warning(
                "party %s runs over PLAINTEXT gRPC (insecure): debugging only", self.config.name
            )
        health = self._serve_health()
        self._endpoint = metrics.serve(self.config.metrics_address, self.registry)
        request = self.attach_request()
        heartbeat = threading.Thread(target=self._heartbeats, daemon=True, name="heartbeat")
        heartbeat.start()
        # The fork server's imports take seconds: done now, the first job need not wait for them.
        threading.Thread(target=forkserver.ensure_running, daemon=True, name="forkserver").start()
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
        if health is not None:
            health.stop(grace=1).wait()

    def _running(self) -> list[str]:
        """Jobs whose worker still works: one that reported its end no longer counts."""
        return sorted(j for j, h in list(self._workers.items()) if not h.ended)

    def _cancel_on_stop(self, stream: Any) -> None:
        self.stopping.wait()
        stream.cancel()

    def _serve_health(self) -> grpc.Server | None:
        """`grpc.health.v1` and reflection on `health_address`: NOT_SERVING until attached."""
        if not self.config.health_address:
            return None
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2),
            interceptors=[RequestGuard(HEALTH_REQUEST_BYTES, "the health endpoint's limit")],
        )
        self._health = add_health_and_reflection(server, [])
        self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        bind(server, self.config.health_address, self.config.tls)
        server.start()
        return server

    def _set_health(self, attached: bool) -> None:
        if self._health is not None:
            status = health_pb2.HealthCheckResponse
            self._health.set("", status.SERVING if attached else status.NOT_SERVING)

    def _heartbeats(self) -> None:
        while not self.stopping.wait(self.config.heartbeat_s):
            try:
                self._stub.Heartbeat(
                    cpb.HeartbeatRequest(party=self.config.name, running_jobs=self._running()),
                    timeout=self.config.heartbeat_s * 2,
                )
                self._heartbeat_at = time.monotonic()
                self._set_health(True)
            except grpc.RpcError:  # the attach loop reports and retries
                self._set_health(False)

    def _handle(self, assignment: cpb.Assignment) -> None:
        kind = assignment.WhichOneof("kind")
        message = getattr(assignment, kind)
        job_id = "" if kind == "vet" else message.job_id
        log.debug(
            "assignment %s for %s",
            kind,
            job_id or message.request_id,
            extra={"job_id": job_id, "round": message.round if kind == "go" else None},
        )
        if kind == "start":
            self._start(assignment.start)
        elif kind == "go":
            go = assignment.go
            handle = self._workers.get(go.job_id)
            if handle is None or handle.attempt != go.attempt:
                self._report(
                    cpb.WorkerReport(
                        job_id=go.job_id,
                        attempt=go.attempt,
                        failed=cpb.Failure(
                            reason=f"the party has no worker for run {go.attempt} of this job",
                            round=go.round,
                        ),
                    )
                )
                return
            try:
                handle.conn.send_bytes(assignment.SerializeToString())
            except OSError:
                log.warning(
                    "job %s: the worker is gone", handle.job_id, extra={"job_id": handle.job_id}
                )
        elif kind == "stop":
            stop = assignment.stop
            known = stop.HasField("committed_round")
            self._stop(stop.job_id, stop.reason, stop.committed_round if known else None)
        elif kind == "vet":
            self._vet(assignment.vet)

    def _verdict(self, spec: jpb.JobSpec, submitter: str) -> policy.Verdict:
        """The verdict of the party's policy on a job; a refusal is logged."""
        config = self.config
        verdict = policy.check(
            config.policy, config.name, spec, submitter, provenance.lineage(config)
        )
        if not verdict.allowed:
            log.warning("refused a job from %s: %s", submitter, verdict.reason)
        return verdict

    def _vet(self, vet: cpb.VetJob) -> None:
        verdict = self._verdict(vet.spec, vet.submitter)
        self._report(
            cpb.WorkerReport(
                verdict=cpb.Verdict(
                    request_id=vet.request_id, allowed=verdict.allowed, reason=verdict.reason
                )
            )
        )

    def _start(self, start: cpb.StartJob) -> None:
        """Start the job's worker; a StartJob heard again (after a re-attach) changes nothing.

        A worker of an earlier run of the same job (its StopJob was lost with the stream) is
        stopped first: the coordinator starts a run only once the one before it has ended.
        """
        old = self._workers.get(start.job_id)
        if old is not None and not old.exited.is_set():
            if old.attempt >= start.attempt:
                log.info(
                    "job %s: run %d already runs here; ignoring a StartJob for run %d",
                    start.job_id,
                    old.attempt,
                    start.attempt,
                    extra={"job_id": start.job_id},
                )
                return
            self._stop(start.job_id, f"run {start.attempt} of the job replaces run {old.attempt}")
            old.exited.wait(STOP_GRACE_S)
        verdict = self._verdict(start.spec, start.submitter)
        if not verdict.allowed:  # the policy changed since the job was vetted
            reason = f"party {self.config.name!r} refuses the job: {verdict.reason}"
            self._report(
                cpb.WorkerReport(
                    job_id=start.job_id, attempt=start.attempt, failed=cpb.Failure(reason=reason)
                )
            )
            return
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
                    cpb.WorkerReport(
                        job_id=start.job_id,
                        attempt=start.attempt,
                        failed=cpb.Failure(reason=reason),
                    )
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
            handle = WorkerHandle(start.job_id, process, parent, start.slot, start.attempt)
            self._workers[start.job_id] = handle
        self.metrics.started.inc()
        log.info(
            "job %s: worker %d started as rank %d in slot %d",
            start.job_id,
            process.pid,
            start.rank,
            start.slot,
            extra={"job_id": start.job_id},
        )
        threading.Thread(target=self._relay, args=(handle,), daemon=True).start()

    def _relay(self, handle: WorkerHandle) -> None:
        with logs.scope(job_id=handle.job_id):
            self._relay_reports(handle)

    def _relay_reports(self, handle: WorkerHandle) -> None:
        while True:
            try:
                data = handle.conn.recv_bytes()
            except (EOFError, OSError):
                break
            report = cpb.WorkerReport.FromString(data)
            report.attempt = handle.attempt
            if report.WhichOneof("kind") in ("finished", "failed"):
                handle.ended = True
            self._observe(handle, report)
            self._report(report)
        handle.process.join()
        handle.exited.set()
        code = handle.process.exitcode
        if not handle.ended:
            self.metrics.failed.inc()
            how = (
                f"was killed by signal {-code}"
                if code is not None and code < 0
                else f"exited with code {code}"
            )
            self._report(
                cpb.WorkerReport(
                    job_id=handle.job_id,
                    attempt=handle.attempt,
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

    def _observe(self, handle: WorkerHandle, report: cpb.WorkerReport) -> None:
        """Count a worker's report in the metrics, and drop its per-peer traffic.

        Only this daemon's metrics use the traffic; the coordinator never needs it.
        """
        kind = report.WhichOneof("kind")
        body: cpb.RoundDone | cpb.Finished | cpb.Failure
        if kind == "done":
            body = report.done
            self.metrics.rounds.inc()
        elif kind == "finished":
            body = report.finished
            self.metrics.finished.inc()
        elif kind == "failed":
            body = report.failed
            self.metrics.failed.inc()
        else:
            return
        handle.traffic = self.metrics.traffic(handle.traffic, body.traffic)
        body.ClearField("traffic")

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
                        extra={"job_id": report.job_id},
                    )
                    return
                if self.stopping.wait(0.5 * 2**attempt):
                    return
        log.error(
            "job %s: could not deliver a report to the coordinator",
            report.job_id,
            extra={"job_id": report.job_id},
        )

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
        log.info("job %s: stopping the worker (%s)", job_id, reason, extra={"job_id": job_id})
        handle.process.terminate()
        if not handle.exited.wait(STOP_GRACE_S):
            handle.process.kill()

    def shutdown(self) -> None:
        """Stop every worker and close the channel."""
        self.stopping.set()
        for job_id in list(self._workers):
            self._stop(job_id, "the party daemon is shutting down")
        self._channel.close()
        if self._endpoint is not None:
            self._endpoint.stop()
            self._endpoint = None
