"""`mpcml coordinator`: its config, and the server that runs the scheduler."""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpcml import config as cfg
from mpcml import metrics
from mpcml.console import server as console
from mpcml.console.server import ConsoleSettings
from mpcml.console.server import settings as console_settings
from mpcml.coordinator.console_source import CoordinatorSource
from mpcml.coordinator.metrics import RoundMetrics, SchedulerCollector
from mpcml.coordinator.scheduler import Scheduler
from mpcml.coordinator.service import CoordinatorService, PartyControlService
from mpcml.coordinator.sql_store import POSTGRES_SCHEMES, postgres_name
from mpcml.coordinator.store import StoreUnavailable, open_store
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.transport.interceptors import RequestGuard
from mpcml.transport.serving import start_server
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
    store: str
    """A `postgresql://` URL, or the path of the SQLite file (relative to the config's folder)."""
    tls: TLSFiles | None
    roster: tuple[str, ...]
    heartbeat_timeout: float
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_job_rows: int = MAX_JOB_ROWS
    metrics_address: str = ""
    """HOST:PORT of the Prometheus endpoint (mpcml/coordinator/metrics.py); empty: none."""
    admins: tuple[str, ...] = ()
    """Client certificate names that may read, cancel and resume every job, not only their own."""
    name: str = ""
    """Who holds the leases of the jobs this coordinator runs (store.py); the host's name by
    default. Two coordinators on one store need two names; a restarted one keeps its name, so
    it takes its running jobs back at once."""
    lease_s: float = 30.0
    """How long a lease lasts unrenewed: a standby coordinator takes over a job this long after
    the coordinator running it stopped renewing."""
    console: ConsoleSettings | None = None
    """The consortium's web console (jobs and rounds), when `console_address` is set."""

    @property
    def store_name(self) -> str:
        """The store for logs: a URL without its password."""
        return postgres_name(self.store) if self.store.startswith(POSTGRES_SCHEMES) else self.store

    @classmethod
    def load(cls, path: str | Path) -> CoordinatorConfig:
        """Read the file (and `MPCML_*` overrides)."""
        data, base = cfg.load(path)
        roster, admins = (_names(data, key) for key in ("parties", "admins"))
        tls = cfg.tls_files(data, base)
        return cls(
            listen=str(cfg.need(data, "listen", base)),
            store=_store(data, base),
            tls=tls,
            roster=roster,
            heartbeat_timeout=float(data.get("heartbeat_timeout_s", 15)),
            max_message_bytes=cfg.positive_int(data, "max_message_bytes", MAX_MESSAGE_BYTES, base),
            max_job_rows=cfg.positive_int(data, "max_job_rows", MAX_JOB_ROWS, base),
            metrics_address=metrics.address(data, base),
            admins=admins,
            name=str(data.get("name") or socket.gethostname()),
            lease_s=_lease_s(data, base),
            console=console_settings(data, base, tls),
        )


def _store(data: dict[str, Any], base: Path) -> str:
    if "database" in data:
        raise cfg.ConfigError(
            f"the config in {base} sets `database`, which is now `store` (a SQLite file's path "
            "or a postgresql:// URL): rename the key"
        )
    value = str(data.get("store", "coordinator.db"))
    return value if value.startswith(POSTGRES_SCHEMES) else str(cfg.resolve(base, value))


def _lease_s(data: dict[str, Any], base: Path) -> float:
    try:
        value = float(data.get("lease_s", 30.0))
    except (TypeError, ValueError):
        value = 0.0
    if value < 1:
        raise cfg.ConfigError(f"the config in {base}: `lease_s` must be a number of seconds >= 1")
    return value


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
    if not config.store.startswith(POSTGRES_SCHEMES):
        Path(config.store).parent.mkdir(parents=True, exist_ok=True)
    store = open_store(config.store)
    registry = metrics.registry()
    scheduler = Scheduler(
        store,
        list(config.roster),
        config.heartbeat_timeout,
        max_job_rows=config.max_job_rows,
        on_event=RoundMetrics(registry).observe,
        admins=config.admins,
        holder=config.name,
        lease_s=config.lease_s,
    )
    registry.register(SchedulerCollector(scheduler))
    guard = RequestGuard(config.max_message_bytes, "max_message_bytes")
    insecure = config.tls is None
    names = cpb.DESCRIPTOR.services_by_name
    services = [
        (
            names["Coordinator"].full_name,
            cgrpc.add_CoordinatorServicer_to_server,
            CoordinatorService(scheduler, insecure),
        ),
        (
            names["PartyControl"].full_name,
            cgrpc.add_PartyControlServicer_to_server,
            PartyControlService(scheduler, insecure),
        ),
    ]
    server, port, _ = start_server(
        "coordinator", config.listen, config.tls, guard, services, max_workers=64
    )
    log.info(
        "coordinator %s listening on %s (port %d), jobs in %s",
        scheduler.holder,
        config.listen,
        port,
        config.store_name,
    )
    endpoint = None
    web = None
    try:
        endpoint = metrics.serve(config.metrics_address, registry)
        web = console.start(config.console, config.tls, CoordinatorSource(scheduler))
        while not stop.wait(TICK_S):
            try:
                scheduler.tick()
            except StoreUnavailable as exc:  # the next tick opens a new connection
                log.error("%s; the coordinator goes on and tries again", exc)
    finally:
        if endpoint is not None:
            endpoint.stop()
        if web is not None:
            web.stop()
        server.stop(grace=2).wait()
        store.close()
        log.info("coordinator stopped")
