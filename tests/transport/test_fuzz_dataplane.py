"""Random and mutated calls at a party's data plane (`mpcml.v1.DataPlane`), over real gRPC and
mutual TLS.

Party 0 runs in its own process and, as a party daemon does for its jobs, serves one session
after another on the same address, each consuming what rank 1 sends it. The test process plays
rank 1 (with rank 1's certificate, or with rank 0's as an impostor) and sends what no mpcml party
would: random and mutated HelloRequests; streams with a wrong or missing session and rank; and,
each in a live session of its own, streams of random, mutated, truncated, reordered, oversized
and lying frames (huge and negative sizes, unknown enum values, chunk counts and data lengths
that lie), and a second stream from the same peer.

Every reply must be a proper status with a message, or a success, within a deadline; every
refused call is logged once by party 0; a session a stream breaks ends on party 0 with a
TransportError naming rank 1, logged once (never another exception, a crash or a hang); and
party 0 then serves its next session, and still answers at the end. `MPCML_FUZZ_CASES` sets the
cases per door (default 300).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import multiprocessing as mp
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.transport import framing, options
from mpcml.transport.address import free_ports
from mpcml.transport.errors import ProtocolError, TransportError
from mpcml.transport.link import STREAM_METHOD, PeerInfo
from mpcml.transport.tls import TLSFiles, channel_credentials, server_credentials
from mpcml.transport.transport import Transport
from tests.support.fuzz import CASES, MUTATIONS, UNDECODABLE, mutate, payloads, well_formed
from tests.support.parties import make_pki

pytestmark = pytest.mark.system

NAMES = ["party0", "party1"]
HELLO_METHOD = "/mpcml.v1.DataPlane/Hello"
RPC_TIMEOUT_S = 10.0
SESSION_TIMEOUT_S = 60.0
"""Longest party 0 may take to end a session and serve the next: past it, party 0 hung."""
CONNECT_TIMEOUT_S = 120.0 + CASES
"""How long each of party 0's sessions waits for rank 1's stream (the first one waits while the
Hello and metadata doors are fuzzed)."""
TEST_TIMEOUT_S = 300.0 + 2 * CASES
"""Far more than the test takes, `MPCML_FUZZ_CASES` cases per door (pytest's default is 300 s)."""
REFUSED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
}
"""What party 0 answers a Hello or a stream it will not let into its session."""
STREAM_FAILED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
"""What party 0 answers a stream of its session that breaks the protocol."""
ENDED = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.CANCELLED,
}
"""What a Hello for a session that has ended gets: the party is ending it (UNAVAILABLE) or
serves the next one; or, from gRPC, the server is shutting down (CANCELLED) or gone."""
SETTINGS = settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _session(index: int) -> str:
    return f"fuzz-{index}"


# -- party 0, in its own process ------------------------------------------------------------------


