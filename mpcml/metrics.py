"""The Prometheus endpoint a daemon serves when its config sets `metrics_address`.

Each daemon keeps its metrics in a registry of its own (the role's `metrics` module defines
them) and serves it as plain HTTP at `http://HOST:PORT/metrics`. Metrics are public metadata
(counts, durations, party names, job states), never a key, a share or an input; still, bind the
address to an interface only the monitoring can reach.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

from mpcml.config import ConfigError
from mpcml.transport.address import Address, AddressError, parse

log = logging.getLogger(__name__)

KEY = "metrics_address"
"""The config key (and so `MPCML_METRICS_ADDRESS`); empty or absent: no endpoint."""


def registry() -> CollectorRegistry:
    """A daemon's own registry, with the process's CPU, memory and file descriptors."""
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    return reg


def address(data: dict[str, Any], where: Path) -> str:
    """The config's `metrics_address` (HOST:PORT), "" when unset; a ConfigError when malformed."""
    value = str(data.get(KEY, "") or "").strip()
    if value:
        try:
            parse(value)
        except AddressError:
            raise ConfigError(
                f"`{KEY}` in the config in {where} must be HOST:PORT, got {value!r}"
            ) from None
    return value


@dataclass
class MetricsServer:
    """A running endpoint; `stop()` releases its port."""

    url: str
    server: WSGIServer
    thread: threading.Thread

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(address: str, reg: CollectorRegistry) -> MetricsServer | None:
    """Serve `reg` on `address` (HOST:PORT; port 0 picks one) in a thread; None if no address.

    An address in use raises OSError, as a daemon's gRPC address does.
    """
    if not address:
        return None
    where = parse(address)
    server, thread = start_http_server(where.port, addr=where.host, registry=reg)
    url = f"http://{Address(where.host, server.server_port)}/metrics"
    log.info("metrics on %s", url)
    return MetricsServer(url, server, thread)
