"""What a job may reveal, through the live daemons: issue 23's two routes are refused at submit,
naming the dataset and the rule, and their legitimate twins run and match plaintext PyTorch.

Route 1: a loss revealed per batch of one row is that row (alice's labels are 100, her private
weights select bob's column 0, so 100 - sqrt(loss) is bob's value). Route 2: bob admits the
agreed graph, and alice brings her own weights for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from mpcml.api.client import Client, ClientError
from mpcml.api.job import Job
from mpcml.demo.cluster import LocalCluster
from mpcml.demo.run import predictions
from mpcml.graph.capture import capture
from mpcml.graph.digest import graph_digest, weights_commitment
from mpcml.graph.init import initial_state
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import dealer_pb2 as dpb
from mpcml.proto.v1 import dealer_pb2_grpc as dgrpc
from tests.system.conftest import AGREED, AGREED_WEIGHTS, SELECT0

pytestmark = pytest.mark.system
SHARES_CLUSTER = True
"""Only submits jobs and reads their own results: runs on the session's shared cluster."""

DIGEST = graph_digest(capture(AGREED, (15,)))
ROUTE_1 = {
    "model": AGREED,
    "weights": {"alice": "select0"},
    "features": {"bob": "bc-train"},
    "labels": {"alice": "hundreds"},
    "align_on": "id",
    "loss": "mse",
    "lr": 1e-9,
    "reveal": {"metrics": ["alice", "coordinator"]},
}


def _bob_rows(cluster: LocalCluster, name: str = "bc_train.csv") -> np.ndarray:
    """bob's rows of a dataset in id order (the order an id-aligned job uses), id column off."""
    raw = np.loadtxt(cluster.parties_dir / "bob" / "data" / name, delimiter=",", skiprows=1)
    return raw[np.argsort(raw[:, 0], kind="stable")][:, 1:]


def _refused(client: Client, job: Job, code: grpc.StatusCode) -> str:
    before = len(client.jobs())
    with pytest.raises(ClientError) as info:
        client.submit(job)
    assert info.value.code == code, info.value
    assert len(client.jobs()) == before  # nothing stored, nothing started
    return info.value.message


def test_a_loss_over_too_few_rows_is_refused_at_submit(client: Client) -> None:
    """Route 1, and the last partial batch: each names bob's dataset, the rule and numbers."""
    per_row = Job.train(**ROUTE_1, batch_size=1, batches_per_round=1)  # type: ignore[arg-type]
    message = _refused(client, per_row, grpc.StatusCode.PERMISSION_DENIED)
    assert message == (
        "party 'bob' refuses the job: metrics computed from its dataset 'bc-train' would reach "
        "'alice' from as few as 1 of its rows (the loss of round 1 is computed from 1 of its "
        "rows (batch_size 1, batches_per_round 1, 455 rows in all)), and policy.min_rows is 32"
    )
    last = Job.train(**ROUTE_1, batch_size=64, batches_per_round=1)  # type: ignore[arg-type]
    message = _refused(client, last, grpc.StatusCode.PERMISSION_DENIED)
    assert "from as few as 7 of its rows (the loss of round 8 is computed from 7" in message


def test_a_loss_over_at_least_min_rows_rows_is_revealed(
    cluster: LocalCluster, client: Client
) -> None:
    """The same job with one round per epoch: its loss covers all 455 of bob's rows, reaches
    alice and the coordinator, and equals plaintext PyTorch's on the same rows."""
    job = client.submit(Job.train(**ROUTE_1, batch_size=64))  # type: ignore[arg-type]
    status = job.wait(timeout=240)
    assert status.state == cpb.COMPLETED, status.reason
    x = torch.from_numpy(_bob_rows(cluster)).float()
    model = nn.Sequential(nn.Linear(15, 1))
    model.load_state_dict(SELECT0)
    with torch.no_grad():
        batches = [(model(x[i : i + 64]) - 100).square().mean() for i in range(0, len(x), 64)]
    plain = float(torch.stack(batches).mean())
    assert status.metrics["loss"] == pytest.approx(plain, rel=1e-3)
    [metrics] = [o for o in job.result().outputs if o.party == "alice"]
    [line] = Path(metrics.path).read_text().splitlines()
    assert json.loads(line)["loss"] == pytest.approx(plain, rel=1e-3)


