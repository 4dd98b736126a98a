"""What every mpcml gRPC server carries: health, reflection, and one way to bind with TLS."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mpcml.transport.tls import TLSFiles, channel_credentials, server_credentials

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:  # grpc's class is not generic at run time, only in its stubs
    _Interceptor = grpc.ServerInterceptor


class MessageSizeLimit(_Interceptor):
    """Refuses a request larger than `limit` bytes with RESOURCE_EXHAUSTED naming `setting`.

    gRPC's own cap (`hard_limit`, set on the server) refuses far larger ones before they are
    read; between the two the daemon answers itself, so the message names the setting to raise.
    """

    def __init__(self, limit: int, setting: str) -> None:
        self.limit, self.setting = limit, setting

    @property
    def hard_limit(self) -> int:
        """What to give gRPC as `grpc.max_receive_message_length`."""
        return 2 * self.limit

    def _checked(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        def check(request: Any, context: grpc.ServicerContext) -> Any:
            size = request.ByteSize()
            if size > self.limit:
                log.warning("refused a %d-byte %s request (%s)", size, method, self.setting)
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the request is {size} bytes, over this daemon's limit "
                    f"{self.setting} = {self.limit}",
                )
            return behaviour(request, context)

        return check

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap unary-request handlers; streaming requests are framed and checked elsewhere."""
        handler = continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._checked(handler.unary_unary, details.method),
                handler.request_deserializer,
                handler.response_serializer,
            )
        assert handler.unary_stream is not None
        return grpc.unary_stream_rpc_method_handler(
            self._checked(handler.unary_stream, details.method),
            handler.request_deserializer,
            handler.response_serializer,
        )


def add_health_and_reflection(server: grpc.Server, services: Sequence[str]) -> None:
    """Serve `grpc.health.v1` (SERVING for "" and each service) and server reflection."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )


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
