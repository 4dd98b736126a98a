"""The party's job workers: one process per job, forked from a server that imported CrypTen.

The pool starts and stops workers, passes each the coordinator's round GOs over its pipe, and
relays what the worker reports (ready, round done, finished, failed) to `report`. Its lock
guards the table of workers only: no wait for a process happens under it.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess

from mpcml import logs
from mpcml.party import worker
from mpcml.party.config import PartyConfig
from mpcml.party.durable import discard_uncommitted
from mpcml.party.limits import (
    ADDRESS_ALLOWANCE,
    MIB,
    Limits,
    hard_cap,
    resident_bytes,
)
from mpcml.party.metrics import PartyMetrics, Totals
from mpcml.proto.v1 import coordinator_pb2 as cpb

log = logging.getLogger(__name__)

MONITOR_S = 0.2
"""How often a worker's resident memory and run time are checked."""
STOP_GRACE_S = 5.0
"""A stopped worker gets this long after SIGTERM before SIGKILL."""
WORKER_EXIT_S = 30.0
"""A worker that reported its end gets this long to close its session before the next job."""

WORKER_PRELOAD = ["mpcml.runtime.preload"]
"""What the worker fork server imports once, instead of every worker afresh (see there)."""


def _probe_device(conn: Connection, device: str, party: str) -> None:
    """In a worker-to-be: the DeviceError message for `device`, or "" when it is there."""
    from mpcml.runtime import devices

    try:
        devices.resolve(device, party)
        conn.send("")
    except devices.DeviceError as exc:
        conn.send(str(exc))


def worker_context() -> ForkServerContext:
    """The fork-server context job workers start from, preloading `WORKER_PRELOAD`."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(WORKER_PRELOAD)
    return ctx


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
    memory_cap: int = 0
    """Bytes of resident memory it may hold (0: no cap); the monitor stops it beyond."""
    estimate: int = 0
    """Its job's estimated peak memory here, in bytes."""
    deadline: float = 0.0
    """`time.monotonic()` past which the monitor stops it (0: none)."""


def _cap_rule(estimate: int, limits: Limits) -> str:
    """How a worker's memory cap was set, for a failure's reason."""
    rule = f"memory_margin = {limits.memory_margin:g} times"
    if estimate:
        rule += f" the job's estimate here, {estimate / MIB:.0f} MiB"
    if limits.max_job_memory_mib and (not estimate or estimate > limits.max_job_memory_mib * MIB):
        rule += f"{' and' if estimate else ''} max_job_memory_mib = {limits.max_job_memory_mib}"
    return rule


def _failed(job_id: str, attempt: int, reason: str) -> cpb.WorkerReport:
    return cpb.WorkerReport(job_id=job_id, attempt=attempt, failed=cpb.Failure(reason=reason))


