"""A party daemon's metrics: per-peer traffic arrives as running totals from each worker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from mpcml.party.metrics import PartyMetrics
from mpcml.proto.v1 import coordinator_pb2 as cpb


def test_traffic_totals_of_several_workers_add_up_per_peer() -> None:
    registry = CollectorRegistry()
    party = PartyMetrics(registry, running=lambda: 2, heartbeat_age=lambda: 1.5)

    def sent(peer: str) -> float | None:
        return registry.get_sample_value("mpcml_party_peer_sent_bytes_total", {"peer": peer})

    def received(peer: str) -> float | None:
        return registry.get_sample_value("mpcml_party_peer_received_bytes_total", {"peer": peer})

    one = party.traffic({}, [cpb.PeerTraffic(peer="bob", bytes_sent=100, bytes_received=40)])
    one = party.traffic(
        one,
        [
            cpb.PeerTraffic(peer="bob", bytes_sent=250, bytes_received=90),
            cpb.PeerTraffic(peer="carol", bytes_sent=7, bytes_received=0),
        ],
    )
    assert one == {"bob": (250, 90), "carol": (7, 0)}
    # A second job's worker counts from zero again.
    party.traffic({}, [cpb.PeerTraffic(peer="bob", bytes_sent=10, bytes_received=5)])
    assert (sent("bob"), received("bob")) == (260, 95)
    assert (sent("carol"), received("carol")) == (7, 0)
    assert registry.get_sample_value("mpcml_party_jobs_running") == 2
    assert registry.get_sample_value("mpcml_party_heartbeat_age_seconds") == 1.5
