"""What a vertical job on customer lists puts on the wire: no id in the clear.

The cluster runs over plaintext gRPC (`--insecure`) so that what crosses loopback can be read,
and every party's data plane and its link to the coordinator go through a relay that records
both directions of every connection. The gRPC messages are read out of the recorded HTTP/2
streams (so framing cannot hide an id) and searched for every id of every party's list, shared
or not, as the parties hold them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpcml.api.job import Job
from mpcml.demo import models
from mpcml.demo.cluster import LocalCluster
from mpcml.party import catalogue
from mpcml.party.config import DatasetEntry
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.support.relay import Relay, grpc_messages
from tests.system.conftest import system_parties

pytestmark = pytest.mark.system

LISTS = {"alice": "bc-mail", "carol": "bc-mail-labels"}
FILES = {"alice": "mail.csv", "carol": "mail_labels.csv"}


def _messages(relays: list[Relay]) -> list[bytes]:
    return [m for r in relays for tape in r.recorded for m in grpc_messages(bytes(tape))]


def test_no_id_crosses_the_data_plane_or_reaches_the_coordinator(tmp_path: Path) -> None:
    parties = system_parties(tmp_path)
    for party in LISTS:  # without TLS, the submitter has no certificate: it is "anonymous"
        profile = parties / party / "party.toml"
        text = profile.read_text().replace('["analyst"]', '["analyst", "anonymous"]', 1)
        profile.write_text(text)
    cluster = LocalCluster(
        tmp_path / "run", parties=["alice", "carol"], parties_dir=parties, insecure=True
    )
    data: list[Relay] = []
    control: list[Relay] = []
    for party in cluster.parties:
        data.append(Relay(cluster.data_addresses[party], record=True))
        cluster.data_routes[party] = data[-1].address
        control.append(Relay(cluster.coordinator_address, record=True))
        cluster.coordinator_routes[party] = control[-1].address
    try:
        with cluster:
            client = cluster.start()
            job = client.submit(
                Job.train(
                    model=models.LogisticRegression(15),
                    features={"alice": LISTS["alice"]},
                    labels={"carol": LISTS["carol"]},
                    align_on="id",
                    epochs=1,
                    reveal={"weights": ["carol"]},
                )
            )
            status = job.wait(timeout=240)
            assert status.state == cpb.COMPLETED, status.reason
    finally:
        for relay in data + control:
            relay.close()
    ids = {
        party: catalogue.read(
            DatasetEntry(name, parties / party / "data" / FILES[party], id_column="id")
        ).ids
        for party, name in LISTS.items()
    }
    texts = {str(t) for held in ids.values() if held is not None for t in held}
    assert len(texts) > 400
    on_the_data_plane = _messages(data)
    to_the_coordinator = _messages(control)
    # the capture holds the job: the PSI alone sends 32 bytes per id each way, and the
    # coordinator link carries the parties' registrations in the clear
    assert sum(map(len, on_the_data_plane)) > 32 * len(texts)
    assert any(b"bc-mail-labels" in m for m in to_the_coordinator)
    held = [set(map(str, t)) for t in ids.values() if t is not None]
    assert status.rows == len(held[0] & held[1])  # what the coordinator learns: the size
    for where, messages in (("data plane", on_the_data_plane), ("coordinator", to_the_coordinator)):
        wire = b"\x00".join(messages)
        leaked = sorted(t for t in texts if t.encode() in wire)
        assert not leaked, f"{len(leaked)} ids in the clear on the {where}: {leaked[:3]}"
