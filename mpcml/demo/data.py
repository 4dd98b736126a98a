"""The demo's data: plaintext reference splits and the example parties' private files.

Everything comes from scikit-learn's bundled datasets (no download), split by fixed seeds, so
`python -m mpcml.demo.data [PARTIES_DIR]` rewrites the committed `parties/` files exactly and the
tests can check them against `breast_cancer()` and `digits()`.

The breast-cancer features are split vertically: alice holds the first 15 columns, bob the last
15 and carol the labels, joined by the `id` column. Bob writes his rows sorted by id (a different
order from alice's and carol's), so a job must align rows by id; his `*_positional.csv` copies are
in alice's order for jobs that align by position. The same rows as customer lists
(`customers_*.csv`, text ids such as `CUST-000512`) overlap only partly: alice lacks the rows
whose id is a multiple of 7, bob those of 5, so a job on them aligns rows by private set
intersection and runs on the rows both hold. For the digits, alice holds test images and bob
a privately trained classifier (private inference); likewise for the reviews (`sentiment.py`):
alice's token sequences, bob's small BERT.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from sklearn.datasets import load_breast_cancer, load_digits
from torch import nn

from mpcml.demo import sentiment
from mpcml.demo.models import DigitsMLP

BC_TRAIN_ROWS = 455
DIGITS_TRAIN_ROWS = 1437
ALICE_COLUMNS = 15
LACKS = {"alice": 7, "bob": 5}
"""Each feature party's customer lists lack the rows whose id is a multiple of this."""


@dataclass(frozen=True)
class Split:
    """A deterministic train/test split; rows are in the permuted (alice's) order.

    `y_*` is float32 0/1 for the breast-cancer set (what BCE needs) and int64 class 0..9 for the
    digits (what cross-entropy and argmax need). `id_*` is the row's index in sklearn's dataset.
    """

    x_train: npt.NDArray[np.float32]
    y_train: npt.NDArray[Any]
    x_test: npt.NDArray[np.float32]
    y_test: npt.NDArray[Any]
    id_train: npt.NDArray[np.int64]
    id_test: npt.NDArray[np.int64]
    columns: list[str]


def breast_cancer() -> Split:
    """The breast-cancer set, permuted by seed 0, standardised with the train rows' statistics.

    Standardising with train statistics only keeps the test rows unseen, and makes plain SGD
    (in plaintext or under MPC fixed point) converge without feature scaling surprises.
    """
    bunch = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.float32)
    order = np.random.RandomState(0).permutation(len(x)).astype(np.int64)
    train, test = order[:BC_TRAIN_ROWS], order[BC_TRAIN_ROWS:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    z = ((x - mean) / std).astype(np.float32)
    return Split(
        x_train=z[train],
        y_train=y[train],
        x_test=z[test],
        y_test=y[test],
        id_train=train,
        id_test=test,
        columns=[str(name).replace(" ", "_") for name in bunch.feature_names],
    )


def digits() -> Split:
    """The 8x8 digits, pixels scaled to [0, 1], permuted by seed 1; labels are int64."""
    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    order = np.random.RandomState(1).permutation(len(x)).astype(np.int64)
    train, test = order[:DIGITS_TRAIN_ROWS], order[DIGITS_TRAIN_ROWS:]
    return Split(
        x_train=x[train],
        y_train=y[train],
        x_test=x[test],
        y_test=y[test],
        id_train=train,
        id_test=test,
        columns=[f"pixel_{i}" for i in range(x.shape[1])],
    )


def train_digits_mlp(split: Split, epochs: int = 30) -> DigitsMLP:
    """Bob's private model: plain SGD with momentum, seeded so that reruns give the same model."""
    model = DigitsMLP()
    train_digits(model, split, epochs)
    return model


def train_digits(model: nn.Module, split: Split, epochs: int = 30) -> nn.Module:
    """Train a digits classifier in plaintext, seeded: SGD with momentum.

    Cross-entropy on its logits (a final Softmax is left out of the loss). Its input is what
    its first layer takes: 64 pixels, or a 1x8x8 image for a convolution.
    """
    torch.manual_seed(0)
    for module in model.modules():  # initial weights from the seed, whenever it was built
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
    layers = list(model.children())
    logits = nn.Sequential(*layers[:-1]) if isinstance(layers[-1], nn.Softmax) else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.from_numpy(split.x_train)
    if isinstance(layers[0], nn.Conv2d):
        x = x.reshape(-1, 1, 8, 8)
    y = torch.from_numpy(split.y_train.astype(np.int64))
    model.train()
    for _ in range(epochs):
        for batch in torch.split(torch.randperm(len(x)), 64):
            optimizer.zero_grad()
            loss_fn(logits(x[batch]), y[batch]).backward()
            optimizer.step()
    model.eval()
    return model


def accuracy(model: nn.Module, x: npt.NDArray[np.float32], y: npt.NDArray[Any]) -> float:
    """The share of rows whose argmax logit is the true class."""
    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean())


