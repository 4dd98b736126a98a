"""Each party's audit log records what its data did: the jobs it admitted and refused (with the
rule), the private set intersection's sizes, and every value revealed, with its recipient; the
chain verifies, and no data value or id enters it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mpcml.api.client import Client
from mpcml.api.job import Job
from mpcml.demo import models
from mpcml.demo.cluster import LocalCluster
from mpcml.party import audit
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.system.conftest import (
    REFUSED_BY_ALICE,
    audit_entries,
    mail_id,
    submit_refused_by_alice,
)

pytestmark = pytest.mark.system
SHARES_CLUSTER = True


def test_a_jobs_reveals_and_intersection_are_recorded_at_every_party(
    cluster: LocalCluster, client: Client
) -> None:
    since = time.time()
    job = client.submit(
        Job.train(
            model=models.LogisticRegression(15),
            features={"alice": "bc-mail"},
            labels={"carol": "bc-mail-labels"},
            align_on="id",
            epochs=2,
            reveal={"weights": ["carol"], "metrics": ["carol", "coordinator"]},
        )
    )
    status = job.wait(timeout=240)
    assert status.state == cpb.COMPLETED, status.reason
    for party in ("alice", "bob", "carol"):
        mine = [e for e in audit_entries(cluster, party, since) if e["job"] == job.id]
        kinds = [e["kind"] for e in mine]
        if party == "bob":  # not one of the job's parties
            assert kinds == [], kinds
            continue
        assert kinds[:2] == ["job_admitted", "job_started"], kinds
        admitted = mine[0]
        assert admitted["submitter"] == "analyst" and admitted["graph"] == status.graph_digest
        [psi] = [e for e in mine if e["kind"] == "psi"]
        assert psi["shared_rows"] == status.rows and set(psi["sizes"]) == {"alice", "carol"}
        revealed = [
            (e["what"], e["to"], e["round"], e["rows"]) for e in mine if e["kind"] == "revealed"
        ]
        assert revealed == [
            ("metrics", "carol", 1, status.rows),
            ("metrics", "coordinator", 1, status.rows),
            ("metrics", "carol", 2, status.rows),
            ("metrics", "coordinator", 2, status.rows),
            ("weights", "carol", 0, status.rows),
        ]
        text = (cluster.workdir / party / "state" / audit.FILE).read_text()
        assert mail_id(1) not in text and "@bank.example" not in text  # no id enters the log


def test_a_refused_job_leaves_its_rule_and_the_chain_verifies(
    cluster: LocalCluster, client: Client
) -> None:
    since = time.time()
    submit_refused_by_alice(client)
    [refusal] = [e for e in audit_entries(cluster, "alice", since) if e["kind"] == "job_refused"]
    assert refusal["rule"] == REFUSED_BY_ALICE and refusal["submitter"] == "analyst"
    assert refusal["datasets"] == ["bc-test"] and refusal["request"]
    for party in cluster.parties:
        path = cluster.workdir / party / "state" / audit.FILE
        run = subprocess.run(
            [sys.executable, "-m", "mpcml.cli.main", "audit", "verify", "--log", str(path)],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