def _party0(tls: dict[str, str], peers: list[str], out: str, connect_timeout: float) -> None:
    """Party 0: one session after another on one address, as a party daemon runs jobs.

    Each session consumes rank 1's messages until it fails (as every one here does), then
    ends as `mpcml.session` ends a failed one; how it ended goes to `out`.jsonl.
    """
    logging.basicConfig(level=logging.INFO, filename=f"{out}.log", force=True)
    infos = [PeerInfo(rank, name, peers[rank]) for rank, name in enumerate(NAMES)]
    for index in itertools.count():
        transport = Transport(rank=0, peers=infos, session_id=_session(index), tls=TLSFiles(**tls))
        error: BaseException | None = None
        try:
            transport.start(connect_timeout)  # stops the transport itself if it raises
        except BaseException as exc:  # recorded for the test, which asserts on it
            error = exc
        else:
            try:
                while True:
                    transport.recv(1, pb.OP_SEND)
            except BaseException as exc:
                error = exc
                transport.abort(str(exc))
        record = {
            "session": index,
            "type": type(error).__name__,
            "transport_error": isinstance(error, TransportError),
            "message": str(error),
        }
        with open(f"{out}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


# -- rank 1's own server, in the test process ---------------------------------------------------


class _Broken(BaseException):
    """Party 0 died or hung. A BaseException, so that hypothesis stops at once instead of
    shrinking against a dead party."""


class Rank1Server:
    """Rank 1's data-plane server as party 0 sees it: answers party 0's Hello for any session and
    drains the stream party 0 opens, so that party 0's sessions start; notes which started."""

    def __init__(self, address: str, tls: TLSFiles) -> None:
        self._started: set[str] = set()
        self._cond = threading.Condition()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            options=options.server_options(options.CHUNK_BYTES),
        )
        handler = grpc.method_handlers_generic_handler(
            "mpcml.v1.DataPlane",
            {
                "Hello": grpc.unary_unary_rpc_method_handler(
                    self._hello,
                    request_deserializer=pb.HelloRequest.FromString,
                    response_serializer=pb.HelloReply.SerializeToString,
                ),
                "Stream": grpc.stream_unary_rpc_method_handler(
                    self._stream, response_serializer=pb.StreamSummary.SerializeToString
                ),
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        assert self._server.add_secure_port(address, server_credentials(tls))
        self._server.start()

    def _hello(self, request: pb.HelloRequest, context: grpc.ServicerContext) -> pb.HelloReply:
        with self._cond:
            self._started.add(request.session_id)
            self._cond.notify_all()
        return pb.HelloReply(session_id=request.session_id, rank=1, world_size=len(NAMES))

    def _stream(self, frames: Iterator[bytes], context: grpc.ServicerContext) -> pb.StreamSummary:
        try:
            for _ in frames:
                pass
        except grpc.RpcError:
            pass  # party 0 dropped its stream: it ended the session
        return pb.StreamSummary()

    def wait_started(self, session: str, party0: Party0) -> None:
        """Return once party 0 serves `session`; raise _Broken if it died or hung."""
        deadline = time.monotonic() + SESSION_TIMEOUT_S
        with self._cond:
            while session not in self._started:
                if not party0.process.is_alive():
                    raise _Broken(
                        f"party 0 died (exit code {party0.process.exitcode}) before serving "
                        f"session {session!r}:\n{party0.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise _Broken(
                        f"party 0 did not get to session {session!r} within "
                        f"{SESSION_TIMEOUT_S:g} s: it hung\n{party0.log_tail()}"
                    )
                self._cond.wait(0.1)

    def stop(self) -> None:
        self._server.stop(0).wait()


@dataclass
class Party0:
    """The party 0 process and what it writes."""

    process: Any
    out: Path

    @property
    def log(self) -> Path:
        return self.out.with_suffix(".log")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no log)"
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join([line for line in text if "refused a call" not in line][-lines:])

    def outcome(self, index: int) -> dict[str, Any]:
        """How session `index` ended on party 0."""
        path = self.out.with_suffix(".jsonl")
        for line in path.read_text().splitlines() if path.exists() else []:
            record: dict[str, Any] = json.loads(line)
            if record["session"] == index:
                return record
        raise AssertionError(f"party 0 recorded no end of session {_session(index)!r}")

    def failures_logged(self, index: int) -> int:
        """How many times party 0 logged that session `index` failed."""
        return self.log.read_text(errors="replace").count(f"session {_session(index)} failed on ")


_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):", re.MULTILINE)


