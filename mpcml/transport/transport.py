"""One party's end of an MPC session's data plane.

It holds the party's server, its streams to every peer, and the inboxes of what the peers sent.

The session is fail-stop: the first failure anywhere (a peer dies, aborts, sends garbage) fails
every pending and future call on this party with an error naming that peer, and is passed on to
the other peers as an ABORT, so that no party is left waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc
import torch

from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.transport import framing, options
from mpcml.transport import server as server_module
from mpcml.transport.errors import (
    PeerConnectError,
    PeerIdentityError,
    ProtocolError,
    TransportError,
)
from mpcml.transport.inbox import Inbox
from mpcml.transport.link import Link, PeerInfo, hello
from mpcml.transport.server import DataPlaneServicer
from mpcml.transport.serving import add_health_and_reflection, bind
from mpcml.transport.shaping import EmulatedLink, Shaping
from mpcml.transport.tls import TLSFiles, channel_credentials

log = logging.getLogger(__name__)

_OP_NAMES = {
    v.number: v.name.removeprefix("OP_").lower()
    for v in pb.DESCRIPTOR.enum_types_by_name["Op"].values
}


class Transport:
    """The data plane of one party in one session."""

    def __init__(
        self,
        *,
        rank: int,
        peers: Sequence[PeerInfo],
        session_id: str,
        tls: TLSFiles | None,
        listen: str | None = None,
        chunk_bytes: int = options.CHUNK_BYTES,
        network: Shaping | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = len(peers)
        self.peers = list(peers)
        self.me = self.peers[rank]
        self.session_id = session_id
        self.tls = tls
        self.insecure = tls is None
        self.chunk_bytes = chunk_bytes
        self._listen = listen or self.me.address
        self._lock = threading.Lock()
        self._failure: TransportError | None = None
        self.network = network or Shaping()
        self._inboxes = {
            p.rank: Inbox(p.label(), EmulatedLink(self.network) if self.network else None)
            for p in self.peers
            if p.rank != rank
        }
        self._inbound_open = {r: threading.Event() for r in self._inboxes}
        self._inbound_done = {r: threading.Event() for r in self._inboxes}
        self._rejections: dict[int, str] = {}
        self._links: dict[int, Link] = {}
        self._channels: list[grpc.Channel] = []
        self._server: grpc.Server | None = None
        self._stopped = False
        self.accepting = True
        """False once the session ends: late callers (a peer's next session on the same
        address) are told to retry instead of joining this one."""

    # -- start ---------------------------------------------------------------------------------

    def start(self, connect_timeout: float) -> None:
        """Serve, reach every peer and wait until every peer has reached us."""
        deadline = time.monotonic() + connect_timeout
        try:
            self._serve()
            self._connect(deadline)
            self._await_inbound(deadline, connect_timeout)
        except PeerIdentityError:
            time.sleep(options.IDENTITY_LINGER_S)
            self.stop()
            raise
        except BaseException:
            self.stop()
            raise

    def _serve(self) -> None:
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.world_size + 8, thread_name_prefix="mpcml-dataplane"
            ),
            options=options.server_options(self.chunk_bytes),
        )
        server_module.add_to_server(DataPlaneServicer(self), server)
        add_health_and_reflection(server, [pb.DESCRIPTOR.services_by_name["DataPlane"].full_name])
        try:
            bind(server, self._listen, self.tls)
        except OSError as exc:
            raise PeerConnectError(f"{self.me.label()} {exc}") from None
        server.start()
        self._server = server

    def _connect(self, deadline: float) -> None:
        request = pb.HelloRequest(
            session_id=self.session_id, rank=self.rank, world_size=self.world_size
        )
        credentials = channel_credentials(self.tls) if self.tls is not None else None
        for peer in self.peers:
            if peer.rank == self.rank:
                continue
            opts = options.channel_options(
                self.chunk_bytes, None if self.tls is None else peer.name
            )
            if credentials is None:
                channel = grpc.insecure_channel(peer.address, options=opts)
            else:
                channel = grpc.secure_channel(peer.address, credentials, options=opts)
            self._channels.append(channel)
            hello(channel, peer, request, deadline, self.tls, self._raise_if_failed)
            link = Link(peer, channel, self.fail)
            self._links[peer.rank] = link
            link.open(self.session_id, self.rank)

    def _await_inbound(self, deadline: float, connect_timeout: float) -> None:
        for rank, opened in self._inbound_open.items():
            if not opened.wait(max(0.0, deadline - time.monotonic())):
                peer = self.peers[rank]
                why = self._rejections.get(rank)
                detail = f"; it was refused: {why}" if why else ""
                raise PeerConnectError(
                    f"{peer.label()} did not open its stream to this party "
                    f"within {connect_timeout:g} s{detail}"
                )
            self._raise_if_failed()

    # -- called by the servicer ----------------------------------------------------------------

    def inbound_opened(self, rank: int) -> Inbox | None:
        """Register the stream from `rank`; None if it already has one."""
        with self._lock:
            if self._inbound_open[rank].is_set():
                return None
            self._inbound_open[rank].set()
            return self._inboxes[rank]

    def inbound_closed(self, rank: int) -> None:
        """The peer `rank` closed its stream cleanly."""
        self._inbound_done[rank].set()

    def note_rejection(self, rank: int, message: str) -> None:
        """Remember why a caller claiming `rank` was refused, for the connect-timeout error."""
        log.warning("%s refused a caller claiming rank %d: %s", self.me.label(), rank, message)
        self._rejections[rank] = message

    # -- failure -------------------------------------------------------------------------------

    def fail(self, error: TransportError) -> None:
        """Fail the session on this party and tell every peer (first failure wins)."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = error
            self.accepting = False
        log.error("session %s failed on %s: %s", self.session_id, self.me.label(), error)
        for inbox in self._inboxes.values():
            inbox.fail(error)
        for event in self._inbound_done.values():
            event.set()
        for link in list(self._links.values()):
            link.end(framing.control_frame(link.seq(), pb.FRAME_KIND_ABORT, str(error)))

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise type(self._failure)(*self._failure.args)

    # -- messages ------------------------------------------------------------------------------

    def _link(self, dst: int) -> Link:
        self._raise_if_failed()
        try:
            return self._links[dst]
        except KeyError:
            raise TransportError(f"rank {dst} is not a peer of {self.me.label()}") from None

    def send_tensor(self, dst: int, op: pb.Op, tensor: torch.Tensor) -> None:
        """Queue a tensor for `dst`."""
        self._link(dst).send(lambda seq: framing.tensor_frames(seq, op, tensor, self.chunk_bytes))

    def send_object(self, dst: int, op: pb.Op, obj: Any) -> None:
        """Queue a schema'd object for `dst`."""
        self._link(dst).send(lambda seq: [framing.object_frame(seq, op, obj)])

    def post_recv(self, src: int) -> int:
        """Reserve the next message from `src`; returns the ticket for `take`."""
        if src not in self._inboxes:
            raise TransportError(f"rank {src} is not a peer of {self.me.label()}")
        return self._inboxes[src].ticket()

    def take(self, src: int, ticket: int, op: pb.Op) -> framing.Message:
        """Wait for the reserved message from `src` and check it belongs to the same call."""
        message = self._inboxes[src].take(ticket)
        if message.op != op:
            error = ProtocolError(
                f"{self.me.label()} expected a {_OP_NAMES.get(op, op)} message from "
                f"{self.peers[src].label()}, received {_OP_NAMES.get(message.op, message.op)}:"
                " the parties' computations diverged"
            )
            self.fail(error)
            raise error
        return message

    def recv(self, src: int, op: pb.Op) -> framing.Message:
        """Receive the next message from `src`."""
        return self.take(src, self.post_recv(src), op)

    # -- end -----------------------------------------------------------------------------------

    def close(self, timeout: float = options.CLOSE_TIMEOUT_S) -> None:
        """End the session cleanly, never blocking much longer than `timeout`.

        Delivers everything queued, waits for the peers to do the same, then stops.
        """
        deadline = time.monotonic() + timeout
        self.accepting = False
        if self._failure is None:
            for link in self._links.values():
                link.end(framing.control_frame(link.seq(), pb.FRAME_KIND_CLOSE))
            for link in self._links.values():
                if not link.wait(deadline - time.monotonic()):
                    log.warning(
                        "%s did not acknowledge the end of its stream within %g s",
                        link.peer.label(),
                        timeout,
                    )
            for rank, done in self._inbound_done.items():
                if not done.wait(max(0.0, deadline - time.monotonic())):
                    log.warning(
                        "%s did not close its stream within %g s", self.peers[rank].label(), timeout
                    )
        self.stop()

    def abort(self, reason: str) -> None:
        """End the session at once because this party failed; peers are told `reason`."""
        self.fail(TransportError(reason))
        deadline = time.monotonic() + 1.0
        for link in self._links.values():
            link.wait(deadline - time.monotonic())
        self.stop()

    def stop(self) -> None:
        """Release the server, the streams and the channels."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for link in self._links.values():
            link.cancel()
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
        for channel in self._channels:
            channel.close()
