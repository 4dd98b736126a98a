"""Bad jobs are refused at submission, with a status code and a message naming the problem."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from mpcml.api.client import Client, ClientError
from mpcml.api.job import Job
from mpcml.demo import models
from mpcml.demo.cluster import LocalCluster
from mpcml.graph.ops import GraphError
from mpcml.proto.v1 import graph_pb2 as gpb
from mpcml.proto.v1 import job_pb2 as jpb
from tests.system.conftest import LIMITS

pytestmark = pytest.mark.system
SHARES_CLUSTER = True
"""Only submits jobs and reads their own results: runs on the session's shared cluster."""

FEATURES = {"alice": "bc-train", "bob": "bc-train"}
LABELS = {"carol": "bc-train-labels"}


def _train(**overrides: object) -> Job:
    args: dict[str, object] = {
        "model": models.LogisticRegression(),
        "features": FEATURES,
        "labels": LABELS,
        "align_on": "id",
        "input_shape": (30,),
    }
    args.update(overrides)
    return Job.train(**args)  # type: ignore[arg-type]


def _first_op(spec: jpb.JobSpec) -> gpb.Node:
    """The first node of the captured graph that is an op, not a parameter."""
    return next(n for n in spec.graph.nodes if n.op.startswith("aten."))


def _with_op(op: str) -> Job:
    job = _train()
    _first_op(job.spec).op = op
    return job


def _mutate(change: Callable[[jpb.JobSpec], None]) -> Job:
    job = _train()
    change(job.spec)
    return job


CASES = [
    (
        "unknown-party",
        _train(features={"mallory": "bc-train", "bob": "bc-train"}),
        "INVALID_ARGUMENT",
        "unknown party 'mallory'",
    ),
    (
        "not-registered",
        _train(features={"dave": "bc-train", "bob": "bc-train"}),
        "FAILED_PRECONDITION",
        "party 'dave' is not registered",
    ),
    (
        "unknown-dataset",
        _train(features={"alice": "bc-tran", "bob": "bc-train"}),
        "INVALID_ARGUMENT",
        "party 'alice' has no dataset 'bc-tran'",
    ),
    (
        "unknown-column",
        _train(features={"alice": ("bc-train", ["mean_radius", "shoe_size"]), "bob": "bc-train"}),
        "INVALID_ARGUMENT",
        "no column 'shoe_size'",
    ),
    (
        "row-mismatch",
        _train(features={"alice": "bc-train", "bob": "bc-test"}, align_on=""),  # by position
        "INVALID_ARGUMENT",
        "dataset 'bc-test' of party 'bob' has 114 rows",
    ),
    (
        "label-rows",
        _train(labels={"carol": "bc-test-labels"}, align_on=""),  # with align_on: PSI's rows
        "INVALID_ARGUMENT",
        "labels 'bc-test-labels' of party 'carol' have 114 rows",
    ),
    (
        "op-off-whitelist",
        _with_op("Hardswish"),
        "INVALID_ARGUMENT",
        "the model graph is refused: node 'permute': op 'Hardswish' is not a supported core ATen",
    ),
    (
        "unknown-setting",
        _mutate(lambda s: _first_op(s).attrs["scale"].CopyFrom(gpb.Attr(f=1e-6))),
        "INVALID_ARGUMENT",
        "node 'permute': aten.permute.default has no setting 'scale' (its settings: dims)",
    ),
    (
        "shape",
        _train(model=nn.Sequential(nn.Linear(20, 1), nn.Sigmoid()), input_shape=(20,)),
        "INVALID_ARGUMENT",
        "captured for rows of shape [20], the data's rows have shape [30]",
    ),
    (
        "reveal-outsider",
        _train(reveal={"weights": ["dave"]}),
        "INVALID_ARGUMENT",
        "revealed to 'dave', not a party of the job",
    ),
    (
        "reveal-coordinator-weights",
        _train(reveal={"weights": ["coordinator"]}),
        "INVALID_ARGUMENT",
        "only metrics may be revealed to the coordinator",
    ),
    (
        "no-loss",
        _mutate(lambda s: setattr(s.hyper, "loss", jpb.LOSS_UNSPECIFIED)),
        "INVALID_ARGUMENT",
        "names no loss",
    ),
    ("bad-lr", _train(lr=-1.0), "INVALID_ARGUMENT", "learning rate must be positive"),
    (
        "unknown-model",
        Job.infer(
            model=models.DigitsMLP(),
            weights={"bob": "digits-big"},
            features={"alice": "digits-test"},
        ),
        "INVALID_ARGUMENT",
        "party 'bob' has no model 'digits-big'",
    ),
    (
        "unknown-job",
        Job.infer(from_job="0" * 32, features=FEATURES, align_on="id"),
        "NOT_FOUND",
        "no job '00000000",
    ),
    (
        "no-task",
        _mutate(lambda s: setattr(s, "task", jpb.TASK_UNSPECIFIED)),
        "INVALID_ARGUMENT",
        "names no task",
    ),
    (
        "too-many-rows",
        _train(epochs=LIMITS["max_job_rows"] // 455 + 1),
        "RESOURCE_EXHAUSTED",
        f"over the coordinator's limit max_job_rows = {LIMITS['max_job_rows']}",
    ),
    (
        "too-large",
        _mutate(lambda s: setattr(s, "name", "x" * (LIMITS["max_message_bytes"] + 1))),
        "RESOURCE_EXHAUSTED",
        f"over this daemon's limit max_message_bytes = {LIMITS['max_message_bytes']}",
    ),
    (
        "far-too-large",  # refused by gRPC before the coordinator reads it
        _mutate(lambda s: setattr(s, "name", "x" * (3 * LIMITS["max_message_bytes"]))),
        "RESOURCE_EXHAUSTED",
        "larger than max",
    ),
]


@pytest.mark.parametrize("job, code, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_jobs_are_refused_at_submission(
    cluster: LocalCluster, client: Client, job: Job, code: str, message: str
) -> None:
    log = cluster.logs / "coordinator.log"
    line = f"refused /mpcml.v1.Coordinator/SubmitJob from analyst: {code}: "
    before, logged = len(client.jobs()), log.read_text().count(line)
    with pytest.raises(ClientError) as info:
        client.submit(job)
    assert info.value.code.name == code
    assert message in info.value.message, info.value.message
    assert len(client.jobs()) == before
    if "larger than max" not in message:  # else gRPC refused it before the coordinator saw it
        assert log.read_text().count(line) == logged + 1, "not logged exactly once"


class _Sine(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x)


def test_a_model_with_an_op_mpcml_cannot_compute_is_refused_by_name_on_the_client() -> None:
    with pytest.raises(GraphError, match=r"aten\.sin\.default has no lowering"):
        Job.infer({"bob": "bc"}, model=nn.Sequential(nn.Linear(30, 4), _Sine()), input_shape=(30,))
