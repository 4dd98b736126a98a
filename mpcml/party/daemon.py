"""`mpcml party`: the long-running daemon of one organisation.

It registers with the coordinator (its catalogue's names and sizes, never values) and keeps a
heartbeat (`coordinator_link.py`), applies its own policy to every job it is asked to vet or
start (`policy.py`), and runs each job in a fresh worker process (`pool.py`), relaying the
worker's reports to the coordinator and the coordinator's round GOs to the worker.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from multiprocessing import forkserver
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer
from prometheus_client import CollectorRegistry

from mpcml import metrics
from mpcml.console import server as console
from mpcml.graph.digest import graph_digest
from mpcml.party import catalogue, policy, provenance
from mpcml.party.audit import AuditLog
from mpcml.party.config import PartyConfig
from mpcml.party.console_source import PartySource
from mpcml.party.coordinator_link import CoordinatorLink
from mpcml.party.metrics import PartyMetrics
from mpcml.party.pool import WorkerPool
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.interceptors import RequestGuard
from mpcml.transport.serving import channel, start_server
from mpcml.transport.tls import PARTY_ROLE, check_certificate

log = logging.getLogger(__name__)

HEALTH_REQUEST_BYTES = 64 * 1024
"""Largest request the health endpoint reads: health and reflection requests are tiny."""


class PartyDaemon:
    """One party's daemon."""

    def __init__(self, config: PartyConfig, registry: CollectorRegistry | None = None) -> None:
        if config.tls is not None:
            check_certificate(config.tls, PARTY_ROLE)
        self.config = config
        self.stopping = threading.Event()
        self.registry = registry or metrics.registry()
        """What `metrics_address` serves; counted into even when nothing serves it."""
        self.link = CoordinatorLink(config, self.stopping, self._set_health)
        self.audit = AuditLog(config.state_dir)
        self.metrics = PartyMetrics(
            self.registry,
            running=lambda: len(self.pool),
            heartbeat_age=lambda: time.monotonic() - self.link.heartbeat_at,
        )
        self.pool = WorkerPool(config, self.metrics, self.link.report)
        self._endpoint: metrics.MetricsServer | None = None
        self._console: console.Console | None = None
        self._attached = False
        self._health: HealthServicer | None = None

    def attach_request(self) -> cpb.AttachRequest:
        """What the party registers with: its catalogue's public description."""
        return cpb.AttachRequest(
            party=self.config.name,
            data_address=self.config.data_address,
            device=self.config.device,
            datasets=[catalogue.describe(e) for e in self.config.datasets.values()],
            models=sorted(self.config.models),
            model_info=[
                catalogue.describe_model(name, path)
                for name, path in sorted(self.config.models.items())
            ],
            running_jobs=self.pool.running(),
            max_concurrent_jobs=self.config.max_concurrent_jobs,
            health_address=self.config.public_health_address(),
            limits=self.config.limits.to_proto(),
        )

    def run(self) -> None:
        """Serve until `stopping` is set; a device the machine lacks raises DeviceError first."""
        self.pool.check_device()
        if self.config.tls is None:
            log.warning(
                "party %s runs over PLAINTEXT gRPC (insecure): debugging only", self.config.name
            )
        health = self._serve_health()
        self._endpoint = metrics.serve(self.config.metrics_address, self.registry)
        self._console = console.start(
            self.config.console, self.config.tls, PartySource(self.config)
        )
        self._say_what_is_served()
        threading.Thread(target=self._reach_dealer, daemon=True, name="dealer-check").start()
        threading.Thread(
            target=self.link.heartbeats, args=(self.pool.running,), daemon=True, name="heartbeat"
        ).start()
        # The fork server's imports take seconds: done now, the first job need not wait for them.
        threading.Thread(target=forkserver.ensure_running, daemon=True, name="forkserver").start()
        self.link.attach(self.attach_request, self._handle)
        self.shutdown()
        if health is not None:
            health.stop(grace=1).wait()

    def _serve_health(self) -> grpc.Server | None:
        """`grpc.health.v1` and reflection on `health_address`: NOT_SERVING until attached."""
        if not self.config.health_address:
            return None
        guard = RequestGuard(HEALTH_REQUEST_BYTES, "the health endpoint's limit")
        server, _, self._health = start_server(
            "health", self.config.health_address, self.config.tls, guard, [], max_workers=2
        )
        self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        return server

    def _say_what_is_served(self) -> None:
        """The start-up lines an operator reads first: who, where, and which data."""
        c = self.config
        who = "without TLS" if c.tls is None else f"with the certificate {c.tls.cert}"
        log.info(
            "party %s starting %s: job workers listen on %s (peers reach them at %s, %d slot(s)); "
            "health on %s; metrics on %s; coordinator %s; dealer %s; device %s",
            c.name,
            who,
            c.listen,
            c.data_address,
            c.max_concurrent_jobs,
            c.health_address or "-",
            c.metrics_address or "-",
            c.coordinator,
            c.dealer or "none (only insecure_provider jobs can run)",
            c.device,
        )
        described = []
        for entry in c.datasets.values():
            try:
                info = catalogue.describe(entry)
                described.append(f"{info.name} ({info.rows} rows x {len(info.columns)} columns)")
            except catalogue.DataError as exc:
                log.warning("%s", exc)
                described.append(f"{entry.name} (unreadable)")
        log.info(
            "party %s datasets: %s; models: %s",
            c.name,
            ", ".join(described) or "none",
            ", ".join(sorted(c.models)) or "none",
        )

    def _reach_dealer(self) -> None:
        """Once at start-up: whether the dealer answers its health check, said in the log."""
        c = self.config
        if not c.dealer:
            return
        try:
            with channel(c.dealer, c.tls, c.dealer_name) as ch:
                reply = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=10, wait_for_ready=True
                )
            state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            log.info("reached the dealer at %s (%s)", c.dealer, state)
        except grpc.RpcError as exc:
            log.warning(
                "the dealer at %s did not answer (%s: %s): jobs will fail until it does",
                c.dealer,
                exc.code().name,
                exc.details(),
            )

    def _set_health(self, attached: bool) -> None:
        if attached != self._attached:
            self._attached = attached
            if attached:
                log.info(
                    "attached to the coordinator at %s as party %s",
                    self.config.coordinator,
                    self.config.name,
                )
            else:
                log.warning("lost the coordinator at %s", self.config.coordinator)
        if self._health is not None:
            status = health_pb2.HealthCheckResponse
            self._health.set("", status.SERVING if attached else status.NOT_SERVING)

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
            self.pool.go(assignment.go)
        elif kind == "stop":
            stop = assignment.stop
            known = stop.HasField("committed_round")
            self.audit.append("job_stopped", stop.job_id, reason=stop.reason)
            self.pool.stop(stop.job_id, stop.reason, stop.committed_round if known else None)
        elif kind == "purge":
            self._purge(assignment.purge.job_id)
        elif kind == "vet":
            vet = assignment.vet
            rows = (list(vet.feature_rows), list(vet.label_rows))
            answer = cpb.Verdict(request_id=vet.request_id)
            verdict = self._verdict(
                vet.spec, vet.submitter, rows, answer=answer, request=vet.request_id
            )
            answer.allowed, answer.reason = verdict.allowed, verdict.reason
            self.link.report(cpb.WorkerReport(verdict=answer))

    def _estimate(self, spec: jpb.JobSpec, rows: policy.Rows, answer: cpb.Verdict) -> str:
        """Put the job's estimate in `answer`; why this party's limits refuse it, or "".

        The rows are the most any binding registered: with `align_on` the intersection is no
        larger.
        """
        from mpcml.jobs import estimate

        most = max([*rows[0], *rows[1]], default=0)
        try:
            found = estimate.estimate(spec, most).to_proto()
        except Exception as exc:  # a graph the estimate cannot run is refused, not crashed on
            log.warning("cannot estimate a job: %s", exc, exc_info=True)
            return f"its cost cannot be estimated ({type(exc).__name__})"
        answer.estimate.CopyFrom(found)
        over = estimate.over(found, self.config.name, self.config.limits.to_proto())
        answer.over_limit = bool(over)
        return "; ".join(over)

    def _verdict(
        self,
        spec: jpb.JobSpec,
        submitter: str,
        rows: policy.Rows | None = None,
        job: str = "",
        answer: cpb.Verdict | None = None,
        **context: Any,
    ) -> policy.Verdict:
        """The verdict of the party's policy on a job, an entry of its audit log.

        A refusal is logged too. `context` goes into the entry: the vet's request, the
        start's attempt.

        A job that runs this party's private model is refused too when the stored weights no
        longer match the commitment the job names. With `answer` (a vet's), the job's estimate
        goes into it, and a job over the party's limits is refused.
        """
        config = self.config
        verdict = policy.check(
            config.policy, config.name, spec, submitter, provenance.lineage(config), rows
        )
        private = spec.weights.private
        if verdict.allowed and spec.weights.HasField("private") and private.party == config.name:
            try:
                catalogue.committed_model(
                    config.models, config.name, private.model, private.commitment
                )
            except catalogue.DataError as exc:
                verdict = policy.Verdict(False, str(exc))
        if verdict.allowed and answer is not None and rows is not None:
            problem = self._estimate(spec, rows, answer)
            if problem:
                verdict = policy.Verdict(False, problem)
        if not verdict.allowed:
            log.warning("refused a job from %s: %s", submitter, verdict.reason)
        mine = [b.dataset for b in [*spec.features, *spec.labels] if b.party == config.name]
        self.audit.append(
            "job_admitted" if verdict.allowed else "job_refused",
            job,
            **context,
            submitter=submitter,
            task=jpb.Task.Name(spec.task),
            graph=graph_digest(spec.graph),
            datasets=sorted(set(mine)),
            model=private.model if private.party == config.name else "",
            reveal={jpb.Output.Name(r.output): list(r.recipients) for r in spec.reveal},
            **({} if verdict.allowed else {"rule": verdict.reason}),
        )
        return verdict

    def _purge(self, job_id: str) -> None:
        """Remove an ended job's checkpoints, kept shares and results here, as the audit says."""
        if not re.fullmatch(r"[0-9a-f]{32}", job_id):  # it becomes part of a path
            log.warning("ignored a purge of a malformed job id %r", job_id[:80])
            return
        if job_id in self.pool.running():
            log.warning("job %s: purge refused: its worker still runs here", job_id)
            return
        removed = []
        for folder in (self.config.job_state(job_id), self.config.job_results(job_id)):
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(str(folder))
        self.audit.append("job_purged", job_id, removed=removed)
        log.info("job %s: purged %s", job_id, ", ".join(removed) or "nothing (no files here)")

    def _start(self, start: cpb.StartJob) -> None:
        """Start the job's worker; a StartJob heard again (after a re-attach) changes nothing.

        The policy is applied again first: it may have changed since the job was vetted.
        """
        if self.pool.already_runs(start):
            return
        verdict = self._verdict(
            start.spec, start.submitter, job=start.job_id, stage="start", attempt=start.attempt
        )
        if verdict.allowed:
            self.audit.append(
                "job_started", start.job_id, attempt=start.attempt, resume_round=start.resume_round
            )
            self.pool.start(start)
            return
        reason = f"party {self.config.name!r} refuses the job: {verdict.reason}"
        self.pool.stop(start.job_id, reason)  # a worker of an earlier run, if one is left
        self.link.report(
            cpb.WorkerReport(
                job_id=start.job_id, attempt=start.attempt, failed=cpb.Failure(reason=reason)
            )
        )

    def shutdown(self) -> None:
        """Stop every worker and close the channel."""
        self.stopping.set()
        self.pool.stop_all("the party daemon is shutting down")
        self.link.close()
        if self._endpoint is not None:
            self._endpoint.stop()
            self._endpoint = None
        if self._console is not None:
            self._console.stop()
            self._console = None