class LogReader:
    """The log records party 0 wrote since the last call."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = path.stat().st_size if path.exists() else 0

    def new_records(self) -> list[str]:
        with self._path.open("rb") as f:
            f.seek(self._offset)
            text = f.read().decode(errors="replace")
        self._offset += len(text.encode(errors="replace"))
        bounds = [m.start() for m in _RECORD.finditer(text)] + [len(text)]
        return [text[a:b].strip() for a, b in itertools.pairwise(bounds)]


# -- calls ---------------------------------------------------------------------------------------


def _channel(address: str, tls: TLSFiles) -> grpc.Channel:
    opts = [
        (key, value)
        for key, value in options.channel_options(options.CHUNK_BYTES, "party0")
        if key != "grpc.max_send_message_length"
    ]
    # This client sends what the server must refuse, oversized frames included.
    opts.append(("grpc.max_send_message_length", -1))
    return grpc.secure_channel(address, channel_credentials(tls), options=opts)


@dataclass(frozen=True)
class Reply:
    code: grpc.StatusCode
    details: str
    message: Any = None


def _call(fn: Callable[[], Any]) -> Reply:
    try:
        return Reply(grpc.StatusCode.OK, "", fn())
    except grpc.RpcError as exc:
        return Reply(exc.code(), exc.details() or "")


def _hello(channel: grpc.Channel, data: bytes) -> Reply:
    call = channel.unary_unary(HELLO_METHOD, None, pb.HelloReply.FromString)
    return _call(lambda: call(data, timeout=RPC_TIMEOUT_S))


def _stream(
    channel: grpc.Channel, frames: list[bytes], metadata: tuple[tuple[str, str], ...]
) -> Reply:
    call = channel.stream_unary(STREAM_METHOD, None, pb.StreamSummary.FromString)
    return _call(lambda: call(iter(frames), metadata=metadata, timeout=RPC_TIMEOUT_S))


def _hello_request(session: str) -> bytes:
    return pb.HelloRequest(session_id=session, rank=1, world_size=len(NAMES)).SerializeToString()


def _show(frames: list[bytes]) -> str:
    """Frames for a failure message, long ones cut."""
    return repr([f if len(f) <= 96 else f[:96] + b"...(%d bytes)" % len(f) for f in frames])


def _metadata(session: str | None, rank: str | None) -> tuple[tuple[str, str], ...]:
    out = [("mpcml-session", session)] if session is not None else []
    return tuple(out + ([("mpcml-rank", rank)] if rank is not None else []))


def _as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# -- frames ---------------------------------------------------------------------------------------

_DATA_TAG = bytes([(15 << 3) | 2])
_ITEM_SIZES = {1: 8, 2: 4, 3: 2, 4: 1, 5: 1, 6: 1, 7: 8, 8: 4, 9: 2, 10: 2}
"""Element size per wire DType."""
_DTYPES = [torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.float16]
_UINT32 = st.integers(0, 2**32 - 1)
_UINT64 = st.integers(0, 2**64 - 1)
_DIMS = st.one_of(
    st.integers(0, 5),
    st.sampled_from([0, *(2**k for k in (31, 32, 33, 34, 35, 40, 62)), 2**63 - 1]),
    st.integers(-(2**63), 2**63 - 1),  # negative ones too
)
_OPS = st.one_of(st.integers(0, 9), st.integers(-(2**31), 2**31 - 1)).map(
    lambda op: cast(pb.Op, op)
)  # unknown values included


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


@st.composite
def _headers(draw: st.DrawFn) -> pb.TensorHeader:
    """Tensor headers of every kind: unknown dtypes, negative and huge dimensions, and byte
    counts that match the shape (however huge) or lie."""
    unknown = draw(st.integers(0, 3)) == 3  # mostly a known dtype
    dtype = draw(st.integers(-(2**31), 2**31 - 1) if unknown else st.integers(1, 10))
    if draw(st.integers(0, 9)) == 9:  # absurdly many dimensions
        shape = draw(st.lists(_DIMS, min_size=60, max_size=2000))
    else:
        shape = draw(st.lists(_DIMS, max_size=4))
    empty = draw(st.booleans())
    if shape and empty:  # no elements, however absurd the other dimensions
        shape[draw(st.integers(0, len(shape) - 1))] = 0
    nbytes = math.prod(shape) * _ITEM_SIZES.get(dtype, 1)
    if not 0 <= nbytes < 2**64 or draw(st.integers(0, 3)) == 3:  # else the exact size
        nbytes = draw(st.one_of(st.integers(0, 64), _UINT64))
    return pb.TensorHeader(dtype=cast(pb.DType, dtype), shape=shape, nbytes=nbytes)


def _value_leaves() -> st.SearchStrategy[pb.Value]:
    return st.one_of(
        st.builds(pb.Value),  # no kind
        st.booleans().map(lambda b: pb.Value(none=b)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: pb.Value(int_value=i)),
        st.floats().map(lambda x: pb.Value(float_value=x)),
        st.text(max_size=8).map(lambda s: pb.Value(str_value=s)),
        st.lists(_DIMS, max_size=4).map(lambda d: pb.Value(size_value=pb.Shape(dims=d))),
        st.builds(
            lambda h, data: pb.Value(tensor_value=pb.InlineTensor(header=h, data=data)),
            _headers(),
            st.binary(max_size=32),
        ),
    )


def _value_trees(children: st.SearchStrategy[pb.Value]) -> st.SearchStrategy[pb.Value]:
    items = st.lists(children, max_size=3)
    return st.one_of(
        items.map(lambda xs: pb.Value(list_value=pb.ValueList(items=xs))),
        items.map(lambda xs: pb.Value(tuple_value=pb.ValueList(items=xs))),
        st.lists(st.tuples(children, children), max_size=3).map(
            lambda kvs: pb.Value(
                map_value=pb.ValueMap(entries=[pb.ValueMapEntry(key=k, value=v) for k, v in kvs])
            )
        ),
    )


def _nested(depth: int) -> bytes:
    """A Value of lists nested `depth` deep, encoded by hand: protobuf will not build it."""
    value = pb.Value(none=True).SerializeToString()
    for _ in range(depth):
        items = b"\x0a" + _varint(len(value)) + value  # ValueList.items
        value = b"\x3a" + _varint(len(items)) + items  # Value.list_value
    return value


_VALUES = st.one_of(
    st.recursive(_value_leaves(), _value_trees, max_leaves=6).map(lambda v: v.SerializeToString()),
    st.integers(25, 120).map(_nested),  # past the schema's depth, and protobuf's
)
"""Encoded Values."""
_OBJECTS = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(),
        st.text(max_size=8),
        st.binary(max_size=8),
    ),
    lambda c: st.one_of(
        st.lists(c, max_size=3),
        st.lists(c, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.integers(-9, 9), st.text(max_size=4)), c, max_size=3),
    ),
    max_leaves=6,
)
_TENSORS = st.builds(
    lambda dtype, shape: torch.full(shape, 3).to(dtype),
    st.sampled_from(_DTYPES),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
)


@st.composite
def _with_data(draw: st.DrawFn, frame: pb.Frame) -> bytes:
    """`frame` with random data whose length field tells the truth, or lies (a truncated frame,
    or data that runs on into garbage fields)."""
    data = draw(st.binary(max_size=64))
    claimed = len(data)
    if draw(st.integers(0, 3)) == 3:
        claimed = draw(st.one_of(st.integers(0, len(data) + 16), _UINT64))
    return b"".join((frame.SerializeToString(), _DATA_TAG, _varint(claimed), data))


@st.composite
def _bad_frame(draw: st.DrawFn, seq: int) -> list[bytes]:
    """One frame no mpcml party would write, for message `seq` or another."""
    if draw(st.integers(0, 3)) == 3:  # else the message expected next
        seq = draw(st.one_of(st.integers(0, 3), _UINT64))
    kind = draw(st.sampled_from(["tensor", "tensor", "object", "control", "scalars", "bytes"]))
    if kind == "tensor":  # the first chunk of a message with a random header, or anything
        frame = pb.Frame(kind=pb.FRAME_KIND_TENSOR, seq=seq, header=draw(_headers()))
        if draw(st.booleans()):
            frame.chunks = draw(st.integers(1, 3))
        else:
            frame.op = draw(_OPS)
            frame.chunk = draw(st.one_of(st.integers(0, 2), _UINT32))
            frame.chunks = draw(st.one_of(st.integers(0, 3), _UINT32))
            if draw(st.booleans()):
                frame.ClearField("header")
        return [draw(_with_data(frame))]
    if kind == "object":
        frame = pb.Frame(kind=pb.FRAME_KIND_OBJECT, seq=seq, op=draw(_OPS))
        value = draw(_VALUES)  # Frame.value is field 7, as Value.list_value
        return [frame.SerializeToString() + b"\x3a" + _varint(len(value)) + value]
    if kind == "control":
        frame_kind = draw(st.sampled_from([pb.FRAME_KIND_CLOSE, pb.FRAME_KIND_ABORT]))
        return [framing.control_frame(seq, frame_kind, draw(st.text(max_size=20)))]
    if kind == "scalars":
        seed = pb.Frame(
            kind=pb.FRAME_KIND_TENSOR,
            seq=seq,
            op=pb.OP_SEND,
            chunks=1,
            header=pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[1], nbytes=8),
            data=bytes(8),
        )
        return [draw(well_formed(seed))]
    return [draw(st.binary(max_size=128))]


@st.composite
def _message(draw: st.DrawFn, seq: int) -> tuple[list[bytes], bool]:
    """The frames of message `seq`, and whether they are those an mpcml party would write:
    valid, or valid and then mutated, truncated, reordered or cut short."""
    if draw(st.booleans()):
        frames = [framing.object_frame(seq, pb.OP_SEND, draw(_OBJECTS))]
    else:
        chunk_bytes = draw(st.integers(1, 48))
        frames = framing.tensor_frames(seq, pb.OP_SEND, draw(_TENSORS), chunk_bytes)
    how = draw(st.sampled_from(["valid", "mutated", "reordered", "cut"]))
    if how == "mutated":
        at = draw(st.integers(0, len(frames) - 1))
        frames[at] = mutate(frames[at], *draw(MUTATIONS))
    elif how == "reordered":
        frames = draw(st.permutations(frames))
    elif how == "cut":
        frames = frames[: draw(st.integers(0, len(frames) - 1))]
    return frames, how == "valid"


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """What rank 1 writes on its stream: messages, good and bad, then perhaps an end."""
    frames: list[bytes] = []
    seq = 0
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            message, valid = draw(_message(seq))
            frames += message
            seq += valid
        else:
            frames += draw(_bad_frame(seq))
    end = draw(st.sampled_from(["close", "abort", "none"]))
    if end == "close":
        frames.append(framing.control_frame(seq, pb.FRAME_KIND_CLOSE))
    elif end == "abort":
        frames.append(framing.control_frame(seq, pb.FRAME_KIND_ABORT, "fuzz"))
    return frames


_NO_STRIDES = pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[0, 2**62, 2**62], nbytes=0)
"""No elements, but strides past int64: torch raised RuntimeError."""
_UNALLOCATABLE = pb.TensorHeader(dtype=pb.DTYPE_UINT8, shape=[2**36], nbytes=2**36)
"""64 GiB, within the size bound, more than most machines can allocate: torch raised
RuntimeError (elsewhere allocated lazily, and the missing data fails the message)."""
_MANY_DIMS = pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[2**62] * 5000, nbytes=8)
"""Python's int-to-str limit raised ValueError on the error message; with more dimensions,
the size computation alone took minutes."""
REGRESSIONS = [
    *(
        [pb.Frame(kind=pb.FRAME_KIND_TENSOR, chunks=1, header=h).SerializeToString()]
        for h in (_NO_STRIDES, _UNALLOCATABLE, _MANY_DIMS)
    ),
    [
        pb.Frame(
            kind=pb.FRAME_KIND_OBJECT,
            chunks=1,
            value=pb.Value(tensor_value=pb.InlineTensor(header=_NO_STRIDES)),
        ).SerializeToString()
    ],
]
"""Streams the fuzzing found to break the receiver once, checked on every run."""


def _regressions(test: Callable[..., None]) -> Callable[..., None]:
    for frames in REGRESSIONS:
        test = example(frames=frames)(test)
    return test


# -- the tests ------------------------------------------------------------------------------------


@SETTINGS
@given(frames=streams())
@_regressions
def test_receiving_any_frames_raises_only_protocol_errors(frames: list[bytes]) -> None:
    """What the servicer does with each frame, without the network and its costs."""
    assembler = framing.Assembler()
    try:
        for raw in frames:
            wire = framing.parse_frame(raw)  # never raises
            if wire.error:
                raise ProtocolError(wire.error)
            if wire.frame.kind == pb.FRAME_KIND_CLOSE:
                assembler.finish()
            if wire.frame.kind in (pb.FRAME_KIND_CLOSE, pb.FRAME_KIND_ABORT):
                break
            message = assembler.feed(wire.frame, wire.data)
            assert message is None or message.seq == assembler.next_seq - 1
    except ProtocolError as exc:
        assert str(exc)


@pytest.fixture
def party0(tmp_path: Path) -> Iterator[tuple[Party0, Rank1Server, str, dict[str, TLSFiles]]]:
    """Party 0 in its own process, rank 1's server here, and the TLS files to call party 0 as
    rank 1 ("rank1") or as an impostor with rank 0's certificate ("impostor")."""
    files = make_pki(tmp_path / "pki", NAMES)
    pki = {name: TLSFiles(**paths) for name, paths in files.items()}
    peers = [f"127.0.0.1:{port}" for port in free_ports(len(NAMES))]
    rank1 = Rank1Server(peers[1], pki["party1"])
    out = tmp_path / "party0"
    process = mp.get_context("spawn").Process(
        target=_party0, args=(files["party0"], peers, str(out), CONNECT_TIMEOUT_S), daemon=True
    )
    process.start()
    party = Party0(process, out)
    try:
        yield party, rank1, peers[0], {"rank1": pki["party1"], "impostor": pki["party0"]}
    finally:
        process.kill()
        process.join(10)
        rank1.stop()


_PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_every_data_plane_reply_is_a_proper_status(
    party0: tuple[Party0, Rank1Server, str, dict[str, TLSFiles]],
) -> None:
    party, rank1, address, tls = party0
    try:
        _fuzz(party, rank1, address, tls)
    except _Broken as exc:
        pytest.fail(str(exc))


def _fuzz(party: Party0, rank1: Rank1Server, address: str, tls: dict[str, TLSFiles]) -> None:
    rank1.wait_started(_session(0), party)
    log = LogReader(party.log)
    channels = {who: _channel(address, files) for who, files in tls.items()}
    valid_hello = pb.HelloRequest(session_id=_session(0), rank=1, world_size=len(NAMES))
    answer = pb.HelloReply(session_id=_session(0), rank=0, world_size=len(NAMES))

    def refused_once(what: str, reply: Reply, proper: bool) -> None:
        records = log.new_records()
        assert proper, f"{what} -> {reply.code.name}: {reply.details}"
        assert reply.details, f"{what} -> {reply.code.name} without a message"
        assert len(records) == 1, f"{what} -> {reply.code.name}, logged {len(records)}x: {records}"

    # Hello: random and mutated requests, as rank 1 and as an impostor.
    @SETTINGS
    @given(payload=payloads(valid_hello), who=st.sampled_from(["rank1", "impostor"]))
    def hello(payload: Any, who: str) -> None:
        data = (
            payload
            if isinstance(payload, bytes)
            else mutate(valid_hello.SerializeToString(), *payload)
        )
        reply = _hello(channels[who], data)
        what = f"Hello({data!r}) as {who}"
        if reply.code == grpc.StatusCode.OK:
            assert reply.message == answer, f"{what} -> {reply.message}"
            assert not log.new_records(), f"{what} succeeded but logged"
            return
        undecodable = reply.code == grpc.StatusCode.INTERNAL and reply.details == UNDECODABLE
        refused_once(what, reply, reply.code in REFUSED or undecodable)

    hello()

    # Stream: a wrong or missing session or rank, or the wrong certificate; refused before any
    # frame is read, and the session goes on.
    @SETTINGS
    @given(
        session=st.one_of(st.none(), st.just(_session(0)), st.just(_session(1)), _PRINTABLE),
        rank=st.one_of(st.none(), st.integers(-(2**70), 2**70).map(str), _PRINTABLE),
        who=st.sampled_from(["rank1", "impostor"]),
        frames=st.lists(st.binary(max_size=32), max_size=2),
    )
    def stream_refused(
        session: str | None, rank: str | None, who: str, frames: list[bytes]
    ) -> None:
        if who == "rank1" and session == _session(0) and _as_int(rank) == 1:
            rank = "0"  # the one stream that would join the session
        reply = _stream(channels[who], frames, _metadata(session, rank))
        what = f"Stream(session={session!r}, rank={rank!r}) as {who}"
        refused_once(what, reply, reply.code in REFUSED)

    stream_refused()
    reply = _hello(channels["rank1"], valid_hello.SerializeToString())
    assert reply.message == answer, f"session {_session(0)} suffered: {reply}"
    assert not log.new_records()

    # Stream in a live session: each case is a new session of party 0.
    index = 0

    def in_session(what: str, send: Callable[[grpc.Channel, str], Reply]) -> dict[str, Any]:
        """`send` a stream in party 0's current session; returns how the session ended."""
        nonlocal index
        session = _session(index)
        channel = _channel(address, tls["rank1"])
        what = f"{what} in session {session}"
        try:
            reply = send(channel, session)
            what = f"{what} -> {reply.code.name}: {reply.details}"
            after = _hello(channel, _hello_request(session))
            if after.code != grpc.StatusCode.OK:
                assert after.code in ENDED, f"{what}; then Hello -> {after}"
                assert after.details, f"{what}; then Hello -> {after.code.name} without a message"
        except AssertionError as exc:
            what = str(exc)
            raise
        finally:
            channel.close()
            # Even after a failed check: the next case needs party 0's next session.
            try:
                rank1.wait_started(_session(index + 1), party)
            except _Broken as exc:
                raise _Broken(f"{what}\n{exc}") from None
            index += 1
        ended = party.outcome(index - 1)
        assert ended["transport_error"], f"{what}: party 0 ended with {ended}"
        assert "rank 1 ('party1'" in ended["message"], f"{what}: party 0 ended with {ended}"
        if reply.code == grpc.StatusCode.INVALID_ARGUMENT:
            assert ended["type"] == "ProtocolError", f"{what}: party 0 ended with {ended}"
        logged = party.failures_logged(index - 1)
        assert logged == 1, f"{what}: party 0 logged the failure {logged} times"
        return ended

    def stream(
        frames: list[bytes], proper: set[grpc.StatusCode]
    ) -> Callable[[grpc.Channel, str], Reply]:
        def send(channel: grpc.Channel, session: str) -> Reply:
            reply = _stream(channel, frames, _metadata(session, "1"))
            what = f"Stream({_show(frames)}) -> {reply.code.name}: {reply.details}"
            assert reply.code in proper | {grpc.StatusCode.OK}, what
            assert reply.code == grpc.StatusCode.OK or reply.details, f"{what} without a message"
            return reply

        return send

    # A frame over the size limit: gRPC refuses it before party 0's code sees it, and party 0
    # ending the session may overtake that refusal.
    limit = options.max_message_bytes(options.CHUNK_BYTES)
    oversized = b"\0" * (limit + 1)
    ended = in_session(
        "an oversized frame",
        stream([oversized], {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}),
    )
    assert ended["type"] == "PeerFailedError" and f"larger than {limit}" in ended["message"]

    # A tensor message cut short by the end of the stream.
    cut = framing.tensor_frames(0, pb.OP_SEND, torch.zeros(4, dtype=torch.int64), 8)[:2]
    cut.append(framing.control_frame(1, pb.FRAME_KIND_CLOSE))
    ended = in_session("a cut message", stream(cut, {grpc.StatusCode.INVALID_ARGUMENT}))
    assert ended["type"] == "ProtocolError" and "closed inside message 0" in ended["message"]

    # A second stream from rank 1 in the same session.
    def twice(channel: grpc.Channel, session: str) -> Reply:
        gate = threading.Event()

        def gated() -> Iterator[bytes]:
            gate.wait(RPC_TIMEOUT_S)
            yield framing.control_frame(0, pb.FRAME_KIND_CLOSE)

        call = channel.stream_unary(STREAM_METHOD, None, pb.StreamSummary.FromString)
        first, second = (
            call.future(gated(), metadata=_metadata(session, "1"), timeout=RPC_TIMEOUT_S)
            for _ in range(2)
        )
        deadline = time.monotonic() + RPC_TIMEOUT_S
        while not (first.done() or second.done()) and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        refused, other = (first, second) if first.done() else (second, first)
        reply = _call(refused.result)
        records = [r for r in log.new_records() if "ALREADY_EXISTS" in r]
        assert reply.code == grpc.StatusCode.ALREADY_EXISTS and reply.details, reply
        assert len(records) == 1, f"{reply} logged {len(records)}x: {records}"
        return _call(other.result)

    assert in_session("two streams", twice)["type"] == "PeerFailedError"

    @SETTINGS
    @given(frames=streams())
    @_regressions
    def stream_in_session(frames: list[bytes]) -> None:
        in_session("random frames", stream(frames, STREAM_FAILED))

    stream_in_session()

    reply = _hello(channels["rank1"], _hello_request(_session(index)))
    answer = pb.HelloReply(session_id=_session(index), rank=0, world_size=len(NAMES))
    assert reply.message == answer, f"party 0 no longer answers: {reply}"
    assert party.process.is_alive()
    for channel in channels.values():
        channel.close()
