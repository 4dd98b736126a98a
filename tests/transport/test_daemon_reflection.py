"""The coordinator and the dealer serve grpc.health.v1 and server reflection, as a
party's data plane does (test_health_and_reflection.py): a client in any language, or grpcurl,
can discover their services and message types over mutual TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mpcml.demo.cluster import LocalCluster
from mpcml.proto.v1 import coordinator_pb2, dealer_pb2
from mpcml.transport.serving import channel

pytestmark = pytest.mark.system

DAEMONS = {
    "coordinator": (coordinator_pb2.DESCRIPTOR, ["Coordinator", "PartyControl"]),
    "dealer": (dealer_pb2.DESCRIPTOR, ["Dealer"]),
}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The coordinator and the dealer as their own processes, with no parties."""
    with LocalCluster(tmp_path_factory.mktemp("daemons") / "run", parties=[]) as cluster:
        cluster.start()
        yield cluster


def _reflect(
    ch: grpc.Channel, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(ch)
    [answer] = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    return answer


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_daemon_reports_serving_and_describes_its_services_by_reflection(
    daemons: LocalCluster, daemon: str
) -> None:
    file, services = DAEMONS[daemon]
    names = [file.services_by_name[s].full_name for s in services]
    address = daemons.coordinator_address if daemon == "coordinator" else daemons.dealer_address
    with channel(address, daemons.client_tls(), daemon) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", *names):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service

        listed = _reflect(ch, reflection_pb2.ServerReflectionRequest(list_services=""))
        assert {s.name for s in listed.list_services_response.service} >= {
            *names,
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        }
        for service, name in zip(services, names, strict=True):
            found = _reflect(
                ch, reflection_pb2.ServerReflectionRequest(file_containing_symbol=name)
            )
            protos = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in found.file_descriptor_response.file_descriptor_proto
            ]
            served = next(s for p in protos for s in p.service if s.name == service)
            expected = file.services_by_name[service].methods_by_name
            assert [m.name for m in served.method] == list(expected), name
            assert Path(protos[0].name).parent == Path("mpcml/v1")
