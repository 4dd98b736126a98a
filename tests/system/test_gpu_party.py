"""A consortium with one GPU party: alice computes on `cuda:0`, bob and carol on the CPU.

Through the daemons, as deployed: alice's inputs, parameters, gradients, momentum and dealer
tuples are made on her device, her checkpoints and kept model cross to the host and back, and
her shares cross to bob's and carol's CPUs through host memory in the transport. Every result
is compared with plaintext PyTorch.

Two clusters: alice on a real `cuda:0` (where there is one: `scripts/gpu-check` runs it), and
alice with `cuda_emulation = true`, which runs the same code with her data on the CPU (shares in
CrypTen's `CUDALongTensor`, products in float64 blocks): what every machine can check.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mpcml.api.client import Client
from mpcml.api.job import Job
from mpcml.demo import data, models
from mpcml.demo.cluster import LocalCluster
from mpcml.demo.run import breast_cancer_task, by_id, digits_task, plaintext_train, predictions
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.system.conftest import cli, system_parties
from tests.system.test_recovery import resume_after_losing_round_3, same_checkpoints

pytestmark = pytest.mark.system

NO_CUDA = "no CUDA device on this machine: the GPU path is checked only where one is present"
EMULATED = "cuda:0 (emulated on the CPU)"
ACCURACY_POINTS = 0.01
OUTPUT_TOLERANCE = 0.05
WEIGHT_TOLERANCE = 0.02
"""One epoch of six batches: fixed-point rounding moves each weight by about 1e-3."""
HYPER = {"epochs": 1, "lr": 0.1, "momentum": 0.9, "batch_size": 60, "seed": 4}


class SmallCNN(nn.Sequential):
    """A convolution whose backward takes the grouped path (conv2d's weight gradient)."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(64, 10),
        )


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("emulated", id="cuda-emulated"),
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
        ),
    ],
)
def gpu_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalCluster, str]]:
    root = tmp_path_factory.mktemp(f"gpu-{request.param}")
    parties = system_parties(root)
    toml = parties / "alice" / "party.toml"
    setting = 'device = "cuda:0"\n'
    if request.param == "emulated":
        setting += "cuda_emulation = true\n"
    toml.write_text(toml.read_text().replace('device = "cpu"\n', setting, 1))
    with (parties / "carol" / "party.toml").open("a") as f:  # the kept model's predictions
        f.write("\n[policy.for_dataset.digits-test-labels]\n")
        f.write('outputs_to = { predictions = ["alice"] }\n')
    device = EMULATED if request.param == "emulated" else "cuda:0"
    with LocalCluster(root / "run", parties_dir=parties) as c:
        c.start()
        yield c, device


def _devices(client: Client, name: str) -> dict[str, str]:
    job = next(j for j in client.jobs() if j.name == name)
    return dict(client.job(job.job_id).result().devices)


def test_a_cnn_trains_and_infers_with_alice_on_her_gpu(
    gpu_cluster: tuple[LocalCluster, str],
) -> None:
    cluster, device = gpu_cluster
    client = cluster.client
    assert client is not None
    train = client.submit(
        Job.train(
            SmallCNN(),
            {"alice": "digits-images"},
            {"carol": "digits-test-labels"},
            align_on="id",
            loss="cross_entropy",
            reveal={"weights": ["carol"]},
            **HYPER,  # type: ignore[arg-type]
        )
    )
    status = train.wait(timeout=600)
    assert status.state == cpb.COMPLETED, status.reason
    result = train.result()
    assert dict(result.devices) == {"alice": device, "carol": "cpu"}
    shown = cli(cluster, "job", "result", train.id).stdout
    assert f"devices: alice {device}, carol cpu" in shown, shown
    [output] = result.outputs
    secure = torch.load(output.path, weights_only=True)
    digits = data.digits()
    x, y = by_id(digits.id_test, digits.x_test.reshape(-1, 1, 8, 8), digits.y_test)
    plain = SmallCNN()
    plaintext_train(plain, x, y, loss="cross_entropy", **HYPER)  # type: ignore[arg-type]
    for key, value in plain.state_dict().items():
        error = float((secure[key] - value).abs().max())
        assert error < WEIGHT_TOLERANCE, f"{key}: off by {error}"
    # The kept model, read back onto alice's device, predicts her images for her.
    infer = client.submit(
        Job.infer(
            from_job=train.id,
            features={"alice": "digits-images"},
            reveal={"predictions": ["alice"]},
        )
    )
    status = infer.wait(timeout=600)
    assert status.state == cpb.COMPLETED, status.reason
    logits, ids = predictions(infer.result(), "alice")
    assert ids.astype(np.int64).tolist() == digits.id_test.tolist()  # the file's order
    with torch.no_grad():
        expected = plain(torch.from_numpy(digits.x_test.reshape(-1, 1, 8, 8))).numpy()
    error = float(np.abs(logits - expected).max())
    assert error < 0.1, f"logits off by {error}"


def test_the_demo_tasks_match_plaintext_with_alice_on_her_gpu(
    gpu_cluster: tuple[LocalCluster, str],
) -> None:
    """On a real GPU only: emulated, the CNN job above and the resume below take the same
    paths (inputs, parameters, the kept model and checkpoints on alice's device), and the
    suite's time is short."""
    cluster, device = gpu_cluster
    if device == EMULATED:
        pytest.skip("the demo's tasks run with alice on a real cuda:0 (scripts/gpu-check)")
    client = cluster.client
    assert client is not None
    row = breast_cancer_task(client, "gpu-logreg", models.LogisticRegression(), epochs=1)
    assert abs(row.secure_accuracy - row.plaintext_accuracy) <= ACCURACY_POINTS
    assert row.max_abs_diff <= OUTPUT_TOLERANCE
    for name in ("gpu-logreg-train", "gpu-logreg-infer"):
        assert _devices(client, name) == {"alice": device, "bob": "cpu", "carol": "cpu"}
    row = digits_task(client, cluster)
    assert abs(row.secure_accuracy - row.plaintext_accuracy) <= ACCURACY_POINTS
    assert row.max_abs_diff <= OUTPUT_TOLERANCE
    assert _devices(client, "digits-private-model") == {"alice": device, "bob": "cpu"}


def test_a_checkpoint_of_alices_gpu_shares_holds_plain_cpu_tensors(
    gpu_cluster: tuple[LocalCluster, str],
) -> None:
    cluster, _ = gpu_cluster
    state = Path(cluster.workdir) / "alice" / "state"
    files = sorted([*state.rglob("checkpoint-*.pt"), *state.rglob("model.shares.pt")])
    assert files, f"alice wrote no checkpoint or kept model under {state}"
    for path in files:
        saved = torch.load(path, weights_only=True)  # a wrapper would not load here
        tensors = [t for part in ("shares", "momentum") for t in saved.get(part, {}).values()]
        assert tensors and all(t.device.type == "cpu" for t in tensors), path


def test_a_resume_reads_alices_checkpoint_back_onto_her_device_bit_for_bit(
    gpu_cluster: tuple[LocalCluster, str],
) -> None:
    """Round 3 lost after every party checkpointed it: the resumed run reads round 2's
    checkpoints (alice's onto her device) and writes round 3's again, byte for byte."""
    cluster, device = gpu_cluster
    assert cluster.client is not None
    job, lost = resume_after_losing_round_3(cluster, cluster.client)
    assert dict(job.result().devices) == {"alice": device, "bob": "cpu", "carol": "cpu"}
    same_checkpoints(cluster, job, lost)
