"""A peer that sends a malformed stream fails the session at once, naming that peer.

The test process plays rank 1 itself, with a valid certificate, over real gRPC and mTLS, and
writes frames no mpcml party would write.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from mpcml.proto.v1 import dataplane_pb2 as pb
from mpcml.proto.v1 import dataplane_pb2_grpc
from mpcml.transport import options
from mpcml.transport.link import STREAM_METHOD
from mpcml.transport.tls import TLSFiles, channel_credentials
from tests.support.parties import Parties, party_specs

pytestmark = pytest.mark.system

OUT_OF_ORDER = pb.Frame(
    kind=pb.FRAME_KIND_TENSOR,
    seq=5,
    op=pb.OP_SEND,
    chunks=1,
    header=pb.TensorHeader(dtype=pb.DTYPE_INT64, shape=[1], nbytes=8),
    data=b"\0" * 8,
).SerializeToString()


@pytest.mark.parametrize(
    "raw, why",
    [
        (OUT_OF_ORDER, "expected message 0"),
        (b"\xff\xff\xff\xff", "malformed frame"),
    ],
    ids=["out-of-order", "not-protobuf"],
)
def test_malformed_stream_fails_the_session_naming_the_sender(
    tmp_path: Path, raw: bytes, why: str
) -> None:
    specs = party_specs(
        tmp_path, 2, "tests.transport.scenarios:smoke", session_kwargs={"connect_timeout": 60.0}
    )
    parties = Parties(tmp_path)
    try:
        parties.start(specs[0])
        assert specs[1].tls is not None
        channel = grpc.secure_channel(
            specs[0].peers[0],
            channel_credentials(TLSFiles(**specs[1].tls)),
            options=options.channel_options(options.CHUNK_BYTES, "party0"),
        )
        stub = dataplane_pb2_grpc.DataPlaneStub(channel)
        hello = pb.HelloRequest(session_id="mpcml-session", rank=1, world_size=2)
        deadline = time.monotonic() + 60
        while True:
            try:
                stub.Hello(hello, timeout=2)
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, "party 0 never came up"
                time.sleep(0.1)
        stream = channel.stream_unary(STREAM_METHOD, None, pb.StreamSummary.FromString)
        with pytest.raises(grpc.RpcError) as refused:
            stream(
                iter([raw]),
                metadata=(("mpcml-session", "mpcml-session"), ("mpcml-rank", "1")),
                timeout=30,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert why in (refused.value.details() or "")
        # Well inside party 0's 60 s connect timeout: the failure is reported at once.
        result = parties.wait(0, timeout=30)
        channel.close()
    finally:
        parties.kill_all()
    assert not result.ok and result.error_type == "ProtocolError"
    assert "rank 1 ('party1'" in result.error and "sent a malformed stream" in result.error
    assert why in result.error
