"""Vertical jobs on partly overlapping customer lists: the rows every party holds are found by
private set intersection over the data plane, and the job trains on them alone.

Each party of the system cluster lacks some of the others' training rows (conftest
`PART_KEEP`); the secure result is compared with plaintext PyTorch trained on the joined rows,
ordered by id as the parties order them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpcml.api.client import Client, JobHandle
from mpcml.api.job import Job
from mpcml.demo import data, models
from mpcml.demo.cluster import LocalCluster
from mpcml.demo.run import plaintext_train
from mpcml.party import catalogue
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.system.conftest import mail_id, part_ids

pytestmark = pytest.mark.system
SHARES_CLUSTER = True

EPOCHS = 2
SEED = 5
LR = 0.5
MOMENTUM = 0.5
OUTPUT_TOLERANCE = 0.05


def _joined(parties: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The training rows every party holds, sorted by id: ids, features, labels."""
    split = data.breast_cancer()
    order = np.argsort(split.id_train, kind="stable")
    ids, x, y = split.id_train[order], split.x_train[order], split.y_train[order]
    keep = np.ones(len(ids), dtype=bool)
    for party in parties:
        keep &= np.isin(ids, part_ids(party, ids))
    return ids[keep], x[keep], y[keep]


def _train(features: dict[str, str], labels: str) -> Job:
    """Logistic regression on `features` (15 columns each), aligned on ids, weights to carol."""
    return Job.train(
        model=models.LogisticRegression(15 * len(features)),
        features=features,
        labels={"carol": labels},
        align_on="id",
        epochs=EPOCHS,
        lr=LR,
        momentum=MOMENTUM,
        seed=SEED,
        reveal={"weights": ["carol"]},
    )


def _assert_near_plaintext(job: JobHandle, x: np.ndarray, y: np.ndarray) -> None:
    """The weights carol received, against plaintext PyTorch on the same rows and settings."""
    width = x.shape[1]
    plain = plaintext_train(
        models.LogisticRegression(width), x, y, epochs=EPOCHS, lr=LR, momentum=MOMENTUM, seed=SEED
    ).state_dict()
    [output] = job.result().outputs
    secure = torch.load(output.path, weights_only=True)
    for key, value in plain.items():
        diff = float((secure[key].reshape(value.shape) - value).abs().max())
        assert diff < OUTPUT_TOLERANCE, f"{key}: {diff} from plaintext on the joined rows"


@pytest.mark.parametrize("parties", [["alice", "carol"], ["alice", "bob", "carol"]])
def test_a_vertical_job_on_partly_overlapping_lists_trains_on_the_shared_rows(
    cluster: LocalCluster, client: Client, parties: list[str]
) -> None:
    features = {p: "bc-part" for p in parties if p != "carol"}
    job = client.submit(_train(features, "bc-part-labels"))
    status = job.wait(timeout=240)
    assert status.state == cpb.COMPLETED, status.reason
    ids, x, y = _joined(parties)
    assert 0 < len(ids) < 455
    _assert_near_plaintext(job, x[:, : 15 * len(features)], y)
    log = (cluster.logs / "alice.log").read_text()
    assert f"{len(ids)} of this party's" in log


def test_an_intersection_under_min_rows_is_refused_naming_the_dataset(client: Client) -> None:
    job = client.submit(
        Job.train(
            model=models.LogisticRegression(15),
            features={"alice": "bc-few"},
            labels={"carol": "bc-even-labels"},
            align_on="id",
            reveal={"weights": ["carol"]},
        )
    )
    status = job.wait(timeout=120)
    assert status.state == cpb.FAILED
    assert "bc-few" in status.reason and "min_rows" in status.reason, status.reason
    assert "20" in status.reason, status.reason


def test_e_mail_ids_align_as_text_and_reach_the_predictions_recipient(
    cluster: LocalCluster, client: Client
) -> None:
    # carol's ids carry stray spaces: trimmed
    train = client.submit(_train({"alice": "bc-mail"}, "bc-mail-labels"))
    assert train.wait(timeout=240).state == cpb.COMPLETED
    ids, x, y = _joined(["alice", "carol"])
    texts = [mail_id(int(i)) for i in ids]
    order = sorted(range(len(texts)), key=lambda i: catalogue.id_order(texts[i]))
    _assert_near_plaintext(train, x[order][:, :15], y[order])

    infer = client.submit(
        Job.infer(
            from_job=train.id,
            features={"alice": "bc-mail"},
            align_on="id",
            reveal={"predictions": ["carol"]},
        )
    )
    assert infer.wait(timeout=120).state == cpb.COMPLETED
    [output] = infer.result().outputs
    with np.load(output.path) as npz:
        received = npz["ids"].tolist()
    split = data.breast_cancer()
    held = [mail_id(int(i)) for i in part_ids("alice", split.id_train)]
    assert received == sorted(held, key=catalogue.id_order)
