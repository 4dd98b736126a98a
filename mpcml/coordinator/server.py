"""`mpcml coordinator`: its config, and the server that runs the scheduler."""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from mpcml import config as cfg
from mpcml import metrics
from mpcml.coordinator.metrics import RoundMetrics, SchedulerCollector
from mpcml.coordinator.scheduler import Scheduler
from mpcml.coordinator.service import CoordinatorService, PartyControlService
from mpcml.coordinator.store import SqliteJobStore
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.transport.interceptors import RequestGuard
from mpcml.transport.serving import add_health_and_reflection, bind
from mpcml.transport.tls import COORDINATOR_ROLE, TLSFiles, check_certificate

log = logging.getLogger(__name__)

TICK_S = 0.5
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Default `max_message_bytes`: the largest request, a job spec with its graph (weights never
travel here)."""
MAX_JOB_ROWS = 10_000_000
"""Default `max_job_rows`: rows a job passes through its model, over all its epochs."""


@dataclass(frozen=True)
class CoordinatorConfig:
    """What `coordinator.toml` holds."""

    listen: str
    database: Path
    tls: TLSFiles | None
    roster: tuple[str, ...]
    heartbeat_timeout: float
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_job_rows: int = MAX_JOB_ROWS
    metrics_address: str = ""
    """HOST:PORT of the Prometheus endpoint (mpcml/coordinator/metrics.py); empty: none."""
    admins: tuple[str, ...] = ()
    """Client certificate names that may read, cancel and resume every job, not only their own."""

    @classmethod
    def load(cls, path: str | Path) -> CoordinatorConfig:
        """Read the file (and `MPCML_*` overrides)."""
        data, base = cfg.load(path)
        roster, admins = (_names(data, key) for key in ("parties", "admins"))
        return cls(
            listen=str(cfg.need(data, "listen", base)),
            database=cfg.resolve(base, str(data.get("database", "coordinator.db"))),
            tls=cfg.tls_files(data, base),
            roster=roster,
            heartbeat_timeout=float(data.get("heartbeat_timeout_s", 15)),
            max_message_bytes=cfg.positive_int(data, "max_message_bytes", MAX_MESSAGE_BYTES, base),
            max_job_rows=cfg.positive_int(data, "max_job_rows", MAX_JOB_ROWS, base),
            metrics_address=metrics.address(data, base),
            admins=admins,
        )


def _names(data: dict[str, Any], key: str) -> tuple[str, ...]:
    """A list of names, or one string of comma-separated names (an `MPCML_*` override)."""
    value = data.get(key, [])
    if isinstance(value, str):
        value = [n.strip() for n in value.split(",") if n.strip()]
    return tuple(str(n) for n in value)


def serve(config: CoordinatorConfig, stop: threading.Event) -> None:
    """Serve until `stop` is set."""
    if config.tls is None:
        log.warning(
            "the coordinator runs over PLAINTEXT gRPC with no authentication (insecure): "
            "use it only for debugging"
        )
    if config.tls is not None:
        check_certificate(config.tls, COORDINATOR_ROLE)
    config.database.parent.mkdir(parents=True, exist_ok=True)
    store = SqliteJobStore(config.database)
    registry = metrics.registry()
    scheduler = Scheduler(
        store,
        list(config.roster),
        config.heartbeat_timeout,
        max_job_rows=config.max_job_rows,
        on_event=RoundMetrics(registry).observe,
        admins=config.admins,
    )
    registry.register(SchedulerCollector(scheduler))
    guard = RequestGuard(config.max_message_bytes, "max_message_bytes")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="mpcml-coordinator"),
        interceptors=[guard],
        options=[
            ("grpc.max_receive_message_length", guard.hard_limit),
            ("grpc.max_send_message_length", guard.hard_limit),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.so_reuseport", 0),
        ],
    )
    insecure = config.tls is None
    cgrpc.add_CoordinatorServicer_to_server(CoordinatorService(scheduler, insecure), server)
    cgrpc.add_PartyControlServicer_to_server(PartyControlService(scheduler, insecure), server)
    services = [
        cpb.DESCRIPTOR.services_by_name[n].full_name for n in ("Coordinator", "PartyControl")
    ]
    add_health_and_reflection(server, services)
    port = bind(server, config.listen, config.tls)
    server.start()
    log.info(
        "coordinator listening on %s (port %d), jobs in %s", config.listen, port, config.database
    )
    endpoint = None
    try:
        endpoint = metrics.serve(config.metrics_address, registry)
        while not stop.wait(TICK_S):
            scheduler.tick()
    finally:
        if endpoint is not None:
            endpoint.stop()
        server.stop(grace=2).wait()
        store.close()
        log.info("coordinator stopped")
