"""The receiving side of the data plane: the `mpcml.v1.DataPlane` servicer of one session.

The servicer is a thin adapter: it checks who is calling (session, rank, certificate name) and
hands frames to the session's `Transport`, which holds the state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import grpc

from mpcml.errors import StatusError
from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.transport import options
from mpcml.transport.errors import PeerFailedError, ProtocolError
from mpcml.transport.framing import Assembler, WireFrame, parse_frame
from mpcml.transport.serving import check_caller
from mpcml.transport.tls import PARTY_ROLE, caller_identity

if TYPE_CHECKING:
    from mpcml.transport.transport import Transport

log = logging.getLogger(__name__)


class DataPlaneServicer:
    """Serves one party's end of every stream of one session."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def _refuse(
        self,
        context: grpc.ServicerContext,
        code: grpc.StatusCode,
        message: str,
        level: int = logging.WARNING,
    ) -> NoReturn:
        """End the call with `code` and `message`, logged once."""
        log.log(level, "%s refused a call (%s): %s", self._t.me.label(), code.name, message)
        context.abort(code, message)

    def _check_caller(self, rank: int, session_id: str, context: grpc.ServicerContext) -> None:
        t = self._t
        # A peer already on its next session retries these: logged, but not as warnings.
        if not t.accepting:
            self._refuse(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"{t.me.label()} is ending session {t.session_id!r}; retry for the next one",
                logging.INFO,
            )
        if session_id != t.session_id:
            self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{t.me.label()} serves session {t.session_id!r}, not {session_id!r}",
                logging.INFO,
            )
        if not 0 <= rank < t.world_size or rank == t.rank:
            self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"rank {rank} is not a peer of {t.me.label()} (world size {t.world_size})",
            )
        try:
            check_caller(
                caller_identity(context),
                (PARTY_ROLE,),
                "join a data plane",
                insecure=t.insecure,
                expected=t.peers[rank].name,
                subject=f"rank {rank}",
            )
        except StatusError as exc:
            t.note_rejection(rank, str(exc))  # logs it
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))

    def Hello(self, request: pb.HelloRequest, context: grpc.ServicerContext) -> pb.HelloReply:
        """Answer a peer that is about to open its stream."""
        self._check_caller(request.rank, request.session_id, context)
        if request.world_size != self._t.world_size:
            self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self._t.me.label()} expects {self._t.world_size} parties, the "
                f"caller {request.world_size}",
            )
        return pb.HelloReply(
            session_id=self._t.session_id, rank=self._t.rank, world_size=self._t.world_size
        )

    def Stream(
        self, request_iterator: Iterator[WireFrame], context: grpc.ServicerContext
    ) -> pb.StreamSummary:
        """Receive every message one peer sends this party during the session."""
        metadata = dict(context.invocation_metadata())
        try:
            rank = int(metadata.get("mpcml-rank", ""))
        except ValueError:
            self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "missing or malformed mpcml-rank metadata",
            )
        self._check_caller(rank, str(metadata.get("mpcml-session", "")), context)
        t = self._t
        peer = t.peers[rank]
        inbox = t.inbound_opened(rank)
        if inbox is None:
            self._refuse(
                context,
                grpc.StatusCode.ALREADY_EXISTS,
                f"{peer.label()} already has a stream open to {t.me.label()}",
            )
        assembler = Assembler()
        try:
            for wire in request_iterator:
                if wire.error:
                    raise ProtocolError(wire.error)
                frame = wire.frame
                if frame.kind == pb.FRAME_KIND_CLOSE:
                    assembler.finish()
                    inbox.close()
                    t.inbound_closed(rank)
                    break
                if frame.kind == pb.FRAME_KIND_ABORT:
                    t.fail(
                        PeerFailedError(
                            f"{peer.label()} aborted the session: "
                            f"{frame.reason or 'no reason given'}"
                        )
                    )
                    break
                message = assembler.feed(frame, wire.data)
                if message is not None:
                    inbox.put(message)
            else:
                t.fail(
                    PeerFailedError(
                        f"lost the connection from {peer.label()}: its stream ended without "
                        f"closing the session{_oversized_hint(t.chunk_bytes)}"
                    )
                )
        except ProtocolError as exc:
            t.fail(ProtocolError(f"{peer.label()} sent a malformed stream: {exc}"))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except grpc.RpcError:
            t.fail(
                PeerFailedError(
                    f"lost the connection from {peer.label()}: the peer died or became "
                    f"unreachable{_oversized_hint(t.chunk_bytes)}"
                )
            )
        return pb.StreamSummary(messages=assembler.next_seq, bytes=assembler.bytes_received)


def _oversized_hint(chunk_bytes: int) -> str:
    # gRPC ends the call of a frame over the size limit (say, from a peer configured with
    # larger chunks) as if the peer had died or closed its stream, and does not say so.
    return f", or it sent a frame larger than {options.max_message_bytes(chunk_bytes)} bytes"


def add_to_server(servicer: DataPlaneServicer, server: grpc.Server) -> None:
    """Register the servicer; Stream frames are parsed by `parse_frame`, without copying data."""
    handler = grpc.method_handlers_generic_handler(
        pb.DESCRIPTOR.services_by_name["DataPlane"].full_name,
        {
            "Hello": grpc.unary_unary_rpc_method_handler(
                servicer.Hello,
                request_deserializer=pb.HelloRequest.FromString,
                response_serializer=pb.HelloReply.SerializeToString,
            ),
            "Stream": grpc.stream_unary_rpc_method_handler(
                servicer.Stream,
                request_deserializer=parse_frame,
                response_serializer=pb.StreamSummary.SerializeToString,
            ),
        },
    )
    server.add_generic_rpc_handlers((handler,))
