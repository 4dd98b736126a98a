"""The committed parties/ files agree with the plaintext reference splits."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch

from mpcml.demo.data import Split, accuracy, breast_cancer, digits, shared_customers
from mpcml.demo.models import BreastCancerMLP, DigitsMLP, LogisticRegression
from mpcml.party import catalogue
from mpcml.party.config import DatasetEntry

PARTIES = Path(__file__).resolve().parents[2] / "parties"


def read_csv(path: Path) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    with path.open(newline="") as f:
        header, *rows = list(csv.reader(f))
    ids = np.array([int(row[0]) for row in rows], dtype=np.int64)
    values = np.array([[float(v) for v in row[1:]] for row in rows], dtype=np.float64)
    return header, ids, values


@pytest.fixture(scope="module")
def bc() -> Split:
    return breast_cancer()


@pytest.fixture(scope="module")
def dg() -> Split:
    return digits()


def test_breast_cancer_split(bc: Split) -> None:
    assert bc.x_train.shape == (455, 30) and bc.x_test.shape == (114, 30)
    assert bc.x_train.dtype == np.float32 and bc.y_train.dtype == np.float32
    assert sorted(np.concatenate([bc.id_train, bc.id_test]).tolist()) == list(range(569))
    np.testing.assert_allclose(bc.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(bc.x_train.std(axis=0), 1.0, atol=1e-5)
    assert len(bc.columns) == 30 and all(" " not in c for c in bc.columns)


@pytest.mark.parametrize("name", ["train", "test"])
def test_breast_cancer_files(bc: Split, name: str) -> None:
    x, y, ids = (
        (bc.x_train, bc.y_train, bc.id_train)
        if name == "train"
        else (bc.x_test, bc.y_test, bc.id_test)
    )
    a_header, a_ids, a_x = read_csv(PARTIES / "alice/data" / f"bc_{name}.csv")
    b_header, b_ids, b_x = read_csv(PARTIES / "bob/data" / f"bc_{name}.csv")
    p_header, p_ids, p_x = read_csv(PARTIES / "bob/data" / f"bc_{name}_positional.csv")
    c_header, c_ids, c_y = read_csv(PARTIES / "carol/data" / f"bc_{name}_labels.csv")

    assert a_header == ["id", *bc.columns[:15]]
    assert b_header == p_header == ["id", *bc.columns[15:]]
    assert c_header == ["id", "label"]
    np.testing.assert_array_equal(a_ids, ids)
    np.testing.assert_array_equal(p_ids, ids)
    np.testing.assert_array_equal(c_ids, ids)
    np.testing.assert_array_equal(b_ids, np.sort(ids))
    assert not np.array_equal(b_ids, a_ids)  # bob's order differs: jobs must join by id

    position = {int(i): k for k, i in enumerate(b_ids)}
    b_aligned = b_x[[position[int(i)] for i in a_ids]]
    np.testing.assert_allclose(np.hstack([a_x, b_aligned]), x, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(p_x, b_aligned)
    np.testing.assert_array_equal(c_y[:, 0], y)


@pytest.mark.parametrize("name", ["train", "test"])
def test_the_customer_lists_overlap_partly_and_join_to_the_split(bc: Split, name: str) -> None:
    x, y, ids = (
        (bc.x_train, bc.y_train, bc.id_train)
        if name == "train"
        else (bc.x_test, bc.y_test, bc.id_test)
    )
    tables = {
        party: catalogue.read(
            DatasetEntry(party, PARTIES / party / "data" / f"customers_{name}.csv", id_column="id")
        )
        for party in ("alice", "bob")
    }
    held = {p: set(t.ids.tolist()) for p, t in tables.items() if t.ids is not None}
    assert held["alice"] - held["bob"] and held["bob"] - held["alice"]  # each lacks some
    shared, joined_x, joined_y = shared_customers(x, y, ids)
    assert set(shared) == held["alice"] & held["bob"]
    rows = {}
    for party, table in tables.items():
        assert table.ids is not None
        where = {t: i for i, t in enumerate(table.ids.tolist())}
        rows[party] = table.values[[where[t] for t in shared.tolist()]]
    np.testing.assert_array_equal(np.hstack([rows["alice"], rows["bob"]]), joined_x)
    if name == "train":
        labels = catalogue.read(
            DatasetEntry("l", PARTIES / "carol/data/customers_train_labels.csv", id_column="id")
        )
        assert labels.ids is not None and len(labels.ids) == len(ids)
        where = {t: i for i, t in enumerate(labels.ids.tolist())}
        np.testing.assert_array_equal(labels.values[[where[t] for t in shared], 0], joined_y)


def test_digits_files(dg: Split) -> None:
    assert dg.x_train.shape == (1437, 64) and dg.x_test.shape == (360, 64)
    assert dg.y_test.dtype == np.int64
    with np.load(PARTIES / "alice/data/digits_test.npz") as npz:
        assert npz["x"].dtype == np.float32 and npz["id"].dtype == np.int64
        np.testing.assert_array_equal(npz["x"], dg.x_test)
        np.testing.assert_array_equal(npz["id"], dg.id_test)
    header, ids, labels = read_csv(PARTIES / "alice/data/digits_test_labels.csv")
    assert header == ["id", "label"]
    np.testing.assert_array_equal(ids, dg.id_test)
    np.testing.assert_array_equal(labels[:, 0], dg.y_test)


def test_bobs_model(dg: Split) -> None:
    model = DigitsMLP()
    state = torch.load(PARTIES / "bob/models/digits_mlp.pt", weights_only=True)
    model.load_state_dict(state)
    model.eval()
    assert accuracy(model, dg.x_test, dg.y_test) >= 0.95


def test_models_trace() -> None:
    for model, width, out in (
        (LogisticRegression(), 30, 1),
        (BreastCancerMLP(), 30, 1),
        (DigitsMLP(), 64, 10),
    ):
        traced = torch.fx.symbolic_trace(model)
        x = torch.randn(4, width)
        assert traced(x).shape == (4, out)
        torch.testing.assert_close(traced(x), model(x))
