"""CrypTen's `Communicator` over the gRPC data plane.

Every call CrypTen makes (docs/architecture.md) is built from point-to-point messages on the
session's streams. Method names and the `_logging` decorator are CrypTen's own, so its communication
statistics (rounds, bytes) count exactly what they count over torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

import torch
from crypten.communicator.communicator import Communicator, _logging
from torch.distributed import ReduceOp

from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.transport import framing
from mpcml.transport.errors import ProtocolError, TransportError
from mpcml.transport.transport import Transport

_F = TypeVar("_F", bound=Callable[..., Any])

_SPLIT_ALL_REDUCE_ELEMENTS = 1 << 15
"""From this size on, all_reduce among 3+ parties reduce-scatters and all-gathers."""


def _counted(func: _F) -> _F:
    # CrypTen's statistics decorator, keyed on the method name, typed for mypy.
    return cast(_F, _logging(func))


class Request:
    """What `isend`/`irecv` return: `wait()` completes the operation."""

    def __init__(self, complete: Callable[[], None] | None = None) -> None:
        self._complete = complete

    def wait(self) -> None:
        """Block until the operation is done (sends are done when queued)."""
        if self._complete is not None:
            complete, self._complete = self._complete, None
            complete()


def _check_fits(target: torch.Tensor, received: torch.Tensor, what: str) -> None:
    # Like torch.distributed, only the element count and type must match: CrypTen itself
    # sends a 0-d seed into a 1-element buffer.
    if target.numel() != received.numel() or target.dtype != received.dtype:
        raise ProtocolError(
            f"{what}: received a {received.dtype} tensor of shape "
            f"{tuple(received.shape)}, expected {target.dtype} of shape "
            f"{tuple(target.shape)}: the parties' computations diverged"
        )


def _fill(target: torch.Tensor, received: torch.Tensor, what: str) -> None:
    _check_fits(target, received, what)
    target.copy_(received.reshape(target.shape))


def _combine(op: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if op == ReduceOp.SUM:
        return torch.Tensor.add_
    if op == ReduceOp.BXOR:
        return torch.Tensor.bitwise_xor_
    raise TransportError(f"reduce op {op} is not supported (only SUM and BXOR)")


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    # Batched collectives travel as one message, not one per tensor.
    return torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else tensors[0]


def _split_into(targets: list[torch.Tensor], flat: torch.Tensor) -> list[torch.Tensor]:
    if len(targets) == 1:
        return [flat.reshape(targets[0].shape)]
    sizes = [t.numel() for t in targets]
    if sum(sizes) != flat.numel():
        raise ProtocolError(
            f"batched message of {flat.numel()} elements, expected "
            f"{sum(sizes)}: the parties' computations diverged"
        )
    pieces = torch.split(flat, sizes)
    return [piece.reshape(t.shape) for piece, t in zip(pieces, targets, strict=True)]


class PeerTraffic:
    """Payload bytes this party sent to and received from each peer during the session.

    CrypTen's statistics count only what this party sends, over all peers; the party daemon's
    per-peer metrics need both directions. Counted per message: a tensor's data, an object's
    encoded `Value`. Framing and TLS overhead are not included. Every communicator call runs on
    the computation's thread, so the counters need no lock.
    """

    def __init__(self, names: list[str]) -> None:
        self.names = names
        """Each rank's party name."""
        self.sent = [0] * len(names)
        self.received = [0] * len(names)

    def totals(self) -> dict[str, tuple[int, int]]:
        """(bytes sent, bytes received) by peer name, for every peer of the session."""
        return {
            name: (self.sent[r], self.received[r])
            for r, name in enumerate(self.names)
            if self.sent[r] or self.received[r]
        }


def _payload_bytes(message: framing.Message) -> int:
    if message.tensor is not None:
        return message.tensor.numel() * message.tensor.element_size()
    return framing.to_value(message.value).ByteSize()


