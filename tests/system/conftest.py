"""One deployment for the system tests: the coordinator and alice, bob and carol as separate
processes on loopback with real mutual TLS, on a copy of `parties/` the tests may extend."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from bench import zoo
from mpcml.api.client import Client, ClientError
from mpcml.api.job import Job
from mpcml.demo import data, models
from mpcml.demo.cluster import PARTIES_DIR, LocalCluster
from mpcml.graph.capture import capture
from mpcml.graph.digest import graph_digest, weights_commitment
from mpcml.party import audit

H_SPLIT = 228
"""Horizontal split: alice holds the first 228 training rows (by id), bob the rest."""
MAX_CONCURRENT_JOBS = 2
"""Every party's `max_concurrent_jobs`: two jobs at once, further ones wait PENDING."""
LIMITS = {"max_message_bytes": 1 << 20, "max_job_rows": 100_000}
"""The coordinator's limits: far above what the tests' jobs need, except those that test them."""
TUNABLE = {"digits-tanh": models.DigitsTanhMLP, "digits-cnn": models.DigitsCNN}
"""bob's private models with non-linear nodes to approximate, by catalogue name."""
ADMIN = "ops"
"""The client the coordinator's `admins` names: it may act on every job."""
AGREED = nn.Sequential(nn.Linear(15, 1))
"""The consortium's agreed model in the security tests: bob's `bc-agreed` admits its graph."""
AGREED_WEIGHTS = {"0.weight": torch.full((1, 15), 0.1), "0.bias": torch.tensor([0.5])}
"""alice's private weights for it that bob's policy pins by commitment (`agreed`)."""
SELECT0 = {"0.weight": torch.eye(15)[:1].clone(), "0.bias": torch.zeros(1)}
"""alice's attacking weights for the agreed graph: they select their input's column 0."""