class WorkerPool:
    """The job workers of one party."""

    def __init__(
        self,
        config: PartyConfig,
        metrics: PartyMetrics,
        report: Callable[[cpb.WorkerReport], None],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._report = report
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerHandle] = {}
        self._ctx = worker_context()

    def __len__(self) -> int:
        return len(self._workers)

    def check_device(self, timeout: float = 120.0) -> None:
        """Refuse a device this machine lacks now, not at the first job.

        Asked in a process forked from the workers' fork server, like a job worker: neither the
        daemon nor the fork server initialise CUDA (workers forked from a process that did
        could not use it). Nothing to ask for the CPU or an emulated GPU.
        """
        from mpcml.runtime import devices

        if self.config.device == "cpu" or self.config.cuda_emulation:
            return
        parent, child = self._ctx.Pipe()
        probe = self._ctx.Process(
            target=_probe_device,
            args=(child, self.config.device, self.config.name),
            name="mpcml-device-probe",
        )
        probe.start()
        child.close()
        try:
            if not parent.poll(timeout):
                raise devices.DeviceError(
                    f"party {self.config.name!r}: checking device {self.config.device!r} "
                    f"took over {timeout:g} s"
                )
            problem = parent.recv()
        except EOFError:
            problem = f"party {self.config.name!r}: the probe of device {self.config.device!r} died"
        finally:
            probe.join(timeout)
        if problem:
            raise devices.DeviceError(problem)

    def running(self) -> list[str]:
        """Jobs whose worker still works: one that reported its end no longer counts."""
        with self._lock:
            return sorted(j for j, h in self._workers.items() if not h.ended)

    def already_runs(self, start: cpb.StartJob) -> bool:
        """Whether this run (or a later one) of the job runs here: a StartJob heard again."""
        with self._lock:
            old = self._workers.get(start.job_id)
        if old is None or old.exited.is_set() or old.attempt < start.attempt:
            return False
        log.info(
            "job %s: run %d already runs here; ignoring a StartJob for run %d",
            start.job_id,
            old.attempt,
            start.attempt,
            extra={"job_id": start.job_id},
        )
        return True

    def start(self, start: cpb.StartJob) -> None:
        """Start the job's worker, or report why not.

        A worker of an earlier run of the same job (its StopJob was lost with the stream) is
        stopped first: the coordinator starts a run only once the one before it has ended. A
        worker that reported its end in the same slot gets `WORKER_EXIT_S` to free its port.
        """
        with self._lock:
            old = self._workers.get(start.job_id)
            lingering = [h for h in self._workers.values() if h.slot == start.slot and h.ended]
        if old is not None and not old.exited.is_set():
            self.stop(start.job_id, f"run {start.attempt} of the job replaces run {old.attempt}")
            old.exited.wait(STOP_GRACE_S)
        for handle in lingering:  # the slot's port is free once its last worker closed
            if not handle.exited.wait(WORKER_EXIT_S):
                handle.process.kill()  # it reported, but did not close its session
                handle.exited.wait(STOP_GRACE_S)
        with self._lock:
            busy = [
                f"job {j} in slot {h.slot}"
                for j, h in self._workers.items()
                if not h.exited.is_set() and (h.slot == start.slot or j == start.job_id)
            ]
            limit = self.config.max_concurrent_jobs
            if busy or start.slot >= limit:
                reason = (
                    f"the party is still running {busy[0]}"
                    if busy
                    else f"slot {start.slot} is beyond max_concurrent_jobs = {limit}"
                )
                self._report(_failed(start.job_id, start.attempt, reason))
                return
            parent, child = self._ctx.Pipe()
            estimate = start.estimate.peak_memory_bytes.get(self.config.name, 0)
            cap = self.config.limits.memory_cap(estimate)
            process = self._ctx.Process(
                target=worker.main,
                args=(child, start.SerializeToString(), self.config, hard_cap(cap)),
                name=f"mpcml-worker-{start.job_id[:8]}",
                daemon=False,
            )
            process.start()
            child.close()
            handle = WorkerHandle(start.job_id, process, parent, start.slot, start.attempt)
            handle.memory_cap, handle.estimate = cap, estimate
            seconds = self.config.limits.max_job_seconds
            handle.deadline = time.monotonic() + seconds if seconds else 0.0
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
        threading.Thread(target=self._monitor, args=(handle,), daemon=True).start()

    def go(self, go: cpb.GoRound) -> None:
        """Pass a round's GO to the job's worker; a GO for a run it does not have fails."""
        with self._lock:
            handle = self._workers.get(go.job_id)
        if handle is None or handle.attempt != go.attempt:
            failure = cpb.Failure(
                reason=f"the party has no worker for run {go.attempt} of this job", round=go.round
            )
            self._report(cpb.WorkerReport(job_id=go.job_id, attempt=go.attempt, failed=failure))
            return
        try:
            handle.conn.send_bytes(cpb.Assignment(go=go).SerializeToString())
        except OSError:
            log.warning("job %s: the worker is gone", go.job_id, extra={"job_id": go.job_id})

    def stop(self, job_id: str, reason: str, committed_round: int | None = None) -> None:
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

    def stop_all(self, reason: str) -> None:
        """Stop every worker."""
        with self._lock:
            jobs = list(self._workers)
        for job_id in jobs:
            self.stop(job_id, reason)

    # --- each worker's monitor thread ---------------------------------------------------------

    def _monitor(self, handle: WorkerHandle) -> None:
        """Stop the worker past its memory cap or its wall time, with a reason naming the limit."""
        limits = self.config.limits
        while not handle.exited.wait(MONITOR_S):
            if handle.ended:
                return
            reason = ""
            resident = resident_bytes(handle.process.pid or 0)
            if handle.memory_cap and resident > handle.memory_cap:
                reason = (
                    f"its job worker held {resident / MIB:.0f} MiB, over its memory cap of "
                    f"{handle.memory_cap / MIB:.0f} MiB ({_cap_rule(handle.estimate, limits)}); "
                    "the worker was stopped"
                )
            elif handle.deadline and time.monotonic() > handle.deadline:
                reason = (
                    f"its job worker ran past max_job_seconds = {limits.max_job_seconds:g} "
                    "(policy.limits); the worker was stopped"
                )
            if reason:
                log.warning("job %s: %s", handle.job_id, reason, extra={"job_id": handle.job_id})
                handle.ended = True
                self.metrics.failed.inc()
                self._report(_failed(handle.job_id, handle.attempt, reason))
                handle.process.kill()
                return

    # --- each worker's relay thread ---------------------------------------------------------

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
            reason = f"the job worker process {how} without a report"
            if handle.memory_cap:
                reason += (
                    f" (it ran under a hard memory cap of {hard_cap(handle.memory_cap) / MIB:.0f}"
                    f" MiB: {_cap_rule(handle.estimate, self.config.limits)}, plus "
                    f"{ADDRESS_ALLOWANCE / MIB:.0f} MiB of reserved address space)"
                )
            self._report(_failed(handle.job_id, handle.attempt, reason))
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
