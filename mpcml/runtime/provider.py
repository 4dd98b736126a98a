"""The CrypTen provider that takes correlated randomness from the dealer (docs/security.md).

Registered in `crypten.mpc`'s provider table as `MPCML_DEALER`; `mpcml.session(dealer=...)`
selects it, opens the job's dealer session (which hands this party its key) and closes it at
the end. Each call draws this party's shares from its key's ChaCha20 stream; rank 0 also asks
the dealer for its correcting share.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc
import torch

from mpcml.proto.v1 import dealer_pb2 as pb
from mpcml.proto.v1 import dealer_pb2_grpc as pb_grpc
from mpcml.runtime import tuples
from mpcml.runtime.prg import ChaChaStream, wrap
from mpcml.transport.errors import TransportError
from mpcml.transport.serving import channel
from mpcml.transport.tls import TLSFiles

NAME = "MPCML_DEALER"
REQUEST_TIMEOUT_S = 120.0


class DealerError(TransportError):
    """The dealer is unreachable or refused a request; the message names it."""


@dataclass(frozen=True)
class DealerEndpoint:
    """Where a party reaches the dealer, and the name its certificate must carry."""

    address: str
    name: str = "dealer"


class DealerClient:
    """One party's connection to the dealer for one session."""

    def __init__(
        self,
        endpoint: DealerEndpoint,
        tls: TLSFiles | None,
        session_id: str,
        rank: int,
        parties: list[str],
    ) -> None:
        self.endpoint = endpoint
        self.session_id = session_id
        self.rank = rank
        self._channel = channel(
            endpoint.address,
            tls,
            endpoint.name,
            [
                ("grpc.max_receive_message_length", tuples.MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", tuples.MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = pb_grpc.DealerStub(self._channel)
        self._seq = 0
        self.tuples = 0
        """Correcting shares received (rank 0 only; the other ranks never call the dealer)."""
        self.wire_bytes = 0
        """Their requests' and replies' serialized size: what the dealer adds to the traffic."""
        self._lock = threading.Lock()
        reply = self._call(
            self._stub.Open,
            pb.OpenRequest(session_id=session_id, rank=rank, parties=parties),
            timeout=30.0,
            wait=True,
        )
        self.stream = ChaChaStream(reply.key)

    def _call(self, method: Any, request: Any, timeout: float, wait: bool = False) -> Any:
        """One call, its failure a DealerError naming the dealer.

        `wait` waits for a dealer that is not up yet, at Open only: once the session runs, a
        dealer that went away fails the job at once.
        """
        try:
            return method(request, timeout=timeout, wait_for_ready=wait)
        except grpc.RpcError as exc:
            raise DealerError(
                f"the dealer at {self.endpoint.address} ({self.endpoint.name!r}) failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from None

    def correction(self, request: pb.TupleRequest, device: Any) -> torch.Tensor:
        """Rank 0's correcting share for `request`."""
        with self._lock:
            request.session_id, request.seq = self.session_id, self._seq
            self._seq += 1
            reply = self._call(self._stub.Correction, request, REQUEST_TIMEOUT_S)
            self.tuples += 1
            self.wire_bytes += request.ByteSize() + reply.ByteSize()
        tensor = torch.frombuffer(bytearray(reply.data), dtype=torch.int64).reshape(
            torch.Size(reply.shape)
        )
        return tensor.to(device) if device is not None else tensor

    def close(self) -> None:
        """End the dealer session (best effort) and the channel."""
        with contextlib.suppress(grpc.RpcError):
            self._stub.Close(pb.CloseRequest(session_id=self.session_id), timeout=5.0)
        self._channel.close()


def _request(
    kind: pb.TupleKind, size0: Any, size1: Any = (), op: str = "", **kwargs: Any
) -> pb.TupleRequest:
    request = pb.TupleRequest(
        kind=kind, size0=list(torch.Size(size0)), size1=list(torch.Size(size1)), op=op
    )
    for key, value in kwargs.items():
        values = value if isinstance(value, tuple | list) else (value,)
        request.kwargs[key].values.extend(int(v) for v in values)
    return request


class DealerProvider:
    """CrypTen's TupleProvider interface, answered from the dealer."""

    NAME = NAME
    client: DealerClient | None = None
    """The session's connection; set by `mpcml.session` for its lifetime."""

    # CrypTen's provider base class state (tracing is not supported with the dealer).
    tracing = False
    request_cache: ClassVar[list[Any]] = []
    tuple_cache: ClassVar[dict[Any, Any]] = {}

    def _shares(self, request: pb.TupleRequest, device: Any) -> list[Any]:
        client = DealerProvider.client
        if client is None:
            raise DealerError("no dealer session is open: jobs need mpcml.session(dealer=...)")
        shares = tuples.draw(client.stream, client.rank, request, device)
        if client.rank == 0:
            shares.append(client.correction(request, device))
        return [wrap(s) for s in shares]

    @staticmethod
    def _arithmetic(share: Any) -> Any:
        from crypten.mpc.primitives import ArithmeticSharedTensor

        return ArithmeticSharedTensor.from_shares(share, precision=0)

    @staticmethod
    def _binary(share: Any) -> Any:
        from crypten.mpc.primitives import BinarySharedTensor

        return BinarySharedTensor.from_shares(share)

    def generate_additive_triple(
        self, size0: Any, size1: Any, op: str, device: Any = None, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any, Any]:
        """a, b and c = op(a, b), arithmetically shared."""
        if args:
            raise DealerError(f"{op} with positional arguments {args} is not supported")
        a, b, c = self._shares(_request(pb.ADDITIVE, size0, size1, op, **kwargs), device)
        return self._arithmetic(a), self._arithmetic(b), self._arithmetic(c)

    def square(self, size: Any, device: Any = None) -> tuple[Any, Any]:
        """R and r * r."""
        r, r2 = self._shares(_request(pb.SQUARE, size), device)
        return self._arithmetic(r), self._arithmetic(r2)

    def generate_binary_triple(
        self, size0: Any, size1: Any, device: Any = None
    ) -> tuple[Any, Any, Any]:
        """a, b and a & b, binary shared."""
        a, b, c = self._shares(_request(pb.BINARY, size0, size1), device)
        return self._binary(a), self._binary(b), self._binary(c)

    def wrap_rng(self, size: Any, device: Any = None) -> tuple[Any, Any]:
        """R and the number of wraps of its shares."""
        r, theta = self._shares(_request(pb.WRAPS, size), device)
        return self._arithmetic(r), self._arithmetic(theta)

    def B2A_rng(self, size: Any, device: Any = None) -> tuple[Any, Any]:
        """A random bit, arithmetically and binary shared."""
        bit, arithmetic = self._shares(_request(pb.B2A, size), device)
        return self._arithmetic(arithmetic), self._binary(bit)

    @staticmethod
    def _init() -> None:
        """CrypTen calls this on init; the session opens the dealer session itself."""

    @staticmethod
    def uninit() -> None:
        """CrypTen calls this on uninit."""


def register() -> None:
    """Add the provider to CrypTen's table (idempotent)."""
    import crypten.mpc

    crypten.mpc.__dict__["__SUPPORTED_PROVIDERS"][NAME] = DealerProvider()