class GrpcCommunicator(Communicator):  # type: ignore[misc]
    """CrypTen communicator whose messages travel over an `mpcml` `Transport`."""

    BYTES_PER_ELEMENT = 8
    instance: ClassVar[GrpcCommunicator | None] = None
    pending: ClassVar[Transport | None] = None
    """Set by `mpcml.session` just before `crypten.init()`, which calls `initialize`."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.world_size = transport.world_size
        self._name = transport.me.name
        self.traffic = PeerTraffic([p.name for p in transport.peers])
        self.ttp_initialized = False
        self.reset_communication_stats()

    # -- lifecycle, as crypten.communicator expects it -----------------------------------------

    @classmethod
    def initialize(cls, rank: int = 0, world_size: int = 1, init_ttp: bool = False) -> None:
        """Called by `crypten.init()` with placeholder arguments; the session has the real ones."""
        if init_ttp:
            raise TransportError(
                "CrypTen's TTP provider runs over torch.distributed and is "
                "not available over the gRPC data plane"
            )
        if cls.pending is None:
            raise TransportError("start CrypTen with mpcml.session(...), not crypten.init()")
        cls.instance = cls(cls.pending)

    @classmethod
    def is_initialized(cls) -> bool:
        """Whether a session's communicator is live."""
        return cls.instance is not None

    @classmethod
    def get(cls) -> GrpcCommunicator | None:
        """The live communicator."""
        return cls.instance

    @classmethod
    def shutdown(cls) -> None:
        """Called by `crypten.uninit()`: close the session's data plane cleanly."""
        instance, cls.instance = cls.instance, None
        if instance is not None:
            instance.transport.close()

    # -- point to point ------------------------------------------------------------------------

    def _peers(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.rank]

    # Every message goes through these four, which count it in `traffic`.

    def _send_tensor(self, dst: int, op: pb.Op, tensor: torch.Tensor) -> None:
        self.transport.send_tensor(dst, op, tensor)
        self.traffic.sent[dst] += tensor.numel() * tensor.element_size()

    def _send_object(self, dst: int, op: pb.Op, obj: Any) -> None:
        self.transport.send_object(dst, op, obj)
        self.traffic.sent[dst] += framing.to_value(obj).ByteSize()

    def _take(self, src: int, ticket: int, op: pb.Op) -> framing.Message:
        message = self.transport.take(src, ticket, op)
        self.traffic.received[src] += _payload_bytes(message)
        return message

    def _recv(self, src: int, op: pb.Op) -> framing.Message:
        return self._take(src, self.transport.post_recv(src), op)

    def _recv_into(self, target: torch.Tensor, src: int, op: pb.Op, what: str) -> None:
        _fill(target, self._recv(src, op).tensor_or_raise(), what)

    @_counted
    def send(self, tensor: Any, dst: int) -> None:
        """Send `tensor` to `dst`."""
        self._send_tensor(dst, pb.OP_SEND, tensor.data)

    @_counted
    def recv(self, tensor: Any, src: int | None = None) -> Any:
        """Receive a tensor shaped like `tensor` from `src`; returns a new tensor."""
        if src is None:
            raise TransportError("recv needs a source rank")
        received = self._recv(src, pb.OP_SEND).tensor_or_raise()
        if type(tensor) is torch.Tensor and tensor.device.type == "cpu":
            _check_fits(tensor, received, f"recv from rank {src}")
            return received.reshape(tensor.shape)
        result = tensor.clone()  # a CUDALongTensor or another wrapper: keep its type
        _fill(result.data, received, f"recv from rank {src}")
        return result

    @_counted
    def isend(self, tensor: Any, dst: int) -> Request:
        """Send without blocking (the data is copied at once)."""
        self._send_tensor(dst, pb.OP_SEND, tensor.data)
        return Request()

    @_counted
    def irecv(self, tensor: Any, src: int | None = None) -> Request:
        """Post a receive into `tensor`; it is filled in place by `wait()`."""
        if src is None:
            raise TransportError("irecv needs a source rank")
        ticket = self.transport.post_recv(src)

        def complete() -> None:
            message = self._take(src, ticket, pb.OP_SEND)
            _fill(tensor.data, message.tensor_or_raise(), f"irecv from rank {src}")

        return Request(complete)

    # -- collectives ---------------------------------------------------------------------------

    @_counted
    def scatter(
        self, scatter_list: list[Any], src: int, size: Any = None, device: Any = None
    ) -> Any:
        """Send `scatter_list[i]` from `src` to party i."""
        if src == self.rank:
            for r in self._peers():
                self._send_tensor(r, pb.OP_SCATTER, scatter_list[r].data)
            return scatter_list[self.rank].data
        if size is None:
            size = scatter_list[self.rank].size()
        if device is None and scatter_list is not None:
            try:
                device = scatter_list[self.rank].device
            except (IndexError, AttributeError, TypeError):
                device = None
        tensor = torch.empty(size=size, dtype=torch.long, device=device)
        self._recv_into(tensor, src, pb.OP_SCATTER, f"scatter from rank {src}")
        return tensor

    def _accumulate(
        self,
        targets: list[torch.Tensor],
        op: pb.Op,
        combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        # Fold every peer's (batched, flattened) message into `targets`, in rank order.
        for src in self._peers():
            received = self._recv(src, op).tensor_or_raise()
            for acc, part in zip(targets, _split_into(targets, received), strict=True):
                combine(acc, part.to(acc.device))

    @_counted
    def reduce(self, input: Any, dst: int, op: Any = ReduceOp.SUM, batched: bool = False) -> Any:
        """Combine every party's tensor(s) with `op` at `dst`."""
        combine = _combine(op)
        inputs = list(input) if batched else [input]
        if self.rank != dst:
            self._send_tensor(dst, pb.OP_REDUCE, _flat([x.data for x in inputs]))
            return None
        result = [x.clone().data for x in inputs] if batched else [input.clone()]
        self._accumulate([r.data for r in result], pb.OP_REDUCE, combine)
        return result if batched else result[0]

    @_counted
    def all_reduce(self, input: Any, op: Any = ReduceOp.SUM, batched: bool = False) -> Any:
        """Combine every party's tensor(s) with `op`; every party gets the result."""
        combine = _combine(op)
        inputs = list(input) if batched else [input]
        flat = _flat([x.data for x in inputs])
        result = [x.clone() for x in inputs]
        if self.world_size > 2 and flat.numel() >= _SPLIT_ALL_REDUCE_ELEMENTS:
            reduced = self._split_all_reduce(flat.reshape(-1), combine)
            for target, part in zip(
                result, _split_into([r.data for r in result], reduced), strict=True
            ):
                target.data.copy_(part)
            return result if batched else result[0]
        for dst in self._peers():
            self._send_tensor(dst, pb.OP_ALL_REDUCE, flat)
        self._accumulate([r.data for r in result], pb.OP_ALL_REDUCE, combine)
        return result if batched else result[0]

    def _split_all_reduce(
        self, flat: torch.Tensor, combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        # Reduce-scatter then all-gather: party i reduces part i and hands it out, so each party
        # sends 2(n-1)/n of the tensor instead of (n-1) times all of it, in two rounds.
        parts = list(torch.tensor_split(flat, self.world_size))
        for dst in self._peers():
            self._send_tensor(dst, pb.OP_ALL_REDUCE, parts[dst])
        mine = parts[self.rank].clone()
        for src in self._peers():
            received = self._recv(src, pb.OP_ALL_REDUCE).tensor_or_raise()
            _check_fits(mine, received, f"all_reduce part from rank {src}")
            combine(mine, received.to(mine.device))
        for dst in self._peers():
            self._send_tensor(dst, pb.OP_ALL_REDUCE, mine)
        parts[self.rank] = mine
        for src in self._peers():
            received = self._recv(src, pb.OP_ALL_REDUCE).tensor_or_raise()
            _check_fits(parts[src], received, f"all_reduce result from rank {src}")
            parts[src] = received.to(mine.device)
        return torch.cat(parts)

    def _collect(self, tensor: Any, op: pb.Op, what: str) -> list[Any]:
        # Every party's tensor, in rank order, ours included.
        result = []
        for r in range(self.world_size):
            if r == self.rank:
                result.append(tensor.data.clone())
                continue
            out = torch.empty(size=tensor.size(), dtype=torch.long, device=tensor.data.device)
            self._recv_into(out, r, op, f"{what} from rank {r}")
            result.append(out)
        return result

    @_counted
    def gather(self, tensor: Any, dst: int) -> list[Any]:
        """Collect every party's tensor at `dst` (others get `[None]`)."""
        if self.rank != dst:
            self._send_tensor(dst, pb.OP_GATHER, tensor.data)
            return [None]
        return self._collect(tensor, pb.OP_GATHER, "gather")

    @_counted
    def all_gather(self, tensor: Any) -> list[Any]:
        """Every party gets every party's tensor."""
        for dst in self._peers():
            self._send_tensor(dst, pb.OP_ALL_GATHER, tensor.data)
        return self._collect(tensor, pb.OP_ALL_GATHER, "all_gather")

    @_counted
    def broadcast(self, input: Any, src: int, group: Any = None, batched: bool = False) -> Any:
        """Overwrite every party's tensor(s) with those of `src`, in place."""
        inputs = list(input) if batched else [input]
        targets = [x.data for x in inputs]
        if self.rank == src:
            flat = _flat(targets)
            for dst in self._peers():
                self._send_tensor(dst, pb.OP_BROADCAST, flat)
        else:
            received = self._recv(src, pb.OP_BROADCAST).tensor_or_raise()
            for target, part in zip(targets, _split_into(targets, received), strict=True):
                _fill(target, part, f"broadcast from rank {src}")
        return input

    @_counted
    def barrier(self) -> None:
        """Return once every party has entered the barrier."""
        for dst in self._peers():
            self._send_object(dst, pb.OP_BARRIER, None)
        for src in self._peers():
            self._recv(src, pb.OP_BARRIER)

    # -- objects (schema'd, never pickled) -----------------------------------------------------

    @_counted
    def send_obj(self, obj: Any, dst: int, group: Any = None) -> None:
        """Send a small structured object to `dst`."""
        self._send_object(dst, pb.OP_OBJECT, obj)

    @_counted
    def recv_obj(self, src: int, group: Any = None) -> Any:
        """Receive a small structured object from `src`."""
        return self._recv(src, pb.OP_OBJECT).value

    @_counted
    def broadcast_obj(self, obj: Any, src: int, group: Any = None) -> Any:
        """Every party gets `src`'s object."""
        if self.rank == src:
            for dst in self._peers():
                self._send_object(dst, pb.OP_OBJECT, obj)
            return obj
        return self._recv(src, pb.OP_OBJECT).value

    # -- identity ------------------------------------------------------------------------------

    def get_world_size(self) -> int:
        """Number of parties."""
        return self.world_size

    def get_rank(self) -> int:
        """Rank of this party."""
        return self.rank

    def get_ttp_rank(self) -> int:
        """Where CrypTen's TTP would sit (unused: TTP is not offered)."""
        return self.world_size

    def set_name(self, name: str) -> None:
        """Set the party name CrypTen uses for file save/load."""
        if not isinstance(name, str):
            raise TypeError(f"party name must be a string, not {type(name).__name__}")
        self._name = name

    def get_name(self) -> str:
        """The party name."""
        return self._name

    def get_distributed_backend(self) -> str:
        """Name of the backend, in place of torch.distributed's."""
        return "mpcml-grpc"