def test_the_agreed_graph_with_another_partys_weights_is_refused(
    cluster: LocalCluster, client: Client
) -> None:
    """Route 2: the digest matches bob's allow-list, the weights are alice's own."""
    attack = Job.infer(
        model=AGREED,
        weights={"alice": "select0"},
        features={"bob": "bc-agreed"},
        align_on="id",
        reveal={"predictions": ["alice"]},
    )
    message = _refused(client, attack, grpc.StatusCode.PERMISSION_DENIED)
    select0 = weights_commitment(SELECT0)
    agreed = weights_commitment(AGREED_WEIGHTS)
    assert message == (
        f"party 'bob' refuses the job: its dataset 'bc-agreed' may meet the model {DIGEST} "
        f"only as policy.for_dataset.bc-agreed.graphs admits it ({DIGEST} with weights trained "
        f"from the job's seed; {DIGEST} with alice's model 'agreed' ({agreed})), and the job "
        f"brings alice's model 'select0' ({select0})"
    )
    # The route is real: on bob's bc-train (any graph admitted), revealed to bob himself, the
    # same job gives back bob's column 0.
    own = client.submit(
        Job.infer(
            model=AGREED,
            weights={"alice": "select0"},
            features={"bob": "bc-train"},
            align_on="id",
            reveal={"predictions": ["bob"]},
        )
    )
    assert own.wait(timeout=120).state == cpb.COMPLETED
    values, _ = predictions(own.result(), "bob")
    assert np.abs(values[:, 0] - _bob_rows(cluster)[:, 0]).max() < 1e-3


def test_the_agreed_model_with_committed_weights_runs_until_they_change(
    cluster: LocalCluster, client: Client
) -> None:
    job = Job.infer(
        model=AGREED,
        weights={"alice": "agreed"},
        features={"bob": "bc-agreed"},
        align_on="id",
        reveal={"predictions": ["alice"]},
    )
    done = client.submit(job)
    assert done.wait(timeout=120).state == cpb.COMPLETED
    values, _ = predictions(done.result(), "alice")
    model = nn.Sequential(nn.Linear(15, 1))
    model.load_state_dict(AGREED_WEIGHTS)
    with torch.no_grad():
        plain = model(torch.from_numpy(_bob_rows(cluster, "agreed.csv")).float()).numpy()
    assert np.abs(values - plain).max() < 1e-3
    # alice's weights change on disk after bob approved them: alice herself refuses to share
    # them (the coordinator still has the commitment she registered).
    path = cluster.parties_dir / "alice" / "agreed.pt"
    saved = path.read_bytes()
    try:
        torch.save({k: v + 1 for k, v in AGREED_WEIGHTS.items()}, path)
        message = _refused(client, job, grpc.StatusCode.PERMISSION_DENIED)
        assert message == (
            "party 'alice' refuses the job: model 'agreed' no longer matches the commitment "
            f"{weights_commitment(AGREED_WEIGHTS)} the job names: its weights changed after "
            "the job was submitted"
        )
    finally:
        path.write_bytes(saved)


