"""The CrypTen provider that takes correlated randomness from the dealer (docs/security.md).

Registered in `crypten.mpc`'s provider table as `MPCML_DEALER`; `mpcml.session(dealer=...)`
selects it, opens the job's dealer session (which hands this party its key) and closes it at
the end. Each call draws this party's shares from its key's ChaCha20 stream; rank 0 also asks
the dealer for its correcting share.
"""

from __future__ import annotations

import contextlib
import queue
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
        self._outbox: queue.Queue[tuple[pb.TupleRequest, Pending] | None] = queue.Queue()
        self._sender: threading.Thread | None = None
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

    def correction(self, request: pb.TupleRequest, device: Any) -> Pending:
        """Rank 0's correcting share for `request`, asked for now and awaited when first used.

        The requests go out in order from one sender thread, so the dealer sees them in
        sequence; meanwhile CrypTen opens the tuple's masked values with the other parties,
        which is when the correction is first needed: the dealer's round trip overlaps that
        one instead of adding to it.
        """
        with self._lock:
            request.session_id, request.seq = self.session_id, self._seq
            self._seq += 1
            pending = Pending(device)
            self._outbox.put((request, pending))
            if self._sender is None:
                self._sender = threading.Thread(
                    target=self._send, daemon=True, name="dealer-corrections"
                )
                self._sender.start()
        return pending

    def _send(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            request, pending = item
            try:
                reply = self._call(self._stub.Correction, request, REQUEST_TIMEOUT_S)
            except DealerError as exc:
                pending.fail(exc)
                continue
            with self._lock:
                self.tuples += 1
                self.wire_bytes += request.ByteSize() + reply.ByteSize()
            pending.set(reply)

    def close(self) -> None:
        """End the dealer session (best effort) and the channel."""
        self._outbox.put(None)
        with contextlib.suppress(grpc.RpcError):
            self._stub.Close(pb.CloseRequest(session_id=self.session_id), timeout=5.0)
        self._channel.close()


class Pending:
    """A correcting share on its way from the dealer."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._done = threading.Event()
        self._reply: pb.TupleReply | None = None
        self._error: DealerError | None = None

    def set(self, reply: pb.TupleReply) -> None:
        """The dealer answered."""
        self._reply = reply
        self._done.set()

    def fail(self, error: DealerError) -> None:
        """The dealer failed."""
        self._error = error
        self._done.set()

    def result(self) -> torch.Tensor:
        """The share, waiting for it; a DealerError if the dealer failed."""
        if not self._done.wait(REQUEST_TIMEOUT_S + 5):
            raise DealerError(f"no correcting share from the dealer in {REQUEST_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        tensor = torch.frombuffer(bytearray(self._reply.data), dtype=torch.int64).reshape(
            torch.Size(self._reply.shape)
        )
        return tensor.to(self.device) if self.device is not None else tensor


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
        """The party's shares of the tuple; rank 0's last one is `Pending` on the dealer."""
        client = DealerProvider.client
        if client is None:
            raise DealerError("no dealer session is open: jobs need mpcml.session(dealer=...)")
        shares: list[Any] = [
            wrap(s) for s in tuples.draw(client.stream, client.rank, request, device)
        ]
        if client.rank == 0:
            shares.append(client.correction(request, device))
        return shares

    @staticmethod
    def _arithmetic(share: Any) -> Any:
        from crypten.mpc.primitives import ArithmeticSharedTensor

        if isinstance(share, Pending):
            empty = ArithmeticSharedTensor.from_shares(
                torch.zeros(0, dtype=torch.int64), precision=0
            )
            return _awaiting(empty, share)
        return ArithmeticSharedTensor.from_shares(share, precision=0)

    @staticmethod
    def _binary(share: Any) -> Any:
        from crypten.mpc.primitives import BinarySharedTensor

        if isinstance(share, Pending):
            return _awaiting(
                BinarySharedTensor.from_shares(torch.zeros(0, dtype=torch.int64)), share
            )
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


_AWAITING: dict[type, type] = {}


def _awaiting(tensor: Any, pending: Pending) -> Any:
    """`tensor` (a CrypTen shared tensor) made to hold the dealer's `pending` correction.

    It reads like any other; the first read of its share waits for the correction. CrypTen
    reads the last element of a tuple only after opening the masked values with the other
    parties, so the dealer's answer is usually there by then.
    """
    base = type(tensor)
    cls = _AWAITING.get(base)
    if cls is None:

        def _get(self: Any) -> Any:
            waiting = self.__dict__.pop("_pending", None)
            if waiting is not None:
                self.__dict__["_share"] = wrap(waiting.result())
            return self.__dict__["_share"]

        def _set(self: Any, value: Any) -> None:
            self.__dict__.pop("_pending", None)
            self.__dict__["_share"] = value

        cls = type(f"Awaiting{base.__name__}", (base,), {"_tensor": property(_get, _set)})
        _AWAITING[base] = cls
    tensor.__class__ = cls
    tensor.__dict__.pop("_tensor", None)
    tensor.__dict__["_pending"] = pending
    return tensor


def register() -> None:
    """Add the provider to CrypTen's table (idempotent)."""
    import crypten.mpc

    crypten.mpc.__dict__["__SUPPORTED_PROVIDERS"][NAME] = DealerProvider()
