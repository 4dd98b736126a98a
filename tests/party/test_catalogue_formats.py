"""Datasets as users have them: CSV and Parquet read by Arrow, .npz; `describe` reads no values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpcml.party import catalogue
from mpcml.party.catalogue import DataError
from mpcml.party.config import DatasetEntry


def _csv(tmp_path: Path, text: str, id_column: str = "id") -> DatasetEntry:
    path = tmp_path / "d.csv"
    path.write_text(text)
    return DatasetEntry(name="d", path=path, id_column=id_column)


def test_csv_and_parquet_of_one_table_read_alike(tmp_path: Path) -> None:
    ids = ["9000000000000000001", "9000000000000000002", "C-7"]
    x = np.array([[0.5, -1.0], [1.25, 2.0], [3.0, 1e-3]], dtype=np.float32)
    csv_entry = _csv(
        tmp_path, "a,id,b\n" + "".join(f"{r[0]},{i},{r[1]}\n" for i, r in zip(ids, x, strict=True))
    )
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"a": x[:, 0], "id": ids, "b": x[:, 1].astype(np.float64)}), path)
    parquet_entry = DatasetEntry(name="d", path=path, id_column="id")
    for entry in (csv_entry, parquet_entry):
        table = catalogue.read(entry)
        assert table.columns == ["a", "b"]
        assert table.ids is not None and table.ids.tolist() == ids
        assert table.values.dtype == np.float32 and np.array_equal(table.values, x)
        info = catalogue.describe(entry)
        assert (info.rows, list(info.columns), list(info.row_shape)) == (3, ["a", "b"], [2])


def test_parquet_integer_ids_keep_every_digit(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    big = [9_000_000_000_000_000_001, 9_000_000_000_000_000_002]
    pq.write_table(pa.table({"id": pa.array(big, pa.int64()), "x": [1.0, 2.0]}), path)
    table = catalogue.read(DatasetEntry(name="d", path=path, id_column="id"))
    assert table.ids is not None and table.ids.tolist() == [str(v) for v in big]


def test_bad_cells_are_named_by_row_and_column_not_by_value(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"row 3 of .* has 2 cells, its header 3"):
        catalogue.read(_csv(tmp_path, "id,a,b\nx,1,2\ny,1\n"))
    with pytest.raises(DataError, match=r"row 2 of .* non-numeric value in column 'b'") as bad:
        catalogue.read(_csv(tmp_path, "id,a,b\nx,1,secret-word\ny,1,2\n"))
    assert "secret-word" not in str(bad.value)
    with pytest.raises(DataError, match=r"row 3 has no value in column 'a'"):
        catalogue.read(_csv(tmp_path, "id,a,b\nx,1,2\ny,,2\n"))
    with pytest.raises(DataError, match="is empty"):
        catalogue.read(_csv(tmp_path, ""))
    with pytest.raises(DataError, match="no id column 'id'"):
        catalogue.describe(_csv(tmp_path, "key,a\nx,1\n"))
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["x"], "a": ["text"]}), path)
    with pytest.raises(DataError, match=r"column 'a' of .* is string, not numbers"):
        catalogue.read(DatasetEntry(name="d", path=path, id_column="id"))


def test_describe_counts_rows_without_converting_values(tmp_path: Path) -> None:
    # a value no job could load still registers: describe reads the header and counts rows;
    # the job that loads the values is the one refused
    entry = _csv(tmp_path, "id,a\n" + "".join(f"r{i},{i}\n" for i in range(999)) + "z,oops\n")
    info = catalogue.describe(entry)
    assert (info.rows, list(info.columns)) == (1000, ["a"])
    with pytest.raises(DataError, match=r"row 1001 .* column 'a'"):
        catalogue.read(entry)


def test_describe_reads_npz_shapes_from_the_headers(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((5, 4, 3), dtype=np.float32), id=np.arange(5))
    info = catalogue.describe(DatasetEntry(name="d", path=path, id_column="id", array="x"))
    assert (info.rows, list(info.row_shape), list(info.columns)) == (5, [4, 3], [])
    with pytest.raises(DataError, match="has no array 'm'"):
        catalogue.describe(DatasetEntry(name="d", path=path, array="x", mask="m"))