def _write_csv(path: Path, header: list[str], rows: np.ndarray) -> None:
    lines = [",".join(header)] + [",".join(f"{v:.9g}" for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def _extend_profiles(parties: Path) -> None:
    """Datasets only the tests use: a horizontal split with labels in the same table, and a
    copy of bob's training columns that a test corrupts after registration."""
    split = data.breast_cancer()
    order = np.argsort(split.id_train, kind="stable")
    ids, x, y = split.id_train[order], split.x_train[order], split.y_train[order]
    table = np.column_stack([ids, x, y])
    header = ["id", *split.columns, "label"]
    for party, rows in (("alice", table[:H_SPLIT]), ("bob", table[H_SPLIT:])):
        _write_csv(parties / party / "data" / "h_train.csv", header, rows)
        with (parties / party / "party.toml").open("a") as f:
            f.write('\n[datasets.h-train]\npath = "data/h_train.csv"\nid_column = "id"\n')
    _partial_overlap(parties, split, order)
    # bob's policy keeps one dataset out of every job.
    toml = parties / "bob" / "party.toml"
    allowed = (
        '["bc-train", "bc-test", "bc-train-positional", "bc-train-copy", "bc-part", "h-train", '
        '"customers-train", "customers-test"]'
    )
    toml.write_text(toml.read_text().replace('datasets = "*"', f"datasets = {allowed}"))
    shutil.copy(parties / "bob" / "data" / "bc_train.csv", parties / "bob" / "data" / "copy.csv")
    with (parties / "bob" / "party.toml").open("a") as f:
        f.write('\n[datasets.bc-train-copy]\npath = "data/copy.csv"\nid_column = "id"\n')
    # alice lets bob receive the weights trained on her half of the horizontal split and the
    # predictions of models her bc-train columns trained (the security tests' labels), and
    # holds a private model that copies its 15 inputs (an attacker's identity model).
    identity = torch.nn.Linear(15, 15)
    with torch.no_grad():
        identity.weight.copy_(torch.eye(15))
        identity.bias.zero_()
    torch.save(nn.Sequential(identity).state_dict(), parties / "alice" / "identity.pt")  # 0.*
    with (parties / "alice" / "party.toml").open("a") as f:
        f.write('\n[policy.for_dataset.h-train]\noutputs_to = ["bob"]\n')
        f.write(
            "\n[policy.for_dataset.bc-train]\noutputs_to = "
            '{ predictions = ["carol", "bob"], weights = ["carol"], '
            'metrics = ["carol", "coordinator"] }\n'
        )
        f.write('\n[models.identity]\npath = "identity.pt"\n')
    _extend_for_attacks(parties)
    _extend_for_zoo(parties)
    # bob's digits classifiers with Tanh and Softmax (the approximation tests), and alice's
    # test images as 1x8x8 for the convolutional one.
    digits = data.digits()
    for name, model in TUNABLE.items():
        torch.save(data.train_digits(model(), digits).state_dict(), parties / "bob" / f"{name}.pt")
        with (parties / "bob" / "party.toml").open("a") as f:
            f.write(f'\n[models.{name}]\npath = "{name}.pt"\n')
        with (parties / "bob" / "party.toml").open("a") as f:
            f.write(f'\n[policy.for_model.{name}]\noutputs_to = {{ predictions = ["alice"] }}\n')
    images = parties / "alice" / "data" / "digits_images.npz"
    np.savez(images, x=digits.x_test.reshape(-1, 1, 8, 8), id=digits.id_test)
    with (parties / "alice" / "party.toml").open("a") as f:
        f.write('\n[datasets.digits-images]\npath = "data/digits_images.npz"\nid_column = "id"\n')


ZOO_MODELS = ("squeezenet1_0", "resnet18")
"""The torchvision classifiers the suite runs through the daemons (tests/system/test_zoo.py):
ceil-mode pooling and concatenation, residual blocks with batch norm; each has random-weight
logits of magnitude 0.8 to 2.8, so an error shows (MobileNet's and EfficientNet's are below
0.01). tests/graph/test_aten.py covers every op on shares (Hardswish, squeeze-and-excitation
gates, channels-last layer norm included) and bench/models.py runs all 18."""
ZOO_SIZE = 32


def _extend_for_zoo(parties: Path) -> None:
    """carol's labels of the digits test images (alice's `digits-images`), one 3x32x32 image
    of alice's, and bob's zoo classifiers (random weights) as private models whose logits go to
    alice."""
    digits = data.digits()
    alice, bob, carol = (parties / name for name in ("alice", "bob", "carol"))
    image = np.random.default_rng(1).standard_normal((1, 3, ZOO_SIZE, ZOO_SIZE))
    np.savez(alice / "data" / "zoo_image.npz", x=image.astype(np.float32), id=np.array([0]))
    to_alice = '{ predictions = ["alice"] }'
    with (alice / "party.toml").open("a") as f:
        f.write('\n[datasets.zoo-image]\npath = "data/zoo_image.npz"\nid_column = "id"\n')
        f.write(f"\n[policy.for_dataset.zoo-image]\noutputs_to = {to_alice}\n")
    rows = "\n".join(f"{i},{y}" for i, y in zip(digits.id_test, digits.y_test, strict=True))
    (carol / "data" / "digits_test_labels.csv").write_text(f"id,label\n{rows}\n")
    with (carol / "party.toml").open("a") as f:
        f.write('\n[datasets.digits-test-labels]\npath = "data/digits_test_labels.csv"\n')
        f.write('id_column = "id"\n')
    if zoo.torchvision() is None:
        return
    with (bob / "party.toml").open("a") as f:
        for name in ZOO_MODELS:
            torch.save(zoo.classifier(name).state_dict(), bob / f"zoo_{name}.pt")
            f.write(f'\n[models.zoo-{name}]\npath = "zoo_{name}.pt"\n')
            f.write(f"\n[policy.for_model.zoo-{name}]\noutputs_to = {to_alice}\n")


def _extend_for_attacks(parties: Path) -> None:
    """The two routes of issue 23 and their legitimate twins (tests/system/test_security.py).

    alice holds labels of 100 for every bc-train id, the agreed model's weights (`agreed`), the
    attacking weights (`select0`), LogisticRegression weights, and a bare Linear whose keys do
    not fit a Sequential's graph. bob lets alice receive the metrics of bc-train, and has a
    copy of bc-train (`bc-agreed`) that admits only the agreed graph, trained from the seed on
    his rows or with alice's pinned weights, with predictions to alice.
    """
    ids = np.loadtxt(parties / "bob" / "data" / "bc_train.csv", delimiter=",", skiprows=1)[:, 0]
    _write_csv(
        parties / "alice" / "data" / "hundreds.csv",
        ["id", "label"],
        np.column_stack([ids, np.full(len(ids), 100.0)]),
    )
    weights = {
        "agreed": AGREED_WEIGHTS,
        "select0": SELECT0,
        "logreg": models.LogisticRegression().state_dict(),
        "bare-linear": nn.Linear(15, 1).state_dict(),
    }
    with (parties / "alice" / "party.toml").open("a") as f:
        f.write('\n[datasets.hundreds]\npath = "data/hundreds.csv"\nid_column = "id"\n')
        for name, state in weights.items():
            torch.save(state, parties / "alice" / f"{name}.pt")
            f.write(f'\n[models.{name}]\npath = "{name}.pt"\n')
        f.write(
            "\n[policy.for_model.select0]\n"
            'outputs_to = { predictions = ["bob"], metrics = ["coordinator"] }\n'
        )
    shutil.copy(parties / "bob" / "data" / "bc_train.csv", parties / "bob" / "data" / "agreed.csv")
    digest = graph_digest(capture(AGREED, (15,)))
    commitment = weights_commitment(AGREED_WEIGHTS)
    with (parties / "bob" / "party.toml").open("a") as f:
        f.write('\n[datasets.bc-agreed]\npath = "data/agreed.csv"\nid_column = "id"\n')
        f.write(
            '\n[policy.for_dataset.bc-train]\noutputs_to = { predictions = ["carol"], '
            'weights = ["carol"], metrics = ["carol", "alice", "coordinator"] }\n'
        )
        f.write(
            "\n[policy.for_dataset.bc-agreed]\n"
            'outputs_to = { predictions = ["alice"], ids = ["alice"], metrics = ["alice"] }\n'
            f'graphs = ["{digest}", {{ graph = "{digest}", weights = {{ party = "alice", '
            f'model = "agreed", commitment = "{commitment}" }} }}]\n'
        )
    _allow(parties / "bob" / "party.toml", "bc-agreed")


PART_KEEP = {"alice": 5, "bob": 7, "carol": 11}
"""Customer lists that partly overlap: each party lacks the training rows whose id is a
multiple of its number (alice and bob hold 15 features each, carol the labels)."""


def part_ids(party: str, ids: np.ndarray) -> np.ndarray:
    """The ids of `ids` that `party` holds in the partly overlapping datasets."""
    kept: np.ndarray = ids[ids % PART_KEEP[party] != 0]
    return kept


def _partial_overlap(parties: Path, split: data.Split, order: np.ndarray) -> None:
    ids, x, y = split.id_train[order], split.x_train[order], split.y_train[order]
    halves = {"alice": (split.columns[:15], x[:, :15]), "bob": (split.columns[15:], x[:, 15:])}
    for party, (columns, values) in halves.items():
        keep = ids % PART_KEEP[party] != 0
        _write_csv(
            parties / party / "data" / "part.csv",
            ["id", *columns],
            np.column_stack([ids[keep], values[keep]]),
        )
        with (parties / party / "party.toml").open("a") as f:
            f.write('\n[datasets.bc-part]\npath = "data/part.csv"\nid_column = "id"\n')
    keep = ids % PART_KEEP["carol"] != 0
    _write_csv(
        parties / "carol" / "data" / "part_labels.csv",
        ["id", "label"],
        np.column_stack([ids[keep], y[keep]]),
    )
    few = ids[(ids % 2 == 0)][:20]  # 20 rows alice's other table shares: under min_rows (32)
    keep = np.isin(ids, few) | (ids % 2 == 1)
    _write_csv(
        parties / "alice" / "data" / "few.csv",
        ["id", *split.columns[:15]],
        np.column_stack([ids[keep], x[keep][:, :15]]),
    )
    with (parties / "carol" / "party.toml").open("a") as f:
        f.write('\n[datasets.bc-part-labels]\npath = "data/part_labels.csv"\nid_column = "id"\n')
        f.write('\n[datasets.bc-even-labels]\npath = "data/even_labels.csv"\nid_column = "id"\n')
    even = ids % 2 == 0
    _write_csv(
        parties / "carol" / "data" / "even_labels.csv",
        ["id", "label"],
        np.column_stack([ids[even], y[even]]),
    )
    with (parties / "alice" / "party.toml").open("a") as f:
        f.write('\n[datasets.bc-few]\npath = "data/few.csv"\nid_column = "id"\n')
    # The same rows under e-mail ids (carol's with stray spaces), as customer lists hold them.
    mails = np.array([mail_id(int(i)) for i in ids])
    keep = ids % PART_KEEP["alice"] != 0
    _write_text_ids(
        parties / "alice" / "data" / "mail.csv", split.columns[:15], mails[keep], x[keep][:, :15]
    )
    keep = ids % PART_KEEP["carol"] != 0
    _write_text_ids(
        parties / "carol" / "data" / "mail_labels.csv",
        ["label"],
        np.array([f"  {m} " for m in mails[keep]]),
        y[keep].reshape(-1, 1),
    )
    with (parties / "alice" / "party.toml").open("a") as f:
        f.write('\n[datasets.bc-mail]\npath = "data/mail.csv"\nid_column = "id"\n')
    with (parties / "carol" / "party.toml").open("a") as f:
        f.write('\n[datasets.bc-mail-labels]\npath = "data/mail_labels.csv"\nid_column = "id"\n')


def mail_id(row: int) -> str:
    """The e-mail id of a training row in the `bc-mail` datasets."""
    return f"customer-{row}@bank.example"


def _write_text_ids(path: Path, header: list[str], ids: np.ndarray, rows: np.ndarray) -> None:
    lines = ["id," + ",".join(header)]
    lines += [f"{i}," + ",".join(f"{v:.9g}" for v in row) for i, row in zip(ids, rows, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def _allow(profile: Path, dataset: str) -> None:
    """Add `dataset` to the profile's `policy.datasets` list."""
    text = profile.read_text()
    found = re.search(r"^datasets = \[(.*)\]$", text, flags=re.MULTILINE)
    assert found is not None, f"{profile} has no policy.datasets list"
    listed = f'datasets = [{found.group(1)}, "{dataset}"]'
    profile.write_text(text[: found.start()] + listed + text[found.end() :])


def system_parties(root: Path) -> Path:
    """The example parties with the system tests' extra datasets and rules, under `root`."""
    parties = root / "parties"
    shutil.copytree(
        PARTIES_DIR, parties, ignore=shutil.ignore_patterns("state", "results", "certs")
    )
    _extend_profiles(parties)
    return parties


def _system_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("system")
    parties = system_parties(root)
    with LocalCluster(
        root / "run",
        parties_dir=parties,
        roster_extra=["dave"],
        log_level="debug",
        max_concurrent_jobs=MAX_CONCURRENT_JOBS,
        coordinator_settings={**LIMITS, "admins": [ADMIN]},
        console=True,
    ) as c:
        c.start()
        yield c


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the modules that set `SHARES_CLUSTER`: each start costs about 11 s of
    the 2-core CI machine (five daemons and three warm workers importing torch)."""
    yield from _system_cluster(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A cluster of its own for a module that kills, restarts or counts what ran on it; the
    shared one for a module that only submits jobs and reads their own results and refusals."""
    if getattr(request.module, "SHARES_CLUSTER", False):
        yield request.getfixturevalue("shared_cluster")
        return
    yield from _system_cluster(tmp_path_factory)


@pytest.fixture()
def client(cluster: LocalCluster) -> Client:
    assert cluster.client is not None
    return cluster.client


def audit_entries(cluster: LocalCluster, party: str, since: float = 0.0) -> list[dict[str, Any]]:
    """`party`'s audit log entries written at or after `since` (seconds since the epoch)."""
    path = cluster.workdir / party / "state" / audit.FILE
    if not path.exists():
        return []
    return [e for _, e in audit.entries(path) if float(e["at"]) >= since]


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`mpcml ARGS` as the cluster's submitter runs it, its coordinator and certificate from the
    environment."""
    tls = cluster.client_tls()
    assert tls is not None
    env = {
        **os.environ,
        "MPCML_COORDINATOR": cluster.coordinator_address,
        "MPCML_CA": str(tls.ca),
        "MPCML_CERT": str(tls.cert),
        "MPCML_KEY": str(tls.key),
    }
    return subprocess.run(
        [sys.executable, "-m", "mpcml.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


REFUSED_BY_ALICE = (
    "predictions computed from its dataset 'bc-test' would reach 'bob', and "
    "policy.outputs_to does not name 'bob' for predictions"
)
"""The rule alice's policy refuses `submit_refused_by_alice`'s job with."""


def submit_refused_by_alice(client: Client) -> None:
    """Submit a job alice's policy refuses (bob's model on her rows, predictions to bob)."""
    with pytest.raises(ClientError, match="refuses the job"):
        client.submit(
            Job.infer(
                model=nn.Sequential(nn.Flatten(), nn.ReLU()),
                weights={"bob": "digits-mlp"},
                features={"alice": "bc-test"},
                reveal={"predictions": ["bob"]},
            )
        )
