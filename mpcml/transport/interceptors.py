"""What every daemon does to each call before and after its servicer: the request guard.

One place refuses requests over the daemon's size limit, naming the setting to raise, turns a
servicer's `StatusError` into its gRPC status, logs every refused call once, with the caller
and the status, so that servicers only raise or abort, and stamps each unary reply with the
daemon's clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from mpcml.errors import StatusError
from mpcml.transport.tls import caller_identity

log = logging.getLogger(__name__)

TIME_METADATA = "mpcml-time"
"""Initial metadata of every unary reply: the daemon's clock (seconds since the epoch)."""

if TYPE_CHECKING:
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:  # grpc's class is generic only in its stubs
    _Interceptor = grpc.ServerInterceptor


class RequestGuard(_Interceptor):
    """Refuses requests over `limit` bytes (RESOURCE_EXHAUSTED naming `setting`); logs refusals.

    gRPC's own cap (`hard_limit`, given to the server) cuts off far larger requests before they
    are read; between the two the daemon answers itself, so the message names the setting.
    A servicer's unexpected exception becomes INTERNAL with a message, logged with its traceback.
    """

    def __init__(self, limit: int, setting: str) -> None:
        self.limit, self.setting = limit, setting

    @property
    def hard_limit(self) -> int:
        """What to give gRPC as `grpc.max_receive_message_length`."""
        return 2 * self.limit

    def _refused(self, method: str, context: grpc.ServicerContext, exc: Exception) -> None:
        """Log the refusal once; a StatusError becomes its status, anything else INTERNAL."""
        code: grpc.StatusCode | None = context.code()  # type: ignore[attr-defined]
        identity = caller_identity(context)
        caller = identity.name if identity else context.peer()
        if code is None and isinstance(exc, StatusError):
            log.info("refused %s from %s: %s: %s", method, caller, exc.code, exc)
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        if code is None:  # not an abort: a bug in the daemon, not bad input
            log.error("%s from %s failed", method, caller, exc_info=exc)
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"internal error in {method} ({type(exc).__name__}); details in the daemon's log",
            )
        details = context.details()  # type: ignore[attr-defined]
        text = details.decode(errors="replace") if isinstance(details, bytes) else details
        log.info("refused %s from %s: %s: %s", method, caller, code.name, text)

    def _check_size(self, request: Any, context: grpc.ServicerContext) -> None:
        size = request.ByteSize()
        if size > self.limit:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the request is {size} bytes, over this daemon's limit "
                f"{self.setting} = {self.limit}",
            )

    def _unary(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                self._check_size(request, context)
                # The daemon's clock, for `mpcml doctor`'s skew check.
                context.send_initial_metadata(((TIME_METADATA, f"{time.time():.6f}"),))
                return behaviour(request, context)
            except Exception as exc:
                self._refused(method, context, exc)
                raise

        return guarded

    def _unary_stream(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        def guarded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                self._check_size(request, context)
                yield from behaviour(request, context)
            except Exception as exc:
                self._refused(method, context, exc)
                raise

        return guarded

    def _stream_unary(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        """Streamed requests come as frames; their size is the transport's to check."""

        def guarded(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            try:
                return behaviour(requests, context)
            except Exception as exc:
                self._refused(method, context, exc)
                raise

        return guarded

    def _stream_stream(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        def guarded(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from behaviour(requests, context)
            except Exception as exc:
                self._refused(method, context, exc)
                raise

        return guarded

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The method's handler, guarded."""
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        kinds = (
            (handler.unary_unary, self._unary, grpc.unary_unary_rpc_method_handler),
            (handler.unary_stream, self._unary_stream, grpc.unary_stream_rpc_method_handler),
            (handler.stream_unary, self._stream_unary, grpc.stream_unary_rpc_method_handler),
            (handler.stream_stream, self._stream_stream, grpc.stream_stream_rpc_method_handler),
        )
        for behaviour, wrap, make in kinds:
            if behaviour is not None:
                return make(
                    wrap(behaviour, method),
                    handler.request_deserializer,
                    handler.response_serializer,
                )
        return handler
