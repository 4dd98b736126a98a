"""Models as users have them, through the daemons: torchvision classifiers passed straight to
`Job.infer`, and a residual CNN with batch norm trained through the job API, each compared with
the same model in plaintext PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bench import zoo
from mpcml.api.client import Client
from mpcml.api.job import Job
from mpcml.demo import data
from mpcml.demo.run import by_id, plaintext_train, predictions
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.system.conftest import ZOO_MODELS, ZOO_SIZE

pytestmark = pytest.mark.system
SHARES_CLUSTER = True
"""Only submits jobs and reads their own results: runs on the session's shared cluster."""

LOGIT_TOLERANCE = 0.1
"""CrypTen's 16 fractional bits and approximations through tens of random-weight layers."""


@pytest.mark.skipif(zoo.torchvision() is None, reason="torchvision is not in .venv/zoo")
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_a_torchvision_classifier_runs_as_torchvision_builds_it(client: Client, name: str) -> None:
    model = zoo.classifier(name)
    handle = client.submit(  # captured at submission, for the shape alice registered
        Job.infer(
            {"alice": "zoo-image"},
            model=model,
            weights={"bob": f"zoo-{name}"},
            reveal={"predictions": ["alice"]},
            batch_size=1,
        )
    )
    status = handle.wait(timeout=600)
    assert status.state == cpb.COMPLETED, status.reason
    secure, _ = predictions(handle.result(), "alice")
    image = np.random.default_rng(1).standard_normal((1, 3, ZOO_SIZE, ZOO_SIZE))
    with torch.no_grad():
        plain = model(torch.from_numpy(image.astype(np.float32))).numpy()
    assert np.abs(plain).max() > 0.5, f"{name}: logits too small for the comparison to tell"
    error = float(np.abs(secure.reshape(plain.shape) - plain).max())
    assert error < LOGIT_TOLERANCE, f"{name}: logits differ by {error}"


class DigitsResNet(nn.Module):
    """A residual CNN on 1x8x8 digits: conv, batch norm, ReLU, a residual block, pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(y + self.bn2(self.conv2(y)))
        out: torch.Tensor = self.fc(self.pool(y).flatten(1))
        return out


HYPER = {"epochs": 4, "lr": 0.1, "momentum": 0.9, "batch_size": 32, "seed": 4}
"""Trained on the 360 digits test images (44 batches), scored on the 1437 training ones."""


def _accuracy(state: dict[str, torch.Tensor]) -> float:
    digits = data.digits()
    model = DigitsResNet()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(digits.x_train.reshape(-1, 1, 8, 8)))
    return float((out.argmax(1).numpy() == digits.y_train).mean())


def test_a_residual_cnn_trains_through_the_job_api_to_plaintext_accuracy(client: Client) -> None:
    handle = client.submit(
        Job.train(
            DigitsResNet(),
            {"alice": "digits-images"},
            {"carol": "digits-test-labels"},
            align_on="id",
            loss="cross_entropy",
            reveal={"weights": ["carol"]},
            **HYPER,  # type: ignore[arg-type]
        )
    )
    status = handle.wait(timeout=900)
    assert status.state == cpb.COMPLETED, status.reason
    [output] = handle.result().outputs
    secure = torch.load(output.path, weights_only=True)
    digits = data.digits()
    x, y = by_id(digits.id_test, digits.x_test.reshape(-1, 1, 8, 8), digits.y_test)
    plain = DigitsResNet().train()
    plaintext_train(plain, x, y, loss="cross_entropy", **HYPER)  # type: ignore[arg-type]
    plain_accuracy, secure_accuracy = _accuracy(plain.state_dict()), _accuracy(secure)
    assert plain_accuracy > 0.85, plain_accuracy
    # 360 training images at lr 0.1 and momentum 0.9: fixed-point noise moves the secure
    # model's accuracy by a few points from run to run (0.882 against 0.930 once, in a CI run
    # whose previous run at the same code passed). A model whose early layers do not train
    # stays near 0.78 (commit 36bb0d7), well under this bound.
    assert secure_accuracy >= plain_accuracy - 0.06, (secure_accuracy, plain_accuracy)
