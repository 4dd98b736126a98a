"""The sending side of the data plane: one long-lived stream from this party to one peer.

Sends are buffered: a message is encoded into frames at once and queued, and a gRPC thread
writes the queue to the stream. HTTP/2 flow control and the SPMD order of CrypTen's calls make
this safe; the receiver's `Inbox` hands messages out in order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.proto.v1 import dataplane_pb2_grpc
from mpcml.transport.errors import (
    PeerConnectError,
    PeerFailedError,
    PeerIdentityError,
    TransportError,
)
from mpcml.transport.tls import TLSFiles, diagnose_peer

log = logging.getLogger(__name__)

STREAM_METHOD = "/mpcml.v1.DataPlane/Stream"


@dataclass(frozen=True)
class PeerInfo:
    """A party of the session as this party knows it."""

    rank: int
    name: str
    address: str

    def label(self) -> str:
        """How errors name the party: rank, certificate name and address."""
        return f"rank {self.rank} ({self.name!r} at {self.address})"


# Words in gRPC's connection errors that mean the TLS handshake, not the network, failed.
_TLS_HINTS = (
    "ssl",
    "handshake",
    "certificate",
    "peer name",
    "tls",
    "alert",
    "verification",
    "hostname",
)


def hello(
    channel: grpc.Channel,
    peer: PeerInfo,
    request: pb.HelloRequest,
    deadline: float,
    tls: TLSFiles | None,
    check_failed: Callable[[], None],
) -> None:
    """Wait until `peer` answers Hello as the party we expect, or raise an error saying why.

    `check_failed` raises if the session has already failed meanwhile (say, a peer that did
    connect to us sent garbage), so that error is reported instead of a later timeout.
    """
    stub = dataplane_pb2_grpc.DataPlaneStub(channel)
    backoff, last = 0.05, "no answer"
    while True:
        check_failed()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerConnectError(
                f"{peer.label()} did not come up within the connect timeout; last error: {last}"
            )
        try:
            reply = stub.Hello(request, timeout=min(remaining, 5.0))
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise PeerIdentityError(f"{peer.label()} refused this party: {details}") from None
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise PeerConnectError(f"{peer.label()} rejected Hello: {details}") from None
            last = f"{code.name}: {details}"
            if tls is not None and any(h in details.lower() for h in _TLS_HINTS):
                reason = diagnose_peer(peer.address, tls, peer.name)
                if reason is None and "alert" in details.lower():
                    reason = (
                        "it rejected this party's certificate during the TLS handshake "
                        f"({details.strip()}); is it issued by the CA the peer trusts?"
                    )
                if reason is not None:
                    raise PeerIdentityError(f"{peer.label()}: {reason}") from None
            time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, 1.0)
            continue
        if reply.rank != peer.rank or reply.session_id != request.session_id:
            last = (
                f"it answered as rank {reply.rank} of session {reply.session_id!r}, "
                f"expected rank {peer.rank} of {request.session_id!r}"
            )
            time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            continue
        return


class Link:
    """The stream from this party to one peer."""

    def __init__(
        self, peer: PeerInfo, channel: grpc.Channel, on_failure: Callable[[TransportError], None]
    ) -> None:
        self.peer = peer
        self._channel = channel
        self._on_failure = on_failure
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._seq = 0
        self._ended = False
        self._future: grpc.Future[pb.StreamSummary] | None = None

    def open(self, session_id: str, my_rank: int) -> None:
        """Start the stream; frames flow as soon as they are queued."""
        call = self._channel.stream_unary(
            STREAM_METHOD,
            request_serializer=None,
            response_deserializer=pb.StreamSummary.FromString,
        )
        metadata = (("mpcml-session", session_id), ("mpcml-rank", str(my_rank)))
        self._future = call.future(self._frames(), metadata=metadata)
        self._future.add_done_callback(self._done)

    def _frames(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def _done(self, future: grpc.Future[pb.StreamSummary]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            return
        with self._lock:
            ended = self._ended
        if isinstance(exc, grpc.RpcError):
            what = f"{exc.code().name}: {exc.details()}"
        else:
            what = repr(exc)
        if not ended or not isinstance(exc, grpc.RpcError):
            self._on_failure(PeerFailedError(f"lost the stream to {self.peer.label()}: {what}"))
        else:
            log.warning("stream to %s ended with %s", self.peer.label(), what)

    def send(self, encode: Callable[[int], list[bytes]]) -> None:
        """Queue one message; `encode(seq)` gives its frames."""
        with self._lock:
            if self._ended:
                raise PeerFailedError(f"the stream to {self.peer.label()} is already closed")
            frames = encode(self._seq)
            self._seq += 1
            for frame in frames:
                self._queue.put(frame)

    def end(self, frame: bytes) -> None:
        """Queue a final CLOSE or ABORT frame and finish the stream after it."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self._queue.put(frame)
            self._queue.put(None)

    def seq(self) -> int:
        """The sequence number the next message would get."""
        with self._lock:
            return self._seq

    def wait(self, timeout: float) -> bool:
        """Wait for the receiver to acknowledge the end of the stream; False on timeout."""
        if self._future is None:
            return True
        try:
            self._future.result(timeout=max(timeout, 0.0))
        except grpc.FutureTimeoutError:
            return False
        except (grpc.RpcError, grpc.FutureCancelledError):
            return True
        return True

    def cancel(self) -> None:
        """Drop the stream at once."""
        if self._future is not None:
            self._future.cancel()
