"""`mpcml.session`: CrypTen in the calling process, over the gRPC data plane with mutual TLS.

CrypTen picks its communicator by looking up `crypten.communicator.DistributedCommunicator` when
`crypten.init()` runs (docs/architecture.md), so the session installs `GrpcCommunicator` there
for its lifetime and puts CrypTen's own class back afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from mpcml.runtime import compat

compat.apply()

import crypten  # noqa: E402  (after the shims)
import crypten.communicator as crypten_comm  # noqa: E402

from mpcml.runtime import devices, prg  # noqa: E402
from mpcml.runtime.provider import (  # noqa: E402
    NAME as DEALER_PROVIDER,
)
from mpcml.runtime.provider import (  # noqa: E402
    DealerClient,
    DealerEndpoint,
    DealerProvider,
    register,
)
from mpcml.transport import options  # noqa: E402
from mpcml.transport.address import parse  # noqa: E402
from mpcml.transport.communicator import GrpcCommunicator, PeerTraffic  # noqa: E402
from mpcml.transport.errors import TransportError  # noqa: E402
from mpcml.transport.link import PeerInfo  # noqa: E402
from mpcml.transport.shaping import Shaping  # noqa: E402
from mpcml.transport.tls import TLSFiles, check_certificate  # noqa: E402
from mpcml.transport.transport import Transport  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Session:
    """A live session: who this party is, and its view of the data plane."""

    rank: int
    world_size: int
    peer_names: tuple[str, ...]
    session_id: str
    transport: Transport
    traffic: PeerTraffic
    """Payload bytes sent to and received from each peer; still readable after the session."""
    placement: devices.Placement
    """Where this party's tensors live (`device`), and how its shares reach the host."""

    def communication_stats(self) -> dict[str, Any]:
        """CrypTen's counters for this party (rounds, bytes as CrypTen counts them, time).

        Also the tuples and serialized bytes it took from the dealer (`dealer_tuples`,
        `dealer_bytes`), zero but on rank 0.
        """
        stats = dict(crypten_comm.get().get_communication_stats())
        client = DealerProvider.client
        stats["dealer_tuples"] = client.tuples if client is not None else 0
        stats["dealer_bytes"] = client.wire_bytes if client is not None else 0
        return stats

    def start_round(self, round: int) -> None:
        """Draw `round`'s randomness from its own start (party streams and dealer tuples).

        With `randomness` given to `session`, a resumed run then draws in each round exactly
        what the first run drew in it.
        """
        prg.start_round(round)
        if DealerProvider.client is not None:
            DealerProvider.client.start_round(round)

    def reset_communication_stats(self) -> None:
        """Zero CrypTen's counters and the dealer's."""
        crypten_comm.get().reset_communication_stats()
        if DealerProvider.client is not None:
            DealerProvider.client.tuples = DealerProvider.client.wire_bytes = 0


