"""The serving toolkit of every mpcml daemon: one way to do each thing a gRPC server does.

Who is calling (`caller`), how a call is refused (raise a StatusError: the request guard turns
it into its status), and the server itself (`start_server`: request guard, keepalive, health,
reflection, TLS binding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mpcml.errors import StatusError
from mpcml.transport.interceptors import RequestGuard
from mpcml.transport.tls import (
    Identity,
    TLSFiles,
    caller_identity,
    channel_credentials,
    server_credentials,
)

Service = tuple[str, Callable[[Any, grpc.Server], None], Any]
"""A service a daemon serves: its full name, the generated `add_*_to_server`, the servicer."""


def check_caller(
    identity: Identity | None,
    roles: Sequence[str],
    what: str,
    *,
    insecure: bool,
    claimed: str = "",
    expected: str = "",
    subject: str = "the caller",
) -> Identity:
    """Who is calling, or a StatusError saying why the call is refused.

    The certificate must have one of `roles` (`what` says what they may do), carry the name
    `expected` when one is (`subject` is who must present it), and the name the request
    `claimed`, if any. Without TLS (`insecure`) the caller is who it claims, in `roles[0]`.
    """
    if identity is None:
        if not insecure:
            raise StatusError("UNAUTHENTICATED", "a client certificate is required")
        return Identity(claimed or expected or "anonymous", roles[0])
    if expected and identity.name != expected:
        raise StatusError(
            "PERMISSION_DENIED",
            f"{subject} must present a certificate for {expected!r}, the caller presented "
            f"{identity.name!r}",
        )
    if identity.role not in roles:
        raise StatusError(
            "PERMISSION_DENIED",
            f"certificate {identity.name!r} has role {identity.role or 'none'!r}; only a "
            f"{roles[0]!r} certificate may {what}",
        )
    if claimed and claimed != identity.name:
        raise StatusError(
            "PERMISSION_DENIED",
            f"the caller's certificate names {identity.name!r}, the request claims {claimed!r}",
        )
    return identity


def caller(
    context: grpc.ServicerContext,
    roles: Sequence[str],
    what: str,
    *,
    insecure: bool,
    claimed: str = "",
    expected: str = "",
) -> Identity:
    """`check_caller` of the call's client certificate."""
    return check_caller(
        caller_identity(context), roles, what, insecure=insecure, claimed=claimed, expected=expected
    )


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


def start_server(
    name: str,
    address: str,
    tls: TLSFiles | None,
    guard: RequestGuard,
    services: Sequence[Service],
    *,
    max_workers: int,
    max_send_bytes: int | None = None,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A daemon's server on `address`, started, with keepalive, health and reflection.

    Every call to `services` passes `guard`. Returns the server, the port it took, and its
    health servicer.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"mpcml-{name}"),
        interceptors=[guard],
        options=[
            ("grpc.max_receive_message_length", guard.hard_limit),
            ("grpc.max_send_message_length", max_send_bytes or guard.hard_limit),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.so_reuseport", 0),
        ],
    )
    for _, add, servicer in services:
        add(servicer, server)
    health_servicer = add_health_and_reflection(server, [name for name, _, _ in services])
    port = bind(server, address, tls)
    server.start()
    return server, port, health_servicer
