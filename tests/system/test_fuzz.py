"""Random and mutated requests at every gRPC method of the coordinator and the dealer.

Each reply must be a proper status (or a success) within a deadline, and afterwards every
daemon is still alive and answering. `MPCML_FUZZ_CASES` sets how many cases per method
(default 300; a few thousand in all).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from mpcml.demo.cluster import LocalCluster
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import dealer_pb2 as dpb
from mpcml.transport.serving import channel
from mpcml.transport.tls import TLSFiles
from tests.support.fuzz import CASES, PROPER, UNDECODABLE
from tests.support.fuzz import mutate as _mutate
from tests.support.fuzz import payloads as _payloads

DEADLINE_S = 60.0
"""Long enough for the largest request a daemon serves: a dealer tuple of 2^26 elements (which
a mutated size can ask for) takes about 9 s to draw on one idle core of a CI machine."""

pytestmark = pytest.mark.system

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
    (
        "Dealer",
        "Corrections",
        dpb.TupleBatch(
            requests=[
                dpb.TupleRequest(session_id="fuzz", seq=s, kind=dpb.SQUARE, size0=[3])
                for s in (0, 1)
            ]
        ),
        "alice",
    ),
    ("Dealer", "Close", dpb.CloseRequest(session_id="fuzz"), "alice"),
]


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
                call(data, timeout=DEADLINE_S)
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