def _plain_mse(x: np.ndarray, epochs: int, lr: float, seed: int) -> nn.Module:
    """Plaintext SGD on the MSE to labels of 100, batches of 64 in row order."""
    model = nn.Sequential(nn.Linear(15, 1))
    model.load_state_dict(initial_state(capture(model, (15,)), seed))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xt = torch.from_numpy(x).float()
    for _ in range(epochs):
        for i in range(0, len(xt), 64):
            loss = (model(xt[i : i + 64]) - 100).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def test_weights_trained_from_the_seed_on_bobs_rows_reveal_predictions_where_allowed(
    cluster: LocalCluster, client: Client
) -> None:
    """Trained in two jobs (the second goes on from the first, with no model given), then run
    on bob's rows with the predictions to alice: what bob's entry for the graph admits."""
    train = {
        "features": {"bob": "bc-agreed"},
        "labels": {"alice": "hundreds"},
        "align_on": "id",
        "loss": "mse",
        "lr": 0.01,
    }
    first = client.submit(Job.train(model=AGREED, seed=4, **train))  # type: ignore[arg-type]
    assert first.wait(timeout=240).state == cpb.COMPLETED
    # What each party keeps of the model (and checkpoints) is a share: alone it says nothing,
    # together the shares are the trained weights.
    x = _bob_rows(cluster, "agreed.csv")
    one_epoch = _plain_mse(x, epochs=1, lr=0.01, seed=4).state_dict()["0.weight"]
    kept = [
        torch.load(
            cluster.workdir / p / "state" / "jobs" / first.id / "model.shares.pt", weights_only=True
        )["shares"]["0.weight"]
        for p in ("bob", "alice")
    ]
    together = (kept[0] + kept[1]).double() / 2**16
    assert torch.allclose(together.float(), one_epoch, atol=0.01)
    for share in kept:
        assert (share.double() / 2**16 - one_epoch).abs().min() > 1.0
    second = client.submit(Job.train(from_job=first.id, **train))  # type: ignore[arg-type]
    assert second.wait(timeout=240).state == cpb.COMPLETED
    infer = client.submit(
        Job.infer(
            from_job=second.id,
            features={"bob": "bc-agreed"},
            align_on="id",
            reveal={"predictions": ["alice"]},
        )
    )
    status = infer.wait(timeout=120)
    assert status.state == cpb.COMPLETED, status.reason
    values, _ = predictions(infer.result(), "alice")
    trained = _plain_mse(x, epochs=2, lr=0.01, seed=4)
    with torch.no_grad():
        plain = trained(torch.from_numpy(x).float()).numpy()
    assert np.abs(values - plain).max() < 0.05, np.abs(values - plain).max()


def test_a_private_model_whose_keys_do_not_fit_the_graph_is_refused_at_submit(
    client: Client,
) -> None:
    job = Job.infer(
        model=AGREED,
        weights={"alice": "bare-linear"},
        features={"bob": "bc-agreed"},
        reveal={"predictions": ["alice"]},
    )
    message = _refused(client, job, grpc.StatusCode.INVALID_ARGUMENT)
    assert message == (
        "model 'bare-linear' of party 'alice' does not fit the job's graph: it lacks 0.bias, "
        "0.weight; it has keys the graph does not use: bias, weight"
    )


def test_the_cli_shows_each_models_commitment(cluster: LocalCluster) -> None:
    tls = cluster.client_tls()
    assert tls is not None
    out = subprocess.run(
        [sys.executable, "-m", "mpcml.cli.main", "job", "parties"],
        env={
            **os.environ,
            "MPCML_COORDINATOR": cluster.coordinator_address,
            "MPCML_CA": str(tls.ca),
            "MPCML_CERT": str(tls.cert),
            "MPCML_KEY": str(tls.key),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"  model agreed: {weights_commitment(AGREED_WEIGHTS)}" in out.stdout


def test_the_dealer_checks_who_calls_before_it_reads_the_request(cluster: LocalCluster) -> None:
    """A client certificate learns nothing from the dealer: not that a request is malformed,
    not whether a session exists."""
    from mpcml.transport.serving import channel

    with channel(cluster.dealer_address, cluster.client_tls(), "dealer") as ch:
        stub = dgrpc.DealerStub(ch)
        calls: dict[str, Callable[[], object]] = {
            "Open": lambda: stub.Open(dpb.OpenRequest(), timeout=10),
            "Correction": lambda: stub.Correction(dpb.TupleRequest(session_id="x"), timeout=10),
            "Close": lambda: stub.Close(dpb.CloseRequest(session_id="x"), timeout=10),
        }
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            assert "role 'client'" in (info.value.details() or ""), info.value.details()
