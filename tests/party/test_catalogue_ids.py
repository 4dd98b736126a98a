"""Ids as users have them: read as text, exactly, and refused when empty or repeated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpcml.party import catalogue
from mpcml.party.catalogue import DataError
from mpcml.party.config import DatasetEntry


def _entry(path: Path) -> DatasetEntry:
    return DatasetEntry(name="customers", path=path, id_column="id")


def _csv(tmp_path: Path, ids: list[str]) -> DatasetEntry:
    path = tmp_path / "customers.csv"
    path.write_text("id,x\n" + "".join(f"{i},{n}.5\n" for n, i in enumerate(ids)))
    return _entry(path)


def test_nineteen_digit_emails_and_lettered_ids_survive_exactly(tmp_path: Path) -> None:
    ids = ["9000000000000000001", "9000000000000000002", "C-10293", " ana@bank.example "]
    table = catalogue.read(_csv(tmp_path, ids))
    assert table.ids is not None
    assert table.ids.tolist() == [
        "9000000000000000001",
        "9000000000000000002",  # as floats these two would be one id
        "C-10293",
        "ana@bank.example",  # trimmed; case as stored
    ]
    assert np.array_equal(table.values[:, 0], [0.5, 1.5, 2.5, 3.5])


def test_a_repeated_or_empty_id_is_refused_naming_the_rows(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"rows 2 and 4 have the same id \('id'\)"):
        catalogue.read(_csv(tmp_path, ["a", "b", "a "]))
    with pytest.raises(DataError, match="row 3 has an empty id"):
        catalogue.read(_csv(tmp_path, ["a", " "]))


def test_rows_aligned_on_ids_sort_numbers_as_numbers_then_text(tmp_path: Path) -> None:
    entry = _csv(tmp_path, ["10", "9", "b", "a", "100"])
    values, ids = catalogue.select(catalogue.read(entry), entry, ["x"], "id")
    assert ids is not None and ids.tolist() == ["9", "10", "100", "a", "b"]
    assert values[:, 0].tolist() == [1.5, 0.5, 4.5, 3.5, 2.5]


def test_numeric_npz_ids_read_as_their_whole_numbers(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((2, 3), dtype=np.float32), id=np.array([7, 12], dtype=np.int64))
    entry = DatasetEntry(name="d", path=path, id_column="id", array="x")
    table = catalogue.read(entry)
    assert table.ids is not None and table.ids.tolist() == ["7", "12"]
