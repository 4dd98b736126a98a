"""Approximation plans through the job API, with the real daemons.

An explicit plan and an "auto" plan (the tuner, run by the model's owner on its own rows) are
stored with their jobs and shown; bad plans are refused at submission with their message; and
the tuner's plan for a digits MLP and a small CNN with Tanh and Softmax is cheaper than CrypTen's
choices by the measured cost table and stays within its accuracy budget when the job really runs
under MPC.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mpcml.api.client import Client, ClientError
from mpcml.api.job import Job
from mpcml.api.tune import tune
from mpcml.demo import data, models
from mpcml.demo.cluster import LocalCluster
from mpcml.demo.run import predictions
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from tests.system.conftest import TUNABLE

pytestmark = pytest.mark.system
SHARES_CLUSTER = True
"""Only submits jobs and reads their own results: runs on the session's shared cluster."""

BUDGET = 0.02
"""The largest accuracy drop against plaintext the tuned plans may cost."""
DATASETS = {"digits-tanh": "digits-test", "digits-cnn": "digits-images"}


def _owned(cluster: LocalCluster, name: str) -> torch.nn.Module:
    """bob's model with his weights: the owner tunes it on his own rows."""
    model = TUNABLE[name]()
    path = cluster.parties_dir / "bob" / f"{name}.pt"
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def _infer(name: str, model: torch.nn.Module, **approximations: object) -> Job:
    return Job.infer(
        model=model,
        weights={"bob": name},
        features={"alice": DATASETS[name]},
        reveal={"predictions": ["alice"]},
        **approximations,  # type: ignore[arg-type]
    )


def _accuracy(client: Client, job: Job) -> tuple[float, float]:
    """The job's accuracy on alice's test images, and its seconds."""
    handle = client.submit(job)
    status = handle.wait(timeout=300)
    assert status.state == cpb.COMPLETED, status.reason
    result = handle.result()
    secure, ids = predictions(result, "alice")
    split = data.digits()
    truth = dict(zip(split.id_test.tolist(), split.y_test.tolist(), strict=True))
    labels = np.array([truth[int(i)] for i in ids])
    return float((secure.argmax(1) == labels).mean()), result.seconds


def test_explicit_and_auto_plans_are_stored_and_shown(
    cluster: LocalCluster, client: Client
) -> None:
    model = _owned(cluster, "digits-tanh")
    explicit = {"ops": {"Tanh": {"implementation": "poly", "knobs": {"degree": 7, "clip": 1}}}}
    split = data.digits()
    calibration = (torch.from_numpy(split.x_train), torch.from_numpy(split.y_train))
    jobs = {
        "explicit": _infer("digits-tanh", model, approximations=explicit),
        "auto": _infer(
            "digits-tanh", model, approximations="auto", calibration=calibration, budget=BUDGET
        ),
    }
    for source, job in jobs.items():
        handle = client.submit(job)
        status = handle.wait(timeout=300)
        assert status.state == cpb.COMPLETED, status.reason
        plan = handle.status().approximations
        assert plan.source == source and plan == job.spec.approximations
        assert handle.result().status.approximations == plan
    auto = jobs["auto"].spec.approximations
    assert set(auto.nodes) == {"tanh", "_softmax"} and all(
        e.calibrated for e in auto.nodes.values()
    )


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"nodes": {"_7": {}}}, "names node '_7', which the model lacks"),
        ({"ops": {"Tanh": {"implementation": "cubic"}}}, "tanh has no implementation 'cubic'"),
        (
            {"ops": {"Softmax": {"implementation": "treemax", "knobs": {"iterations": 30}}}},
            "knob iterations = 30 is outside",
        ),
        (
            {
                "nodes": {
                    "tanh": {
                        "implementation": "poly",
                        "knobs": {"clip": 0, "bound": 2},
                        "low": -40.0,
                        "high": 3.0,
                    }
                }
            },
            "the node's inputs range over [-40, 3] on the calibration set, outside [-2, 2]",
        ),
    ],
    ids=["unknown-node", "unknown-implementation", "knob-range", "calibrated-range"],
)
def test_bad_plans_are_refused_at_submission(
    cluster: LocalCluster, client: Client, plan: dict[str, object], message: str
) -> None:
    job = _infer("digits-tanh", models.DigitsTanhMLP(), approximations=plan)
    with pytest.raises(ClientError) as info:
        client.submit(job)
    assert info.value.code.name == "INVALID_ARGUMENT", info.value
    assert message in info.value.message, info.value.message


@pytest.mark.parametrize("name", sorted(TUNABLE))
def test_a_tuned_plan_is_cheaper_and_within_its_budget_under_mpc(
    cluster: LocalCluster, client: Client, name: str, tmp_path: Path
) -> None:
    model = _owned(cluster, name)
    split = data.digits()
    x = torch.from_numpy(split.x_train)
    if name == "digits-cnn":
        x = x.reshape(-1, 1, 8, 8)
    tuned = tune(model, x, torch.from_numpy(split.y_train), budget=BUDGET)
    print(tuned.report())
    assert tuned.seconds < tuned.crypten_seconds
    assert any(e.implementation != "crypten" for e in tuned.plan.nodes.values())
    test = torch.from_numpy(split.x_test).reshape(-1, *x.shape[1:])
    with torch.no_grad():
        plain = float((model(test).argmax(1).numpy() == split.y_test).mean())
    crypten_accuracy, crypten_seconds = _accuracy(client, _infer(name, model))
    tuned_accuracy, tuned_seconds = _accuracy(
        client, _infer(name, model, approximations=tuned.plan)
    )
    print(
        f"{name}: plaintext {plain:.4f}, CrypTen's approximations {crypten_accuracy:.4f} in "
        f"{crypten_seconds:.1f} s, tuned {tuned_accuracy:.4f} in {tuned_seconds:.1f} s"
    )
    assert plain - tuned_accuracy <= BUDGET
    assert isinstance(tuned.plan, jpb.ApproximationPlan)
