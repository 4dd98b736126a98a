"""A party's data-plane server answers grpc.health.v1 and server reflection."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mpcml.transport import options
from mpcml.transport.tls import TLSFiles, channel_credentials
from tests.support.parties import Parties, party_specs, start_looping

pytestmark = pytest.mark.system


def test_party_server_reports_serving_and_lists_its_services(tmp_path: Path) -> None:
    specs = party_specs(tmp_path, 2, "tests.transport.scenarios:loop_until_killed")
    parties = Parties(tmp_path)
    try:
        start_looping(tmp_path, parties, specs)
        assert specs[1].tls is not None
        with grpc.secure_channel(
            specs[0].peers[0],
            channel_credentials(TLSFiles(**specs[1].tls)),
            options=options.channel_options(options.CHUNK_BYTES, "party0"),
        ) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "mpcml.v1.DataPlane"):
                reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            [answer] = list(
                reflect.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
                )
            )
            names = {s.name for s in answer.list_services_response.service}
    finally:
        parties.kill_all()
    assert {"mpcml.v1.DataPlane", "grpc.health.v1.Health"} <= names
