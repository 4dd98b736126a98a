"""Identity and policy on every control channel, against the live coordinator and parties.

Each refusal comes with a message saying why: the client refuses a bad certificate of its own
before connecting, and the coordinator refuses the same certificate when that check is skipped.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from torch import nn

from mpcml.api.client import Client, ClientError
from mpcml.api.job import Job
from mpcml.demo import models
from mpcml.demo.cluster import LocalCluster
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.security import certs
from mpcml.transport.serving import channel
from mpcml.transport.tls import TLSFiles
from tests.system.conftest import ADMIN, audit_entries

pytestmark = pytest.mark.system
SHARES_CLUSTER = True
"""Only submits jobs and reads their own results: runs on the session's shared cluster."""

TRAIN = {
    "features": {"alice": "bc-train", "bob": "bc-train"},
    "labels": {"carol": "bc-train-labels"},
    "align_on": "id",
}


def _tls(cluster: LocalCluster, name: str, ca_dir: Path | None = None) -> TLSFiles:
    ca_dir = ca_dir or cluster.certs
    return TLSFiles(cluster.certs / "ca.pem", ca_dir / f"{name}.pem", ca_dir / f"{name}.key")


def _raw_call(cluster: LocalCluster, tls: TLSFiles) -> grpc.RpcError:
    """ListJobs with `tls` and no client-side checks; returns the error the coordinator gave."""
    with channel(cluster.coordinator_address, tls, "coordinator") as ch:
        try:
            cgrpc.CoordinatorStub(ch).ListJobs(cpb.ListJobsRequest(), timeout=10)
        except grpc.RpcError as exc:
            return exc
    raise AssertionError("the coordinator answered")


def test_a_party_certificate_cannot_submit_jobs(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="has role 'party'; this needs a 'client' certificate"):
        Client(cluster.coordinator_address, _tls(cluster, "alice"))
    error = _raw_call(cluster, _tls(cluster, "alice"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "certificate 'alice' has role 'party'" in (error.details() or "")


def test_a_party_cannot_register_under_another_partys_name(cluster: LocalCluster) -> None:
    with channel(cluster.coordinator_address, _tls(cluster, "bob"), "coordinator") as ch:
        stream = cgrpc.PartyControlStub(ch).Attach(
            cpb.AttachRequest(party="alice", data_address="127.0.0.1:1"), timeout=10
        )
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stream))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "certificate names 'bob', the request claims 'alice'" in (info.value.details() or "")


def test_a_certificate_from_another_ca_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    certs.init_ca(tmp_path, name="rogue-ca")
    certs.issue(tmp_path, "analyst", role="client")
    rogue = _tls(cluster, "analyst", tmp_path)
    with pytest.raises(ValueError, match="is not issued by the CA"):
        Client(cluster.coordinator_address, rogue)
    assert _raw_call(cluster, rogue).code() == grpc.StatusCode.UNAVAILABLE


def test_an_expired_certificate_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    certs.issue(
        cluster.certs, "old-analyst", role="client", days=1, not_before=long_ago, out=tmp_path
    )
    old = _tls(cluster, "old-analyst", tmp_path)
    with pytest.raises(ValueError, match="expired on"):
        Client(cluster.coordinator_address, old)
    assert _raw_call(cluster, old).code() == grpc.StatusCode.UNAVAILABLE


