"""Random and mutated requests at every gRPC method of the coordinator and the dealer.

Each reply must be a proper status (or a success) within a deadline, and afterwards every
daemon is still alive and answering. `MPCML_FUZZ_CASES` sets how many cases per method
(default 300; a few thousand in all).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpcml.demo.cluster import LocalCluster
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import dealer_pb2 as dpb
from mpcml.transport.serving import channel
from mpcml.transport.tls import TLSFiles

CASES = int(os.environ.get("MPCML_FUZZ_CASES", "300"))
PROPER = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
}
"""What a daemon may answer to a request it cannot serve."""
UNDECODABLE = "Exception deserializing request!"
"""gRPC-python's own INTERNAL reply to bytes that are not the method's message: the handler
never runs, so no daemon code can answer otherwise."""

# (service, method, a valid request to mutate, who calls: "client" or "alice")
METHODS: list[tuple[str, str, Any, str]] = [
    ("Coordinator", "SubmitJob", cpb.SubmitJobRequest(idempotency_key="k"), "client"),
    ("Coordinator", "GetJob", cpb.GetJobRequest(job_id="f" * 32), "client"),
    ("Coordinator", "ListJobs", cpb.ListJobsRequest(state=cpb.FAILED), "client"),
    ("Coordinator", "CancelJob", cpb.CancelJobRequest(job_id="f" * 32, reason="r"), "client"),
    ("Coordinator", "ResumeJob", cpb.ResumeJobRequest(job_id="f" * 32), "client"),
    ("Coordinator", "GetResult", cpb.GetResultRequest(job_id="f" * 32), "client"),
    ("Coordinator", "ListParties", cpb.ListPartiesRequest(), "client"),
    ("PartyControl", "Heartbeat", cpb.HeartbeatRequest(party="alice"), "alice"),
    (
        "PartyControl",
        "Report",
        cpb.WorkerReport(job_id="f" * 32, party="alice", ready=cpb.Ready(rows=3)),
        "alice",
    ),
    (
        "Dealer",
        "Open",
        dpb.OpenRequest(session_id="fuzz", rank=0, parties=["alice", "bob"]),
        "alice",
    ),
    (
        "Dealer",
        "Correction",
        dpb.TupleRequest(session_id="fuzz", kind=dpb.ADDITIVE, op="mul", size0=[2], size1=[2]),
        "alice",
    ),
    ("Dealer", "Close", dpb.CloseRequest(session_id="fuzz"), "alice"),
]


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for position, value in edits:
        if out:
            out[position % len(out)] = value
    return bytes(out[:cut] if cut is not None else out)


_F = FieldDescriptor
_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    _F.TYPE_STRING: st.text(max_size=40),
    _F.TYPE_BYTES: st.binary(max_size=40),
    _F.TYPE_BOOL: st.booleans(),
    _F.TYPE_ENUM: st.integers(-5, 2**31 - 1),  # unknown values included
    _F.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    _F.TYPE_UINT64: st.integers(0, 2**64 - 1),
    _F.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    _F.TYPE_UINT32: st.integers(0, 2**32 - 1),
    _F.TYPE_DOUBLE: st.floats(allow_nan=True),
}


@st.composite
def _well_formed(draw: st.DrawFn, seed: Any) -> bytes:
    """The seed message with random values (huge, negative, unknown enums) in its scalar and
    repeated scalar fields: requests that decode, so the daemon's own checks answer."""
    message = type(seed)()
    message.CopyFrom(seed)
    for field in seed.DESCRIPTOR.fields:
        strategy = _SCALARS.get(field.type)
        if strategy is None or not draw(st.booleans()):
            continue
        if field.is_repeated:
            getattr(message, field.name)[:] = draw(st.lists(strategy, max_size=6))
        else:
            setattr(message, field.name, draw(strategy))
    return bytes(message.SerializeToString())


def _payloads(seed: Any) -> st.SearchStrategy[Any]:
    mutations = st.tuples(
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
        st.one_of(st.none(), st.integers(0, 64)),
    )
    return st.one_of(st.binary(max_size=256), mutations, _well_formed(seed), _well_formed(seed))


@pytest.mark.parametrize("service, method, seed, caller", METHODS, ids=[m[1] for m in METHODS])
def test_every_reply_is_a_proper_status(
    cluster: LocalCluster, service: str, method: str, seed: Any, caller: str
) -> None:
    certs = cluster.certs
    name = "analyst" if caller == "client" else caller
    tls = TLSFiles(certs / "ca.pem", certs / f"{name}.pem", certs / f"{name}.key")
    address, server = (
        (cluster.dealer_address, "dealer")
        if service == "Dealer"
        else (cluster.coordinator_address, "coordinator")
    )
    valid = seed.SerializeToString()
    with channel(address, tls, server) as ch:
        call: Callable[..., Any] = ch.unary_unary(f"/mpcml.v1.{service}/{method}", None, None)

        @settings(
            max_examples=CASES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(payload=_payloads(seed))
        def check(payload: Any) -> None:
            data = payload if isinstance(payload, bytes) else _mutate(valid, *payload)
            try:
                call(data, timeout=10)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                proper = code in PROPER or (
                    code == grpc.StatusCode.INTERNAL and details == UNDECODABLE
                )
                assert proper, f"{method}({data!r}) -> {code.name}: {details}"
                assert details, f"{method}({data!r}) -> {code.name} without a message"

        check()
    for process, proc in cluster.processes.items():
        assert proc.poll() is None, f"{process} died:\n{cluster.tail(process)}"
    assert {p.name for p in cluster.client.parties() if p.connected} >= set(cluster.parties)  # type: ignore[union-attr]
