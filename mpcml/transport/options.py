"""The handful of gRPC settings the data plane uses, in one place.

Keepalive is what turns a dead or frozen peer into an error within seconds instead of a hang:
each side pings every `KEEPALIVE_TIME_MS` and drops the connection when a ping is not answered
within `KEEPALIVE_TIMEOUT_MS`.
"""

from __future__ import annotations

CHUNK_BYTES = 4 * 1024 * 1024
"""Largest tensor payload in one frame (docs/architecture.md: frames of 1-4 MiB)."""

KEEPALIVE_TIME_MS = 1000
KEEPALIVE_TIMEOUT_MS = 3000
CONNECT_TIMEOUT_S = 30.0
"""Default time a session waits for every peer to come up."""

IDENTITY_LINGER_S = 2.0
"""After refusing a peer's identity, keep serving this long so the peer can see our certificate
and report the mismatch itself, instead of a bare "connection refused"."""

CLOSE_TIMEOUT_S = 10.0
"""Time a closing session waits for its peers to finish delivering and close theirs."""


def max_message_bytes(chunk_bytes: int) -> int:
    """Largest message accepted: one full chunk plus room for its header."""
    return chunk_bytes + 64 * 1024


def _common(chunk_bytes: int) -> list[tuple[str, int | str]]:
    # Both ends ping and drop an unanswered connection: either side notices a frozen peer.
    return [
        ("grpc.max_send_message_length", max_message_bytes(chunk_bytes)),
        ("grpc.max_receive_message_length", max_message_bytes(chunk_bytes)),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # gRPC 1.85 times out an unanswered ping only with this set too.
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def channel_options(chunk_bytes: int, target_name: str | None) -> list[tuple[str, int | str]]:
    """Options for a channel to a peer; `target_name` is the TLS name the peer must present."""
    options = [
        *_common(chunk_bytes),
        # Each session gets its own connection, never one shared with an earlier session.
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    if target_name is not None:
        options.append(("grpc.ssl_target_name_override", target_name))
    return options


def server_options(chunk_bytes: int) -> list[tuple[str, int | str]]:
    """Options for a party's data-plane server."""
    return [
        *_common(chunk_bytes),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.so_reuseport", 0),
    ]