def test_jobs_a_partys_policy_forbids_are_refused_before_any_data_is_read(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    certs.issue(cluster.certs, "eve", role="client", out=tmp_path)
    eve = Client(cluster.coordinator_address, _tls(cluster, "eve", tmp_path))
    logs = {p: (cluster.logs / f"{p}.log").read_text().count("worker") for p in cluster.parties}
    before = len(client.jobs())
    since = time.time()
    refused = {
        "policy.submitters does not list 'eve'": (
            eve,
            Job.train(model=models.LogisticRegression(), **TRAIN),  # type: ignore[arg-type]
        ),
        "party 'bob' refuses the job: policy.datasets does not allow 'bc-test-positional'": (
            client,
            Job.infer(
                from_job="",
                model=models.LogisticRegression(),
                weights={"alice": "logreg"},
                features={"alice": "bc-test", "bob": "bc-test-positional"},
            ),
        ),
        "party 'alice' refuses the job: predictions computed from its dataset 'bc-test' would "
        "reach 'bob', and policy.outputs_to does not name 'bob' for predictions": (
            client,
            Job.infer(
                model=nn.Sequential(nn.Flatten(), nn.ReLU()),
                weights={"bob": "digits-mlp"},
                features={"alice": "bc-test"},
                reveal={"predictions": ["bob"]},
            ),
        ),
    }
    for message, (who, job) in refused.items():
        with pytest.raises(ClientError) as info:
            who.submit(job)
        if info.value.code.name == "INVALID_ARGUMENT":
            pytest.fail(f"refused for another reason: {info.value.message}")
        assert info.value.code == grpc.StatusCode.PERMISSION_DENIED, info.value
        assert message in info.value.message, info.value.message
    assert len(client.jobs()) == before
    assert logs == {
        p: (cluster.logs / f"{p}.log").read_text().count("worker") for p in cluster.parties
    }
    # each refusal is an entry of the refusing party's audit log, naming the rule
    for message in refused:
        party, _, rule = message.partition(" refuses the job: ")
        parties = [party.split("'")[1]] if rule else cluster.parties  # eve: whoever vetted
        rules = [
            e["rule"] for p in parties for e in audit_entries(cluster, p, since) if "rule" in e
        ]
        assert (rule or message) in rules, (parties, rules)


def _refused(client: Client, job: Job) -> str:
    """The PERMISSION_DENIED message a submission got."""
    with pytest.raises(ClientError) as info:
        client.submit(job)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED, info.value
    return info.value.message


BOB_TO_ALICE = (
    "party 'bob' refuses the job: predictions computed from its dataset 'bc-test' would reach "
    "'alice', and policy.outputs_to does not name 'alice' for predictions"
)


def test_near_identity_models_trained_on_bobs_rows_cannot_carry_them_to_alice(
    cluster: LocalCluster, client: Client
) -> None:
    """The reported attack and its public-seed variant: a model that is (nearly) the identity,
    or invertible by whoever knows its seed, is trained with a tiny learning rate on bob's
    columns (the weights stay shared, nothing leaves), then run on bob's test rows with the
    predictions revealed to alice, whom bob's policy does not name."""
    routes = {
        "batchnorm": nn.Sequential(nn.BatchNorm1d(15, momentum=0.0)),
        "public-seed linear": nn.Sequential(nn.Linear(15, 15)),
    }
    trains = {
        name: client.submit(
            Job.train(
                model=model,
                features={"bob": "bc-train"},
                labels={"alice": "bc-train"},
                align_on="id",
                loss="mse",
                lr=1e-6,
                epochs=1,
                seed=1,
            )
        )
        for name, model in routes.items()
    }
    for name, train in trains.items():
        status = train.wait(timeout=240)
        assert status.state == cpb.COMPLETED, (name, status.reason)
    # The route is real: revealed to bob himself (always allowed), the predictions of the
    # BatchNorm model are bob's raw test rows, what alice would have received.
    own = client.submit(
        Job.infer(
            from_job=trains["batchnorm"].id,
            features={"bob": "bc-test"},
            align_on="id",
            reveal={"predictions": ["bob"]},
        )
    )
    assert own.wait(timeout=120).state == cpb.COMPLETED
    [output] = own.result().outputs
    with np.load(output.path) as npz:
        predictions, ids = npz["predictions"], npz["ids"]
    raw = np.loadtxt(
        cluster.parties_dir / "bob" / "data" / "bc_test.csv", delimiter=",", skiprows=1
    )
    assert np.array_equal(ids.astype(np.float64), raw[:, 0]) and predictions.shape == (114, 15)
    assert np.abs(predictions - raw[:, 1:]).max() < 0.02
    before = len(client.jobs())
    for name, train in trains.items():
        infer = Job.infer(
            from_job=train.id,
            features={"bob": "bc-test"},
            align_on="id",
            reveal={"predictions": ["alice"]},
        )
        assert _refused(client, infer) == BOB_TO_ALICE, name
        # bob binds nothing here, but the model was trained on his rows
        infer = Job.infer(
            from_job=train.id,
            features={"alice": "bc-test"},
            align_on="id",
            reveal={"predictions": ["alice"]},
        )
        message = _refused(client, infer)
        assert "party 'bob' refuses the job: predictions computed from its dataset 'bc-train' " in (
            message
        ), message
    assert len(client.jobs()) == before


def test_a_private_model_on_bobs_rows_cannot_reveal_them_to_alice(client: Client) -> None:
    """alice's private model copies its inputs; run on bob's rows, its predictions would be
    bob's raw values."""
    job = Job.infer(
        model=nn.Sequential(nn.Linear(15, 15)),
        weights={"alice": "identity"},
        features={"bob": "bc-test"},
        reveal={"predictions": ["alice"]},
    )
    assert _refused(client, job) == BOB_TO_ALICE


def _mallory(cluster: LocalCluster, tmp_path: Path, name: str = "mallory") -> Client:
    certs.issue(cluster.certs, name, role="client", out=tmp_path)
    return Client(cluster.coordinator_address, _tls(cluster, name, tmp_path))


def test_a_job_belongs_to_its_submitter(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    """Another client cannot cancel, resume, read or watch the analyst's job, nor use its
    model; an admin may; a party of the job may read its status."""
    job = client.submit(
        Job.infer(
            model=models.DigitsMLP(),
            weights={"bob": "digits-mlp"},
            features={"alice": "digits-test"},
            reveal={"predictions": ["alice"]},
        )
    )
    mallory = _mallory(cluster, tmp_path)
    theirs = mallory.job(job.id)
    denied = f"job {job.id} belongs to another submitter: only its submitter or an admin"
    verbs: dict[str, Callable[[], object]] = {
        "cancel": theirs.cancel,
        "resume": theirs.resume,
        "result": theirs.result,
        "status": theirs.status,
        "watch": lambda: list(theirs.watch()),
    }
    for verb, call in verbs.items():
        with pytest.raises(ClientError) as info:
            call()
        assert info.value.code == grpc.StatusCode.PERMISSION_DENIED, (verb, info.value)
        assert denied in info.value.message, (verb, info.value.message)
    assert mallory.jobs() == []
    message = _refused(mallory, Job.infer(from_job=job.id, features={"alice": "digits-test"}))
    assert f"job {job.id} belongs to another submitter" in message
    cancel = subprocess.run(
        [sys.executable, "-m", "mpcml.cli.main", "job", "cancel", job.id],
        env={
            **os.environ,
            "MPCML_COORDINATOR": cluster.coordinator_address,
            "MPCML_CA": str(cluster.certs / "ca.pem"),
            "MPCML_CERT": str(tmp_path / "mallory.pem"),
            "MPCML_KEY": str(tmp_path / "mallory.key"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cancel.returncode == 2 and "PERMISSION_DENIED" in cancel.stderr, cancel.stderr
    assert job.wait(timeout=120).state == cpb.COMPLETED  # nobody cancelled it

    admin = _mallory(cluster, tmp_path, ADMIN).job(job.id)
    assert admin.status().submitter == "analyst" and admin.result().outputs
    with pytest.raises(ClientError, match=r"FAILED_PRECONDITION.*already ended"):
        admin.cancel()  # allowed, but too late
    assert job.id in {j.job_id for j in _mallory(cluster, tmp_path, ADMIN).jobs()}

    with channel(cluster.coordinator_address, _tls(cluster, "alice"), "coordinator") as ch:
        stub = cgrpc.CoordinatorStub(ch)
        status = stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=10)
        assert status.state == cpb.COMPLETED and status.graph_digest.startswith("sha256:")
    carol = channel(cluster.coordinator_address, _tls(cluster, "carol"), "coordinator")
    with carol as ch, pytest.raises(grpc.RpcError) as error:
        cgrpc.CoordinatorStub(ch).GetJob(cpb.GetJobRequest(job_id=job.id), timeout=10)
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"party 'carol' is not a party of job {job.id}" in (error.value.details() or "")


def test_only_jobs_on_the_insecure_provider_carry_its_warning(client: Client) -> None:
    job = Job.infer(
        model=models.DigitsMLP(),
        weights={"bob": "digits-mlp"},
        features={"alice": "digits-test"},
        reveal={"predictions": ["alice"]},
    )
    secure = client.submit(job)
    assert not secure.status().warnings
    assert secure.wait(timeout=120).state == cpb.COMPLETED
    tfp = client.submit(job.with_insecure_provider("tfp"))
    assert any("TFP" in w for w in tfp.status().warnings)
    assert tfp.wait(timeout=120).state == cpb.COMPLETED


def test_insecure_daemons_say_so_on_start(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('listen = "127.0.0.1:0"\nstore = "c.db"\n')
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpcml.cli.main",
            "coordinator",
            "--config",
            str(config),
            "--insecure",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stderr is not None
        first = daemon.stderr.readline()
        assert "WARNING: --insecure: plaintext gRPC with no authentication" in first
    finally:
        daemon.terminate()
        daemon.wait(10)


def test_certs_show_prints_name_role_sans_and_expiry(cluster: LocalCluster) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mpcml.cli.main", "certs", "show", str(cluster.certs / "bob.pem")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for fragment in ("name:    bob", "role:    party", "127.0.0.1", "valid for"):
        assert fragment in out.stdout


def _data_cells(parties_dir: Path) -> set[str]:
    """Every non-trivial value of every party's data files, as written and as Python prints it."""
    cells: set[str] = set()
    for path in parties_dir.glob("*/data/*.csv"):
        for line in path.read_text().splitlines()[1:]:
            for cell in line.split(",")[1:]:  # the ids are not secret
                if len(cell.lstrip("-")) >= 8:
                    cells |= {cell, repr(float(cell))}
    return cells


def _private_key_lines(certs: Path) -> set[str]:
    """The base64 lines of every private key the cluster's CA issued."""
    return {
        line
        for path in certs.glob("*.key")
        for line in path.read_text().splitlines()
        if not line.startswith("-----")
    }


def test_no_private_key_or_data_value_in_any_log(cluster: LocalCluster, client: Client) -> None:
    """Every process of the cluster logs at DEBUG; after its jobs (this module's, those of the
    other modules sharing the cluster, and one more that trains on every party's data), no log
    carries a line of a private key or a data value."""
    job = client.submit(Job.train(model=models.LogisticRegression(), epochs=1, **TRAIN))  # type: ignore[arg-type]
    assert job.wait(timeout=240).state == cpb.COMPLETED
    keys = _private_key_lines(cluster.certs)
    cells = _data_cells(cluster.parties_dir)
    assert len(keys) > 20 and len(cells) > 10_000
    logs = {p.name: p.read_text() for p in cluster.logs.glob("*.log")}
    assert {"coordinator.log", "dealer.log", "alice.log"} <= set(logs)
    assert " DEBUG [alice worker] " in logs["alice.log"], "workers do not log at DEBUG"
    for name, text in logs.items():
        found = [k for k in keys if k in text] + [c for c in cells if c in text]
        assert not found, f"{name} carries secrets: {found[:5]}"