def customer_id(row: int) -> str:
    """A row's id in the customer lists: text, as account numbers are held."""
    return f"CUST-{int(row):06d}"


def holds(party: str, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which of these rows `party`'s customer lists hold."""
    return np.asarray(ids % LACKS[party] != 0) if party in LACKS else np.ones(len(ids), bool)


def shared_customers(
    x: npt.NDArray[np.float32], y: npt.NDArray[Any], ids: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.str_], npt.NDArray[np.float32], npt.NDArray[Any]]:
    """The rows alice and bob both hold, in a job's order (by id): ids, features, labels."""
    keep = holds("alice", ids) & holds("bob", ids)
    text = np.array([customer_id(i) for i in ids[keep]])
    order = np.argsort(text, kind="stable")  # zero-padded: text order is number order
    return text[order], x[keep][order], y[keep][order]


def _write_csv(
    path: Path,
    header: Sequence[str],
    ids: npt.NDArray[Any],
    values: npt.NDArray[Any],
) -> None:
    """One `id,...` CSV; `%.9g` round-trips float32 exactly, integers are written as integers.

    Ids are written as they are: whole numbers, or text.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    integers = np.issubdtype(values.dtype, np.integer)

    def as_text(v: Any) -> str:
        return str(int(v)) if integers else f"{v:.9g}"

    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", *header])
        for row_id, row in zip(ids, values.reshape(len(ids), -1), strict=True):
            row_id = row_id if isinstance(row_id, str) else int(row_id)
            writer.writerow([row_id, *(as_text(v) for v in row)])


def write_parties(parties_dir: Path) -> None:
    """Write every party's private files under `parties_dir` (see the module docstring)."""
    bc = breast_cancer()
    left, right = bc.columns[:ALICE_COLUMNS], bc.columns[ALICE_COLUMNS:]
    for name, x, y, ids in (
        ("train", bc.x_train, bc.y_train, bc.id_train),
        ("test", bc.x_test, bc.y_test, bc.id_test),
    ):
        _write_csv(parties_dir / "alice/data" / f"bc_{name}.csv", left, ids, x[:, :ALICE_COLUMNS])
        by_id = np.argsort(ids, kind="stable")
        bob = x[:, ALICE_COLUMNS:]
        _write_csv(parties_dir / "bob/data" / f"bc_{name}.csv", right, ids[by_id], bob[by_id])
        _write_csv(parties_dir / "bob/data" / f"bc_{name}_positional.csv", right, ids, bob)
        labels = y.astype(np.int64)
        _write_csv(parties_dir / "carol/data" / f"bc_{name}_labels.csv", ["label"], ids, labels)
        text = np.array([customer_id(i) for i in ids])
        a = holds("alice", ids)
        _write_csv(
            parties_dir / "alice/data" / f"customers_{name}.csv",
            left,
            text[a],
            x[a][:, :ALICE_COLUMNS],
        )
        b = np.flatnonzero(holds("bob", ids))
        b = b[np.argsort(ids[b], kind="stable")]
        _write_csv(parties_dir / "bob/data" / f"customers_{name}.csv", right, text[b], bob[b])
        if name == "train":
            _write_csv(
                parties_dir / "carol/data/customers_train_labels.csv", ["label"], text, labels
            )

    dg = digits()
    (parties_dir / "alice/data").mkdir(parents=True, exist_ok=True)
    np.savez_compressed(parties_dir / "alice/data/digits_test.npz", x=dg.x_test, id=dg.id_test)
    _write_csv(parties_dir / "alice/data/digits_test_labels.csv", ["label"], dg.id_test, dg.y_test)

    model = train_digits_mlp(dg)
    print(f"digits_mlp test accuracy: {accuracy(model, dg.x_test, dg.y_test):.4f}")
    (parties_dir / "bob/models").mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), parties_dir / "bob/models/digits_mlp.pt")

    print(f"sentiment_bert test accuracy: {sentiment.write(parties_dir):.4f}")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m mpcml.demo.data [PARTIES_DIR]`."""
    parser = argparse.ArgumentParser(description="Write the demo parties' private files.")
    parser.add_argument("parties_dir", nargs="?", type=Path, default=Path("parties"))
    write_parties(parser.parse_args(argv).parties_dir)


if __name__ == "__main__":
    main()