def _validate(
    rank: int,
    world_size: int,
    peers: Sequence[str],
    peer_names: Sequence[str] | None,
    tls: TLSFiles | None,
    insecure: bool,
) -> tuple[str, ...]:
    if world_size < 2:
        raise ValueError(f"world_size must be at least 2, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    if len(peers) != world_size:
        raise ValueError(f"peers lists {len(peers)} addresses for world_size {world_size}")
    for i, address in enumerate(peers):
        parse(address, f"peers[{i}] =")
    if tls is None and not insecure:
        raise ValueError(
            "tls is required; pass insecure=True (and tls=None) only to debug over plaintext"
        )
    if tls is not None and insecure:
        raise ValueError("pass either tls or insecure=True, not both")
    names = (
        tuple(peer_names)
        if peer_names is not None
        else tuple(f"party{i}" for i in range(world_size))
    )
    if len(names) != world_size:
        raise ValueError(f"peer_names lists {len(names)} names for world_size {world_size}")
    if len(set(names)) != world_size:
        raise ValueError(f"peer_names must be distinct: {list(names)}")
    return names


def _select_provider(dealer: DealerEndpoint | None, session_id: str) -> None:
    if dealer is None:
        log.warning(
            "session %r uses CrypTen's TFP provider: INSECURE, party 0 can recover the other "
            "parties' inputs; give a dealer for anything but debugging",
            session_id,
        )
        crypten.cfg.mpc.provider = "TFP"
        return
    register()
    crypten.cfg.mpc.provider = DEALER_PROVIDER


@contextmanager
def session(
    rank: int,
    world_size: int,
    peers: Sequence[str],
    *,
    tls: TLSFiles | None = None,
    peer_names: Sequence[str] | None = None,
    insecure: bool = False,
    session_id: str = "mpcml-session",
    connect_timeout: float = options.CONNECT_TIMEOUT_S,
    listen: str | None = None,
    device: str | torch.device | None = None,
    cuda_emulation: bool = False,
    chunk_bytes: int = options.CHUNK_BYTES,
    dealer: DealerEndpoint | None = None,
    network: Shaping | str | None = None,
    randomness: prg.JobRandomness | None = None,
) -> Iterator[Session]:
    """Run CrypTen as party `rank` of `world_size`, talking to the others only over gRPC.

    `peers[i]` is the address party i listens on and `peer_names[i]` the name its certificate
    must carry. Every party passes the same `peers`, `peer_names` and `session_id`. This party
    listens on `listen` (default `peers[rank]`). The block ends with CrypTen and the server shut
    down, so another session can start in the same process. Any failure of the data plane
    raises `mpcml.TransportError` naming the peer involved, on every party.

    `dealer` is where correlated randomness comes from (`mpcml dealer`); without one, CrypTen's
    TFP provider is used, which lets party 0 recover every other party's inputs.

    `device` ("cpu", "cuda" or "cuda:N") must exist here, or `DeviceError` says so; on CUDA,
    shares' matmuls and convolutions run as exact float64 block products (runtime/blocks.py).
    `cuda_emulation` runs a CUDA device's code with the data on the CPU (`devices.Placement`).

    `network` (a `Shaping` or its text, `delay=20ms,bandwidth=352mbit`) emulates a slower
    network on this party's inbound streams, for benchmarks (mpcml/transport/shaping.py).

    `randomness` (the job's id and this party's secret for it) makes every run of a job draw
    the same randomness round by round (`Session.start_round`); without it, keys are fresh.
    """
    names = _validate(rank, world_size, peers, peer_names, tls, insecure)
    # Before any connection: a party without its GPU fails alone, with the reason.
    placement = devices.Placement.of(device, names[rank], cuda_emulation)
    if tls is not None:
        # An expired certificate, or one of another CA, fails the peers' TLS handshake, which
        # cannot tell this party why; a wrong role the peers refuse with a message of their own.
        check_certificate(tls, role=None)
    if crypten.is_initialized():
        raise TransportError(
            "CrypTen is already initialised in this process: one session at a time"
        )
    if insecure:
        log.warning(
            "mpcml session %r runs over PLAINTEXT gRPC with no authentication "
            "(insecure=True): use it only for debugging",
            session_id,
        )
    if chunk_bytes < 1024:
        raise ValueError(f"chunk_bytes must be at least 1024, got {chunk_bytes}")
    infos = [PeerInfo(i, names[i], peers[i]) for i in range(world_size)]
    shaping = Shaping.parse(network) if isinstance(network, str) else network
    if shaping:
        log.info("session %r emulates a network: %s", session_id, shaping)
    transport = Transport(
        rank=rank,
        peers=infos,
        session_id=session_id,
        tls=tls,
        listen=listen,
        chunk_bytes=chunk_bytes,
        network=shaping,
    )
    transport.start(connect_timeout)
    original = crypten_comm.DistributedCommunicator
    emulation = ExitStack()  # closed last, after CrypTen and the transport
    emulation.enter_context(devices.emulation(placement.emulated))
    crypten_comm.DistributedCommunicator = GrpcCommunicator
    GrpcCommunicator.pending = transport
    try:
        try:
            prg.install()  # share randomness from ChaCha20, keys exchanged over mTLS
            _select_provider(dealer, session_id)
            if dealer is not None:  # first: the run's binding covers the dealer's tag
                job_id = randomness.job_id if randomness is not None else ""
                DealerProvider.client = DealerClient(
                    dealer, tls, session_id, rank, list(names), job_id
                )
            if randomness is not None and DealerProvider.client is not None:
                randomness = replace(randomness, dealer_tag=DealerProvider.client.tag)
            prg.use(randomness)
            crypten.init(party_name=names[rank], device=placement.device)
            if DealerProvider.client is not None:
                DealerProvider.client.bind(prg.binding())
        except BaseException as exc:
            if DealerProvider.client is not None:
                DealerProvider.client.close()
                DealerProvider.client = None
            if crypten.is_initialized():
                crypten.uninit()
            transport.abort(f"CrypTen failed to start: {exc}")
            raise
        try:
            communicator = GrpcCommunicator.instance
            traffic = communicator.traffic if communicator is not None else PeerTraffic([])
            yield Session(rank, world_size, names, session_id, transport, traffic, placement)
        except TransportError as exc:
            transport.abort(str(exc))
            raise
        except BaseException as exc:
            # Peers learn only the exception's type: its message may quote this party's data.
            log.error(
                "session %r: the computation raised %s: %s", session_id, type(exc).__name__, exc
            )
            transport.abort(f"its computation raised {type(exc).__name__}")
            raise
        finally:
            if DealerProvider.client is not None:
                DealerProvider.client.close()
                DealerProvider.client = None
            crypten.cfg.mpc.provider = "TFP"
            crypten.uninit()
    finally:
        emulation.close()
        GrpcCommunicator.instance = None
        GrpcCommunicator.pending = None
        crypten_comm.DistributedCommunicator = original
        transport.stop()
