"""What every mpcml gRPC server carries: health, reflection, and one way to bind with TLS."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mpcml.transport.tls import TLSFiles, channel_credentials, server_credentials


def add_health_and_reflection(
    server: grpc.Server, services: Sequence[str]
) -> health.HealthServicer:
    """Serve `grpc.health.v1` (SERVING for "" and each service) and server reflection.

    Returns the health servicer, for a daemon whose health changes (`set(name, status)`).
    """
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return servicer


def bind(server: grpc.Server, address: str, tls: TLSFiles | None) -> int:
    """Listen on `address` (mutual TLS unless `tls` is None); raises OSError naming it."""
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, server_credentials(tls))
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {address}: the address is in use or not local")
    return port


def channel(
    address: str,
    tls: TLSFiles | None,
    server_name: str,
    options: Sequence[tuple[str, int | str]] = (),
) -> grpc.Channel:
    """A channel to a daemon whose certificate must carry `server_name`."""
    opts = [
        *options,
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]
    if tls is None:
        return grpc.insecure_channel(address, options=opts)
    opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(address, channel_credentials(tls), options=opts)
