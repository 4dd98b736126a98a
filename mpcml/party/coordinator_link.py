"""The party's link to the coordinator: its Attach stream, its heartbeats and its reports.

The stream is attached again, with exponential back-off and jitter, whenever it breaks; each
assignment it carries goes to `handle`. Reports are retried a few times, then given up with an
error in the log.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from mpcml.party.config import PartyConfig
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.transport.serving import channel

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0
REPORT_TRIES = 5
FINAL = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
)
"""A report the coordinator refuses with these is not sent again."""


class CoordinatorLink:
    """One party's control channel to the coordinator."""

    def __init__(
        self,
        config: PartyConfig,
        stopping: threading.Event,
        on_health: Callable[[bool], None],
    ) -> None:
        self.config = config
        self.stopping = stopping
        self._on_health = on_health
        self.heartbeat_at = time.monotonic()
        """When the coordinator last took a heartbeat."""
        self._channel = channel(config.coordinator, config.tls, config.coordinator_name)
        self._stub = cgrpc.PartyControlStub(self._channel)

    def attach(
        self,
        request: Callable[[], cpb.AttachRequest],
        handle: Callable[[cpb.Assignment], None],
    ) -> None:
        """Attach (again and again) until `stopping` is set, handing on every assignment."""
        backoff = BACKOFF_MIN_S
        while not self.stopping.is_set():
            stream = self._stub.Attach(request())
            threading.Thread(target=self._cancel_on_stop, args=(stream,), daemon=True).start()
            try:
                for assignment in stream:
                    if backoff != BACKOFF_MIN_S:
                        log.info("attached to the coordinator at %s", self.config.coordinator)
                    backoff = BACKOFF_MIN_S
                    handle(assignment)
                log.warning("the coordinator closed the assignment stream; attaching again")
            except grpc.RpcError as exc:
                if self.stopping.is_set():
                    break
                code, details = exc.code(), exc.details()
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

    def _cancel_on_stop(self, stream: Any) -> None:
        self.stopping.wait()
        stream.cancel()

    def heartbeats(self, running: Callable[[], list[str]]) -> None:
        """Send a heartbeat every `heartbeat_s` until `stopping` is set."""
        while not self.stopping.wait(self.config.heartbeat_s):
            try:
                self._stub.Heartbeat(
                    cpb.HeartbeatRequest(party=self.config.name, running_jobs=running()),
                    timeout=self.config.heartbeat_s * 2,
                )
                self.heartbeat_at = time.monotonic()
                self._on_health(True)
            except grpc.RpcError:  # the attach loop reports and retries
                self._on_health(False)

    def report(self, report: cpb.WorkerReport) -> None:
        """Deliver a worker's report (or a verdict), retrying while the coordinator is away."""
        report.party = self.config.name
        for attempt in range(REPORT_TRIES):
            try:
                self._stub.Report(report, timeout=10)
                return
            except grpc.RpcError as exc:
                if exc.code() in FINAL:
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

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()
